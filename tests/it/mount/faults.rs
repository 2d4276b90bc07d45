//! Live-mount faults: the archive truncated, overwritten, replaced by rename or deleted
//! under a running mount; the daemon killed with SIGKILL; 16 readers doing checked random reads;
//! a tiny cache under pressure. The rule throughout: a read returns the archive's bytes as they
//! were at mount time, or fails with EIO; never other bytes, never a crash or a hang.

use std::path::{Path, PathBuf};
use std::process::Command;

use rocm_kpack::fs::setup::mountinfo;
use rocm_kpack::{Archive, Compression};

use super::{lazy_unmount_then_remount, rich_archive, start_passthrough, tmp, write_archive};
use crate::support::fixture;
use crate::support::mount::{ChildOutput, Mount, fuse_available};

/// Bytes that differ at every position for a given seed (each 4-byte word holds its own index),
/// so a read from a wrong offset never matches by accident, as a periodic pattern could.
fn positional(len: usize, seed: u32) -> Vec<u8> {
    (0..len)
        .map(|i| ((i as u32 / 4) ^ seed.wrapping_mul(0x9e37_79b9)).to_le_bytes()[i % 4])
        .collect()
}

/// A copy of the archive as mounted, for the child to compute the expected bytes from.
fn keep_original(path: &Path) -> PathBuf {
    let copy = path.with_extension("orig");
    std::fs::copy(path, &copy).unwrap();
    copy
}

/// The read before each fault: a small kernel in every archive these tests mount.
const READ_FIRST: &str = "bin/tool#0/gfx900.hsaco";

fn after_fault(m: &Mount, original: &Path, read_before: &str, mode: &str) {
    m.check(
        "after_fault",
        &format!("{}|{read_before}|{mode}", original.display()),
    );
}

/// The value of `DELTA name N` printed by the `random_ranges`/`pressure` scenarios.
fn delta(out: &ChildOutput, name: &str) -> u64 {
    let prefix = format!("DELTA {name} ");
    out.output
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("no {prefix}in:\n{}", out.output))
        .parse()
        .unwrap()
}

/// A `kB` field of `/proc/<pid>/status`, in bytes.
fn proc_status_bytes(pid: u32, field: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix(field).and_then(|r| r.strip_prefix(':')))
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"));
    line.trim()
        .strip_suffix("kB")
        .unwrap()
        .trim()
        .parse::<u64>()
        .unwrap()
        * 1024
}

// The in-place tests and the pressure test run in passthrough open mode: they check what the
// daemon's backing files keep serving (page-cache mode keeps no file for small kernels, so a
// kernel whose pages were dropped is decoded again: EIO once the archive changed).

#[test]
fn archive_truncated_in_place_gives_eio_for_what_was_not_read() {
    if !fuse_available() {
        return;
    }
    for compression in [Compression::None, Compression::Zstd { level: 3 }] {
        let d = tmp();
        let path = rich_archive(&d.path().join("t.kpack"), compression);
        let original = keep_original(&path);
        let m = start_passthrough(&path, &[]);
        m.check("walk_one", READ_FIRST);
        let len = std::fs::metadata(&path).unwrap().len();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(len / 2)
            .unwrap();
        after_fault(&m, &original, READ_FIRST, "eio");
        let log = m.daemon_log();
        assert!(
            log.contains("archive changed while open"),
            "{compression:?}:\n{log}"
        );
        // Still serving: the mount was not torn down by the errors.
        after_fault(&m, &original, READ_FIRST, "eio");
        m.stop();
    }
}

/// Kernels of one repeated byte: zstd stores each as an RLE block whose size does not depend on
/// the byte, so archives with different `fill`s have exactly the same layout and every frame of
/// one decodes, without error, in the other.
fn uniform_archive(path: &Path, compression: Compression, fill: u8) -> PathBuf {
    write_archive(
        path,
        compression,
        &[
            ("bin/tool#0", "gfx900", vec![fill; 5000]),
            ("lib/libu.so#0", "gfx900", vec![fill; 70_000]),
            ("lib/libu.so#0", "gfx942", vec![fill; 300_001]),
            ("lib/libu.so#1", "gfx1100", vec![fill; 4096]),
        ],
    )
}

#[test]
fn archive_overwritten_in_place_gives_eio_for_what_was_not_read() {
    if !fuse_available() {
        return;
    }
    for compression in [Compression::None, Compression::Zstd { level: 3 }] {
        let d = tmp();
        let path = uniform_archive(&d.path().join("o.kpack"), compression, 0x11);
        let original = keep_original(&path);
        let other = std::fs::read(uniform_archive(
            &d.path().join("x.kpack"),
            compression,
            0x22,
        ))
        .unwrap();
        let old = std::fs::read(&path).unwrap();
        assert_eq!(other.len(), old.len(), "{compression:?}: same layout");
        assert_ne!(other, old);
        let m = start_passthrough(&path, &[]);
        m.check("walk_one", READ_FIRST);
        // The whole file rewritten with an ordinary write: same inode, same length, every frame
        // still valid. Only the modification time the write sets tells the change apart, so
        // without the check after decoding the mount would serve 0x22 bytes as the kernels.
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        std::os::unix::fs::FileExt::write_all_at(&f, &other, 0).unwrap();
        drop(f);
        after_fault(&m, &original, READ_FIRST, "eio");
        let log = m.daemon_log();
        assert!(
            log.contains("archive changed while open"),
            "{compression:?}:\n{log}"
        );
        assert!(
            !log.contains("failed to decode"),
            "{compression:?}: every frame decodes:\n{log}"
        );
        m.stop();
    }
}

#[test]
fn archive_replaced_by_rename_then_deleted_keeps_serving_the_old_content() {
    if !fuse_available() {
        return;
    }
    let d = tmp();
    let path = rich_archive(&d.path().join("r.kpack"), Compression::Zstd { level: 3 });
    let original = keep_original(&path);
    // A 64 KiB cache: most kernels are decoded again, from the old file, on every pass.
    let m = Mount::start(
        &path,
        &["--backing", "memory", "--memory-cache-size", "64K"],
    );
    m.check("walk_one", READ_FIRST);
    // Same names and sizes, other bytes: serving the new file would fail the checksums.
    let replacement = d.path().join("new.kpack");
    let a = Archive::open(&path).unwrap();
    let kernels: Vec<(String, String, Vec<u8>)> = a
        .entries()
        .map(|(k, e)| {
            let mut data = a.get_kernel(k, e.arch).unwrap();
            data.iter_mut().for_each(|b| *b ^= 0xa5);
            (k.to_owned(), e.arch.to_owned(), data)
        })
        .collect();
    drop(a);
    let borrowed: Vec<(&str, &str, Vec<u8>)> = kernels
        .iter()
        .map(|(k, a, d)| (k.as_str(), a.as_str(), d.clone()))
        .collect();
    write_archive(&replacement, Compression::Zstd { level: 3 }, &borrowed);
    std::fs::rename(&replacement, &path).unwrap();
    after_fault(&m, &original, READ_FIRST, "intact");
    std::fs::remove_file(&path).unwrap();
    after_fault(&m, &original, READ_FIRST, "intact");
    assert!(!m.daemon_log().contains("ERROR"), "{}", m.daemon_log());
    m.stop();
}

#[test]
fn daemon_killed_with_sigkill_gives_enotconn_then_lazy_unmount_and_a_new_mount_work() {
    if !fuse_available() {
        return;
    }
    let d = tmp();
    let mp = d.path().join("mnt");
    std::fs::create_dir(&mp).unwrap();
    // The daemon open mode: in page-cache mode the kernel opens files without the daemon, so
    // an open after the crash would not see ENOTCONN.
    let mut crashed = Mount::start_on(&mp, &fixture("test_noop.kpack"), &["--open-mode", "daemon"]);
    crashed.check("walk", "");
    crashed.kill_daemon();
    crashed.check("enotconn", "lib/libtest.so#0/gfx900.hsaco");
    let mp = crashed.mountpoint.clone();
    assert!(
        mountinfo::mount_at(&mp).unwrap().is_some(),
        "the dead mount stays listed"
    );
    // A new mount over the dead one is refused before anything is mounted.
    let bin = env!("CARGO_BIN_EXE_kpack-fuse");
    let out = Command::new(bin)
        .arg("mount")
        .arg(fixture("test_zstd.kpack"))
        .arg(&mp)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(8), "{err}");
    assert!(err.contains("already mounted"), "{err}");
    lazy_unmount_then_remount(&mp, &fixture("test_zstd.kpack"));
    drop(crashed);
}

/// 24 kernels of 100 KB to 950 KB (12.6 MB decoded), 6 arches under 4 keys.
fn multi_mb_archive(path: &Path, compression: Compression) -> PathBuf {
    let arches = ["gfx900", "gfx906", "gfx908", "gfx90a", "gfx942", "gfx1100"];
    let keys = [
        "lib/liba.so#0",
        "lib/libb.so#0",
        "lib/libc.so#0",
        "bin/tool#0",
    ];
    let kernels: Vec<(&str, &str, Vec<u8>)> = (0..24)
        .map(|i| {
            (
                keys[i % 4],
                arches[i / 4],
                positional(100_000 + i * 37_000, i as u32 + 1),
            )
        })
        .collect();
    write_archive(path, compression, &kernels)
}

#[test]
fn sixteen_readers_random_ranged_reads_with_checksums() {
    if !fuse_available() {
        return;
    }
    let d = tmp();
    let path = multi_mb_archive(&d.path().join("big.kpack"), Compression::Zstd { level: 3 });
    // Memory backing: the scenario drops page caches every 32 reads, which for backing files on
    // disk means writing them back and reading them from the disk again; that tests the disk,
    // not the mount.
    let m = Mount::start(&path, &["--threads", "4", "--backing", "memory"]);
    let out = m.child("random_ranges", "16,2000");
    assert!(
        out.success,
        "{}\ndaemon log:\n{}",
        out.output,
        m.daemon_log()
    );
    eprintln!(
        "{}",
        out.output
            .lines()
            .find(|l| l.contains("checked reads"))
            .unwrap_or("")
    );
    // The cache holds everything: each kernel decoded exactly once however many readers raced.
    assert_eq!(delta(&out, "decodes"), 24, "{}", out.output);
    m.stop();
}

#[test]
fn tiny_cache_under_pressure_serves_exact_bytes_with_bounded_memory() {
    if !fuse_available() {
        return;
    }
    let d = tmp();
    // 8 kernels that fit the 64 KiB cache a few at a time, 8 that never fit (pinned per handle).
    let arches = [
        "gfx900", "gfx906", "gfx908", "gfx90a", "gfx942", "gfx1100", "gfx1101", "gfx1030",
    ];
    let mut kernels: Vec<(&str, &str, Vec<u8>)> = Vec::new();
    for (i, arch) in arches.iter().enumerate() {
        kernels.push((
            "lib/small.so#0",
            arch,
            positional(6_000 + i * 2_000, i as u32 + 1),
        ));
        kernels.push((
            "lib/large.so#0",
            arch,
            positional(200_000 + i * 50_000, i as u32 + 101),
        ));
    }
    let path = write_archive(
        &d.path().join("p.kpack"),
        Compression::Zstd { level: 3 },
        &kernels,
    );
    let decoded_total: usize = kernels.iter().map(|k| k.2.len()).sum();
    let m = start_passthrough(
        &path,
        &[
            "--backing",
            "memory",
            "--memory-cache-size",
            "64K",
            "--threads",
            "4",
        ],
    );
    let pid = m.daemon_pid();
    let rss_before = proc_status_bytes(pid, "VmRSS");
    let out = m.child("pressure", "16,100");
    assert!(
        out.success,
        "{}\ndaemon log:\n{}",
        out.output,
        m.daemon_log()
    );
    let hwm = proc_status_bytes(pid, "VmHWM");
    let (decodes, evictions) = (delta(&out, "decodes"), delta(&out, "evictions"));
    let growth = hwm.saturating_sub(rss_before);
    eprintln!(
        "pressure: {decodes} decodes, {evictions} evictions; daemon RSS {rss_before} before, \
         peak {hwm} (+{growth}); archive decodes to {decoded_total} bytes"
    );
    assert!(evictions > 0, "{}", out.output);
    // Every open of a large kernel decodes it again: far more bytes than the archive holds
    // passed through the daemon ...
    assert!(decodes > 16, "{}", out.output);
    // ... while its peak memory grew by less than 16 pinned large kernels, 4 in-flight decodes
    // and their buffers (16 x 550 KB + 4 x 2 x 550 KB), plus 16 MiB for allocator and FUSE
    // buffers: bounded by the readers, not by the archive or by the work done.
    let bound = 16 * 550_000 + 8 * 550_000 + (16 << 20);
    assert!(
        growth < bound,
        "daemon peak RSS grew by {growth} bytes (bound {bound})"
    );
    m.stop();
}
