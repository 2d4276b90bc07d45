//! One mount at a mount point: a mount holds an exclusive `flock` on its mount point's
//! directory from before it checks the mount table until its daemon exits, so of any number of
//! `kpack-fuse mount` commands racing for one directory exactly one mounts; the others exit 8.
//!
//! The lock is on the directory itself (the inode under the mount), so it needs no file of its
//! own and nothing is left behind. A mount that finds the lock held and nothing mounted yet
//! waits: the holder is either another mount starting (which then mounts, and this one is
//! refused) or a daemon whose mount was unmounted and which is still exiting (which then lets
//! go, and this one goes on). Once the lock is taken, the mount table is read again: a command
//! that opened the directory after another mount was already on it locked that mount's root,
//! not the directory under it, and the table shows the mount.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

/// How long a mount waits for the lock while nothing is mounted at the path.
pub const WAIT: Duration = Duration::from_secs(30);

/// How often the lock and the mount table are looked at while waiting.
const POLL: Duration = Duration::from_millis(20);

/// The lock on a mount point, held until this process (and any child forked with it) exits.
#[derive(Debug)]
pub struct Claim {
    /// The locked directory; none where it cannot be locked (see [`claim`]).
    _dir: Option<File>,
}

/// Why a mount point could not be claimed.
#[derive(Debug)]
pub enum Refused {
    /// Something is mounted there now (what the mount table says it is).
    Mounted(String),
    /// Another mount holds the lock and neither mounted nor let go within [`WAIT`].
    Held,
    /// The directory could not be opened or locked.
    Io(io::Error),
}

/// Claims `dir` (canonical) for a mount: takes its lock, waiting while another holder has it and
/// nothing is mounted, then checks that nothing is mounted there. `mounted_at` reads the mount
/// table: the file-system type mounted at a path, if any. A directory that cannot be locked at
/// all (not readable by this user, or on a file system without `flock`) is claimed after the
/// mount-table check alone, with a warning.
pub fn claim(
    dir: &Path,
    wait: Duration,
    mounted_at: impl Fn(&Path) -> Option<String>,
) -> Result<Claim, Refused> {
    // A dead FUSE mount there fails the open (ENOTCONN): the table says what it is.
    let file = match File::options()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open(dir)
    {
        Ok(f) => Some(f),
        Err(e) => match mounted_at(dir) {
            Some(fs_type) => return Err(Refused::Mounted(fs_type)),
            None if cannot_lock(&e) => None,
            None => return Err(Refused::Io(e)),
        },
    };
    let Some(file) = file else {
        return unlocked(dir, &mounted_at);
    };
    let deadline = Instant::now() + wait;
    loop {
        // SAFETY: a valid open descriptor.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            break;
        }
        let e = io::Error::last_os_error();
        if cannot_lock(&e) {
            return unlocked(dir, &mounted_at);
        }
        if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
            return Err(Refused::Io(e));
        }
        if let Some(fs_type) = mounted_at(dir) {
            return Err(Refused::Mounted(fs_type));
        }
        if Instant::now() >= deadline {
            return Err(Refused::Held);
        }
        std::thread::sleep(POLL);
    }
    match mounted_at(dir) {
        Some(fs_type) => Err(Refused::Mounted(fs_type)),
        None => Ok(Claim { _dir: Some(file) }),
    }
}

/// Whether `e` says the directory cannot be locked at all (a directory this user may not read,
/// a file system without `flock`), rather than that another mount holds it.
fn cannot_lock(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EACCES | libc::EOPNOTSUPP | libc::ENOLCK | libc::EINVAL | libc::ENOSYS)
    )
}

/// A mount point that cannot be locked is still mounted on, as before claims existed, after
/// the mount-table check alone; a warning says that racing mounts there are not excluded.
fn unlocked(dir: &Path, mounted_at: &impl Fn(&Path) -> Option<String>) -> Result<Claim, Refused> {
    if let Some(fs_type) = mounted_at(dir) {
        return Err(Refused::Mounted(fs_type));
    }
    log::warn!(
        "{}: cannot lock the mount point; another mount started there at the same time would \
         not be refused",
        dir.display()
    );
    Ok(Claim { _dir: None })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    const NOTHING: fn(&Path) -> Option<String> = |_| None;

    #[test]
    fn one_claim_at_a_time_and_a_released_claim_can_be_taken() {
        let d = tempfile::tempdir().unwrap();
        let first = claim(d.path(), WAIT, NOTHING).unwrap();
        assert!(matches!(
            claim(d.path(), Duration::from_millis(50), NOTHING),
            Err(Refused::Held)
        ));
        drop(first);
        claim(d.path(), Duration::ZERO, NOTHING).unwrap();
    }

    #[test]
    fn a_waiting_claim_is_refused_once_the_holder_mounts() {
        let d = tempfile::tempdir().unwrap();
        let first = claim(d.path(), WAIT, NOTHING).unwrap();
        let mounted = AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(100));
                mounted.store(true, Ordering::SeqCst);
            });
            let got = claim(d.path(), WAIT, |_| {
                mounted
                    .load(Ordering::SeqCst)
                    .then(|| "fuse.kpack-fuse".to_owned())
            });
            assert!(matches!(got, Err(Refused::Mounted(t)) if t == "fuse.kpack-fuse"));
        });
        drop(first);
    }

    #[test]
    fn a_waiting_claim_goes_on_once_the_holder_lets_go() {
        let d = tempfile::tempdir().unwrap();
        let first = claim(d.path(), WAIT, NOTHING).unwrap();
        std::thread::scope(|s| {
            s.spawn(move || {
                std::thread::sleep(Duration::from_millis(100));
                drop(first);
            });
            claim(d.path(), WAIT, NOTHING).unwrap();
        });
    }

    #[test]
    fn a_directory_that_cannot_be_read_is_claimed_without_a_lock() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("x-only");
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o311)).unwrap();
        // Root reads any directory: the unreadable case exists only for other users.
        let readable = File::options()
            .read(true)
            .custom_flags(libc::O_DIRECTORY)
            .open(&dir)
            .is_ok();
        let claim = claim(&dir, Duration::ZERO, NOTHING).unwrap();
        assert_eq!(claim._dir.is_some(), readable);
    }

    #[test]
    fn a_mount_found_after_the_lock_is_taken_refuses_the_claim() {
        let d = tempfile::tempdir().unwrap();
        let got = claim(d.path(), WAIT, |_| Some("ext4".to_owned()));
        assert!(matches!(got, Err(Refused::Mounted(t)) if t == "ext4"));
    }
}
