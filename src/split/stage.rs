//! All-or-nothing output: every file of a split run is first written (and synced) under a
//! temporary name in its final directory, then all are renamed into place. If writing any of
//! them fails, the temporaries written so far and the directories created for them are removed,
//! so the file system is left as it was. A rename never writes into an existing file: it
//! replaces the directory entry, so a file that shared an inode with an output is not changed.

use std::fs::File;
use std::io::{self, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::tree::TreeError;

/// Files written under temporary names, waiting to be renamed into place.
#[derive(Default)]
pub struct Staging {
    /// (temporary, final) in the order they will be renamed.
    files: Vec<(PathBuf, PathBuf)>,
    /// Directories this run created, outermost first.
    created_dirs: Vec<PathBuf>,
}

impl Staging {
    /// Writes `bytes` to a temporary name beside `path`, with permissions `mode`.
    pub fn stage(&mut self, path: &Path, bytes: &[u8], mode: u32) -> Result<(), TreeError> {
        let fail = |source| TreeError::Write { path: path.to_path_buf(), source };
        let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
        self.create_dirs(dir).map_err(fail)?;
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let tmp = dir.join(format!(".{name}.split{}", std::process::id()));
        // Recorded before writing, so a failed write is cleaned up too.
        self.files.push((tmp.clone(), path.to_path_buf()));
        let mut file = File::create(&tmp).map_err(fail)?;
        file.write_all(bytes)
            .and_then(|_| file.set_permissions(std::fs::Permissions::from_mode(mode & 0o7777)))
            .and_then(|_| file.sync_all())
            .map_err(fail)
    }

    /// Renames every staged file into place, in staging order.
    pub fn commit(mut self) -> Result<(), TreeError> {
        // From here on the directories hold (or will hold) outputs: never remove them.
        self.created_dirs.clear();
        while !self.files.is_empty() {
            let (tmp, path) = self.files.remove(0);
            if let Err(source) = std::fs::rename(&tmp, &path) {
                let _ = std::fs::remove_file(&tmp);
                return Err(TreeError::Write { path, source });
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
