//! Writing a file all or nothing: the bytes go to a temporary file beside the target
//! (`.NAME.tmpPID` in its directory), renamed over the target once complete, so readers see the
//! old file or the whole new one, and a write that fails leaves the old target untouched and no
//! temporary file behind. The one implementation for the archive writer, the pack pipeline and
//! the Python binding; each keeps its own wording of errors ([`AtomicError`] says which step
//! failed) and says whether the file is flushed to disk before the rename.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

use crate::error::Error;

/// How a file is written.
#[derive(Debug, Clone, Copy, Default)]
pub struct Options {
    /// Create the target's directory (and its parents) first.
    pub create_parents: bool,
    /// Flush the file to disk (`fsync`) before the rename, so that after a crash the target is
    /// the old file or the whole new one, never an empty or a partial one.
    pub sync: bool,
}

impl Options {
    /// Flushed to disk before the rename, into an existing directory: how the library writes
    /// archives.
    pub const DURABLE: Options = Options {
        create_parents: false,
        sync: true,
    };
}

/// The step of a write that failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// The target names no file (`/`, `dir/..`).
    Name,
    /// Creating the target's directory ([`Options::create_parents`]).
    Parents,
    /// Creating the temporary file.
    Create,
    /// Flushing the file to disk ([`Options::sync`]).
    Sync,
    /// Renaming the temporary file over the target.
    Rename,
}

/// Why a write failed: the step, the target, and the error of the system call (for
/// [`Step::Name`], an `InvalidInput` error saying `TARGET: not a file path`).
#[derive(Debug)]
pub struct AtomicError {
    pub step: Step,
    pub path: PathBuf,
    pub source: io::Error,
}

/// The system call's error, for callers that word errors themselves.
impl From<AtomicError> for io::Error {
    fn from(e: AtomicError) -> io::Error {
        e.source
    }
}

/// The core's error, naming the target (the temporary file is our detail): `TARGET: cannot
/// create: ...`, `cannot sync`, `cannot rename into place`; a target that names no file is an
/// invalid argument.
impl From<AtomicError> for Error {
    fn from(e: AtomicError) -> Error {
        let what = match e.step {
            Step::Name => return Error::InvalidArgument(e.source.to_string()),
            Step::Parents => "cannot create its directory",
            Step::Create => "cannot create",
            Step::Sync => "cannot sync",
            Step::Rename => "cannot rename into place",
        };
        Error::io(e.path, what, e.source)
    }
}

/// A file being written in place of a target. [`commit`](Self::commit) renames it over the
/// target; dropped without that (a failed write, a panic), it removes the temporary file.
#[derive(Debug)]
pub struct AtomicFile {
    target: PathBuf,
    tmp: PathBuf,
    sync: bool,
    committed: bool,
}

impl AtomicFile {
    /// Creates the temporary file for `path`; write it through the [`File`] returned, then
    /// hand that to [`commit`](Self::commit).
    pub fn create(path: &Path, opts: Options) -> Result<(AtomicFile, File), AtomicError> {
        let fail = |step, source| AtomicError {
            step,
            path: path.to_path_buf(),
            source,
        };
        let dir = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        if opts.create_parents {
            std::fs::create_dir_all(dir).map_err(|e| fail(Step::Parents, e))?;
        }
        let name = path.file_name().ok_or_else(|| {
            let why = format!("{}: not a file path", path.display());
            fail(Step::Name, io::Error::new(io::ErrorKind::InvalidInput, why))
        })?;
        let tmp = dir.join(format!(
            ".{}.tmp{}",
            name.to_string_lossy(),
            std::process::id()
        ));
        // Held before the file is made, so that whatever is left at that path by a failed
        // create goes too.
        let guard = AtomicFile {
            target: path.to_path_buf(),
            tmp,
            sync: opts.sync,
            committed: false,
        };
        let file = File::create(&guard.tmp).map_err(|e| fail(Step::Create, e))?;
        Ok((guard, file))
    }

    /// Where the bytes are written until the commit.
    pub fn temp_path(&self) -> &Path {
        &self.tmp
    }

    /// Makes `file` (the one [`create`](Self::create) returned, now complete) the target:
    /// flushed to disk first when [`Options::sync`] says so, closed, then renamed over the
    /// target. On failure the temporary file is removed and the target left as it was.
    pub fn commit(mut self, file: File) -> Result<(), AtomicError> {
        let fail = |step, source| AtomicError {
            step,
            path: self.target.clone(),
            source,
        };
        if self.sync {
            file.sync_all().map_err(|e| fail(Step::Sync, e))?;
        }
        drop(file);
        std::fs::rename(&self.tmp, &self.target).map_err(|e| fail(Step::Rename, e))?;
        self.committed = true;
        Ok(())
    }
}

impl Drop for AtomicFile {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    const SYNC: Options = Options::DURABLE;

    /// The names in `dir`, sorted.
    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn a_commit_replaces_the_target_and_leaves_no_temporary_file() {
        let d = tempfile::tempdir().unwrap();
        let target = d.path().join("a.kpack");
        std::fs::write(&target, b"old").unwrap();
        let (guard, mut file) = AtomicFile::create(&target, SYNC).unwrap();
        let tmp = guard.temp_path().to_path_buf();
        assert_eq!(
            tmp,
            d.path().join(format!(".a.kpack.tmp{}", std::process::id()))
        );
        file.write_all(b"new bytes").unwrap();
        // Until the commit, readers see the old file.
        assert_eq!(std::fs::read(&target).unwrap(), b"old");
        guard.commit(file).unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), b"new bytes");
        assert_eq!(names(d.path()), ["a.kpack"]);
    }

    #[test]
    fn a_failed_write_leaves_the_old_target_and_no_temporary_file() {
        let d = tempfile::tempdir().unwrap();
        let target = d.path().join("a.kpack");
        std::fs::write(&target, b"old").unwrap();
        let (guard, mut file) = AtomicFile::create(&target, SYNC).unwrap();
        file.write_all(b"half").unwrap();
        assert!(guard.temp_path().exists());
        // The writer failed: the file goes without a commit.
        drop((guard, file));
        assert_eq!(std::fs::read(&target).unwrap(), b"old");
        assert_eq!(names(d.path()), ["a.kpack"]);
    }

    #[test]
    fn a_failed_rename_leaves_the_target_and_no_temporary_file() {
        let d = tempfile::tempdir().unwrap();
        // A non-empty directory cannot be replaced by a file.
        let target = d.path().join("a.kpack");
        std::fs::create_dir(&target).unwrap();
        std::fs::write(target.join("inside"), b"x").unwrap();
        let (guard, file) = AtomicFile::create(&target, SYNC).unwrap();
        let e = guard.commit(file).unwrap_err();
        assert_eq!(e.step, Step::Rename);
        assert_eq!(e.path, target);
        assert_eq!(names(d.path()), ["a.kpack"]);
        assert_eq!(names(&target), ["inside"]);
        let core = Error::from(e).to_string();
        assert!(
            core.starts_with(&format!("{}: cannot rename into place: ", target.display())),
            "{core}"
        );
    }

    #[test]
    fn a_missing_directory_is_an_error_unless_parents_are_created() {
        let d = tempfile::tempdir().unwrap();
        let target = d.path().join("x/y/a.kpack");
        let e = AtomicFile::create(&target, SYNC).unwrap_err();
        assert_eq!(e.step, Step::Create);
        assert_eq!(e.source.kind(), io::ErrorKind::NotFound);
        let core = Error::from(e).to_string();
        assert!(
            core.starts_with(&format!("{}: cannot create: ", target.display())),
            "{core}"
        );
        assert!(names(d.path()).is_empty());

        let opts = Options {
            create_parents: true,
            sync: false,
        };
        let (guard, mut file) = AtomicFile::create(&target, opts).unwrap();
        file.write_all(b"k").unwrap();
        guard.commit(file).unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), b"k");
        assert_eq!(names(&d.path().join("x/y")), ["a.kpack"]);
    }

    #[test]
    fn a_path_without_a_file_name_is_refused_before_anything_is_made() {
        let d = tempfile::tempdir().unwrap();
        let target = d.path().join("sub/..");
        let e = AtomicFile::create(&target, SYNC).unwrap_err();
        assert_eq!(e.step, Step::Name);
        let why = format!("{}: not a file path", target.display());
        assert_eq!(e.source.kind(), io::ErrorKind::InvalidInput);
        assert_eq!(e.source.to_string(), why);
        assert!(matches!(Error::from(e), Error::InvalidArgument(m) if m == why));
        assert!(names(d.path()).is_empty());
    }
}
