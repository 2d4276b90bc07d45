//! `--auto-unmount` through `fusermount3`: a clean stop and a crash (SIGKILL) both leave no
//! mount behind.
//!
//! A test binary of its own, so that no other mount comes or goes while it runs: cargo runs
//! test binaries one at a time, and inside the `it` binary dozens of mount tests run in
//! parallel. Beside them, `fusermount3` at times leaves the crashed mount in place (alone, it
//! does not): its monitor exits without unmounting. It decides whether to unmount by looking the mount point up in the mount table,
//! which other mounts coming and going at the same moment can make it miss (our reading of it; the
//! test cannot see inside `fusermount3`).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rocm_kpack::fs::setup::mountinfo;

/// How long a mount may take to appear, and a crashed one to go.
const DEADLINE: Duration = Duration::from_secs(30);

#[path = "it/support/mount_env.rs"]
mod mount_env;

fn have_fuse() -> bool {
    let (root, dev) = mount_env::root_and_dev_fuse();
    let fusermount = [
        "/usr/bin/fusermount3",
        "/bin/fusermount3",
        "/usr/sbin/fusermount3",
        "/sbin/fusermount3",
    ]
    .iter()
    .any(|p| Path::new(p).exists());
    mount_env::required(
        "the auto-unmount test",
        &[
            ("root", root),
            ("/dev/fuse", dev),
            ("fusermount3 (package fuse3)", fusermount),
        ],
    )
}

/// A daemon in the foreground; dropping it kills it and lazily unmounts whatever is left, so a
/// failed test leaves nothing mounted.
struct Daemon {
    child: Option<Child>,
    mountpoint: PathBuf,
}

impl Daemon {
    fn start(archive: &Path, mountpoint: &Path, extra: &[&str]) -> Daemon {
        let child = Command::new(env!("CARGO_BIN_EXE_kpack-fuse"))
            .arg("mount")
            .arg(archive)
            .arg(mountpoint)
            .arg("-f")
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut d = Daemon {
            child: Some(child),
            mountpoint: mountpoint.to_path_buf(),
        };
        let deadline = Instant::now() + DEADLINE;
        while mountinfo::mount_at(mountpoint).unwrap().is_none() {
            let exited = d.child.as_mut().unwrap().try_wait().unwrap();
            assert!(
                exited.is_none(),
                "the daemon exited with {exited:?} before mounting"
            );
            assert!(Instant::now() < deadline, "no mount within {DEADLINE:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
        let entry = mountinfo::mount_at(mountpoint).unwrap().unwrap();
        assert_eq!(entry.fs_type, "fuse.kpack-fuse");
        d
    }

    /// Sends `signal` and waits (bounded) for the daemon; returns its exit code (None: killed).
    fn signal(&mut self, signal: i32) -> Option<i32> {
        let child = self.child.as_mut().unwrap();
        // SAFETY: a signal to our own child, which has not been waited for yet.
        assert_eq!(unsafe { libc::kill(child.id() as i32, signal) }, 0);
        let deadline = Instant::now() + DEADLINE;
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                self.child = None;
                return status.code();
            }
            // Drop kills it and unmounts.
            assert!(Instant::now() < deadline, "no exit after signal {signal}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if mountinfo::mount_at(&self.mountpoint)
            .ok()
            .flatten()
            .is_some()
        {
            let _ = Command::new("umount")
                .arg("-l")
                .arg(&self.mountpoint)
                .status();
        }
    }
}

fn wait_unmounted(path: &Path, what: &str) {
    mount_env::wait_unmounted(path, what, DEADLINE);
}

#[test]
fn auto_unmount_through_fusermount3_cleans_up_after_a_stop_and_a_crash() {
    if !have_fuse() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let archive = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/test_noop.kpack");
    // A clean stop first: SIGTERM unmounts and exits 0 with auto_unmount too. The tree is
    // listed by `find` in a child process under `timeout`, as mount I/O always is here.
    let mut d = Daemon::start(&archive, &mnt, &["--auto-unmount"]);
    let listed = Command::new("timeout")
        .args(["20", "find"])
        .arg(&mnt)
        .output()
        .unwrap();
    assert!(listed.status.success(), "find on the mount: {listed:?}");
    let names = String::from_utf8_lossy(&listed.stdout);
    assert!(names.contains(".hsaco"), "no kernel file listed:\n{names}");
    assert_eq!(d.signal(libc::SIGTERM), Some(0));
    wait_unmounted(&mnt, "after SIGTERM with auto_unmount");
    // Then a crash: fusermount3 notices the daemon is gone and unmounts.
    let mut d = Daemon::start(&archive, &mnt, &["-o", "auto_unmount"]);
    assert_eq!(d.signal(libc::SIGKILL), None);
    wait_unmounted(&mnt, "after SIGKILL with auto_unmount");
}
