//! Open modes: page-cache mode (the daemon refuses the first OPEN with ENOSYS, the kernel then
//! opens files by itself and keeps their page cache) serves the same bytes as passthrough, and
//! `auto` picks it for small kernels only. Scenarios named `om_*` run in the I/O child.

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
