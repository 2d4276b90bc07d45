//! Real mounts: `kpack-fuse mount` in its own process, file I/O in watched child processes
//! (`support::mount`), results compared byte for byte and errno for errno with the archive API.

mod ahead;
mod bounds;
mod cold;
mod crafted;
mod crash_cache;
mod daemon;
mod disk_space;
mod fault_io;
mod faults;
mod lifecycle;
mod memory_limit;
mod open_mode;
mod races;
mod read_path;
mod scenarios;
pub(crate) mod sources;
mod stats_command;
mod user_errors;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use rocm_kpack::fs::fuse::escape_fsname;
use rocm_kpack::fs::setup::mountinfo;
use rocm_kpack::{Archive, ArchiveWriter, Compression};

use crate::support::fixture;
use crate::support::mount::{Mount, fuse_available};

/// The entry point of I/O child processes (run with `--ignored --exact`): runs the scenario
/// named in `KPACK_IT_SCENARIO`. Ignored in normal runs, where it has nothing to do.
#[test]
#[ignore = "entry point of mount I/O child processes, run by support::mount"]
fn io_child_entry() {
    let Ok(name) = std::env::var("KPACK_IT_SCENARIO") else {
        return;
    };
    let var = |k: &str| std::env::var(k).unwrap_or_default();
    scenarios::run(
        &name,
        Path::new(&var("KPACK_IT_MOUNT")),
        Path::new(&var("KPACK_IT_ARCHIVE")),
        &var("KPACK_IT_ARG"),
    );
    // The parent checks for this line, so a child that ran no scenario cannot pass.
    println!("{}{name}", crate::support::mount::DONE_MARKER);
}

/// Deterministic, compressible bytes.
/// Mounts with `--open-mode daemon` added: for tests of what happens at open (backing
/// files, passthrough, cache directory, open-time errors), which `auto` would not exercise on
/// their small kernels (it picks page-cache mode for those).
pub fn start_passthrough(archive: &Path, extra: &[&str]) -> Mount {
    let mut args = extra.to_vec();
    args.extend_from_slice(&["--open-mode", "daemon"]);
    Mount::start(archive, &args)
}

pub fn pattern(len: usize, seed: u32) -> Vec<u8> {
    (0..len as u32)
        .map(|i| ((i / 7).wrapping_mul(31).wrapping_add(seed) % 251) as u8)
        .collect()
}

pub fn write_archive(
    path: &Path,
    compression: Compression,
    kernels: &[(&str, &str, Vec<u8>)],
) -> PathBuf {
    let mut arches: Vec<String> = Vec::new();
    for (_, a, _) in kernels {
        if !arches.iter().any(|x| x == a) {
            arches.push((*a).to_owned());
        }
    }
    let mut w = ArchiveWriter::new("it", "mixed", arches, compression).unwrap();
    for (key, arch, data) in kernels {
        w.add_kernel(key, arch, data.clone()).unwrap();
    }
    w.write(path, &|_| {}).unwrap();
    path.to_path_buf()
}

/// Several keys, arches with features and generic targets, and sizes across page boundaries.
pub fn rich_archive(path: &Path, compression: Compression) -> PathBuf {
    write_archive(
        path,
        compression,
        &[
            ("lib/librich.so#0", "gfx900", pattern(4096, 1)),
            ("lib/librich.so#0", "gfx90a:xnack+", pattern(4097, 2)),
            (
                "lib/librich.so#0",
                "gfx942:sramecc+:xnack-",
                pattern(70_000, 3),
            ),
            (
                "lib/librich.so#0",
                "gfx9-4-generic:sramecc+",
                pattern(12_345, 4),
            ),
            ("lib/librich.so#0", "gfx11-generic", pattern(300_001, 5)),
            ("lib/librich.so#1", "gfx1100", pattern(1, 6)),
            ("bin/tool#0", "gfx900", pattern(5000, 7)),
            ("bin/tool#0", "gfx906", Vec::new()),
        ],
    )
}

fn tmp() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

/// `kpack-fuse unmount --lazy MP` clears a mount whose daemon is gone, and the point then takes
/// a new mount of `archive`, which serves every file.
fn lazy_unmount_then_remount(mp: &Path, archive: &Path) {
    let out = Command::new(env!("CARGO_BIN_EXE_kpack-fuse"))
        .args(["unmount", "--lazy"])
        .arg(mp)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(mountinfo::mount_at(mp).unwrap(), None);
    let again = Mount::start_on(mp, archive, &[]);
    again.check("walk", "");
    again.stop();
}

#[test]
fn walk_compares_every_file_with_the_archive_api() {
    if !fuse_available() {
        return;
    }
    let d = tmp();
    for archive in [
        fixture("test_noop.kpack"),
        fixture("test_zstd.kpack"),
        rich_archive(&d.path().join("rich-none.kpack"), Compression::None),
        rich_archive(
            &d.path().join("rich-zstd.kpack"),
            Compression::Zstd { level: 3 },
        ),
    ] {
        let m = Mount::start(&archive, &[]);
        m.check("walk", "");
        m.stop();
    }
}

/// mount -> pack -> mount gives the same tree and bytes (the archive bytes may differ).
#[test]
fn mount_pack_mount_round_trip() {
    if !fuse_available() {
        return;
    }
    let d = tmp();
    let first = rich_archive(&d.path().join("first.kpack"), Compression::None);
    let second = d.path().join("second.kpack");
    let m = Mount::start(&first, &[]);
    m.check("pack", second.to_str().unwrap());
    m.stop();
    let (a, b) = (
        Archive::open(&first).unwrap(),
        Archive::open(&second).unwrap(),
    );
    let entries = |x: &Archive| -> Vec<(String, String, Vec<u8>)> {
        let mut v: Vec<_> = x
            .entries()
            .map(|(k, e)| {
                (
                    k.to_owned(),
                    e.arch.to_owned(),
                    x.get_kernel(k, e.arch).unwrap(),
                )
            })
            .collect();
        v.sort();
        v
    };
    assert_eq!(entries(&a), entries(&b));
    assert!(!entries(&a).is_empty());
    let m = Mount::start(&second, &[]);
    m.check("walk", "");
    m.stop();
}

#[test]
fn sample_archive_of_real_code_objects() {
    if !fuse_available() {
        return;
    }
    let sample = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("samples/rocrand-sample.kpack");
    let m = Mount::start(&sample, &["--gpu", "gfx90a:xnack+:sramecc+"]);
    m.check("walk", "");
    m.check("elf", "");
    m.check("sample_links", "");
    m.stop();
}

#[test]
fn stat_fields_and_statfs() {
    if !fuse_available() {
        return;
    }
    let d = tmp();
    let m = Mount::start(
        &rich_archive(&d.path().join("r.kpack"), Compression::Zstd { level: 3 }),
        &[],
    );
    m.check("stat", "");
    // Attributes come from the TOC: nothing was decoded to answer them.
    let m2 = Mount::start(&fixture("test_zstd.kpack"), &[]);
    m2.check("stat", "");
    m.stop();
    m2.stop();
}

#[test]
fn pread_offsets_and_mmap() {
    if !fuse_available() {
        return;
    }
    let d = tmp();
    for compression in [Compression::None, Compression::Zstd { level: 3 }] {
        let m = Mount::start(
            &rich_archive(&d.path().join("r.kpack"), compression),
            &["--backing", "memory", "--memory-cache-size", "128K"],
        );
        m.check("pread", "");
        m.check("mmap", "");
        m.stop();
    }
}

#[test]
fn rereads_are_served_by_the_page_cache() {
    if !fuse_available() {
        return;
    }
    let d = tmp();
    let m = start_passthrough(
        &rich_archive(&d.path().join("r.kpack"), Compression::Zstd { level: 3 }),
        &[],
    );
    m.check("keep_cache", "");
    m.stop();
}

#[test]
fn eight_concurrent_readers() {
    if !fuse_available() {
        return;
    }
    let d = tmp();
    // A small cache forces evictions and re-decodes while the readers run.
    let m = Mount::start(
        &rich_archive(&d.path().join("r.kpack"), Compression::Zstd { level: 3 }),
        &[
            "--threads",
            "4",
            "--backing",
            "memory",
            "--memory-cache-size",
            "320K",
        ],
    );
    m.check("concurrent", "");
    m.stop();
}

#[test]
fn errno_matrix() {
    if !fuse_available() {
        return;
    }
    let m = Mount::start(&fixture("test_noop.kpack"), &[]);
    m.check("errno", "lib/libtest.so#0/gfx900.hsaco");
    m.stop();
}

/// Calls that mean nothing on a read-only archive get a plain file's answer and leave no line
/// in the daemon's log: a Python program opening every kernel once asks the daemon whether each
/// is a terminal, and fuser's default answer logged a warning per file.
#[test]
fn calls_beside_reads_answer_quietly() {
    if !fuse_available() {
        return;
    }
    for extra in [&[][..], &["--no-passthrough"][..]] {
        let m = Mount::start(&fixture("test_noop.kpack"), extra);
        m.check("quiet_calls", "lib/libtest.so#0/gfx900.hsaco");
        let log = m.daemon_log();
        assert!(
            !log.contains(" WARN ") && !log.contains(" ERROR "),
            "{extra:?}: the daemon logged:\n{log}"
        );
        m.stop();
    }
}

#[test]
fn fallback_links_and_native() {
    if !fuse_available() {
        return;
    }
    let d = tmp();
    let archive = rich_archive(&d.path().join("r.kpack"), Compression::Zstd { level: 3 });
    // An empty KFD-less default must not invent native links: pass a GPU nothing runs.
    let m = Mount::start(&archive, &["--gpu", "gfx1030"]);
    m.check("fallback", "");
    m.stop();
    let m = Mount::start(&archive, &["--gpu", "gfx1101", "--gpu", "gfx900"]);
    m.check("fallback", "native");
    m.stop();
}

#[test]
fn corrupt_frame_gives_eio_and_neighbours_read() {
    if !fuse_available() {
        return;
    }
    let d = tmp();
    let path = rich_archive(&d.path().join("bad.kpack"), Compression::Zstd { level: 3 });
    let stored = Archive::open(&path)
        .unwrap()
        .locate("lib/librich.so#0", "gfx90a:xnack+")
        .unwrap()
        .stored;
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[stored.offset as usize..(stored.offset + stored.size) as usize].fill(0xff);
    std::fs::write(&path, bytes).unwrap();
    let m = Mount::start(&path, &[]);
    m.check("corrupt", "lib/librich.so#0/gfx90a:xnack+.hsaco");
    let log = m.daemon_log();
    assert!(
        log.contains(&path.display().to_string())
            && log.contains("lib/librich.so#0 [gfx90a:xnack+]"),
        "the failure is logged with archive, key and arch:\n{log}"
    );
    m.stop();
}

#[test]
fn archive_rewritten_in_place_gives_eio_not_wrong_bytes() {
    if !fuse_available() {
        return;
    }
    let d = tmp();
    let path = rich_archive(&d.path().join("w.kpack"), Compression::None);
    let m = Mount::start(&path, &[]);
    let first = "bin/tool#0/gfx900.hsaco";
    m.check("walk_one", first);
    // Rewrite every stored byte in place (same inode, same length, newer mtime).
    let mut bytes = std::fs::read(&path).unwrap();
    let a = Archive::open(&path).unwrap();
    for (key, e) in a.entries() {
        let s = a.locate(key, e.arch).unwrap().stored;
        for b in &mut bytes[s.offset as usize..(s.offset + s.size) as usize] {
            *b ^= 0x5a;
        }
    }
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, &bytes, 0).unwrap();
    f.set_modified(std::time::SystemTime::now() + std::time::Duration::from_secs(2))
        .unwrap();
    m.check("changed", first);
    assert!(
        m.daemon_log().contains("archive changed while open"),
        "{}",
        m.daemon_log()
    );
    m.stop();
}

#[test]
fn single_flight_one_decode_for_eight_cold_readers() {
    if !fuse_available() {
        return;
    }
    let d = tmp();
    let path = write_archive(
        &d.path().join("big.kpack"),
        Compression::Zstd { level: 3 },
        &[
            ("lib/big.so#0", "gfx942", pattern(16 << 20, 9)),
            ("lib/big.so#0", "gfx900", pattern(100, 1)),
        ],
    );
    let m = Mount::start(
        &path,
        &[
            "--threads",
            "8",
            "--backing",
            "memory",
            "--memory-cache-size",
            "64M",
        ],
    );
    m.check("cold_concurrent", "lib/big.so#0/gfx942.hsaco");
    m.stop();
}

#[test]
fn kernel_larger_than_cache_decoded_once_in_small_chunks() {
    if !fuse_available() {
        return;
    }
    let d = tmp();
    let path = write_archive(
        &d.path().join("big.kpack"),
        Compression::Zstd { level: 3 },
        &[("k#0", "gfx1100", pattern(1 << 20, 3))],
    );
    let m = Mount::start(
        &path,
        &["--backing", "memory", "--memory-cache-size", "64K", "-s"],
    );
    m.check("small_chunks", "k#0/gfx1100.hsaco");
    m.stop();
}

#[test]
fn sigterm_and_sigint_unmount_cleanly_and_proc_mounts_shows_escaped_source() {
    if !fuse_available() {
        return;
    }
    let d = tmp();
    let odd = d.path().join("a,b\\c.kpack");
    std::fs::copy(fixture("test_noop.kpack"), &odd).unwrap();
    let odd = odd.canonicalize().unwrap();
    let m = Mount::start(&odd, &[]);
    let entry = mountinfo::mount_at(&m.mountpoint).unwrap().unwrap();
    assert_eq!(entry.fs_type, "fuse.kpack-fuse");
    assert_eq!(entry.source, escape_fsname(&odd.display().to_string()));
    assert!(
        entry.source.ends_with("a\\,b\\\\c.kpack"),
        "{}",
        entry.source
    );
    // Serve something first, so that the unmount happens on a used mount.
    m.check("walk", "");
    m.stop();

    let m = Mount::start(&fixture("test_zstd.kpack"), &[]);
    m.check("walk", "");
    let status = m.stop_with(libc::SIGINT);
    assert_eq!(status.code(), Some(0));
}

#[test]
fn sigterm_with_a_file_open_detaches_and_exits_after_release() {
    if !fuse_available() {
        return;
    }
    let mut m = Mount::start(&fixture("test_noop.kpack"), &[]);
    let scratch = tmp();
    let arg = format!("lib/libtest.so#0/gfx906.hsaco|{}", scratch.path().display());
    let child = m.spawn_child("hold", &arg);
    let deadline = Instant::now() + Duration::from_secs(60);
    while !scratch.path().join("ready").exists() {
        if Instant::now() > deadline {
            let out = m.finish(child);
            panic!("the holder never got ready:\n{}", out.output);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    m.signal(libc::SIGTERM);
    let deadline = Instant::now() + Duration::from_secs(30);
    while mountinfo::mount_at(&m.mountpoint).unwrap().is_some() {
        assert!(
            Instant::now() < deadline,
            "not detached:\n{}",
            m.daemon_log()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        m.daemon_running(),
        "the daemon serves the open file until it is closed"
    );
    std::fs::write(scratch.path().join("go"), b"").unwrap();
    let out = m.finish(child);
    assert!(
        out.success,
        "{}\ndaemon log:\n{}",
        out.output,
        m.daemon_log()
    );
    assert_eq!(m.wait_exit().code(), Some(0));
}

#[test]
fn unmount_command_from_another_process() {
    if !fuse_available() {
        return;
    }
    let bin = env!("CARGO_BIN_EXE_kpack-fuse");
    for lazy in [false, true] {
        let m = Mount::start(&fixture("test_noop.kpack"), &[]);
        let mut cmd = Command::new(bin);
        cmd.arg("unmount").arg(&m.mountpoint);
        if lazy {
            cmd.arg("--lazy");
        }
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mp = m.mountpoint.clone();
        assert_eq!(m.wait_exit().code(), Some(0));
        assert_eq!(mountinfo::mount_at(&mp).unwrap(), None);
    }
    // After a crash (SIGKILL) the mount point is ENOTCONN; unmount still clears it.
    for lazy in [false, true] {
        let mut m = Mount::start(&fixture("test_noop.kpack"), &[]);
        m.kill_daemon();
        assert!(mountinfo::mount_at(&m.mountpoint).unwrap().is_some());
        let mut cmd = Command::new(bin);
        cmd.arg("unmount").arg(&m.mountpoint);
        if lazy {
            cmd.arg("--lazy");
        }
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(mountinfo::mount_at(&m.mountpoint).unwrap(), None);
    }
    // Not a mount point: exit 8 (mount point problem).
    let d = tmp();
    let out = Command::new(bin)
        .arg("unmount")
        .arg(d.path())
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(8),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn mount_exit(archive: &Path, mountpoint: &Path) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kpack-fuse"))
        .arg("mount")
        .arg(archive)
        .arg(mountpoint)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Refusals happen before anything is mounted; they need no FUSE.
#[test]
fn refuses_bad_mount_points_and_archives_before_mounting() {
    let d = tmp();
    let good = fixture("test_noop.kpack");
    let mp = d.path().join("mnt");
    std::fs::create_dir(&mp).unwrap();
    let file = d.path().join("file");
    std::fs::write(&file, b"x").unwrap();

    let (code, err) = mount_exit(&good, &d.path().join("missing"));
    assert_eq!(code, Some(8), "{err}");
    assert!(err.contains("does not exist"), "{err}");
    let (code, err) = mount_exit(&good, &file);
    assert_eq!(code, Some(8), "{err}");
    assert!(err.contains("not a directory"), "{err}");
    let (code, err) = mount_exit(&d.path().join("nope.kpack"), &mp);
    assert_eq!(code, Some(3), "{err}");
    let (code, err) = mount_exit(&file, &mp);
    assert_eq!(code, Some(4), "{err}");
    let unsafe_key = write_archive(
        &d.path().join("unsafe.kpack"),
        Compression::None,
        &[("lib/../escape#0", "gfx900", vec![1])],
    );
    let (code, err) = mount_exit(&unsafe_key, &mp);
    assert_eq!(code, Some(4), "{err}");
    assert!(
        err.contains("\"lib/../escape#0\""),
        "the message names the key: {err}"
    );
    assert_eq!(
        mountinfo::mount_at(&mp.canonicalize().unwrap()).unwrap(),
        None
    );
}

#[test]
fn refuses_a_mount_point_already_in_use() {
    if !fuse_available() {
        return;
    }
    let m = Mount::start(&fixture("test_noop.kpack"), &[]);
    let (code, err) = mount_exit(&fixture("test_zstd.kpack"), &m.mountpoint);
    assert_eq!(code, Some(8), "{err}");
    assert!(err.contains("already mounted"), "{err}");
    m.stop();
}
