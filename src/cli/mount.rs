//! `kpack-fuse mount` and `kpack-fuse unmount`.
//!
//! `mount` checks everything it can before touching the kernel (mount point, archive, names in
//! the tree), then mounts and serves in the foreground until the filesystem is unmounted: by
//! SIGINT/SIGTERM (handled here: fuser installs no signal handlers), by `kpack-fuse unmount`, or
//! by `umount`. It then exits 0.

use std::io;
use std::os::fd::RawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};

use rocm_kpack::Archive;
use rocm_kpack::fs::fuse::{self, MountConfig};
use rocm_kpack::fs::{FsOptions, KpackFs, gpus, mountinfo};

use super::{CliError, CliResult, Exit};

/// Default `--cache-size`.
const DEFAULT_CACHE: &str = "256M";

#[derive(Debug, clap::Args)]
pub struct MountArgs {
    /// The .kpack archive to show.
    pub archive: PathBuf,
    /// An existing directory to mount it on.
    pub mountpoint: PathBuf,
    /// Bytes of decoded kernels kept in memory (suffixes K, M, G: powers of 1024).
    #[arg(long, value_name = "SIZE", default_value = DEFAULT_CACHE, value_parser = parse_size)]
    pub cache_size: u64,
    /// Request-handling threads [default: the number of CPUs].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=256))]
    pub threads: Option<u32>,
    /// Handle requests on one thread (same as --threads 1).
    #[arg(short = 's', conflicts_with = "threads")]
    pub single_thread: bool,
    /// Device ISA for native.hsaco (repeatable, first match wins) [default: the local GPUs
    /// from /sys/class/kfd].
    #[arg(long = "gpu", value_name = "ISA")]
    pub gpus: Vec<String>,
    /// Stay in the foreground (this version always does).
    #[arg(short = 'f', long)]
    pub foreground: bool,
}

#[derive(Debug, clap::Args)]
pub struct UnmountArgs {
    /// Where a kpack-fuse filesystem is mounted.
    pub mountpoint: PathBuf,
    /// Detach now even if files are open; the filesystem goes away when they are closed.
    #[arg(long, short = 'l')]
    pub lazy: bool,
}

/// Parses `1048576`, `512K`, `256M`, `1G` (also `KiB`/`MiB`/`GiB`); units are powers of 1024.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a size (examples: 268435456, 512K, 256M, 1G)"))?;
    let shift = match unit.to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KB" | "KIB" => 10,
        "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        _ => return Err(format!("{s:?}: unknown unit {unit:?} (use K, M or G)")),
    };
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| format!("{s:?} is too large"))
}

fn init_logging() {
    // fuser warns when its own unmount on exit finds the mount already gone (after
    // `kpack-fuse unmount` or `umount`), which is the normal way to stop; keep it quiet.
    let env = env_logger::Env::default().default_filter_or("warn,fuser::session=error");
    let _ = env_logger::Builder::from_env(env).try_init();
}

/// The mount point must exist, be a directory, and not already have a mount on it.
fn check_mountpoint(path: &Path) -> CliResult<PathBuf> {
    let bad = |why: String| CliError::new(Exit::MountPoint, format!("{}: {why}", path.display()));
    let meta = std::fs::metadata(path).map_err(|e| match e.kind() {
        io::ErrorKind::NotFound => bad("mount point does not exist".into()),
        _ => bad(format!("cannot use as mount point: {e}")),
    })?;
    if !meta.is_dir() {
        return Err(bad("mount point is not a directory".into()));
    }
    let canonical = path
        .canonicalize()
        .map_err(|e| bad(format!("cannot resolve: {e}")))?;
    if let Ok(Some(m)) = mountinfo::mount_at(&canonical) {
        return Err(bad(format!(
            "something is already mounted there ({})",
            m.fs_type
        )));
    }
    Ok(canonical)
}

pub fn run_mount(args: MountArgs) -> CliResult {
    init_logging();
    // Handlers go in first, so that a signal arriving at any later point is seen by the watcher
    // (queued in the pipe until the mount is up, then unmounting it), never the default action
    // that would leave a mount dangling.
    let signals = SignalPipe::install().map_err(|e| {
        CliError::new(
            Exit::Failure,
            format!("cannot install signal handlers: {e}"),
        )
    })?;
    let mountpoint = check_mountpoint(&args.mountpoint)?;
    // The canonical path is what xattrs and /proc/mounts show; when it cannot be resolved,
    // opening the path as given reports the problem with the right exit class.
    let archive_path = match args.archive.canonicalize() {
        Ok(p) => p,
        Err(_) => {
            Archive::open(&args.archive)?;
            args.archive.clone()
        }
    };
    let archive = Archive::open(&archive_path)?;
    let gpus = if args.gpus.is_empty() {
        gpus::local_gpus(Path::new(gpus::KFD_NODES))
    } else {
        args.gpus.clone()
    };
    // SAFETY: plain libc calls without arguments; they cannot fail.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    let opts = FsOptions {
        cache_size: args.cache_size,
        gpus,
        uid,
        gid,
    };
    let (fs, _duplicates) = KpackFs::new(vec![Arc::new(archive)], &opts)
        .map_err(|e| CliError::new(Exit::BadFormat, e.to_string()))?;
    let threads = if args.single_thread {
        1
    } else {
        args.threads
            .map(|n| n as usize)
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
    };

    let cfg = MountConfig {
        threads,
        source: archive_path.display().to_string(),
    };
    let mut mounted = fuse::mount(fs, &mountpoint, &cfg).map_err(|e| {
        CliError::new(
            Exit::MountFailed,
            format!("cannot mount on {}: {e}", mountpoint.display()),
        )
    })?;
    log::info!(
        "mounted {} on {} ({threads} threads)",
        archive_path.display(),
        mountpoint.display()
    );
    let mut unmounter = mounted.unmounter();
    let watched = mountpoint.clone();
    std::thread::Builder::new()
        .name("kpack-signals".into())
        .spawn(move || {
            if let Some(sig) = signals.wait() {
                log::info!("signal {sig}: unmounting {}", watched.display());
                if let Err(e) = unmounter.unmount() {
                    // Busy (files still open): detach now; the session ends on last close.
                    log::warn!(
                        "unmount of {} failed ({e}); detaching lazily",
                        watched.display()
                    );
                    if let Err(e) = umount2(&watched, libc::MNT_DETACH) {
                        log::error!("lazy unmount of {} failed: {e}", watched.display());
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
    mounted.run().map_err(|e| {
        CliError::new(
            Exit::MountFailed,
            format!("serving {} failed: {e}", mountpoint.display()),
        )
    })
}

pub fn run_unmount(args: UnmountArgs) -> CliResult {
    init_logging();
    let bad = |why: &str| {
        CliError::new(
            Exit::MountPoint,
            format!("{}: {why}", args.mountpoint.display()),
        )
    };
    // A mount whose daemon died cannot be stat'ed (ENOTCONN), so canonicalize may fail; the
    // absolute path is then looked up as given.
    let canonical = match args.mountpoint.canonicalize() {
        Ok(p) => p,
        Err(_) => std::path::absolute(&args.mountpoint).map_err(|e| bad(&e.to_string()))?,
    };
    let entry = mountinfo::mount_at(&canonical)
        .map_err(|e| bad(&format!("cannot read the mount table: {e}")))?
        .ok_or_else(|| bad("not a mount point"))?;
    if entry.fs_type != format!("fuse.{}", fuse::SUBTYPE) {
        return Err(bad(&format!(
            "not a kpack-fuse mount (type {})",
            entry.fs_type
        )));
    }
    let flags = if args.lazy { libc::MNT_DETACH } else { 0 };
    match umount2(&canonical, flags) {
        Ok(()) => Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => Err(CliError::new(
            Exit::MountFailed,
            format!(
                "{}: busy (files are open); use --lazy to detach now",
                canonical.display()
            ),
        )),
        // Not root: let the setuid helper do it.
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
            fusermount_unmount(&canonical, args.lazy, e)
        }
        Err(e) => Err(CliError::new(
            Exit::MountFailed,
            format!("{}: unmount failed: {e}", canonical.display()),
        )),
    }
}

fn fusermount_unmount(path: &Path, lazy: bool, first: io::Error) -> CliResult {
    for helper in ["fusermount3", "fusermount"] {
        let mut cmd = std::process::Command::new(helper);
        cmd.arg(if lazy { "-uz" } else { "-u" }).arg("--").arg(path);
        match cmd.status() {
            Ok(s) if s.success() => return Ok(()),
            Ok(s) => {
                return Err(CliError::new(
                    Exit::MountFailed,
                    format!("{}: {helper} failed ({s})", path.display()),
                ));
            }
            Err(_) => continue,
        }
    }
    Err(CliError::new(
        Exit::MountFailed,
        format!(
            "{}: unmount failed: {first} (and no fusermount3 found)",
            path.display()
        ),
    ))
}

fn umount2(path: &Path, flags: libc::c_int) -> io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: `c` is a valid NUL-terminated path for the duration of the call.
    if unsafe { libc::umount2(c.as_ptr(), flags) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("256M"), Ok(256 << 20));
        assert_eq!(parse_size("512k"), Ok(512 << 10));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("2GiB"), Ok(2 << 30));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("0"), Ok(0));
        assert!(parse_size("").is_err());
        assert!(parse_size("12T").is_err());
        assert!(parse_size("M").is_err());
        assert!(parse_size("99999999999G").is_err());
    }
}
