//! Real FUSE mounts for tests, arranged so that a broken filesystem fails a test instead of
//! hanging it:
//!
//! * the filesystem runs in its own process (the real `kpack-fuse mount` binary);
//! * every file operation on the mount runs in another child process (this test binary
//!   re-executed on `mount::io_child_entry`), watched with a deadline; on timeout the FUSE
//!   connection is aborted through `/sys/fs/fuse/connections/<n>/abort`, the daemon is killed
//!   (which aborts it too), and the test fails;
//! * a guard detaches the mount lazily and kills the daemon on drop, even when the test failed.
//!
//! Mount tests need root and `/dev/fuse`. Where they are missing the tests say so and pass,
//! unless `CI` or `KPACK_REQUIRE_FUSE` is set: then a missing FUSE is a failure.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Once;
use std::time::{Duration, Instant};

use rocm_kpack::fs::mountinfo;

/// Printed by an I/O child after its scenario completed, followed by the scenario name.
pub const DONE_MARKER: &str = "KPACK_IT_SCENARIO_DONE ";

/// How long one I/O child may run (`KPACK_IT_DEADLINE_SECS` overrides it).
fn child_deadline() -> Duration {
    let secs = std::env::var("KPACK_IT_DEADLINE_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(90);
    Duration::from_secs(secs)
}
/// How long the daemon may take to mount or to exit after SIGTERM.
const DAEMON_DEADLINE: Duration = Duration::from_secs(30);

const CONNECTIONS: &str = "/sys/fs/fuse/connections";

/// Whether mount tests can run here. Panics when they cannot but must (CI).
pub fn fuse_available() -> bool {
    // SAFETY: no arguments, cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    let dev = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
        .is_ok();
    if root && dev {
        ensure_fusectl();
        return true;
    }
    let why =
        format!("mount tests need root and /dev/fuse (root: {root}, /dev/fuse usable: {dev})");
    if std::env::var_os("CI").is_some() || std::env::var_os("KPACK_REQUIRE_FUSE").is_some() {
        panic!("{why}");
    }
    eprintln!("SKIPPED: {why}");
    false
}

/// Mounts the fusectl filesystem if it is not mounted yet, so connections can be aborted.
fn ensure_fusectl() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let mounted = mountinfo::mounts()
            .map(|ms| ms.iter().any(|m| m.fs_type == "fusectl"))
            .unwrap_or(false);
        if !mounted && Path::new(CONNECTIONS).is_dir() {
            let c = |s: &str| std::ffi::CString::new(s).unwrap();
            let (src, dst, ty) = (c("fusectl"), c(CONNECTIONS), c("fusectl"));
            // SAFETY: valid NUL-terminated strings; no data argument.
            let rc = unsafe {
                libc::mount(src.as_ptr(), dst.as_ptr(), ty.as_ptr(), 0, std::ptr::null())
            };
            if rc != 0 {
                eprintln!(
                    "note: cannot mount fusectl: {}",
                    std::io::Error::last_os_error()
                );
            }
        }
    });
}

/// Aborts FUSE connection `conn`: every pending and future request fails with ENOTCONN.
pub fn abort_connection(conn: u32) {
    let _ = std::fs::write(format!("{CONNECTIONS}/{conn}/abort"), "1");
}

fn umount_lazy(path: &Path) {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: valid path string.
    unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
}

/// Waits for `child` until `deadline`; `None` on timeout (the child is still running).
fn wait_until(child: &mut Child, deadline: Instant) -> Option<ExitStatus> {
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn read_file(p: &Path) -> String {
    let mut s = String::new();
    if let Ok(mut f) = std::fs::File::open(p) {
        let _ = f.read_to_string(&mut s);
    }
    s
}

/// What an I/O child did.
#[derive(Debug)]
pub struct ChildOutput {
    pub success: bool,
    pub output: String,
}

/// An I/O child started with [`Mount::spawn_child`]; killed if dropped unfinished.
pub struct RunningChild {
    child: Option<Child>,
    out_path: PathBuf,
    name: String,
    started: Instant,
}

impl Drop for RunningChild {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// One `kpack-fuse mount` process and its mount point.
pub struct Mount {
    dir: tempfile::TempDir,
    pub mountpoint: PathBuf,
    pub archive: PathBuf,
    daemon: Option<Child>,
    pub conn: u32,
    log: PathBuf,
}

impl Mount {
    /// Mounts `archive` with extra `mount` arguments and waits until the mount is live.
    pub fn start(archive: &Path, extra: &[&str]) -> Mount {
        let dir = tempfile::tempdir().unwrap();
        let mountpoint = dir.path().join("mnt");
        std::fs::create_dir(&mountpoint).unwrap();
        Mount::start_in(dir, &mountpoint, archive, extra)
    }

    /// Mounts `archive` on an existing directory `mountpoint` owned by the caller (for a new
    /// mount on a point an earlier, crashed one used). The caller removes the directory.
    pub fn start_on(mountpoint: &Path, archive: &Path, extra: &[&str]) -> Mount {
        Mount::start_in(tempfile::tempdir().unwrap(), mountpoint, archive, extra)
    }

    fn start_in(dir: tempfile::TempDir, mountpoint: &Path, archive: &Path, extra: &[&str]) -> Mount {
        let mountpoint = mountpoint.canonicalize().unwrap();
        let log = dir.path().join("daemon.log");
        let daemon = Command::new(env!("CARGO_BIN_EXE_kpack-fuse"))
            .arg("mount")
            .arg(archive)
            .arg(&mountpoint)
            .arg("-f")
            .args(extra)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let mut m = Mount {
            dir,
            mountpoint,
            archive: archive.to_path_buf(),
            daemon: Some(daemon),
            conn: 0,
            log,
        };
        let deadline = Instant::now() + DAEMON_DEADLINE;
        loop {
            if let Some(entry) = mountinfo::mount_at(&m.mountpoint).unwrap() {
                assert_eq!(entry.fs_type, "fuse.kpack-fuse");
                m.conn = entry.minor;
                return m;
            }
            if let Ok(Some(status)) = m.daemon.as_mut().unwrap().try_wait() {
                panic!(
                    "kpack-fuse mount exited with {status} before mounting:\n{}",
                    m.daemon_log()
                );
            }
            assert!(
                Instant::now() < deadline,
                "mount did not appear within {DAEMON_DEADLINE:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// What the daemon wrote to stderr so far.
    pub fn daemon_log(&self) -> String {
        read_file(&self.log)
    }

    /// Runs scenario `name` of `mount::io_child_entry` in a child process against this mount,
    /// under the watchdog. `arg` is passed through.
    pub fn child(&self, name: &str, arg: &str) -> ChildOutput {
        let running = self.spawn_child(name, arg);
        self.finish(running)
    }

    /// Starts scenario `name` without waiting for it; [`Mount::finish`] waits under the
    /// watchdog (counted from the start).
    pub fn spawn_child(&self, name: &str, arg: &str) -> RunningChild {
        let out_path = self
            .dir
            .path()
            .join(format!("child-{name}-{}.out", std::process::id()));
        let out = std::fs::File::create(&out_path).unwrap();
        let child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--ignored",
                "--exact",
                "mount::io_child_entry",
                "--nocapture",
                "--test-threads",
                "1",
            ])
            .env("KPACK_IT_SCENARIO", name)
            .env("KPACK_IT_MOUNT", &self.mountpoint)
            .env("KPACK_IT_ARCHIVE", &self.archive)
            .env("KPACK_IT_ARG", arg)
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap();
        RunningChild {
            child: Some(child),
            out_path,
            name: name.to_owned(),
            started: Instant::now(),
        }
    }

    /// Waits for a child started with [`Mount::spawn_child`]; on timeout aborts the connection
    /// and fails the test.
    pub fn finish(&self, mut running: RunningChild) -> ChildOutput {
        let deadline = child_deadline();
        let mut child = running.child.take().unwrap();
        let (name, out_path) = (running.name.clone(), running.out_path.clone());
        match wait_until(&mut child, running.started + deadline) {
            Some(status) => ChildOutput {
                success: status.success()
                    && read_file(&out_path).contains(&format!("{DONE_MARKER}{name}\n")),
                output: read_file(&out_path),
            },
            None => {
                abort_connection(self.conn);
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "watchdog: scenario {name} hung for {deadline:?}; FUSE connection {} aborted.\n\
                     child output:\n{}\ndaemon log:\n{}",
                    self.conn,
                    read_file(&out_path),
                    self.daemon_log()
                );
            }
        }
    }

    /// Sends `signal` to the daemon without waiting.
    pub fn signal(&self, signal: i32) {
        let daemon = self.daemon.as_ref().unwrap();
        // SAFETY: signalling the child we started, by its pid.
        unsafe { libc::kill(daemon.id() as i32, signal) };
    }

    /// The daemon's process id (for `/proc/<pid>/status`).
    pub fn daemon_pid(&self) -> u32 {
        self.daemon.as_ref().unwrap().id()
    }

    /// Whether the daemon is still running.
    pub fn daemon_running(&mut self) -> bool {
        matches!(self.daemon.as_mut().unwrap().try_wait(), Ok(None))
    }

    /// Runs a scenario and fails the test, with its output, unless it succeeded.
    pub fn check(&self, name: &str, arg: &str) {
        let out = self.child(name, arg);
        if std::env::var_os("KPACK_IT_VERBOSE").is_some() {
            eprintln!("scenario {name}({arg}):\n{}", out.output);
        }
        assert!(
            out.success,
            "scenario {name}({arg}) failed:\n{}\ndaemon log:\n{}",
            out.output,
            self.daemon_log()
        );
    }

    /// Sends `signal` to the daemon and waits for it to exit; returns its status and checks
    /// that the mount is gone.
    pub fn stop_with(mut self, signal: i32) -> ExitStatus {
        let mut daemon = self.daemon.take().unwrap();
        // SAFETY: signalling the child we started, by its pid.
        unsafe { libc::kill(daemon.id() as i32, signal) };
        let status = match wait_until(&mut daemon, Instant::now() + DAEMON_DEADLINE) {
            Some(s) => s,
            None => {
                abort_connection(self.conn);
                let _ = daemon.kill();
                let _ = daemon.wait();
                panic!(
                    "daemon did not exit after signal {signal}:\n{}",
                    self.daemon_log()
                );
            }
        };
        assert_eq!(
            mountinfo::mount_at(&self.mountpoint).unwrap(),
            None,
            "mount left behind"
        );
        status
    }

    /// SIGTERM, and the daemon must exit 0 having unmounted.
    pub fn stop(self) {
        let log = self.log.clone();
        let status = self.stop_with(libc::SIGTERM);
        assert_eq!(
            status.code(),
            Some(0),
            "daemon exit after SIGTERM:\n{}",
            read_file(&log)
        );
    }

    /// Kills the daemon with SIGKILL, leaving the mount behind (ENOTCONN), as a crash would.
    pub fn kill_daemon(&mut self) {
        let mut daemon = self.daemon.take().unwrap();
        daemon.kill().unwrap();
        daemon.wait().unwrap();
    }

    /// Waits for the daemon to exit by itself (after an external unmount).
    pub fn wait_exit(mut self) -> ExitStatus {
        let mut daemon = self.daemon.take().unwrap();
        match wait_until(&mut daemon, Instant::now() + DAEMON_DEADLINE) {
            Some(s) => s,
            None => {
                let _ = daemon.kill();
                let _ = daemon.wait();
                panic!("daemon did not exit:\n{}", self.daemon_log());
            }
        }
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if let Some(mut daemon) = self.daemon.take() {
            if let Ok(None) = daemon.try_wait() {
                abort_connection(self.conn);
                let _ = daemon.kill();
            }
            let _ = daemon.wait();
        }
        if let Ok(Some(_)) = mountinfo::mount_at(&self.mountpoint) {
            umount_lazy(&self.mountpoint);
        }
    }
}
