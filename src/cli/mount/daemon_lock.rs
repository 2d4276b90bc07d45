//! How `kpack-fuse unmount` knows that a daemon has let go of its mount. Each daemon holds an
//! exclusive lock on a file named by its mount's device number and its pid, in a runtime
//! directory, for as long as it lives; `unmount` opens the files of the mount's device before it
//! unmounts, and afterwards waits to take their locks, which the kernel releases when the daemon
//! exits. Unmounting a user's mount as another user (root) finds no lock and does not wait.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Where the lock files are: `/run/kpack-fuse` for root, else `$XDG_RUNTIME_DIR/kpack-fuse` or
/// a per-user directory under the temporary directory.
fn runtime_dir() -> PathBuf {
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    if uid == 0 {
        return PathBuf::from("/run/kpack-fuse");
    }
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(d) if !d.is_empty() => PathBuf::from(d).join("kpack-fuse"),
        _ => std::env::temp_dir().join(format!("kpack-fuse-{uid}")),
    }
}

fn prefix((major, minor): (u32, u32)) -> String {
    format!("mount-{major}:{minor}-")
}

fn flock(file: &File, op: libc::c_int) -> io::Result<()> {
    // SAFETY: a valid open descriptor.
    if unsafe { libc::flock(file.as_raw_fd(), op) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// A daemon's lock on its mount.
pub struct Held {
    path: PathBuf,
    file: File,
}

/// Takes the lock for the mount with `device`, held until [`Held::retire`] and the process's
/// exit.
pub fn hold(device: (u32, u32)) -> io::Result<Held> {
    use std::os::unix::fs::DirBuilderExt;
    let dir = runtime_dir();
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)?;
    let path = dir.join(format!("{}{}.lock", prefix(device), std::process::id()));
    let file = File::create(&path)?;
    flock(&file, libc::LOCK_EX)?;
    Ok(Held { path, file })
}

impl Held {
    /// The daemon is about to exit: the file goes, and the lock with the process.
    pub fn retire(self) {
        let _ = std::fs::remove_file(&self.path);
        std::mem::forget(self.file);
    }
}

/// The lock files of the daemons of the mount with `device`, opened (so that none is missed
/// once the mount is gone).
pub fn holders(device: (u32, u32)) -> Vec<File> {
    let prefix = prefix(device);
    let Ok(dir) = std::fs::read_dir(runtime_dir()) else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .filter_map(|e| File::open(e.path()).ok())
        .collect()
}

/// Waits, up to `limit`, until every holder has let go; whether they all did.
pub fn wait_released(holders: &[File], limit: Duration) -> bool {
    let start = Instant::now();
    holders.iter().all(|f| {
        loop {
            match flock(f, libc::LOCK_EX | libc::LOCK_NB) {
                Ok(()) => break true,
                Err(e) if e.raw_os_error() == Some(libc::EWOULDBLOCK) => {
                    if start.elapsed() > limit {
                        break false;
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(_) => break true,
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_lock_is_waited_for_and_released_with_its_holder() {
        // A device number no real mount has, so that nothing else shares these files.
        let device = (4095, 1_048_000 + std::process::id() % 1000);
        let held = hold(device).unwrap();
        let waiting = holders(device);
        assert_eq!(waiting.len(), 1);
        assert!(!wait_released(&waiting, Duration::from_millis(50)));
        let path = held.path.clone();
        // What the process's exit does to the lock, done by hand.
        drop(held.file);
        assert!(wait_released(&waiting, Duration::from_secs(5)));
        std::fs::remove_file(path).unwrap();
        assert!(holders(device).is_empty());
    }
}
