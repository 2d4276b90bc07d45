//! `kpack-fuse unmount`, and the unmount the daemon's signal watcher runs: `umount2` as root,
//! the setuid helper `fusermount3` for other users.

use std::io;
use std::path::{Path, PathBuf};

use rocm_kpack::fs::fuse;
use rocm_kpack::fs::setup::mountinfo;

use super::daemon_lock;
use super::logging::{self, Verbosity};
use super::umount::umount2;
use crate::cli::exit::{CliError, CliResult, Exit};
use crate::cli::out::errln;

#[derive(Debug, clap::Args)]
pub struct UnmountArgs {
    /// Where a kpack-fuse filesystem is mounted.
    pub mountpoint: PathBuf,
    /// Detach now even if files are open; the filesystem goes away when they are closed.
    #[arg(long, short = 'l')]
    pub lazy: bool,
}

/// Unmounts `path` (lazily: detaches it, open files keep being served): `umount2` as root,
/// `fusermount3 -u` (`-uz`) for other users. A path that is no longer mounted is not an error.
pub(super) fn unmount_path(path: &Path, lazy: bool) -> io::Result<()> {
    let flags = if lazy { libc::MNT_DETACH } else { 0 };
    match umount2(path, flags) {
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => fusermount_unmount(path, lazy),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(()),
        other => other,
    }
}

/// The setuid helper's unmount, for users other than root.
fn fusermount_unmount(path: &Path, lazy: bool) -> io::Result<()> {
    for helper in ["fusermount3", "fusermount"] {
        let mut cmd = std::process::Command::new(helper);
        cmd.arg(if lazy { "-uz" } else { "-u" }).arg("--").arg(path);
        match cmd.status() {
            Ok(s) if s.success() => return Ok(()),
            Ok(s) => return Err(io::Error::other(format!("{helper} failed ({s})"))),
            Err(_) => continue,
        }
    }
    Err(io::Error::new(
        io::ErrorKind::PermissionDenied,
        "only root may unmount it, and no fusermount3 was found",
    ))
}

/// How long `unmount` waits for the daemon to let go before it says so and returns.
const DAEMON_EXIT_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

pub fn run_unmount(args: UnmountArgs) -> CliResult {
    logging::init(Verbosity::default());
    let bad = |why: &str| {
        CliError::new(
            Exit::MountPoint,
            format!("{}: {why}", args.mountpoint.display()),
        )
    };
    // A mount whose daemon died cannot be stat'ed (ENOTCONN), so canonicalize may fail; the
    // absolute path is then looked up as given.
    let (canonical, missing) = match args.mountpoint.canonicalize() {
        Ok(p) => (p, false),
        Err(e) => (
            std::path::absolute(&args.mountpoint).map_err(|e| bad(&e.to_string()))?,
            e.kind() == io::ErrorKind::NotFound,
        ),
    };
    let entry = mountinfo::mount_at(&canonical)
        .map_err(|e| bad(&format!("cannot read the mount table: {e}")))?
        .ok_or_else(|| {
            bad(if missing {
                "mount point does not exist"
            } else {
                "not a mount point"
            })
        })?;
    if entry.fs_type != format!("fuse.{}", fuse::SUBTYPE) {
        return Err(bad(&format!(
            "not a kpack-fuse mount (type {})",
            entry.fs_type
        )));
    }
    // Opened before the unmount: once it is done, a new mount may take the same device number.
    let daemons = daemon_lock::holders((entry.major, entry.minor));
    match unmount_path(&canonical, args.lazy) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
            return Err(CliError::new(
                Exit::MountFailed,
                format!(
                    "{}: busy (files are open); use --lazy to detach now",
                    canonical.display()
                ),
            ));
        }
        Err(e) => {
            return Err(CliError::new(
                Exit::MountFailed,
                format!("{}: unmount failed: {e}", canonical.display()),
            ));
        }
    }
    // A lazy detach leaves the daemon serving the files still open: nothing to wait for.
    if !args.lazy && !daemon_lock::wait_released(&daemons, DAEMON_EXIT_WAIT) {
        errln!(
            "kpack-fuse: {}: unmounted, but its daemon has not exited after {} s",
            canonical.display(),
            DAEMON_EXIT_WAIT.as_secs()
        );
    }
    Ok(())
}
