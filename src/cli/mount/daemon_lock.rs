//! How `kpack-fuse unmount` knows that a daemon has let go of its mount, and what each live
//! daemon holds. Each daemon holds an exclusive lock on a file `mount-MAJOR:MINOR-PID.lock`
//! (its mount's device number and its own PID) in a runtime directory, for as long as it
//! lives; `unmount` opens the files of the mount's device before it unmounts, and afterwards
//! waits to take their locks, which the kernel releases when the daemon exits. Unmounting a
//! user's mount as another user (root) finds no lock and does not wait.
//!
//! The file says, one `name value` per line, the daemon's `pid`, its `mountpoint` and where
//! its backing files are (`scratch_dir` for the per-mount directory, `cache_dir` for a cache
//! directory; neither with memory backing). A daemon removes its file as it exits; one that
//! was killed leaves it, unlocked: the next daemon to take its own lock removes every file
//! nobody holds, with the per-mount directory it names when that directory's daemon is gone
//! too (a cache directory is never removed).

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use std::{fs, io};

use rocm_kpack::fs::store::remove_dead_scratch_dir;

/// Where a daemon's backing files are, as its lock file records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backing {
    /// The per-mount directory, removed with the daemon.
    Scratch(PathBuf),
    /// A persistent cache directory, never removed.
    CacheDir(PathBuf),
}

impl Backing {
    pub fn dir(&self) -> &Path {
        match self {
            Backing::Scratch(d) | Backing::CacheDir(d) => d,
        }
    }
}

const SCRATCH_DIR: &str = "scratch_dir ";

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

/// Whether `path` still names the file `file` is open on.
fn names(path: &Path, file: &File) -> bool {
    match (fs::symlink_metadata(path), file.metadata()) {
        (Ok(named), Ok(ours)) => named.dev() == ours.dev() && named.ino() == ours.ino(),
        _ => false,
    }
}

/// Takes the lock for the mount with `device` at `mountpoint`, whose backing files are in
/// `backing`, held until [`Held::retire`] and the process's exit; removes first the files
/// that dead daemons left (see the module's text).
pub fn hold(device: (u32, u32), mountpoint: &Path, backing: Option<&Backing>) -> io::Result<Held> {
    use std::os::unix::fs::DirBuilderExt;
    let dir = runtime_dir();
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)?;
    let removed = remove_stale(&dir);
    if removed > 0 {
        log::info!(
            "removed {removed} lock file{} of daemons that are gone from {}",
            if removed == 1 { "" } else { "s" },
            dir.display()
        );
    }
    let path = dir.join(format!("{}{}.lock", prefix(device), std::process::id()));
    let mut record = format!(
        "pid {}\nmountpoint {}\n",
        std::process::id(),
        mountpoint.display()
    );
    match backing {
        Some(Backing::Scratch(d)) => record.push_str(&format!("{SCRATCH_DIR}{}\n", d.display())),
        Some(Backing::CacheDir(d)) => record.push_str(&format!("cache_dir {}\n", d.display())),
        None => {}
    }
    // Another daemon's cleanup may take the new file for a dead one's between its creation
    // and its lock, and remove it: a file whose name no longer leads to it is made again.
    for _ in 0..8 {
        let mut file = File::create(&path)?;
        flock(&file, libc::LOCK_EX)?;
        if names(&path, &file) {
            file.write_all(record.as_bytes())?;
            return Ok(Held { path, file });
        }
    }
    Err(io::Error::other("removed by other daemons as it was made"))
}

/// Removes the lock files under `dir` that no process holds (their daemon is gone), with the
/// per-mount directory each names when its daemon is gone too; returns how many.
fn remove_stale(dir: &Path) -> usize {
    let Ok(entries) = fs::read_dir(dir) else {
        return 0;
    };
    let mut removed = 0;
    for e in entries.flatten() {
        let name = e.file_name();
        let name = name.to_string_lossy();
        if !(name.starts_with("mount-") && name.ends_with(".lock")) {
            continue;
        }
        let path = e.path();
        let Ok(mut file) = File::options()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(&path)
        else {
            continue;
        };
        // Held across the removal: a daemon that locks it after that finds its name gone.
        if flock(&file, libc::LOCK_EX | libc::LOCK_NB).is_err() || !names(&path, &file) {
            continue;
        }
        let mut record = String::new();
        let _ = (&mut file).take(64 << 10).read_to_string(&mut record);
        for scratch in record.lines().filter_map(|l| l.strip_prefix(SCRATCH_DIR)) {
            if remove_dead_scratch_dir(Path::new(scratch)) {
                log::info!("removed {scratch}, the scratch directory of a daemon that is gone");
            }
        }
        if fs::remove_file(&path).is_ok() {
            removed += 1;
        }
    }
    removed
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
        let held = hold(device, Path::new("/mnt/x"), None).unwrap();
        assert_eq!(
            fs::read_to_string(&held.path).unwrap(),
            format!("pid {}\nmountpoint /mnt/x\n", std::process::id())
        );
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

    /// A killed daemon's lock file (nobody holds it) goes, with the scratch directory it names
    /// when that one is dead too; a live daemon's file, and its directory, stay.
    #[test]
    fn the_next_daemon_removes_dead_daemons_lock_files_and_directories() {
        let base = tempfile::tempdir().unwrap();
        // A PID no process has.
        let dead_dir = base.path().join("kpack-fuse.999999999-1f");
        fs::create_dir(&dead_dir).unwrap();
        let live_dir = base.path().join("kpack-fuse.999999998-2f");
        fs::create_dir(&live_dir).unwrap();
        let minor = 1_049_000 + std::process::id() % 1000;
        let dead = runtime_dir().join(format!("mount-4095:{minor}-999999999.lock"));
        fs::create_dir_all(runtime_dir()).unwrap();
        fs::write(
            &dead,
            format!(
                "pid 999999999\nmountpoint /mnt/d\n{SCRATCH_DIR}{}\n",
                dead_dir.display()
            ),
        )
        .unwrap();
        let live = hold(
            (4095, minor + 1),
            Path::new("/mnt/l"),
            Some(&Backing::Scratch(live_dir.clone())),
        )
        .unwrap();
        // What the live daemon's store holds on its directory.
        let live_dir_lock = File::open(&live_dir).unwrap();
        flock(&live_dir_lock, libc::LOCK_EX).unwrap();
        assert!(!dead.exists() && !dead_dir.exists());
        // The next one finds the live daemon's file and directory held.
        let next = hold((4095, minor + 2), Path::new("/mnt/n"), None).unwrap();
        assert!(live.path.exists() && live_dir.exists());
        for h in [live, next] {
            h.retire();
        }
    }
}
