//! `kpack_fuse._native`: the Rust core as the Python package sees it. The reference API itself
//! (`kpack_fuse.kpack`, `kpack_fuse.compression`) is Python; this module does the heavy parts
//! with the GIL released: compressing and hashing kernels, spooling stored kernels to a temporary
//! file, writing the archive file, and reading archives through the core's `Archive`.

use pyo3::exceptions::{PyFileNotFoundError, PyMemoryError, PyOSError, PyValueError};
use pyo3::prelude::*;

mod codec;
mod msgpack_in;
mod msgpack_out;
mod reader;
mod spool;

use rocm_kpack::error::Error;

/// The core modules this crate uses, named in one place.
mod kpack_core {
    pub use rocm_kpack::archive::{codec, format, msgpack};
    pub use rocm_kpack::atomic_file;
}

use crate::kpack_core::format;

/// A core error as the exception the reference raises for it: `ValueError` for anything wrong
/// with the archive's bytes, the OS errors for files, `MemoryError` for a failed allocation.
pub(crate) fn to_py(e: Error) -> PyErr {
    match e {
        Error::FileNotFound { .. } => PyFileNotFoundError::new_err(e.to_string()),
        Error::Io { .. } => PyOSError::new_err(e.to_string()),
        Error::OutOfMemory { .. } => PyMemoryError::new_err(e.to_string()),
        other => PyValueError::new_err(other.to_string()),
    }
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("MAGIC", pyo3::types::PyBytes::new(m.py(), format::MAGIC))?;
    m.add("FORMAT_VERSION", format::VERSION)?;
    m.add("HEADER_SIZE", format::HEADER_SIZE)?;
    m.add("BLOB_ALIGNMENT", format::BLOB_ALIGNMENT)?;
    m.add("SCHEME_NONE", format::SCHEME_NONE)?;
    m.add("SCHEME_ZSTD", format::SCHEME_ZSTD)?;
    m.add("META_FRAME", format::META_FRAME)?;
    m.add("META_BLAKE3", format::META_BLAKE3)?;
    m.add("META_FRAME_BLAKE3", format::META_FRAME_BLAKE3)?;
    m.add("MIN_LEVEL", kpack_core::codec::MIN_LEVEL)?;
    m.add("MAX_LEVEL", kpack_core::codec::MAX_LEVEL)?;
    m.add_function(wrap_pyfunction!(codec::zstd_frame, m)?)?;
    m.add_function(wrap_pyfunction!(codec::blake3_digest, m)?)?;
    m.add_function(wrap_pyfunction!(msgpack_out::packb, m)?)?;
    m.add_function(wrap_pyfunction!(spool::write_archive, m)?)?;
    m.add_class::<spool::Spool>()?;
    m.add_class::<msgpack_in::TocData>()?;
    m.add_class::<reader::Reader>()?;
    Ok(())
}
