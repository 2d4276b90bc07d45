//! The open path: page-cache mode (the daemon refuses the first OPEN with ENOSYS, the kernel
//! then opens files by itself and keeps their page cache) serves the same bytes as passthrough,
//! and `auto` picks it for small kernels only; a daemon without CAP_SYS_ADMIN falls back to
//! serving reads itself. Scenarios named `om_*` run in the I/O child.

use std::path::Path;
use std::time::{Duration, Instant};

use rocm_kpack::Compression;

use super::scenarios::{self, stats};
use super::{pattern, rich_archive, write_archive};
use crate::support::mount::{Mount, fuse_available};

/// I/O child scenarios.
pub fn run(name: &str, mnt: &Path, archive: &Path, arg: &str) {
    match name {
        // Walks and reads the whole tree again: no OPEN and no READ reaches the daemon.
        "om_warm" => {
            let warm_pass = || {
                let before = stats(mnt);
                scenarios::run("walk", mnt, archive, arg);
                scenarios::run("mmap", mnt, archive, arg);
                let after = stats(mnt);
                let grew = |k: &str| after[k] - before[k];
                (grew("daemon_opens"), grew("daemon_reads"), grew("decodes"))
            };
            // Now and then (a few runs in a hundred on this VM) the kernel sends one READ for a
            // single page it had read before, in either pass: one such READ is allowed over
            // both passes; never an open or a decode.
            let (first, second) = (warm_pass(), warm_pass());
            assert!(
                first.0 + second.0 == 0 && first.1 + second.1 <= 1 && first.2 + second.2 == 0,
                "warm passes (opens, reads, decodes): first {first:?}, second {second:?}"
            );
        }
        // `arg`: a kernel path. It opens (page-cache mode opens without the daemon) but every
        // read of it is EIO, twice (a failure is not kept).
        "om_read_eio" => {
            for _ in 0..2 {
                let f = std::fs::File::open(mnt.join(arg)).unwrap();
                let mut buf = [0u8; 16];
                let e = std::os::unix::fs::FileExt::read_at(&f, &mut buf, 0).unwrap_err();
                assert_eq!(e.raw_os_error(), Some(libc::EIO), "{arg}: {e}");
            }
        }
        // `arg`: comma-separated kernel paths, read whole (to decode them).
        "om_read" => {
            for rel in arg.split(',') {
                std::fs::read(mnt.join(rel)).unwrap();
            }
        }
        // `arg`: `ARCHIVE|BIG|WARM,...|COLD,...` (paths of kernels, ARCHIVE a local copy of the
        // mounted one). Reads BIG (cold, from a slow source) on a thread; meanwhile stats the
        // COLD names (never looked up) and reads the WARM kernels (already decoded). Those must
        // all finish, with the right bytes, before BIG's read does.
        "om_isolated" => {
            let parts: Vec<&str> = arg.split('|').collect();
            let a = rocm_kpack::Archive::open(parts[0]).unwrap();
            let want = |rel: &str| {
                let (key, arch) = rel.rsplit_once('/').unwrap();
                a.get_kernel(key, arch.strip_suffix(".hsaco").unwrap())
                    .unwrap()
            };
            let list = |s: &str| -> Vec<String> { s.split(',').map(str::to_owned).collect() };
            let (big, warm, cold) = (parts[1].to_owned(), list(parts[2]), list(parts[3]));
            let big_want = want(&big);
            let start = Instant::now();
            let big_reader = {
                let path = mnt.join(&big);
                std::thread::spawn(move || {
                    let got = std::fs::read(path).unwrap();
                    (got, start.elapsed())
                })
            };
            std::thread::sleep(Duration::from_millis(200));
            for rel in &cold {
                let len = std::fs::metadata(mnt.join(rel)).unwrap().len();
                assert_eq!(len, want(rel).len() as u64, "{rel}");
            }
            for rel in &warm {
                assert!(std::fs::read(mnt.join(rel)).unwrap() == want(rel), "{rel}");
            }
            let others = start.elapsed();
            let (got, big_took) = big_reader.join().unwrap();
            assert!(got == big_want, "{big}: {} bytes", got.len());
            println!("others done after {others:?}, the cold kernel after {big_took:?}");
            assert!(
                others < big_took,
                "other files waited for the cold kernel: {others:?} >= {big_took:?}"
            );
            assert!(
                big_took > Duration::from_millis(1500),
                "the cold read was not slow ({big_took:?}): the test shows nothing"
            );
        }
        other => panic!("unknown scenario {other}"),
    }
}

fn tmp() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

#[test]
fn page_cache_mode_serves_exact_bytes_without_opens() {
    if !fuse_available() {
        return;
    }
    let d = tmp();
    let archive = rich_archive(&d.path().join("r.kpack"), Compression::Zstd { level: 3 });
    let cache = d.path().join("cache");
    let cases: &[&[&str]] = &[
        &["--open-mode", "page-cache"],
        &["-o", "open_mode=page-cache,backing=memory"],
        &["--open-mode", "page-cache", "--no-passthrough", "-s"],
        // Small kernels still get their file in a cache directory.
        &[
            "--open-mode",
            "page-cache",
            "--cache-dir",
            cache.to_str().unwrap(),
        ],
    ];
    for extra in cases {
        let m = Mount::start_env(&archive, extra, &[("RUST_LOG", "info")]);
        m.check("walk", "");
        m.check("pread", "");
        m.check("mmap", "");
        m.check("concurrent", "");
        // One OPEN reached the daemon (the walk's first, answered ENOSYS); none after it.
        m.check(
            "rp_stats",
            "page_cache_mode=1,passthrough=0,daemon_opens=1,daemon_reads>0",
        );
        m.check("om_warm", "");
        if extra.contains(&"--cache-dir") {
            m.check("rp_stats", "cache_dir_misses=7");
        }
        let log = m.daemon_log();
        assert!(log.contains("open mode: page-cache"), "{extra:?}: {log}");
        m.stop();
    }
}

#[test]
fn auto_open_mode_follows_the_median_kernel_size() {
    if !fuse_available() {
        return;
    }
    let d = tmp();
    // Median 4097 bytes: small kernels.
    let small = rich_archive(
        &d.path().join("small.kpack"),
        Compression::Zstd { level: 3 },
    );
    // Median 200 000 bytes (> 64 KiB), one small kernel among them.
    let large = write_archive(
        &d.path().join("large.kpack"),
        Compression::Zstd { level: 3 },
        &[
            ("lib/libbig.so#0", "gfx900", pattern(200_000, 1)),
            ("lib/libbig.so#0", "gfx90a", pattern(300_000, 2)),
            ("lib/libbig.so#1", "gfx900", pattern(1000, 3)),
        ],
    );
    let cases: &[(&Path, &[&str], &str)] = &[
        (
            &small,
            &[],
            "page_cache_mode=1,passthrough=0,daemon_opens=1",
        ),
        (
            &small,
            &["-o", "open_mode=auto"],
            "page_cache_mode=1,daemon_opens=1",
        ),
        // Each of the 8 kernels opened by walk: 8 OPENs.
        (
            &small,
            &["--open-mode", "daemon"],
            "page_cache_mode=0,passthrough=1,daemon_opens=8",
        ),
        (
            &large,
            &[],
            "page_cache_mode=0,passthrough=1,daemon_opens=3",
        ),
        (
            &large,
            &["--open-mode", "page-cache"],
            "page_cache_mode=1,passthrough=0,daemon_opens=1",
        ),
    ];
    for (archive, extra, want) in cases {
        let m = Mount::start(archive, extra);
        m.check("walk", "");
        m.check("rp_stats", want);
        m.stop();
    }
    // The mode is decided at mount time: 75 opens of kernels decoded before (more than any warm
    // set) still each reach the daemon, and nothing is decoded twice.
    let m = Mount::start(&large, &[]);
    for _ in 0..25 {
        m.check("walk", "");
    }
    m.check(
        "rp_stats",
        "page_cache_mode=0,passthrough=1,daemon_opens=75,decodes=3",
    );
    m.stop();
}

/// `CAP_SYS_ADMIN` (Linux's `capability.h`): what the kernel requires of a daemon registering a
/// passthrough backing file.
const CAP_SYS_ADMIN: libc::c_ulong = 21;

#[test]
fn without_cap_sys_admin_the_daemon_serves_reads_itself() {
    if !fuse_available() {
        return;
    }
    use std::os::unix::process::CommandExt;
    let d = tmp();
    let archive = rich_archive(&d.path().join("r.kpack"), Compression::Zstd { level: 3 });
    // The test mounts (as a privileged launcher does for /dev/fd/N) and starts the daemon with
    // CAP_SYS_ADMIN dropped from its bounding set, so the root daemon runs without it after
    // exec. The kernel would refuse every backing id (EPERM): the daemon knows it at start-up
    // and never asks.
    let drop_admin = |cmd: &mut std::process::Command| {
        // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_CAPBSET_DROP, CAP_SYS_ADMIN, 0, 0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    };
    let m = Mount::start_fd_configured(&archive, &["--open-mode", "daemon"], &drop_admin);
    let status = std::fs::read_to_string(format!("/proc/{}/status", m.daemon_pid())).unwrap();
    let eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .map(|v| u64::from_str_radix(v.trim(), 16).unwrap())
        .unwrap();
    assert_eq!(
        eff & (1 << CAP_SYS_ADMIN),
        0,
        "the daemon still has CAP_SYS_ADMIN"
    );
    m.check("walk", "");
    m.check("pread", "");
    m.check("mmap", "");
    m.check("concurrent", "");
    m.check("rp_stats", "passthrough=0,page_cache_mode=0,daemon_reads>0");
    let log = m.daemon_log();
    let said: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("FUSE passthrough needs CAP_SYS_ADMIN"))
        .collect();
    assert_eq!(said.len(), 1, "one log line:\n{log}");
    assert!(
        !log.contains("refused a passthrough backing file"),
        "no backing file was offered to the kernel:\n{log}"
    );
    // The launcher owns the mount: unmounting it ends the daemon, which exits 0.
    crate::support::mount::umount_lazy(&m.mountpoint);
    assert_eq!(m.wait_exit().code(), Some(0));
}

#[test]
fn a_slow_cold_kernel_does_not_hold_up_other_files() {
    if !fuse_available() {
        return;
    }
    use crate::remote::servers::{Nginx, SlowProxy};
    use crate::support::craft::incompressible;
    let www = tmp();
    // The big kernel comes first in the file, so the archive's tail (read at mount with the
    // TOC) does not hold it.
    let mut kernels: Vec<(String, Vec<u8>)> =
        vec![("lib/big.so#0".to_owned(), incompressible(7, 4 << 20))];
    kernels.extend((0..20).map(|i| (format!("lib/s{i}.so#0"), pattern(1000 + i, i as u32))));
    let list: Vec<(&str, &str, Vec<u8>)> = kernels
        .iter()
        .map(|(k, b)| (k.as_str(), "gfx942", b.clone()))
        .collect();
    let archive = write_archive(&www.path().join("x.kpack"), Compression::None, &list);
    let nginx = Nginx::start(www.path());
    let rel = |i: usize| format!("{}/gfx942.hsaco", kernels[i].0);
    let warm: Vec<String> = (1..11).map(rel).collect();
    let cold: Vec<String> = (11..21).map(rel).collect();
    let arg = format!(
        "{}|{}|{}|{}",
        archive.display(),
        rel(0),
        warm.join(","),
        cold.join(",")
    );
    for mode in ["passthrough", "page-cache"] {
        let proxy = SlowProxy::start(nginx.port);
        let url = format!("http://127.0.0.1:{}/x.kpack", proxy.port);
        // One request thread, and one remote request at a time: nothing but the decode pool
        // keeps the daemon answering while the big kernel trickles in.
        let m = Mount::start(
            Path::new(&url),
            &["-s", "--open-mode", mode, "--remote-requests", "1"],
        );
        // Warm the small kernels, then slow the source to 50 ms per 64 KiB: the big kernel
        // (4 MiB) takes seconds.
        m.check("om_read", &warm.join(","));
        proxy.set_delay(Duration::from_millis(50));
        m.check("om_isolated", &arg);
        m.stop();
    }
}

#[test]
fn page_cache_mode_reads_of_a_kernel_failing_its_digest_are_eio() {
    if !fuse_available() {
        return;
    }
    let d = tmp();
    let path = d.path().join("d.kpack");
    // One kernel small enough to be decoded into the reply, one kept in a backing file.
    write_archive(
        &path,
        Compression::Zstd { level: 3 },
        &[
            ("lib/a.so#0", "gfx900", pattern(9000, 1)),
            ("lib/a.so#0", "gfx90a", pattern(200_000, 2)),
            ("lib/a.so#0", "gfx942", pattern(50_000, 7)),
            ("lib/b.so#0", "gfx942", pattern(300_000, 8)),
        ],
    );
    // Flip a bit of the frame digests the TOC records for both gfx942 kernels.
    let mut bytes = std::fs::read(&path).unwrap();
    let a = rocm_kpack::Archive::open(&path).unwrap();
    for key in ["lib/a.so#0", "lib/b.so#0"] {
        let k = a.locate(key, "gfx942").unwrap();
        let frame = k.stored.offset as usize..(k.stored.offset + k.stored.size) as usize;
        let digest = blake3::hash(&bytes[frame]);
        let at = bytes
            .windows(32)
            .position(|w| w == digest.as_bytes())
            .expect("the archive records the frame's digest");
        bytes[at] ^= 0x01;
    }
    drop(a);
    std::fs::write(&path, &bytes).unwrap();
    let m = Mount::start(&path, &["--open-mode", "page-cache"]);
    m.check("om_read_eio", "lib/a.so#0/gfx942.hsaco");
    m.check("om_read_eio", "lib/b.so#0/gfx942.hsaco");
    m.check("walk_one", "lib/a.so#0/gfx900.hsaco");
    m.check("walk_one", "lib/a.so#0/gfx90a.hsaco");
    // Only the large good kernel is kept.
    m.check("rp_stats", "page_cache_mode=1,backing_bytes=200000");
    let log = m.daemon_log();
    for key in ["lib/a.so#0", "lib/b.so#0"] {
        assert!(
            log.contains(&format!("{key} [gfx942]")) && log.contains("BLAKE3 digest mismatch"),
            "{log}"
        );
    }
    m.stop();
}

/// A kernel larger than the store, read once in page-cache mode: the reads after the one that
/// started the decode read the finished job's file, so one pass decodes once.
#[test]
fn page_cache_mode_decodes_a_kernel_larger_than_the_cache_once() {
    if !fuse_available() {
        return;
    }
    let d = tmp();
    let archive = write_archive(
        &d.path().join("big.kpack"),
        Compression::Zstd { level: 3 },
        &[("k#0", "gfx1100", pattern(4 << 20, 5))],
    );
    let bounds: [&[&str]; 2] = [
        &["--backing", "memory", "--memory-cache-size", "64K"],
        &["--backing", "disk", "--disk-cache-size", "64K"],
    ];
    for bound in bounds {
        let mut args = vec!["--open-mode", "page-cache"];
        args.extend_from_slice(bound);
        let m = Mount::start(&archive, &args);
        m.check("small_chunks", "k#0/gfx1100.hsaco");
        m.check("rp_stats", "page_cache_mode=1,decodes=1,bytes_cached=0");
        m.stop();
    }
}

/// `--open-mode passthrough`, the old name of `daemon`, still mounts in that mode, and the
/// command says so on the terminal before it returns (and `-o open_mode=passthrough` in the
/// log).
#[test]
fn the_old_name_of_the_daemon_open_mode_warns_and_still_works() {
    if !fuse_available() {
        return;
    }
    const RENAMED: &str = "--open-mode passthrough (-o open_mode=passthrough) is renamed \
         --open-mode daemon (-o open_mode=daemon): passthrough names only how files opened \
         through the daemon are read (--no-passthrough turns it off); the old name will be \
         refused in a later release";
    let warned = |log: &str| -> Vec<String> {
        log.lines()
            .filter(|l| l.contains(" WARN "))
            .map(|l| l.split_once("] ").map_or(l, |(_, text)| text).to_owned())
            .collect()
    };
    let d = tmp();
    let archive = rich_archive(&d.path().join("r.kpack"), Compression::Zstd { level: 3 });
    let m = Mount::start_background(&archive, &["--open-mode", "passthrough"]);
    let shown = m.command_output();
    m.check("walk", "");
    m.check("rp_stats", "page_cache_mode=0,daemon_opens=8");
    m.stop();
    assert_eq!(warned(&shown), [RENAMED], "{shown}");
    let m = Mount::start(&archive, &["-o", "open_mode=passthrough"]);
    m.check("walk", "");
    m.check("rp_stats", "page_cache_mode=0,daemon_opens=8");
    let log = m.daemon_log();
    m.stop();
    assert_eq!(warned(&log), [RENAMED], "{log}");
}
