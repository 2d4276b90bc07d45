//! Going to the background without losing errors: `fork` while the process has one thread, and
//! a readiness pipe from the daemon back to the command the user ran.
//!
//! The parent waits on the pipe and exits with what the daemon reports: 0 once the mount is live
//! (so `mount`, fstab and systemd see success only when the files can be read), or the exit code
//! and message of the failure. If the daemon dies without a word, or says nothing within the
//! timeout, the parent kills it, detaches any mount it left, and fails with exit 9.
//!
//! Forking a process that has other threads leaves only the forking thread in the child, with
//! whatever locks the others held. So the command forks before anything that may start a
//! thread: before it opens the source (a remote source's network runtime) and long before fuser
//! serves; [`daemonize`] refuses to fork if that ever stops being true. The parent's wait is the
//! one limit on the whole start: opening and checking the source, building the tree, mounting.

use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::time::{Duration, Instant};

use crate::cli::exit::{CliError, CliResult, Exit};
use crate::cli::out::errln;

/// How long the parent waits for the daemon to report, by default.
pub const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// Overrides [`READY_TIMEOUT`] (whole seconds), for slow systems and for tests.
pub const READY_TIMEOUT_ENV: &str = "KPACK_FUSE_READY_TIMEOUT";

fn ready_timeout() -> Duration {
    std::env::var(READY_TIMEOUT_ENV)
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|&s| s > 0)
        .map_or(READY_TIMEOUT, Duration::from_secs)
}

/// The daemon's end of the readiness pipe.
pub struct Ready {
    pipe: Option<std::fs::File>,
}

impl Ready {
    /// The mount is live: the waiting parent exits 0.
    pub fn ok(&mut self) {
        if let Some(mut p) = self.pipe.take() {
            let _ = p.write_all(&[0]);
        }
    }

    /// Startup failed: the parent prints `err` and exits with its code.
    pub fn fail(&mut self, err: &CliError) {
        if let Some(mut p) = self.pipe.take() {
            let mut msg = vec![err.exit as u8];
            msg.extend_from_slice(err.message.as_bytes());
            let _ = p.write_all(&msg);
        }
    }
}

/// Threads of this process, from `/proc/self/task`.
fn thread_count() -> usize {
    std::fs::read_dir("/proc/self/task")
        .map(|d| d.count())
        .unwrap_or(1)
}

fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 writes.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both descriptors were just created and are owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Forks. Returns in the child (the daemon, in a new session, with standard input and output
/// on `/dev/null`; standard error too once [`detach_stderr`] is called). The parent never
/// returns: it waits for the child's report and exits. `mountpoint` is detached by the parent
/// if the child leaves a mount behind on failure (`None` for a `/dev/fd/N` mount point).
pub fn daemonize(mountpoint: Option<&Path>) -> CliResult<Ready> {
    let threads = thread_count();
    if threads > 1 {
        return Err(CliError::new(
            Exit::Failure,
            format!("cannot go to the background: {threads} threads are already running (use -f)"),
        ));
    }
    let (read, write) =
        pipe().map_err(|e| CliError::new(Exit::Failure, format!("cannot create a pipe: {e}")))?;
    // SAFETY: the process has a single thread (checked above), so the child is a full copy.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(CliError::new(
            Exit::Failure,
            format!("cannot fork: {}", io::Error::last_os_error()),
        ));
    }
    if pid > 0 {
        drop(write);
        let code = parent_wait(pid, read, mountpoint);
        std::process::exit(code);
    }
    drop(read);
    // SAFETY: plain process-state calls in the single-threaded child.
    unsafe {
        libc::setsid();
    }
    redirect(&[0, 1]);
    Ok(Ready {
        pipe: Some(std::fs::File::from(write)),
    })
}

/// Points standard error at `/dev/null` (after logging has moved away from it).
pub fn detach_stderr() {
    redirect(&[2]);
}

fn redirect(fds: &[RawFd]) {
    if let Ok(null) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
    {
        for &fd in fds {
            // SAFETY: dup2 onto a standard descriptor; `null` stays valid during the call.
            unsafe { libc::dup2(null.as_raw_fd(), fd) };
        }
    }
}

/// The parent side: returns the exit code to use.
fn parent_wait(pid: libc::pid_t, read: OwnedFd, mountpoint: Option<&Path>) -> i32 {
    let mut file = std::fs::File::from(read);
    let timeout = ready_timeout();
    let deadline = Instant::now() + timeout;
    let mut msg = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let mut pfd = libc::pollfd {
            fd: file.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut pfd, 1, left.as_millis().min(i32::MAX as u128) as i32) };
        if n < 0 {
            if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                continue;
            }
            break;
        }
        if n == 0 {
            // Timed out: the daemon is stuck somewhere in mounting.
            // SAFETY: signalling our own child by pid.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            reap(pid);
            cleanup(mountpoint);
            errln!(
                "kpack-fuse: the mount did not start within {} s (opening and checking the \
                 source, then mounting); stopped it ({READY_TIMEOUT_ENV}=SECONDS allows longer)",
                timeout.as_secs()
            );
            return Exit::MountFailed as i32;
        }
        let mut buf = [0u8; 4096];
        match file.read(&mut buf) {
            Ok(0) => break,
            Ok(k) => {
                msg.extend_from_slice(&buf[..k]);
                if msg == [0] {
                    // Success is one byte, written once the mount is live.
                    return 0;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    match msg.split_first() {
        Some((&0, _)) => 0,
        Some((&code, text)) => {
            reap(pid);
            cleanup(mountpoint);
            errln!("kpack-fuse: {}", String::from_utf8_lossy(text));
            code as i32
        }
        None => {
            let status = reap(pid);
            cleanup(mountpoint);
            errln!("kpack-fuse: the daemon exited before the mount was live ({status})");
            Exit::MountFailed as i32
        }
    }
}

/// Waits for the child; describes how it ended.
fn reap(pid: libc::pid_t) -> String {
    let mut status = 0;
    // SAFETY: waiting for our own child.
    let r = unsafe { libc::waitpid(pid, &mut status, 0) };
    if r != pid {
        return "status unknown".into();
    }
    if libc::WIFEXITED(status) {
        format!("exit status {}", libc::WEXITSTATUS(status))
    } else if libc::WIFSIGNALED(status) {
        format!("killed by signal {}", libc::WTERMSIG(status))
    } else {
        "status unknown".into()
    }
}

/// Detaches a kpack-fuse mount a failed daemon left on `mountpoint` (the mount point was checked
/// to be free before forking, so one found there is ours).
fn cleanup(mountpoint: Option<&Path>) {
    let Some(mp) = mountpoint else { return };
    if let Ok(Some(m)) = rocm_kpack::fs::setup::mountinfo::mount_at(mp) {
        if m.fs_type == format!("fuse.{}", rocm_kpack::fs::fuse::SUBTYPE) {
            let _ = super::umount::umount2(mp, libc::MNT_DETACH);
        }
    }
}
