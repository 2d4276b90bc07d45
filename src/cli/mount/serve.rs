//! Serving a mount until it is unmounted: mounting (on a directory, or over a launcher's
//! `/dev/fd/N`), telling the waiting command it is live, and a thread that turns SIGINT, SIGTERM
//! and SIGHUP into an unmount (fuser installs no signal handlers). A mount also ends by
//! `kpack-fuse unmount` or `umount`.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, Ordering};

use rocm_kpack::fs::KpackFs;
use rocm_kpack::fs::fuse::{self, MountConfig};

use super::daemon::Ready;
use super::daemon_lock;
use super::unmount::unmount_path;
use crate::cli::exit::{CliError, CliResult, Exit};

/// Where the mount goes.
pub enum Target {
    Dir(PathBuf),
    Fd(RawFd),
}

/// Mounts, reports readiness, watches signals, and serves until unmounted.
pub fn serve(
    fs: KpackFs,
    target: Target,
    cfg: &MountConfig,
    ready: Option<&mut Ready>,
    what: &str,
) -> CliResult {
    // Handlers go in before mounting, so that a signal arriving at any later point is seen by
    // the watcher (queued in the pipe until the mount is up, then unmounting it), never the
    // default action that would leave a mount dangling.
    let signals = SignalPipe::install().map_err(|e| {
        CliError::new(
            Exit::Failure,
            format!("cannot install signal handlers: {e}"),
        )
    })?;
    // Made here, by the process that serves the mount: the per-mount directory is named after
    // it and locked for as long as it lives (dead daemons' directories beside it are removed).
    let backing_dir = fs.store().start().map_err(|e| {
        CliError::new(
            Exit::Output,
            format!("cannot make the per-mount directory of backing files: {e}"),
        )
    })?;
    let backing = backing_dir.map(|dir| {
        let kind = if fs.store().is_cache_dir() {
            daemon_lock::Backing::CacheDir(dir)
        } else {
            daemon_lock::Backing::Scratch(dir)
        };
        log::info!("backing files in {}", kind.dir().display());
        kind
    });
    let (mounted, mountpoint) = match target {
        Target::Dir(mp) => {
            let m = fuse::mount(fs, &mp, cfg)
                .map_err(|e| CliError::new(Exit::MountFailed, mount_refused(&mp, &e, cfg)))?;
            (m, Some(mp))
        }
        Target::Fd(fd) => {
            // SAFETY: the descriptor was checked to be an open /dev/fuse; from here on this
            // process owns it.
            let owned = unsafe { OwnedFd::from_raw_fd(fd) };
            let m = fuse::serve_fd(fs, owned, cfg).map_err(|e| {
                CliError::new(Exit::MountFailed, format!("cannot serve /dev/fd/{fd}: {e}"))
            })?;
            (m, None)
        }
    };
    let shown = mountpoint.as_ref().map_or_else(
        || "an inherited /dev/fuse descriptor".to_owned(),
        |p| p.display().to_string(),
    );
    log::info!("mounted {what} on {shown} ({} threads)", cfg.threads);
    if let Some(r) = ready {
        r.ok();
    }
    let own = mounted.own_mount();
    // Held until the process exits, so that `kpack-fuse unmount` can wait for it.
    let held = own.as_ref().and_then(|o| {
        daemon_lock::hold(o.device(), o.mountpoint(), backing.as_ref())
            .map_err(|e| log::debug!("no lock for unmount to wait on: {e}"))
            .ok()
    });
    std::thread::Builder::new()
        .name("kpack-signals".into())
        .spawn(move || {
            let Some(sig) = signals.wait() else { return };
            let Some(own) = own else {
                // The launcher owns a /dev/fd/N mount; all this process can do is stop serving.
                log::info!("signal {sig}: stopping (the launcher unmounts /dev/fd mounts)");
                std::process::exit(0);
            };
            let mp = own.mountpoint();
            log::info!("signal {sig}: unmounting {}", mp.display());
            // Only while the mount at the path is still ours: it may have been unmounted from
            // outside and another mounted there since.
            if !own.still_mounted() {
                return;
            }
            if let Err(e) = unmount_path(mp, false) {
                // Busy (files still open): detach now; the session ends on last close.
                log::warn!("unmount of {} failed ({e}); detaching lazily", mp.display());
                if own.still_mounted() {
                    if let Err(e) = unmount_path(mp, true) {
                        log::error!("lazy unmount of {} failed: {e}", mp.display());
                    }
                }
            }
        })
        .map_err(|e| {
            CliError::new(
                Exit::Failure,
                format!("cannot start the signal thread: {e}"),
            )
        })?;
    let served = mounted
        .run()
        .map_err(|e| CliError::new(Exit::MountFailed, format!("serving {shown} failed: {e}")));
    if let Some(h) = held {
        h.retire();
    }
    served?;
    log::info!("{shown}: unmounted, exiting");
    Ok(())
}

/// The delay a test of the mount's life cycle asks for at the session's end
/// (`KPACK_FUSE_TEST_EXIT_DELAY_MS`), so that a daemon's slow exit can be made to overlap the
/// next mount at the same path. Zero otherwise.
pub fn test_exit_delay() -> std::time::Duration {
    std::env::var("KPACK_FUSE_TEST_EXIT_DELAY_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(std::time::Duration::ZERO, std::time::Duration::from_millis)
}

/// The write end of the self-pipe, for the async-signal-safe handler.
static SIGNAL_FD: AtomicI32 = AtomicI32::new(-1);

extern "C" fn on_signal(sig: libc::c_int) {
    let fd = SIGNAL_FD.load(Ordering::Relaxed);
    if fd >= 0 {
        let b = sig as u8;
        // SAFETY: write(2) is async-signal-safe; the buffer is a local byte.
        unsafe { libc::write(fd, (&b as *const u8).cast(), 1) };
    }
}

/// SIGINT/SIGTERM/SIGHUP turned into bytes on a pipe, read by a watcher thread.
struct SignalPipe {
    read: RawFd,
}

impl SignalPipe {
    fn install() -> io::Result<SignalPipe> {
        let mut fds = [0 as RawFd; 2];
        // SAFETY: `fds` has room for the two descriptors pipe2 writes.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(io::Error::last_os_error());
        }
        SIGNAL_FD.store(fds[1], Ordering::Relaxed);
        for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            // SAFETY: a zeroed sigaction with a valid handler and an empty mask is well formed.
            unsafe {
                let mut sa: libc::sigaction = std::mem::zeroed();
                sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
                sa.sa_flags = libc::SA_RESTART;
                libc::sigemptyset(&mut sa.sa_mask);
                if libc::sigaction(sig, &sa, std::ptr::null_mut()) != 0 {
                    return Err(io::Error::last_os_error());
                }
            }
        }
        Ok(SignalPipe { read: fds[0] })
    }

    /// Blocks until a signal arrives; returns its number.
    fn wait(&self) -> Option<i32> {
        let mut b = 0u8;
        loop {
            // SAFETY: reads one byte into a local.
            let n = unsafe { libc::read(self.read, (&mut b as *mut u8).cast(), 1) };
            if n == 1 {
                return Some(i32::from(b));
            }
            if n < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return None;
        }
    }
}

/// Why the kernel refused a mount, with the fix when it is a known one: a user who may not open
/// /dev/fuse gets "Permission denied" from the mount, which does not say that /dev/fuse is what
/// is denied, and one without /dev/fuse (a container started without it) gets "no such file",
/// which reads as if the mount point were missing.
fn mount_refused(mp: &Path, e: &io::Error, cfg: &MountConfig) -> String {
    if e.kind() == io::ErrorKind::NotFound && !Path::new(FUSE_DEVICE).exists() {
        return format!(
            "cannot mount on {}: {FUSE_DEVICE} does not exist (in a container, pass --device \
             {FUSE_DEVICE}; on a host, load the fuse module: modprobe fuse)",
            mp.display()
        );
    }
    let hint = if cfg.auto_unmount && e.kind() == io::ErrorKind::NotFound {
        " (auto_unmount runs fusermount3: is it installed?)".to_owned()
    } else if e.kind() == io::ErrorKind::PermissionDenied && !fuse_device_usable() {
        format!(
            " (this user cannot open {FUSE_DEVICE} for reading and writing: mount as root, or \
             make {FUSE_DEVICE} usable by all (mode 0666, as the fuse3 package sets it), or, in a \
             container, pass --device {FUSE_DEVICE})"
        )
    } else if !running_as_root() && !fusermount_available() {
        " (a user other than root mounts through fusermount3, which is not installed: install \
         it (Debian and Ubuntu: apt install fuse3), or mount as root, which does not need it)"
            .to_owned()
    } else {
        String::new()
    };
    format!(
        "cannot mount on {}: {}{hint}",
        mp.display(),
        rocm_kpack::error::describe_io(e)
    )
}

const FUSE_DEVICE: &str = "/dev/fuse";

fn running_as_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Whether this process (its real user, as for a non-setuid program) may open /dev/fuse.
fn fuse_device_usable() -> bool {
    let c = c"/dev/fuse";
    // SAFETY: `c` is a valid NUL-terminated path; access(2) only reads it.
    unsafe { libc::access(c.as_ptr(), libc::R_OK | libc::W_OK) == 0 }
}

/// Whether a fusermount helper can be found, as fuser looks for one.
pub fn fusermount_available() -> bool {
    if let Some(p) = std::env::var_os("FUSERMOUNT_PATH") {
        return Path::new(&p).is_file();
    }
    let on_path = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default();
    ["fusermount3", "fusermount"].iter().any(|name| {
        on_path
            .iter()
            .chain([PathBuf::from("/sbin"), PathBuf::from("/bin")].iter())
            .any(|d| d.join(name).is_file())
    })
}
