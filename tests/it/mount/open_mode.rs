//! The open path: page-cache mode (the daemon refuses the first OPEN with ENOSYS, the kernel
//! then opens files by itself and keeps their page cache) serves the same bytes as passthrough,
//! and `auto` picks it for small kernels only; a daemon without CAP_SYS_ADMIN falls back to
//! serving reads itself. Scenarios named `om_*` run in the I/O child.

use std::path::Path;

use rocm_kpack::Compression;

use super::scenarios::{self, stats};
use super::{pattern, rich_archive, write_archive};
use crate::support::mount::{Mount, fuse_available};

/// I/O child scenarios.
pub fn run(name: &str, mnt: &Path, archive: &Path, arg: &str) {
    match name {
        // Walks and reads the whole tree again: no OPEN and no READ reaches the daemon.
        "om_warm" => {
            let before = stats(mnt);
            scenarios::run("walk", mnt, archive, arg);
            scenarios::run("mmap", mnt, archive, arg);
            let after = stats(mnt);
            for k in ["daemon_opens", "daemon_reads", "decodes"] {
                assert_eq!(after[k], before[k], "{k} changed on a warm pass");
            }
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
    let cases: &[&[&str]] = &[
        &["--open-mode", "page-cache"],
        &["-o", "open_mode=page-cache,backing=memory"],
        &["--open-mode", "page-cache", "--no-passthrough", "-s"],
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
            &["--open-mode", "passthrough"],
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
    // exec. The kernel still offers passthrough at init but refuses every backing id (EPERM).
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
    let m = Mount::start_fd_configured(&archive, &["--open-mode", "passthrough"], &drop_admin);
    let status = std::fs::read_to_string(format!("/proc/{}/status", m.daemon_pid())).unwrap();
    let eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .map(|v| u64::from_str_radix(v.trim(), 16).unwrap())
        .unwrap();
    assert_eq!(eff & (1 << CAP_SYS_ADMIN), 0, "the daemon still has CAP_SYS_ADMIN");
    m.check("walk", "");
    m.check("pread", "");
    m.check("mmap", "");
    m.check("concurrent", "");
    m.check("rp_stats", "passthrough=0,page_cache_mode=0,daemon_reads>0");
    let log = m.daemon_log();
    let refused: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("refused a passthrough backing file"))
        .collect();
    assert_eq!(refused.len(), 1, "one log line:\n{log}");
    assert!(refused[0].contains("Operation not permitted"), "{log}");
    // The launcher owns the mount: unmounting it ends the daemon, which exits 0.
    crate::support::mount::umount_lazy(&m.mountpoint);
    assert_eq!(m.wait_exit().code(), Some(0));
}
