//! All-or-nothing output: every file of a split run is first written (and synced) under a
//! temporary name in its final directory, then all are renamed into place. If writing any of
//! them fails, the temporaries written so far and the directories created for them are removed,
//! so the file system is left as it was. A rename never writes into an existing file: it
//! replaces the directory entry, so a file that shared an inode with an output is not changed.

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// An output that could not be written, synced or renamed into place. Its own type, so that
/// staging knows nothing of the runs that use it (`split` turns it into its `TreeError`).
#[derive(Debug)]
pub struct StageError {
    pub path: PathBuf,
    pub source: io::Error,
}

impl fmt::Display for StageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: cannot write: {}", self.path.display(), self.source)
    }
}

impl std::error::Error for StageError {}

/// Files written under temporary names, waiting to be renamed into place.
#[derive(Default)]
pub struct Staging {
    /// (temporary, final) in the order they will be renamed.
    files: Vec<(PathBuf, PathBuf)>,
    /// Directories this run created, outermost first.
    created_dirs: Vec<PathBuf>,
}

impl Staging {
    /// Creates the temporary file that will become `path`, for the caller to fill; then
    /// [`seal`](Self::seal) it.
    pub fn create(&mut self, path: &Path) -> Result<File, StageError> {
        let fail = |source| StageError {
            path: path.to_path_buf(),
            source,
        };
        let tmp = self.temporary(path).map_err(fail)?;
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .map_err(fail)?;
        // Recorded before writing, so a failed write is cleaned up too.
        self.files.push((tmp, path.to_path_buf()));
        Ok(file)
    }

    /// Stages a symlink to `target` that will become `path`.
    pub fn symlink(&mut self, path: &Path, target: &Path) -> Result<(), StageError> {
        let fail = |source| StageError {
            path: path.to_path_buf(),
            source,
        };
        let tmp = self.temporary(path).map_err(fail)?;
        std::os::unix::fs::symlink(target, &tmp).map_err(fail)?;
        self.files.push((tmp, path.to_path_buf()));
        Ok(())
    }

    /// The temporary name for `path`, in its directory (created as needed) and free: a
    /// leftover of a crashed run is removed (a symlink as a link, never its target), and the
    /// caller creates it exclusively, so nothing placed there meanwhile is followed.
    fn temporary(&mut self, path: &Path) -> io::Result<PathBuf> {
        let dir = path
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        self.create_dirs(dir)?;
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let tmp = dir.join(format!(".{name}.split{}", std::process::id()));
        let _ = std::fs::remove_file(&tmp);
        Ok(tmp)
    }

    /// Gives a filled temporary its permissions and syncs it.
    pub fn seal(file: &File, path: &Path, mode: u32) -> Result<(), StageError> {
        file.set_permissions(std::fs::Permissions::from_mode(mode & 0o7777))
            .and_then(|_| file.sync_all())
            .map_err(|source| StageError {
                path: path.to_path_buf(),
                source,
            })
    }

    /// Renames every staged file into place, in staging order.
    pub fn commit(mut self) -> Result<(), StageError> {
        // From here on the directories hold (or will hold) outputs: never remove them.
        self.created_dirs.clear();
        while !self.files.is_empty() {
            let (tmp, path) = self.files.remove(0);
            if let Err(source) = std::fs::rename(&tmp, &path) {
                let _ = std::fs::remove_file(&tmp);
                return Err(StageError { path, source });
            }
        }
        Ok(())
    }

    /// `create_dir_all`, remembering which directories did not exist before.
    fn create_dirs(&mut self, dir: &Path) -> io::Result<()> {
        let mut missing = Vec::new();
        let mut at = Some(dir);
        while let Some(d) = at.filter(|d| !d.as_os_str().is_empty()) {
            if d.is_dir() {
                break;
            }
            missing.push(d.to_path_buf());
            at = d.parent();
        }
        for d in missing.into_iter().rev() {
            match std::fs::create_dir(&d) {
                Ok(()) => self.created_dirs.push(d),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists && d.is_dir() => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

impl Drop for Staging {
    /// Whatever was not renamed into place is removed, then the directories created for it
    /// (innermost first; only empty ones go).
    fn drop(&mut self) {
        for (tmp, _) in &self.files {
            let _ = std::fs::remove_file(tmp);
        }
        for d in self.created_dirs.iter().rev() {
            let _ = std::fs::remove_dir(d);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// What the split does with each output: create, fill, seal.
    fn stage(s: &mut Staging, path: &Path, bytes: &[u8], mode: u32) -> Result<(), StageError> {
        let mut file = s.create(path)?;
        file.write_all(bytes).unwrap();
        Staging::seal(&file, path, mode)
    }

    #[test]
    fn a_symlink_at_the_temporary_name_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, b"keep").unwrap();
        let out = dir.path().join("out.so");
        std::os::unix::fs::symlink(
            &victim,
            dir.path()
                .join(format!(".out.so.split{}", std::process::id())),
        )
        .unwrap();
        let mut s = Staging::default();
        stage(&mut s, &out, b"new", 0o640).unwrap();
        s.commit().unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
        assert_eq!(std::fs::read(&out).unwrap(), b"new");
        assert_eq!(
            std::fs::metadata(&out).unwrap().permissions().mode() & 0o777,
            0o640
        );
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2);
    }

    #[test]
    fn a_failed_stage_removes_temporaries_and_created_directories() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("blocker"), b"x").unwrap();
        let mut s = Staging::default();
        stage(&mut s, &dir.path().join("a/b/one"), b"1", 0o644).unwrap();
        assert!(
            dir.path()
                .join(format!("a/b/.one.split{}", std::process::id()))
                .is_file()
        );
        let e = stage(&mut s, &dir.path().join("blocker/two"), b"2", 0o644).unwrap_err();
        assert!(e.path.ends_with("blocker/two"), "{e}");
        drop(s);
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left, ["blocker"]);
    }
}
