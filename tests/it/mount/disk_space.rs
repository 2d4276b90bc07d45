//! Disk backing on a file system smaller than what the mount reads, and the files a mount
//! leaves behind.
//!
//! Space: the per-mount directory on a small tmpfs (`--scratch-dir`), read whole twice, with
//! the default bound (which follows the file system), a bound below the data but above the free
//! space a large kernel needs, and a bound larger than the file system itself (so the file
//! system fills before the bound does): every byte exact, kernels evicted, none refused. A
//! kernel larger than the whole file system is refused with ENOSPC and a log line naming the
//! kernel, the directory and the sizes.
//!
//! Leftovers: the per-mount directory is named after the daemon; a SIGKILLed daemon's
//! directory and lock file are removed by the next mount while a live mount's stay; a
//! directory removed under a live mount is made again and cold opens still read.

use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

use rocm_kpack::Compression;

use super::scenarios::{getxattr, stats};
use super::{pattern, rich_archive, write_archive};
use crate::support::mount::{Mount, Tmpfs, fuse_available};

const MIB: usize = 1 << 20;

/// Fifteen kernels, three of 13 MiB (more than a 40 MiB file system has free once the store
/// keeps 30 MiB) and twelve of 2 MiB: 63 MiB decoded, more than the 40 MiB tmpfs holds.
fn big_archive(dir: &Path) -> PathBuf {
    let keys: Vec<String> = (0..15).map(|i| format!("lib/lib{i}.so#0")).collect();
    let list: Vec<(&str, &str, Vec<u8>)> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| {
            let len = if i % 5 == 2 { 13 * MIB } else { 2 * MIB };
            (k.as_str(), "gfx942", pattern(len, i as u32))
        })
        .collect();
    write_archive(
        &dir.join("big.kpack"),
        Compression::Zstd { level: 3 },
        &list,
    )
}

/// The directory a mount's backing files take disk in (`user.kpack.backing_dir`).
fn backing_dir(m: &Mount) -> PathBuf {
    let dir = getxattr(&m.mountpoint, "user.kpack.backing_dir").unwrap();
    PathBuf::from(std::ffi::OsString::from_vec(dir))
}

/// The lock file of the daemon `pid` in the runtime directory of root's daemons.
fn lock_of(pid: u32) -> Option<PathBuf> {
    std::fs::read_dir("/run/kpack-fuse")
        .ok()?
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("mount-") && n.ends_with(&format!("-{pid}.lock")))
        })
}

/// A 40 MiB tmpfs as `--scratch-dir` and 63 MiB of kernels read whole, twice: with the
/// default bound (a quarter of the file system), with a 30 MiB bound (room is made before a
/// 13 MiB kernel's space is reserved, though only 10 MiB would be free beside a full store),
/// and with a 1 GiB bound (the file system fills first: the store evicts when the reservation
/// fails, and tries again). Every byte is exact, and nothing is refused.
#[test]
fn a_small_scratch_file_system_is_evicted_not_refused() {
    if !fuse_available() {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let archive = big_archive(d.path());
    let cases: [(&[&str], u64); 3] = [
        (&[], 10 << 20),
        (&["--disk-cache-size", "30M"], 30 << 20),
        (&["--disk-cache-size", "1G"], 1 << 30),
    ];
    for (bound, capacity) in cases {
        let fs = Tmpfs::new(40);
        let mut args = vec!["--scratch-dir", fs.path.to_str().unwrap()];
        args.extend_from_slice(bound);
        let m = Mount::start(&archive, &args);
        m.check("walk", "");
        m.check("walk", "");
        let st = stats(&m.mountpoint);
        let dir = backing_dir(&m);
        let log = m.daemon_log();
        m.stop();
        assert_eq!(st["capacity"], capacity, "{bound:?}");
        assert!(st["evictions"] > 0, "{bound:?}: {st:?}");
        assert_eq!(st["space_refusals"], 0, "{bound:?}: {st:?}\n{log}");
        if capacity > 40 << 20 {
            assert!(st["space_evictions"] > 0, "{bound:?}: {st:?}");
        }
        assert_eq!(dir.parent(), Some(fs.path.as_path()));
        assert!(!log.contains("ERROR"), "{bound:?}:\n{log}");
    }
}

/// A kernel larger than the whole file system cannot fit even in an empty store: its opens
/// fail with ENOSPC, logged with the archive, key and arch, the directory and the sizes; the
/// other kernels read.
#[test]
fn a_kernel_larger_than_the_file_system_is_refused_with_a_log_line_naming_it() {
    if !fuse_available() {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let archive = write_archive(
        &d.path().join("huge.kpack"),
        Compression::Zstd { level: 3 },
        &[
            ("lib/huge.so#0", "gfx942", pattern(20 * MIB, 1)),
            ("lib/small.so#0", "gfx942", pattern(MIB, 2)),
        ],
    );
    let fs = Tmpfs::new(16);
    let m = Mount::start(
        &archive,
        &[
            "--scratch-dir",
            fs.path.to_str().unwrap(),
            "--open-mode",
            "daemon",
        ],
    );
    m.check("walk_one", "lib/small.so#0/gfx942.hsaco");
    m.check(
        "rp_open_errno",
        &format!("lib/huge.so#0/gfx942.hsaco={}", libc::ENOSPC),
    );
    m.check("walk_one", "lib/small.so#0/gfx942.hsaco");
    let st = stats(&m.mountpoint);
    let dir = backing_dir(&m);
    let log = m.daemon_log();
    m.stop();
    assert_eq!(st["space_refusals"], 2, "{st:?}");
    let line = format!(
        "{}: lib/huge.so#0 [gfx942]: no room for its {}-byte backing file in {} (",
        archive.display(),
        20 * MIB,
        dir.display()
    );
    let logged = log
        .lines()
        .find(|l| l.contains(&line))
        .unwrap_or_else(|| panic!("no line with {line:?}:\n{log}"));
    assert!(
        logged.contains(" bytes free there): No space left on device (os error 28); nothing left to evict: the store keeps "),
        "{logged}"
    );
}

/// The per-mount directory is named after the daemon serving the mount (in the background,
/// not the command that started it) and its lock file in `/run/kpack-fuse` says where it is.
/// A SIGKILL leaves both; the next mount removes them, and never a live mount's, which goes
/// on serving and leaves nothing once stopped.
#[test]
fn a_killed_daemons_directory_and_lock_go_with_the_next_mount_and_a_live_ones_stay() {
    if !fuse_available() {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let archive = rich_archive(&d.path().join("r.kpack"), Compression::Zstd { level: 3 });
    let base = d.path().join("scratch");
    std::fs::create_dir(&base).unwrap();
    let args = [
        "--scratch-dir",
        base.to_str().unwrap(),
        "--open-mode",
        "daemon",
    ];
    let live = Mount::start_background(&archive, &args);
    let mut killed = Mount::start(&archive, &args);
    let mut found = Vec::new();
    for m in [&live, &killed] {
        m.check("walk", "");
        let dir = backing_dir(m);
        let name = dir.file_name().unwrap().to_str().unwrap().to_owned();
        assert_eq!(dir.parent(), Some(base.as_path()));
        assert!(
            name.starts_with(&format!("kpack-fuse.{}-", m.daemon_pid())),
            "{name} is not named after the daemon {}",
            m.daemon_pid()
        );
        let lock = lock_of(m.daemon_pid()).expect("the daemon's lock file");
        let record = std::fs::read_to_string(&lock).unwrap();
        assert!(
            record.contains(&format!("scratch_dir {}\n", dir.display())),
            "{record}"
        );
        found.push((dir, lock));
    }
    let [(live_dir, live_lock), (killed_dir, killed_lock)] = <[_; 2]>::try_from(found).unwrap();
    killed.kill_daemon();
    assert!(
        killed_dir.is_dir() && killed_lock.exists(),
        "a kill leaves both"
    );
    let next = Mount::start(&archive, &args);
    // Serving means its daemon took its own lock, which it does after removing dead ones.
    next.check("walk", "");
    assert!(!killed_dir.exists(), "{}", killed_dir.display());
    assert!(!killed_lock.exists(), "{}", killed_lock.display());
    assert!(live_dir.is_dir() && live_lock.exists());
    live.check("walk", "");
    let next_dir = backing_dir(&next);
    next.stop();
    live.stop();
    for gone in [&live_dir, &live_lock, &next_dir] {
        assert!(!gone.exists(), "{} left after a clean stop", gone.display());
    }
    drop(killed);
}

/// The per-mount directory removed under a live mount (as a cleanup by PID used to do) is
/// made again: every cold open still reads, and the log says what happened.
#[test]
fn a_removed_scratch_directory_is_made_again_and_cold_opens_still_read() {
    if !fuse_available() {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let archive = rich_archive(&d.path().join("r.kpack"), Compression::Zstd { level: 3 });
    let args = [
        "--scratch-dir",
        d.path().to_str().unwrap(),
        "--open-mode",
        "daemon",
        "--no-decode-ahead",
    ];
    let m = Mount::start(&archive, &args);
    m.check("walk_one", "bin/tool#0/gfx900.hsaco");
    let dir = backing_dir(&m);
    std::fs::remove_dir_all(&dir).unwrap();
    m.check("walk", "");
    assert!(dir.is_dir(), "made again at the same path");
    let log = m.daemon_log();
    assert!(
        log.contains(&format!(
            "{}: the scratch directory was removed while mounted; made {} again",
            dir.display(),
            dir.display()
        )),
        "{log}"
    );
    m.stop();
    assert!(!dir.exists());
}
