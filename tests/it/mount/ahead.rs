//! Decoding ahead of a scan: reading a mount's files in order has the next ones decoded on idle
//! decode threads, each kernel still decoded once, with opens through the daemon and in
//! page-cache mode; opens far apart decode nothing ahead; `--no-decode-ahead` turns it off, and
//! memory backing never does it. Scenarios named `ahead_*`
//! run in the I/O child.

use std::path::{Path, PathBuf};

use rocm_kpack::{Archive, ArchiveWriter, Compression};

use super::cold::code_like;
use super::scenarios::stats;
use crate::support::mount::{Mount, fuse_available};

/// Kernels in the archive, one binary each (a directory and a file: two inodes per kernel).
const KERNELS: usize = 40;
fn key(i: usize) -> String {
    format!("lib/k{i:02}.so#0")
}

/// `KERNELS` kernels of about 1.5 MiB (several decode steps each), with digests.
fn archive(path: &Path) -> PathBuf {
    let arches = vec!["gfx942".to_string()];
    let mut w = ArchiveWriter::new("it", "ahead", arches, Compression::Zstd { level: 1 }).unwrap();
    for i in 0..KERNELS {
        w.add_kernel(
            &key(i),
            "gfx942",
            code_like(1_500_000 + i * 4099, 100 + i as u64),
        )
        .unwrap();
    }
    w.write(path, &|_| {}).unwrap();
    path.to_path_buf()
}

/// Reads the kernels of the scenario in order, one at a time, checking their bytes; then the
/// counters: each kernel read was decoded once (a scan reads every kernel, so nothing can be
/// decoded ahead past it), and the decodes started ahead (`arg`: `on`, some; `on_whole`, some,
/// and every open got its complete file, which passthrough serves; `off` or `none`, none,
/// because decoding ahead is off or the reads were no scan).
pub fn run(name: &str, mnt: &Path, archive: &Path, arg: &str) {
    let indices: Vec<usize> = match name {
        "ahead_scan" => (0..KERNELS).collect(),
        // Further apart than a scan's window (two inodes per kernel).
        "ahead_scattered" => vec![0, KERNELS / 2, KERNELS - 1],
        other => panic!("unknown scenario {other}"),
    };
    let a = Archive::open(archive).unwrap();
    let before = stats(mnt);
    for &i in &indices {
        let want = a.get_kernel(&key(i), "gfx942").unwrap();
        let got = std::fs::read(mnt.join(key(i)).join("gfx942.hsaco")).unwrap();
        assert!(got == want, "kernel {i}: {} bytes", got.len());
    }
    let after = stats(mnt);
    println!("stats before {before:?}\nafter {after:?}");
    let ahead = after["decodes_ahead"] - before["decodes_ahead"];
    assert_eq!(
        after["decodes"] - before["decodes"],
        indices.len() as u64,
        "each kernel decoded once"
    );
    let streamed = after["opens_while_decoding"] - before["opens_while_decoding"];
    match arg {
        "on" | "on_whole" => assert!(
            ahead >= 1,
            "a scan of {KERNELS} kernels decoded nothing ahead"
        ),
        "off" | "none" => assert_eq!(ahead, 0, "decoded ahead"),
        other => panic!("unknown expectation {other}"),
    }
    if arg == "on_whole" {
        assert_eq!(streamed, 0, "opens got a file still decoding");
    }
}

#[test]
fn a_scan_has_the_next_kernels_decoded_ahead_once_and_scattered_opens_none() {
    if !fuse_available() {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let archive = archive(&d.path().join("ahead.kpack"));
    for (extra, expect) in [
        (&[][..], "on_whole"),
        // Without passthrough an open gains nothing from waiting for the whole file.
        (&["--no-passthrough"][..], "on"),
        // First READs walk the tree as opens do.
        (&["--open-mode", "page-cache"][..], "on"),
        (&["--no-decode-ahead"][..], "off"),
        (&["-o", "no_decode_ahead"][..], "off"),
        // Memory that cannot be reclaimed is not spent ahead of a scan.
        (&["--backing", "memory"][..], "off"),
    ] {
        let m = Mount::start(&archive, extra);
        m.check("ahead_scan", expect);
        m.stop();
    }
    let m = Mount::start(&archive, &[]);
    m.check("ahead_scattered", "none");
    m.stop();
}
