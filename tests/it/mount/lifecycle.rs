//! The mount's life cycle can be repeated: unmount and mount again at the same path, cycle
//! after cycle, each new mount still serving every file once the old daemon is gone, whether
//! the unmount was `kpack-fuse unmount` (which returns once the daemon let go) or `umount(8)`
//! from outside (which returns at once, the old daemon still exiting beside the new mount).
//!
//! Each daemon holds its exit for a while (`KPACK_FUSE_TEST_EXIT_DELAY_MS`), as a daemon
//! freeing a large set does, so an old daemon that unmounted by path on its way out would take
//! the new mount down. `KPACK_IT_REMOUNT_CYCLES` raises the number of cycles for hand runs.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::support::fixture;
use crate::support::mount::{Mount, fuse_available};

const EXIT_DELAY_MS: &str = "1500";

/// How long after a remount the new mount must still serve.
const STILL_SERVING_AFTER: Duration = Duration::from_secs(3);

fn cycles() -> usize {
    std::env::var("KPACK_IT_REMOUNT_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10)
}

fn mount_at(mp: &Path) -> Mount {
    Mount::start_on_configured(mp, &fixture("test_zstd.kpack"), &[], &|cmd| {
        cmd.env("KPACK_FUSE_TEST_EXIT_DELAY_MS", EXIT_DELAY_MS);
    })
}

fn remount_cycles(unmount: &dyn Fn(&Path)) {
    let dir = tempfile::tempdir().unwrap();
    let mp = dir.path().join("mnt");
    std::fs::create_dir(&mp).unwrap();
    let mut current = mount_at(&mp);
    for cycle in 0..cycles() {
        current.check("walk", "");
        unmount(&current.mountpoint);
        let next = mount_at(&mp);
        let remounted = Instant::now();
        let status = current.wait_exit();
        assert!(
            status.success(),
            "cycle {cycle}: old daemon exited with {status}"
        );
        std::thread::sleep(STILL_SERVING_AFTER.saturating_sub(remounted.elapsed()));
        let entry = rocm_kpack::fs::setup::mountinfo::mount_at(&next.mountpoint).unwrap();
        assert_eq!(
            entry.map(|e| e.minor),
            Some(next.conn),
            "cycle {cycle}: the new mount is gone:\n{}",
            next.daemon_log()
        );
        next.check("walk", "");
        current = next;
    }
    current.stop();
}

#[test]
fn remount_after_kpack_fuse_unmount_stays_up() {
    if !fuse_available() {
        return;
    }
    remount_cycles(&|mp| {
        let started = Instant::now();
        let out = Command::new(env!("CARGO_BIN_EXE_kpack-fuse"))
            .arg("unmount")
            .arg(mp)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        // It returned only once the daemon let go, which holds its exit for the delay.
        assert!(
            started.elapsed() >= Duration::from_millis(EXIT_DELAY_MS.parse().unwrap()),
            "unmount returned after {:?}, before the daemon exited",
            started.elapsed()
        );
    });
}

#[test]
fn remount_after_an_outside_umount_stays_up() {
    if !fuse_available() {
        return;
    }
    remount_cycles(&|mp| {
        let status = Command::new("umount").arg(mp).status().unwrap();
        assert!(status.success());
    });
}
