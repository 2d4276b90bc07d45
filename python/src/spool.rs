//! The stored kernels of an archive being built, kept in an unlinked temporary file instead of
//! memory (each kernel is appended as it is added, in ordinal order), and the writing of the
//! archive file: header, padding, blob, TOC.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::kpack_core::atomic_file::{self, AtomicFile};
use crate::kpack_core::format::{self, Header};
use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

/// The blob body of an archive being built: for zstd each record is the frame's `u32` size word
/// and the frame, for `none` the kernels' bytes back to back.
#[pyclass(frozen, module = "kpack_fuse._native")]
pub struct Spool {
    file: File,
    /// Bytes appended so far; the lock also orders appends.
    len: Mutex<u64>,
}

fn os_err(e: io::Error) -> PyErr {
    PyOSError::new_err(e.to_string())
}

#[pymethods]
impl Spool {
    /// An empty spool in a new unlinked file of the temporary directory (`TMPDIR`).
    #[new]
    fn new() -> PyResult<Spool> {
        Ok(Spool {
            file: tempfile::tempfile().map_err(os_err)?,
            len: Mutex::new(0),
        })
    }

    /// Appends `data`, preceded by its `u32` little-endian size when `size_word` is set; returns
    /// where the record starts in the blob body.
    fn append(&self, py: Python<'_>, data: &[u8], size_word: bool) -> PyResult<u64> {
        let word = if size_word {
            let n = u32::try_from(data.len())
                .map_err(|_| PyValueError::new_err("a compressed kernel exceeds 4 GiB"))?;
            Some(n.to_le_bytes())
        } else {
            None
        };
        py.allow_threads(|| {
            let mut len = self.len.lock().unwrap_or_else(|p| p.into_inner());
            let start = *len;
            let mut at = start;
            if let Some(w) = word {
                self.file.write_all_at(&w, at)?;
                at += 4;
            }
            self.file.write_all_at(data, at)?;
            *len = at + data.len() as u64;
            Ok(start)
        })
        .map_err(os_err)
    }

    /// `size` bytes of the blob body from `offset`.
    fn read<'py>(
        &self,
        py: Python<'py>,
        offset: u64,
        size: usize,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let mut buf = vec![0u8; size];
        py.allow_threads(|| self.file.read_exact_at(&mut buf, offset))
            .map_err(os_err)?;
        Ok(PyBytes::new(py, &buf))
    }

    fn __len__(&self) -> usize {
        *self.len.lock().unwrap_or_else(|p| p.into_inner()) as usize
    }
}

impl Spool {
    fn copy_to(&self, out: &mut impl Write) -> io::Result<u64> {
        let len = *self.len.lock().unwrap_or_else(|p| p.into_inner());
        let mut src = &self.file;
        src.seek(SeekFrom::Start(0))?;
        let copied = io::copy(&mut src.take(len), out)?;
        if copied != len {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the spool file is shorter than what was written to it",
            ));
        }
        Ok(copied)
    }

    fn byte_len(&self) -> u64 {
        *self.len.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Writes the archive to `path` through a temporary file in the same directory, renamed into
/// place when complete (parent directories are created; the file is not flushed to disk
/// first): the 16-byte header, zero padding to byte 64, the blob
/// (`prefix` then the spool's contents), then `toc`.
fn write_file(path: &Path, prefix: &[u8], spool: Option<&Spool>, toc: &[u8]) -> io::Result<()> {
    let opts = atomic_file::Options {
        create_parents: true,
        sync: false,
    };
    let (tmp, file) = AtomicFile::create(path, opts)?;
    let blob_len = prefix.len() as u64 + spool.map_or(0, Spool::byte_len);
    let mut out = io::BufWriter::with_capacity(1 << 20, file);
    out.write_all(&Header::encode(format::BLOB_ALIGNMENT + blob_len))?;
    out.write_all(&[0u8; format::BLOB_ALIGNMENT as usize - format::HEADER_SIZE])?;
    out.write_all(prefix)?;
    let mut file = out.into_inner().map_err(|e| e.into_error())?;
    if let Some(s) = spool {
        s.copy_to(&mut file)?;
    }
    file.write_all(toc)?;
    Ok(tmp.commit(file)?)
}

/// `write_archive(path, prefix, spool, toc)`: see [`write_file`]. The GIL is released while
/// the file is written.
#[pyfunction]
#[pyo3(signature = (path, prefix, spool, toc))]
pub fn write_archive(
    py: Python<'_>,
    path: PathBuf,
    prefix: &[u8],
    spool: Option<&Bound<'_, Spool>>,
    toc: &[u8],
) -> PyResult<()> {
    let spool = spool.map(|s| s.get());
    py.allow_threads(|| write_file(&path, prefix, spool, toc))
        .map_err(|e| PyOSError::new_err(format!("{}: {e}", path.display())))
}
