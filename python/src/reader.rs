//! An archive opened through the core's `Archive`, as the C library opens one: the header and
//! TOC are read and checked, and each kernel is read (with a positioned read of its blob or
//! frame) and checked against the digests the archive records when it is asked for.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::OnceLock;

use crate::kpack_core::codec::KernelBuf;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use rocm_kpack::Archive;

use crate::to_py;

#[pyclass(frozen, module = "kpack_fuse._native")]
pub struct Reader {
    archive: Archive,
    /// Ordinal -> (binary, entry) indices, built on the first read by ordinal.
    by_ordinal: OnceLock<HashMap<u32, (usize, usize)>>,
}

/// A new `bytes` object of a kernel's size whose buffer the core decodes into, so a kernel is
/// neither cleared before decoding nor copied after. The core asks for it only once the stored
/// bytes were checked to hold that many, so a hostile size is never allocated.
struct BytesBuf {
    obj: Py<PyBytes>,
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the object is fresh and reached only through this value until it is handed to Python;
// the pointer is its buffer, which lives as long as the object.
unsafe impl Send for BytesBuf {}

impl BytesBuf {
    /// An uninitialised `bytes` of `len` bytes (taking the GIL for the allocation), or `None`
    /// when Python cannot allocate it.
    fn new(len: usize) -> Option<BytesBuf> {
        Python::with_gil(|py| {
            let size = pyo3::ffi::Py_ssize_t::try_from(len).ok()?;
            // SAFETY: a NULL source asks for an uninitialised buffer of `size` bytes; the result
            // is a new reference, or NULL with an exception set.
            let raw = unsafe { pyo3::ffi::PyBytes_FromStringAndSize(std::ptr::null(), size) };
            if raw.is_null() {
                PyErr::fetch(py);
                return None;
            }
            // SAFETY: `raw` is a new, owned reference to a bytes object.
            let obj: Py<PyBytes> = unsafe { Py::from_owned_ptr(py, raw) };
            // SAFETY: the buffer of a bytes object of `size` bytes.
            let ptr = unsafe { pyo3::ffi::PyBytes_AsString(raw) }.cast::<u8>();
            Some(BytesBuf { obj, ptr, len })
        })
    }
}

// SAFETY: `ptr` points at the object's `len` bytes, writable while the object is unshared.
unsafe impl KernelBuf for BytesBuf {
    fn size(&self) -> usize {
        self.len
    }
    fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr
    }
    fn init_mut(&mut self) -> &mut [u8] {
        // SAFETY: see the impl; zeroed before it is handed out as initialised.
        unsafe {
            std::ptr::write_bytes(self.ptr, 0, self.len);
            std::slice::from_raw_parts_mut(self.ptr, self.len)
        }
    }
    unsafe fn filled_mut(&mut self) -> &mut [u8] {
        // SAFETY: every byte was written (the caller's promise).
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Reader {
    fn read_at<'py>(&self, py: Python<'py>, b: usize, e: usize) -> PyResult<Bound<'py, PyBytes>> {
        let buf = py
            .allow_threads(|| {
                let kref = self.archive.locate_for_read_at(b, e)?;
                self.archive.read_with(&kref, BytesBuf::new)
            })
            .map_err(to_py)?;
        Ok(buf.obj.into_bound(py))
    }
}

#[pymethods]
impl Reader {
    #[new]
    fn new(py: Python<'_>, path: PathBuf) -> PyResult<Reader> {
        let archive = py.allow_threads(|| Archive::open(&path)).map_err(to_py)?;
        Ok(Reader {
            archive,
            by_ordinal: OnceLock::new(),
        })
    }

    /// The kernel of `key` for `arch`, or `None` when the TOC has no such entry.
    fn get<'py>(
        &self,
        py: Python<'py>,
        key: &str,
        arch: &str,
    ) -> PyResult<Option<Bound<'py, PyBytes>>> {
        match self.archive.entry_index(key, arch) {
            Some((b, e)) => self.read_at(py, b, e).map(Some),
            None => Ok(None),
        }
    }

    /// The kernel stored under `ordinal`; `ValueError` for an ordinal with no stored kernel or
    /// no TOC entry.
    fn get_ordinal<'py>(&self, py: Python<'py>, ordinal: i64) -> PyResult<Bound<'py, PyBytes>> {
        let n = self.archive.stored_count();
        if ordinal < 0 || ordinal as u64 >= n as u64 {
            return Err(PyValueError::new_err(format!(
                "Ordinal {ordinal} out of range (0..{})",
                n as i64 - 1
            )));
        }
        let map = self.by_ordinal.get_or_init(|| {
            let mut m = HashMap::new();
            for ((b, e), _, entry) in self.archive.indexed_entries() {
                m.entry(entry.ordinal).or_insert((b, e));
            }
            m
        });
        match map.get(&(ordinal as u32)) {
            Some(&(b, e)) => self.read_at(py, b, e),
            None => Err(PyValueError::new_err(format!(
                "Ordinal {ordinal} has no entry in the TOC"
            ))),
        }
    }

    /// Reads every kernel and checks it against what the archive records (sizes, frames,
    /// digests); returns how many were checked. `ValueError` naming the first that fails.
    fn verify(&self, py: Python<'_>) -> PyResult<usize> {
        py.allow_threads(|| {
            let mut n = 0;
            for ((b, e), _, _) in self.archive.indexed_entries() {
                let kref = self.archive.locate_at(b, e)?;
                self.archive.verify_kernel(&kref)?;
                n += 1;
            }
            Ok(n)
        })
        .map_err(to_py)
    }

    /// `(key, arch, ordinal, original_size)` of every entry, by key then in file order of arches.
    fn entries(&self) -> Vec<(String, String, u32, u64)> {
        self.archive
            .entries()
            .map(|(k, e)| (k.to_owned(), e.arch.to_owned(), e.ordinal, e.original_size))
            .collect()
    }

    fn kernel_count(&self) -> usize {
        self.archive.entries().count()
    }

    /// The `gfx_arches` list the C loader matches on.
    fn architectures(&self) -> Vec<String> {
        self.archive.architectures().to_vec()
    }

    /// Whether each entry records its digest (archives written with `digests=True`).
    fn has_digests(&self) -> bool {
        let mut entries = self.archive.entries().peekable();
        entries.peek().is_some() && entries.all(|(_, e)| e.blake3_at.is_some())
    }
}
