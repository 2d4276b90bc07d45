//! Where an archive's bytes come from. `Archive` reads only through [`ByteSource`], so a local
//! file and a remote object (served by the program, not the library) share every parsing and
//! validation rule. This module owns the trait and the local-file implementation.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use crate::error::{Error, Result};

/// Positioned, shareable access to the bytes of one archive.
// The trait's shape is fixed by the design shared with the remote sources; an empty source is
// simply an archive that fails to open.
#[allow(clippy::len_without_is_empty)]
pub trait ByteSource: Send + Sync + std::fmt::Debug {
    /// Positioned read; may return short only at end of source.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize>;
    fn len(&self) -> u64;
    /// What to show in messages and `user.kpack.archive` (a path or a URL).
    fn display_name(&self) -> String;
    /// Stable token that changes when the underlying object changes (local: dev, ino, len,
    /// mtime; remote: ETag or Last-Modified+length). Used in cache-dir keys.
    fn identity(&self) -> String;
    /// Err if the object changed since open (local: len/mtime; remote: ETag), so bytes are
    /// never mixed.
    fn check_unchanged(&self) -> Result<()>;
    /// Hint that [offset, offset+len) will be read soon / only these bytes are needed (fadvise
    /// for files).
    fn will_need(&self, _offset: u64, _len: u64) {}
    /// The bytes read from [offset, offset+len) failed their check (digest, size word, decode):
    /// a source that keeps copies of fetched bytes drops them, so the next read fetches them
    /// again instead of failing the same way for as long as the archive is open.
    fn forget(&self, _offset: u64, _len: u64) {}
    /// When the object was last modified, if the source knows (shown as the mount's times).
    fn modified(&self) -> Option<SystemTime> {
        None
    }
}

/// Fills `buf` from `offset`, retrying short reads and interruptions; returns how many bytes were
/// read (fewer than `buf.len()` only at the end of the source).
pub(crate) fn read_full_at(src: &dyn ByteSource, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    crate::bytes::read_full_with(|b, at| src.read_at(b, at), buf, offset)
}

/// A local file, opened once and read with `pread`.
#[derive(Debug)]
pub struct LocalFile {
    path: PathBuf,
    file: File,
    len: u64,
    modified: Option<SystemTime>,
    dev: u64,
    ino: u64,
}

impl LocalFile {
    /// Opens `path` for reading. A directory is refused the way the reference refuses it (too
    /// short for a header). Access is advised as random: readers fetch the header, the TOC and
    /// single frames, so kernel readahead would only pull in bytes nobody asked for.
    pub fn open(path: impl AsRef<Path>) -> Result<LocalFile> {
        let path = path.as_ref().to_path_buf();
        // O_NONBLOCK: opening a FIFO for reading otherwise waits for a writer forever (found in
        // hardening: `list` on a FIFO hung). A FIFO then reads as an empty file. Regular files
        // get blocking mode back below, so their reads behave as before.
        let file = File::options()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&path)
            .map_err(|e| match e.kind() {
                io::ErrorKind::NotFound => Error::FileNotFound { path: path.clone() },
                _ => Error::io(&path, "cannot open", e),
            })?;
        let meta = file
            .metadata()
            .map_err(|e| Error::io(&path, "cannot stat", e))?;
        if meta.is_dir() {
            return Err(Error::TruncatedHeader { path, len: 0 });
        }
        if meta.is_file() {
            set_blocking(&file).map_err(|e| Error::io(&path, "cannot clear O_NONBLOCK", e))?;
            // SAFETY: advice on a descriptor we own; failure only loses the hint.
            unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_RANDOM) };
        }
        Ok(LocalFile {
            len: meta.len(),
            modified: meta.modified().ok(),
            dev: meta.dev(),
            ino: meta.ino(),
            path,
            file,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl ByteSource for LocalFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.file.read_at(buf, offset)
    }

    fn len(&self) -> u64 {
        self.len
    }

    fn display_name(&self) -> String {
        self.path.display().to_string()
    }

    fn identity(&self) -> String {
        let mtime = self
            .modified
            .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_nanos());
        format!("file:{}:{}:{}:{}", self.dev, self.ino, self.len, mtime)
    }

    fn check_unchanged(&self) -> Result<()> {
        let meta = self
            .file
            .metadata()
            .map_err(|e| Error::io(&self.path, "cannot stat", e))?;
        let modified = meta.modified().ok();
        if meta.len() != self.len || modified != self.modified {
            return Err(Error::io(
                &self.path,
                "archive changed while open",
                io::Error::other(format!(
                    "length {} -> {}{}",
                    self.len,
                    meta.len(),
                    if modified != self.modified {
                        ", modification time changed"
                    } else {
                        ""
                    }
                )),
            ));
        }
        Ok(())
    }

    /// The modification time at open, when the file system reports one.
    fn modified(&self) -> Option<SystemTime> {
        self.modified
    }

    fn will_need(&self, offset: u64, len: u64) {
        let (Ok(offset), Ok(len)) = (i64::try_from(offset), i64::try_from(len)) else {
            return;
        };
        // SAFETY: advice on a descriptor we own; failure only loses the hint.
        unsafe {
            libc::posix_fadvise(
                self.file.as_raw_fd(),
                offset,
                len,
                libc::POSIX_FADV_WILLNEED,
            )
        };
    }
}

fn set_blocking(file: &File) -> io::Result<()> {
    let fd = file.as_raw_fd();
    // SAFETY: fcntl on a descriptor we own, with integer arguments only.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_file_reads_and_notices_changes() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, b"hello world").unwrap();
        let src = LocalFile::open(&p).unwrap();
        assert_eq!(src.len(), 11);
        let mut buf = [0u8; 8];
        assert_eq!(read_full_at(&src, &mut buf, 6).unwrap(), 5);
        assert_eq!(&buf[..5], b"world");
        assert_eq!(src.display_name(), p.display().to_string());
        assert!(src.identity().starts_with("file:"));
        src.check_unchanged().unwrap();
        std::fs::OpenOptions::new()
            .append(true)
            .open(&p)
            .unwrap()
            .write_all_at(b"!", 11)
            .unwrap();
        let e = src.check_unchanged().unwrap_err();
        assert!(e.to_string().contains("changed while open"), "{e}");
    }

    #[test]
    fn directory_reads_as_a_truncated_header() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(
            LocalFile::open(dir.path()),
            Err(Error::TruncatedHeader { len: 0, .. })
        ));
        assert!(matches!(
            LocalFile::open(dir.path().join("missing")),
            Err(Error::FileNotFound { .. })
        ));
    }
}
