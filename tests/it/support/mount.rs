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

use rocm_kpack::fs::setup::mountinfo;

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
    let (root, dev) = super::mount_env::root_and_dev_fuse();
    let ok = super::mount_env::required("mount tests", &[("root", root), ("/dev/fuse", dev)]);
    if ok {
        ensure_fusectl();
    }
    ok
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

pub fn umount_lazy(path: &Path) {
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
/// Unmounts (lazily) whatever is mounted at a path when dropped, so that a test that mounts by
/// running the command itself leaves nothing behind, passed or failed.
pub struct UnmountOnDrop<'a>(pub &'a Path);

impl Drop for UnmountOnDrop<'_> {
    fn drop(&mut self) {
        // Stacked mounts come off one at a time.
        for _ in 0..8 {
            if !matches!(mountinfo::mount_at(self.0), Ok(Some(_))) {
                return;
            }
            let _ = Command::new("umount").arg("-l").arg(self.0).status();
        }
    }
}

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

/// The process serving a mount: a child started with `-f`, or a background daemon adopted
/// after its parent exited (this test process is a child subreaper, see [`Mount::start_background`]).
pub enum Daemon {
    Child(Child),
    Adopted(i32),
}

impl Daemon {
    pub fn id(&self) -> i32 {
        match self {
            Daemon::Child(c) => c.id() as i32,
            Daemon::Adopted(pid) => *pid,
        }
    }

    pub fn try_wait(&mut self) -> std::io::Result<Option<ExitStatus>> {
        match self {
            Daemon::Child(c) => c.try_wait(),
            Daemon::Adopted(pid) => {
                use std::os::unix::process::ExitStatusExt;
                let mut status = 0;
                // SAFETY: waiting, without blocking, for a process reparented to us.
                let r = unsafe { libc::waitpid(*pid, &mut status, libc::WNOHANG) };
                match r {
                    0 => Ok(None),
                    r if r == *pid => Ok(Some(ExitStatus::from_raw(status))),
                    _ => Err(std::io::Error::last_os_error()),
                }
            }
        }
    }

    pub fn kill(&mut self) -> std::io::Result<()> {
        // SAFETY: signalling the process we started (or adopted), by pid.
        unsafe { libc::kill(self.id(), libc::SIGKILL) };
        Ok(())
    }

    pub fn wait(&mut self) -> std::io::Result<ExitStatus> {
        loop {
            if let Some(s) = self.try_wait()? {
                return Ok(s);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// The process whose parent is this one and whose command line names `mountpoint`: the
/// background daemon serving it, once adopted.
fn find_daemon(mountpoint: &Path) -> Option<i32> {
    let me = std::process::id() as i32;
    let needle = mountpoint.as_os_str().as_encoded_bytes();
    for e in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        // Fields after the parenthesised command name: state, ppid, ...
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<i32>().ok());
        if ppid != Some(me) {
            continue;
        }
        let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        if cmdline.split(|b| *b == 0).any(|arg| arg == needle) {
            return Some(pid);
        }
    }
    None
}

/// Waits for a daemon until `deadline`; `None` on timeout.
fn wait_daemon_until(d: &mut Daemon, deadline: Instant) -> Option<ExitStatus> {
    loop {
        if let Ok(Some(status)) = d.try_wait() {
            return Some(status);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// One `kpack-fuse mount` process and its mount point.
pub struct Mount {
    dir: tempfile::TempDir,
    pub mountpoint: PathBuf,
    pub archive: PathBuf,
    daemon: Option<Daemon>,
    pub conn: u32,
    log: PathBuf,
}

impl Mount {
    /// Mounts `archive` with extra `mount` arguments and waits until the mount is live.
    pub fn start(archive: &Path, extra: &[&str]) -> Mount {
        Mount::start_env(archive, extra, &[])
    }

    /// [`Mount::start`] with extra environment variables for the daemon (foreground, `-f`).
    pub fn start_env(archive: &Path, extra: &[&str], env: &[(&str, &str)]) -> Mount {
        Mount::start_configured(archive, extra, &|cmd| {
            cmd.envs(env.iter().copied());
        })
    }

    /// [`Mount::start`] with a hook that adjusts the daemon's command before it starts.
    pub fn start_configured(
        archive: &Path,
        extra: &[&str],
        configure: &dyn Fn(&mut Command),
    ) -> Mount {
        let dir = tempfile::tempdir().unwrap();
        let mountpoint = dir.path().join("mnt");
        std::fs::create_dir(&mountpoint).unwrap();
        Mount::start_in(dir, &mountpoint, archive, extra, configure)
    }

    /// Mounts `archive` on an existing directory `mountpoint` owned by the caller (for a new
    /// mount on a point an earlier, crashed one used). The caller removes the directory.
    pub fn start_on(mountpoint: &Path, archive: &Path, extra: &[&str]) -> Mount {
        Mount::start_on_configured(mountpoint, archive, extra, &|_| {})
    }

    /// [`Mount::start_on`] with a hook that adjusts the daemon's command before it starts.
    pub fn start_on_configured(
        mountpoint: &Path,
        archive: &Path,
        extra: &[&str],
        configure: &dyn Fn(&mut Command),
    ) -> Mount {
        Mount::start_in(
            tempfile::tempdir().unwrap(),
            mountpoint,
            archive,
            extra,
            configure,
        )
    }

    fn start_in(
        dir: tempfile::TempDir,
        mountpoint: &Path,
        archive: &Path,
        extra: &[&str],
        configure: &dyn Fn(&mut Command),
    ) -> Mount {
        let mountpoint = mountpoint.canonicalize().unwrap();
        let log = dir.path().join("daemon.log");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_kpack-fuse"));
        cmd.arg("mount")
            .arg(archive)
            .arg(&mountpoint)
            .arg("-f")
            .args(extra)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        configure(&mut cmd);
        let daemon = cmd.spawn().unwrap();
        let mut m = Mount {
            dir,
            mountpoint,
            archive: archive.to_path_buf(),
            daemon: Some(Daemon::Child(daemon)),
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

    /// Mounts in the background (no `-f`; the daemon logs to `--log-file`). The command must
    /// exit 0 with the mount already live: this checks the mount table once, right after the
    /// command returned, without waiting. The daemon, orphaned when the command exits, is
    /// reparented to this process (a child subreaper), so its exit status can be checked.
    pub fn start_background(source: &Path, extra: &[&str]) -> Mount {
        Mount::start_background_configured(source, extra, &|_| {})
    }

    /// [`Mount::start_background`] with a hook that adjusts the command before it starts.
    pub fn start_background_configured(
        source: &Path,
        extra: &[&str],
        configure: &dyn Fn(&mut Command),
    ) -> Mount {
        static SUBREAPER: Once = Once::new();
        SUBREAPER.call_once(|| {
            // SAFETY: a process attribute; no pointers involved.
            let rc = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
            assert_eq!(rc, 0, "prctl(PR_SET_CHILD_SUBREAPER)");
        });
        let dir = tempfile::tempdir().unwrap();
        let mountpoint = dir.path().join("mnt");
        std::fs::create_dir(&mountpoint).unwrap();
        let mountpoint = mountpoint.canonicalize().unwrap();
        let log = dir.path().join("daemon.log");
        let out_path = dir.path().join("command.out");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_kpack-fuse"));
        cmd.arg("mount")
            .arg(source)
            .arg(&mountpoint)
            .arg("--log-file")
            .arg(&log)
            .args(extra)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&out_path).unwrap())
            .stderr(
                std::fs::OpenOptions::new()
                    .append(true)
                    .open(&out_path)
                    .unwrap(),
            );
        configure(&mut cmd);
        let mut command = cmd.spawn().unwrap();
        let status = wait_until(&mut command, Instant::now() + DAEMON_DEADLINE);
        let mut m = Mount {
            dir,
            mountpoint,
            archive: source.to_path_buf(),
            daemon: None,
            conn: 0,
            log,
        };
        // Adopt the daemon first, so that the guard cleans up whatever happens next.
        m.daemon = find_daemon(&m.mountpoint).map(Daemon::Adopted);
        let Some(status) = status else {
            let _ = command.kill();
            let _ = command.wait();
            panic!("kpack-fuse mount did not return within {DAEMON_DEADLINE:?}");
        };
        assert!(
            status.success(),
            "kpack-fuse mount: {status}\n{}\ndaemon log:\n{}",
            read_file(&out_path),
            m.daemon_log()
        );
        let entry = mountinfo::mount_at(&m.mountpoint)
            .unwrap()
            .expect("the mount is live when the command returns");
        assert_eq!(entry.fs_type, "fuse.kpack-fuse");
        m.conn = entry.minor;
        assert!(
            m.daemon.is_some(),
            "no daemon process found for {}",
            m.mountpoint.display()
        );
        m
    }

    /// Mounts the way a privileged launcher does for `/dev/fd/N`: this process opens
    /// `/dev/fuse`, calls `mount(2)` with it, and starts `kpack-fuse mount SOURCE /dev/fd/N -f`
    /// with the descriptor inherited. Stopping is the launcher's job: `umount` it.
    pub fn start_fd(source: &Path, extra: &[&str]) -> Mount {
        Mount::start_fd_configured(source, extra, &|_| {})
    }

    /// [`Mount::start_fd`] with a hook that adjusts the daemon's command before it starts (for
    /// a daemon without privileges the mount itself would need).
    pub fn start_fd_configured(
        source: &Path,
        extra: &[&str],
        configure: &dyn Fn(&mut Command),
    ) -> Mount {
        use std::os::fd::AsRawFd;
        use std::os::unix::process::CommandExt;
        const CHILD_FD: i32 = 7;
        let dir = tempfile::tempdir().unwrap();
        let mountpoint = dir.path().join("mnt");
        std::fs::create_dir(&mountpoint).unwrap();
        let mountpoint = mountpoint.canonicalize().unwrap();
        let log = dir.path().join("daemon.log");
        let dev = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/fuse")
            .unwrap();
        let c = |s: &str| std::ffi::CString::new(s).unwrap();
        let data = c(&format!(
            "fd={},rootmode=40000,user_id=0,group_id=0,default_permissions",
            dev.as_raw_fd()
        ));
        let (src, dst, ty) = (
            c("kpack-fd-test"),
            c(mountpoint.to_str().unwrap()),
            c("fuse.kpack-fuse"),
        );
        // SAFETY: valid NUL-terminated strings for the duration of the call.
        let rc = unsafe {
            libc::mount(
                src.as_ptr(),
                dst.as_ptr(),
                ty.as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV | libc::MS_RDONLY,
                data.as_ptr().cast(),
            )
        };
        assert_eq!(rc, 0, "mount(2): {}", std::io::Error::last_os_error());
        let raw = dev.as_raw_fd();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_kpack-fuse"));
        cmd.arg("mount")
            .arg(source)
            .arg(format!("/dev/fd/{CHILD_FD}"))
            .arg("-f")
            .args(extra)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        // SAFETY: only async-signal-safe dup2 between fork and exec; dup2 clears CLOEXEC.
        unsafe {
            cmd.pre_exec(move || {
                if libc::dup2(raw, CHILD_FD) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        configure(&mut cmd);
        let spawned = cmd.spawn();
        drop(dev);
        let entry = mountinfo::mount_at(&mountpoint).unwrap().unwrap();
        let m = Mount {
            dir,
            mountpoint,
            archive: source.to_path_buf(),
            daemon: spawned.ok().map(Daemon::Child),
            conn: entry.minor,
            log,
        };
        assert!(m.daemon.is_some(), "cannot start kpack-fuse");
        m
    }

    /// The path of the daemon's log (standard error, or `--log-file` in the background).
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// What the daemon wrote to stderr so far.
    pub fn daemon_log(&self) -> String {
        read_file(&self.log)
    }

    /// What the command of [`Mount::start_background`] printed before it returned (its
    /// standard output and error: what a user sees on the terminal).
    pub fn command_output(&self) -> String {
        read_file(&self.dir.path().join("command.out"))
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
        // SAFETY: signalling the daemon we started, by its pid.
        unsafe { libc::kill(daemon.id(), signal) };
    }

    /// The daemon's process id (for `/proc/<pid>/status`).
    pub fn daemon_pid(&self) -> u32 {
        self.daemon.as_ref().unwrap().id() as u32
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
        // SAFETY: signalling the daemon we started, by its pid.
        unsafe { libc::kill(daemon.id(), signal) };
        let status = match wait_daemon_until(&mut daemon, Instant::now() + DAEMON_DEADLINE) {
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
        match wait_daemon_until(&mut daemon, Instant::now() + DAEMON_DEADLINE) {
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
        let mut killed = false;
        if let Some(mut daemon) = self.daemon.take() {
            if let Ok(None) = daemon.try_wait() {
                abort_connection(self.conn);
                let _ = daemon.kill();
                killed = true;
            }
            let _ = daemon.wait();
        }
        // Only our own mount, left behind by a daemon that was killed: a live mount at the same
        // path is a later one, which may even have been given the same device number.
        if let Ok(Some(m)) = mountinfo::mount_at(&self.mountpoint) {
            let dead = connection_gone(&self.mountpoint);
            if m.minor == self.conn && (killed || dead) {
                umount_lazy(&self.mountpoint);
            }
        }
    }
}

/// Whether the FUSE mount at `path` has lost its daemon (ENOTCONN). Asked with `statfs`, which
/// always reaches the daemon: a `stat` of the root can be answered from attributes the kernel
/// cached while the daemon lived (the mount gives them a year).
fn connection_gone(path: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: a NUL-terminated path and a statfs buffer for the call to fill.
    let mut buf: libc::statfs = unsafe { std::mem::zeroed() };
    let r = unsafe { libc::statfs(c.as_ptr(), &mut buf) };
    r != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ENOTCONN)
}

/// `sh -c SCRIPT` in a private mount namespace (mounts made there stay there and go with it),
/// killed after `limit_secs`; the caller adds what else it needs and runs it.
pub fn in_private_mount_namespace(limit_secs: u32, script: &str) -> std::process::Command {
    let mut cmd = std::process::Command::new("timeout");
    cmd.arg(limit_secs.to_string())
        .args(["unshare", "--mount", "--propagation", "private", "sh", "-c"])
        .arg(script);
    cmd
}

/// A tmpfs of `mib` MiB mounted on a new temporary directory (mounts need root), detached when
/// dropped: a small file system to fill.
pub struct Tmpfs {
    _dir: tempfile::TempDir,
    pub path: PathBuf,
}

impl Tmpfs {
    pub fn new(mib: u64) -> Tmpfs {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fs");
        std::fs::create_dir(&path).unwrap();
        let c = |s: &str| std::ffi::CString::new(s).unwrap();
        let (src, dst, ty) = (c("tmpfs"), c(path.to_str().unwrap()), c("tmpfs"));
        let data = c(&format!("size={mib}m,mode=0755"));
        // SAFETY: valid NUL-terminated strings for the duration of the call.
        let rc = unsafe {
            libc::mount(
                src.as_ptr(),
                dst.as_ptr(),
                ty.as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV,
                data.as_ptr().cast(),
            )
        };
        assert_eq!(rc, 0, "mount tmpfs: {}", std::io::Error::last_os_error());
        Tmpfs { _dir: dir, path }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        umount_lazy(&self.path);
    }
}
