//! The per-mount scratch directory of disk backing: `BASE/kpack-fuse.PID-STAMP` under
//! `--scratch-dir` (default `/var/tmp`), where PID is the process that serves the mount (the
//! daemon, not the command that started it: the directory is made by the daemon, at
//! [`ScratchDir::start`] or its first file) and STAMP its creation time (nanoseconds, hex).
//!
//! Backing files are unlinked the moment they are made, so the directory holds no names; what
//! it holds shows in `df`, not in `du`. The daemon holds an exclusive `flock` on the directory
//! for its whole life, which the kernel drops when it dies, however it dies: that lock, not
//! the PID, tells a live mount's directory from a dead one's. Before making its own, a daemon
//! removes every directory of this form beside it whose lock it can take and whose PID runs no
//! process ([`remove_dead_in`]), so a SIGKILL leaves an empty directory only until the next
//! mount on the same base. Directories named `kpack-fuse.PID.STAMP` (with a dot: made by
//! versions before the lock, named after the command) are never touched: their daemon may
//! still live.
//!
//! A directory removed under a live mount (an over-eager cleanup) is made again at the same
//! path by the next file that needs it ([`ScratchDir::new_file`]), with a warning.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::sync::lock;

/// What every scratch directory's name starts with.
pub const PREFIX: &str = "kpack-fuse.";

/// The PID in the name of a scratch directory of this form (`kpack-fuse.PID-STAMP`).
pub fn pid_of(name: &str) -> Option<u32> {
    let (pid, stamp) = name.strip_prefix(PREFIX)?.split_once('-')?;
    let digits = |s: &str, hex: bool| {
        !s.is_empty()
            && s.len() <= 32
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (hex && b.is_ascii_hexdigit()))
    };
    if !digits(pid, false) || !digits(stamp, true) {
        return None;
    }
    pid.parse().ok()
}

/// Whether a process `pid` exists (in this PID namespace).
fn pid_alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    if pid <= 0 {
        return false;
    }
    // SAFETY: signal 0 only checks that the process exists.
    let sent = unsafe { libc::kill(pid, 0) } == 0;
    sent || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

fn flock(file: &File, op: libc::c_int) -> io::Result<()> {
    // SAFETY: flock on a descriptor we own.
    if unsafe { libc::flock(file.as_raw_fd(), op) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Opens the directory `path` itself (not a link to one), to lock it.
fn open_dir(path: &Path) -> io::Result<File> {
    File::options()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
        .open(path)
}

/// Whether `path` still names the directory `dir` is open on.
fn names(path: &Path, dir: &File) -> bool {
    match (std::fs::symlink_metadata(path), dir.metadata()) {
        (Ok(named), Ok(ours)) => named.dev() == ours.dev() && named.ino() == ours.ino(),
        _ => false,
    }
}

/// A scratch directory this process made, and holds locked.
struct Made {
    path: PathBuf,
    /// The directory, open and locked until the process exits.
    lock: File,
}

impl Made {
    /// Makes the directory at `path` and locks it.
    fn at(path: PathBuf) -> io::Result<Made> {
        std::fs::DirBuilder::new().mode(0o700).create(&path)?;
        let dir = open_dir(&path)?;
        match flock(&dir, libc::LOCK_EX | libc::LOCK_NB) {
            Ok(()) => {}
            // A file system without flock (some network file systems): the directory is
            // still used, and nothing ever takes it for a dead one (no lock can be taken).
            Err(e) if e.raw_os_error() != Some(libc::EWOULDBLOCK) => {
                log::debug!("{}: cannot lock: {e}", path.display());
            }
            Err(e) => return Err(e),
        }
        // Only the lock keeps other mounts' cleanup away; one that found the directory
        // before it was locked may have removed it.
        if !names(&path, &dir) {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                "removed while it was made",
            ));
        }
        Ok(Made { path, lock: dir })
    }

    /// Makes a new directory under `base`, named after this process.
    fn new_in(base: &Path) -> io::Result<Made> {
        let mut last = None;
        for _ in 0..4 {
            let stamp = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos());
            let path = base.join(format!("{PREFIX}{}-{stamp:x}", std::process::id()));
            match Made::at(path.clone()) {
                Ok(m) => return Ok(m),
                Err(e) => last = Some(io::Error::new(e.kind(), format!("{}: {e}", path.display()))),
            }
        }
        Err(last.expect("tried at least once"))
    }

    fn in_place(&self) -> bool {
        names(&self.path, &self.lock)
    }
}

/// The per-mount directory under a base, made when first needed (see the module's text).
pub struct ScratchDir {
    base: PathBuf,
    made: Mutex<Option<Made>>,
}

impl ScratchDir {
    /// A scratch directory to be made under `base` (nothing is made yet).
    pub fn new(base: PathBuf) -> ScratchDir {
        ScratchDir {
            base,
            made: Mutex::new(None),
        }
    }

    /// The directory, made now if it is not yet (named after this process), once the
    /// directories that dead daemons left beside it are removed.
    pub fn start(&self) -> io::Result<PathBuf> {
        let mut made = lock(&self.made);
        if let Some(m) = &*made {
            return Ok(m.path.clone());
        }
        let removed = remove_dead_in(&self.base);
        if removed > 0 {
            log::info!(
                "removed {removed} scratch director{} of daemons that are gone from {}",
                if removed == 1 { "y" } else { "ies" },
                self.base.display()
            );
        }
        let m = Made::new_in(&self.base)?;
        let path = m.path.clone();
        *made = Some(m);
        Ok(path)
    }

    /// The directory, once made.
    pub fn path(&self) -> Option<PathBuf> {
        lock(&self.made).as_ref().map(|m| m.path.clone())
    }

    /// A new file `k<n>` in the directory, already unlinked: it lives as long as it is open.
    /// The directory is made if it is not yet, and made again if it was removed. The error
    /// names the path it happened on.
    pub fn new_file(&self, n: u64) -> Result<File, (PathBuf, io::Error)> {
        let dir = self.start().map_err(|e| (self.base.clone(), e))?;
        let path = dir.join(format!("k{n}"));
        match create_unlinked(&path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let dir = self.remake(&dir).map_err(|e| (dir.clone(), e))?;
                let path = dir.join(format!("k{n}"));
                create_unlinked(&path).map_err(|e| (path, e))
            }
            made => made.map_err(|e| (path, e)),
        }
    }

    /// Makes the directory `gone` again (someone removed it), at the same path if it can.
    fn remake(&self, gone: &Path) -> io::Result<PathBuf> {
        let mut made = lock(&self.made);
        if let Some(m) = &*made {
            // Another thread made it again already.
            if m.path != gone || m.in_place() {
                return Ok(m.path.clone());
            }
        }
        let m = Made::at(gone.to_owned()).or_else(|_| Made::new_in(&self.base))?;
        log::warn!(
            "{}: the scratch directory was removed while mounted; made {} again",
            gone.display(),
            m.path.display()
        );
        let path = m.path.clone();
        *made = Some(m);
        Ok(path)
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        if let Some(m) = lock(&self.made).take() {
            // Its files were unlinked when made; only the directory itself remains.
            if m.in_place() {
                let _ = std::fs::remove_dir(&m.path);
            }
        }
    }
}

fn create_unlinked(path: &Path) -> io::Result<File> {
    let file = File::options()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    let _ = std::fs::remove_file(path);
    Ok(file)
}

/// Removes the scratch directories under `base` that dead daemons left (see
/// [`remove_if_dead`]); returns how many.
pub fn remove_dead_in(base: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(base) else {
        return 0;
    };
    entries
        .flatten()
        .filter(|e| e.file_name().to_str().and_then(pid_of).is_some())
        .filter(|e| remove_if_dead(&e.path()))
        .count()
}

/// Removes the scratch directory at `path` if it is one (`kpack-fuse.PID-STAMP`, a real
/// directory) whose daemon is gone: no process holds its lock, and no process has its PID.
/// What a killed daemon may have left in it (a file made and not yet unlinked, `k<N>`) goes
/// with it; anything else keeps it in place. Returns whether it was removed.
pub fn remove_if_dead(path: &Path) -> bool {
    let Some(pid) = path.file_name().and_then(|n| n.to_str()).and_then(pid_of) else {
        return false;
    };
    if pid_alive(pid) {
        return false;
    }
    let Ok(dir) = open_dir(path) else {
        return false;
    };
    // Held across the removal: a daemon that locks it after that finds its name gone.
    if flock(&dir, libc::LOCK_EX | libc::LOCK_NB).is_err() || !names(path, &dir) {
        return false;
    }
    if let Ok(entries) = std::fs::read_dir(path) {
        for e in entries.flatten() {
            let name = e.file_name();
            let leftover = name.to_str().is_some_and(|n| {
                n.strip_prefix('k')
                    .is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
            });
            if leftover && e.file_type().is_ok_and(|t| t.is_file()) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
    std::fs::remove_dir(path).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A PID no process has (above any `pid_max`).
    const DEAD: u32 = 999_999_999;

    #[test]
    fn names_carry_the_pid_of_the_process_that_made_them() {
        assert_eq!(pid_of("kpack-fuse.123-17a2b"), Some(123));
        for other in [
            "kpack-fuse.123.17a2b",
            "kpack-fuse.-17a2b",
            "kpack-fuse.12x-1",
            "kpack-fuse.12-",
            "kpack-fuse.12-xyz",
            "other.12-1",
        ] {
            assert_eq!(pid_of(other), None, "{other}");
        }
        let base = tempfile::tempdir().unwrap();
        let s = ScratchDir::new(base.path().to_owned());
        assert_eq!(s.path(), None, "made only when needed");
        let dir = s.start().unwrap();
        let name = dir.file_name().unwrap().to_str().unwrap();
        assert_eq!(pid_of(name), Some(std::process::id()));
        assert_eq!(s.start().unwrap(), dir, "made once");
        drop(s);
        assert!(!dir.exists(), "removed with the store");
    }

    /// A dead daemon's directory (its lock free, its PID gone) is removed by the next one,
    /// with what a kill left in it; a live one's (locked) and an old-style name stay.
    #[test]
    fn the_next_mount_removes_dead_daemons_directories_only() {
        let base = tempfile::tempdir().unwrap();
        let live = ScratchDir::new(base.path().to_owned());
        let live_dir = live.start().unwrap();
        let dead = base.path().join(format!("{PREFIX}{DEAD}-1f"));
        std::fs::create_dir(&dead).unwrap();
        std::fs::write(dead.join("k7"), b"left by a kill").unwrap();
        let dead_but_odd = base.path().join(format!("{PREFIX}{DEAD}-2f"));
        std::fs::create_dir(&dead_but_odd).unwrap();
        std::fs::write(dead_but_odd.join("notes"), b"someone else's").unwrap();
        // A live PID with no lock: a daemon between making its directory and locking it.
        let unlocked_live = base
            .path()
            .join(format!("{PREFIX}{}-3f", std::process::id()));
        std::fs::create_dir(&unlocked_live).unwrap();
        let old_style = base.path().join(format!("{PREFIX}{DEAD}.4f"));
        std::fs::create_dir(&old_style).unwrap();
        // Locked by a live daemon though its PID is gone (another PID namespace).
        let other_ns = base.path().join(format!("{PREFIX}{}-5f", DEAD - 1));
        std::fs::create_dir(&other_ns).unwrap();
        let held = open_dir(&other_ns).unwrap();
        flock(&held, libc::LOCK_EX).unwrap();

        let next = ScratchDir::new(base.path().to_owned());
        let next_dir = next.start().unwrap();
        assert!(!dead.exists());
        for stays in [
            &live_dir,
            &dead_but_odd,
            &unlocked_live,
            &old_style,
            &other_ns,
        ] {
            assert!(stays.exists(), "{}", stays.display());
        }
        assert!(next_dir.exists() && next_dir != live_dir);
        // A directory removed under a live mount is made again by its next file.
        std::fs::remove_dir(&live_dir).unwrap();
        let f = live.new_file(1).unwrap();
        assert!(f.metadata().unwrap().is_file());
        assert_eq!(live.path().unwrap(), live_dir);
        assert!(live_dir.is_dir());
        assert!(!remove_if_dead(&live_dir), "locked again");
    }
}
