//! Deployment: the files under `mount-helpers/` and the `Dockerfile` (checked for syntax and
//! wiring, since no container engine or systemd runs here), and real mounts the way production
//! makes them: `mount -t fuse.kpack-fuse` (mount.fuse3), `mount -t kpack-fuse` (the native
//! helper), `mount -T FSTAB`, a non-root user through fusermount3, and the container entrypoint.
//!
//! Every command that touches a mount runs in a child process under a deadline; a guard aborts
//! the FUSE connection, detaches the mount and kills the daemons started for it on drop, even
//! when the test failed.

mod files;
mod mounts;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rocm_kpack::fs::setup::mountinfo;

use crate::support::mount::abort_connection;

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// What a command did.
#[derive(Debug)]
pub struct Run {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    pub fn ok(&self) -> bool {
        self.code == Some(0)
    }
}

/// Runs `cmd` with a deadline; on timeout kills it and fails the test (the caller's guards then
/// clean up).
pub fn run_for(cmd: &mut Command, secs: u64) -> Run {
    let dir = tempfile::tempdir().unwrap();
    let (out, err) = (dir.path().join("out"), dir.path().join("err"));
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    let deadline = Instant::now() + Duration::from_secs(secs);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "watchdog: {cmd:?} still running after {secs}s\nstdout:\n{}\nstderr:\n{}",
                std::fs::read_to_string(&out).unwrap_or_default(),
                std::fs::read_to_string(&err).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Run {
        code: status.code(),
        stdout: std::fs::read_to_string(&out).unwrap_or_default(),
        stderr: std::fs::read_to_string(&err).unwrap_or_default(),
    }
}

/// Runs `cmd` (120 s deadline) and fails the test unless it exits 0; returns stdout.
pub fn must(cmd: &mut Command) -> String {
    let desc = format!("{cmd:?}");
    let r = run_for(cmd, 120);
    assert!(
        r.ok(),
        "{desc} exited {:?}\nstdout:\n{}\nstderr:\n{}",
        r.code,
        r.stdout,
        r.stderr
    );
    r.stdout
}

/// The processes whose command line mentions `needle` (a path unique to one test): the daemons
/// a test started, found without knowing their pids (a backgrounded daemon is not our child).
pub fn processes_mentioning(needle: &str) -> Vec<i32> {
    let mut pids = Vec::new();
    let me = std::process::id() as i32;
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if pid == me {
            continue;
        }
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        if String::from_utf8_lossy(&cmdline).contains(needle) {
            pids.push(pid);
        }
    }
    pids
}

/// Waits until no process mentions `needle`; false on timeout.
pub fn wait_no_process(needle: &str, secs: u64) -> bool {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !processes_mentioning(needle).is_empty() {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

/// Cleans up a mount point on drop: aborts its FUSE connection, detaches it, and kills the
/// processes whose command line names it.
pub struct MountGuard {
    pub path: PathBuf,
}

impl MountGuard {
    pub fn new(path: &Path) -> MountGuard {
        MountGuard {
            path: path.to_path_buf(),
        }
    }
}

impl Drop for MountGuard {
    fn drop(&mut self) {
        while let Ok(Some(entry)) = mountinfo::mount_at(&self.path) {
            if entry.fs_type.starts_with("fuse") {
                abort_connection(entry.minor);
            }
            if !umount_lazy(&self.path) {
                break;
            }
        }
        for pid in processes_mentioning(&self.path.display().to_string()) {
            // SAFETY: signalling a process started for this test's unique mount point.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

pub fn umount_lazy(path: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) == 0 }
}

/// The kind of mount at `path`, if any.
pub fn mounted_type(path: &Path) -> Option<String> {
    mountinfo::mount_at(path).unwrap().map(|m| m.fs_type)
}
