//! The size bounds of `kpack-fuse mount` on a real mount: the stats' `capacity` is the bound in
//! force for the backing in use, the deprecated spellings warn (on the terminal, before the
//! mount goes to the background) with exact messages, and a current bound given where it
//! cannot apply is refused with exit 2 before anything is mounted.

use std::process::Command;

use rocm_kpack::fs::setup::mountinfo;

use super::scenarios::stats;
use crate::support::fixture;
use crate::support::mount::{Mount, Tmpfs, fuse_available};

const BIN: &str = env!("CARGO_BIN_EXE_kpack-fuse");

const CACHE_SIZE_ON_DISK: &str = "--cache-size (-o cache_size) does nothing with disk backing \
     (the default): use --disk-cache-size to bound decoded kernels on disk, or --backing memory \
     to keep them in memory; it will be refused there in a later release";
const CACHE_DIR_SIZE_IN_MEMORY: &str = "--cache-dir-size (-o cache_dir_size) does nothing with \
     --backing memory: use --memory-cache-size to bound decoded kernels in memory; it will be \
     refused there in a later release";
const RENAMED_MEMORY: &str = "--cache-size (-o cache_size) is renamed --memory-cache-size \
     (-o memory_cache_size); the old name will be refused in a later release";
const RETRIES_FOR_LOCAL: &str = "--remote-retries (-o remote_retries) does nothing with a local \
     source (it is for s3://, http(s):// and oci:// sources); it will be refused there in a later \
     release";

/// The text of each WARN line of a log (after env_logger's `[time WARN target] `).
fn warnings(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|l| l.contains(" WARN "))
        .map(|l| l.split_once("] ").map_or(l, |(_, text)| text))
        .collect()
}

#[test]
fn the_capacity_shown_is_the_bound_in_force() {
    if !fuse_available() {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let cache = d.path().join("cache");
    let cache = cache.to_str().unwrap();
    // The default follows the file system the files go to: a quarter of a 64 MiB one.
    let small = Tmpfs::new(64);
    let small_cache = small.path.join("cache");
    let small_cache = small_cache.to_str().unwrap();
    let cases: [(&[&str], u64, u64); 7] = [
        (
            &["--scratch-dir", small.path.to_str().unwrap()],
            16 << 20,
            0,
        ),
        (&["--cache-dir", small_cache], 16 << 20, 0),
        (&["--disk-cache-size", "3M"], 3 << 20, 0),
        (&["-o", "disk_cache_size=5M"], 5 << 20, 0),
        (
            &["--cache-dir", cache, "--disk-cache-size", "7M"],
            7 << 20,
            0,
        ),
        (
            &["--backing", "memory", "--memory-cache-size", "1M"],
            1 << 20,
            1,
        ),
        (&["-o", "backing=memory,memory-cache-size=2M"], 2 << 20, 1),
    ];
    for (args, capacity, in_memory) in cases {
        let m = Mount::start(&fixture("test_noop.kpack"), args);
        m.check("walk", "");
        let got = stats(&m.mountpoint);
        let log = m.daemon_log();
        m.stop();
        assert_eq!(got["capacity"], capacity, "{args:?}");
        assert_eq!(got["backing_in_memory"], in_memory, "{args:?}");
        assert_eq!(warnings(&log), Vec::<&str>::new(), "{args:?}: {log}");
    }
}

/// `--cache-size 1G` did nothing with disk backing and still does: the mount keeps the disk
/// bound (the default, a quarter of the 64 MiB file system of the scratch directory), and the
/// command says so on the terminal before it returns.
#[test]
fn cache_size_with_disk_backing_warns_and_keeps_the_disk_bound() {
    if !fuse_available() {
        return;
    }
    let small = Tmpfs::new(64);
    let m = Mount::start_background(
        &fixture("test_noop.kpack"),
        &[
            "--cache-size",
            "1G",
            "--scratch-dir",
            small.path.to_str().unwrap(),
        ],
    );
    let shown = m.command_output();
    let capacity = stats(&m.mountpoint)["capacity"];
    m.stop();
    assert_eq!(warnings(&shown), [CACHE_SIZE_ON_DISK], "{shown}");
    assert_eq!(capacity, 16 << 20);
}

/// The default disk bound counts a cache directory's own files as free space (its bound
/// removes them): a cache that filled half of its file system is not trimmed by the next mount
/// for want of free space.
#[test]
fn the_default_bound_of_a_cache_directory_counts_its_own_files_as_free() {
    if !fuse_available() {
        return;
    }
    let small = Tmpfs::new(64);
    let cache = small.path.join("cache");
    // 40 MiB of kernels in the layout of a cache directory: 24 MiB free, so half of the free
    // space alone (12 MiB) would be the bound; with the cache's own it is a quarter of 64 MiB.
    let sub = cache.join("kpack-v1/ab");
    std::fs::create_dir_all(&sub).unwrap();
    for i in 0..4 {
        std::fs::write(sub.join(format!("ab{i:062}")), vec![7u8; 10 << 20]).unwrap();
    }
    let m = Mount::start(
        &fixture("test_noop.kpack"),
        &["--cache-dir", cache.to_str().unwrap()],
    );
    let capacity = stats(&m.mountpoint)["capacity"];
    m.stop();
    assert_eq!(capacity, 16 << 20);
}

/// The old spellings with memory backing: `cache_size=` is the memory bound, `cache_dir_size=`
/// does nothing; each says so, as does a remote setting given for a local source.
#[test]
fn old_spellings_with_memory_backing_warn_and_the_memory_bound_holds() {
    if !fuse_available() {
        return;
    }
    let m = Mount::start(
        &fixture("test_noop.kpack"),
        &[
            "--backing",
            "memory",
            "-o",
            "cache_size=2M,cache_dir_size=1G,remote_retries=1",
        ],
    );
    let capacity = stats(&m.mountpoint)["capacity"];
    let log = m.daemon_log();
    m.stop();
    assert_eq!(capacity, 2 << 20);
    assert_eq!(
        warnings(&log),
        [CACHE_DIR_SIZE_IN_MEMORY, RENAMED_MEMORY, RETRIES_FOR_LOCAL],
        "{log}"
    );
}

/// A current bound where it cannot apply: exit 2, one line saying why, nothing mounted. No
/// FUSE needed: the options are refused before anything else.
#[test]
fn a_bound_for_the_other_backing_is_refused() {
    let memory_on_disk = "kpack-fuse: --memory-cache-size (-o memory_cache_size) bounds decoded \
         kernels in memory, which only --backing memory keeps: use --disk-cache-size\n";
    let disk_in_memory = "kpack-fuse: --disk-cache-size (-o disk_cache_size) bounds decoded \
         kernels on disk, and --backing memory keeps none there: use --memory-cache-size\n";
    let cases: [(&[&str], &str); 4] = [
        (&["--memory-cache-size", "1G"], memory_on_disk),
        (&["-o", "memory_cache_size=1G,backing=disk"], memory_on_disk),
        (
            &["--backing", "memory", "--disk-cache-size", "1G"],
            disk_in_memory,
        ),
        (
            &["-o", "disk_cache_size=1G", "-o", "backing=memory"],
            disk_in_memory,
        ),
    ];
    for (args, message) in cases {
        let d = tempfile::tempdir().unwrap();
        let out = Command::new("timeout")
            .arg("30")
            .arg(BIN)
            .arg("mount")
            .arg(fixture("test_noop.kpack"))
            .arg(d.path())
            .args(args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
        assert_eq!(String::from_utf8_lossy(&out.stderr), message, "{args:?}");
        assert!(out.stdout.is_empty(), "{args:?}");
        let canonical = d.path().canonicalize().unwrap();
        assert!(
            mountinfo::mount_at(&canonical).unwrap().is_none(),
            "{args:?}"
        );
    }
}

/// A deprecated flag and its new name together: clap's usage error (exit 2), nothing mounted.
#[test]
fn an_old_flag_beside_its_new_name_is_refused() {
    for (old, new) in [
        ("--cache-size", "--memory-cache-size"),
        ("--cache-dir-size", "--disk-cache-size"),
    ] {
        let d = tempfile::tempdir().unwrap();
        let out = Command::new("timeout")
            .arg("30")
            .arg(BIN)
            .arg("mount")
            .arg(fixture("test_noop.kpack"))
            .arg(d.path())
            .args([old, "1M", new, "2M"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            stderr.lines().next(),
            Some(
                format!("error: the argument '{old} <SIZE>' cannot be used with '{new} <SIZE>'")
                    .as_str()
            ),
            "{stderr}"
        );
    }
}
