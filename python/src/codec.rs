//! Compressing and hashing one kernel with the GIL released (the map phase of a pack).

use std::cell::RefCell;

use crate::kpack_core::codec::FrameEncoder;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

thread_local! {
    /// One encoder per worker thread and level: a pool's threads compress many kernels, and a
    /// fresh zstd context per kernel costs more than compressing a small one. The frame does
    /// not depend on the context being reused.
    static ENCODER: RefCell<Option<(i32, FrameEncoder)>> = const { RefCell::new(None) };
}

fn encode(data: &[u8], level: i32) -> Result<Vec<u8>, String> {
    ENCODER.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.as_ref().is_none_or(|(l, _)| *l != level) {
            *slot = Some((level, FrameEncoder::new(level)?));
        }
        slot.as_mut().expect("just set").1.encode(data)
    })
}

/// `zstd_frame(data, level, digests) -> (frame, kernel_blake3 | None, frame_blake3 | None)`:
/// one zstd frame of `data` (content size recorded, no checksum), and with `digests` the BLAKE3
/// digests of the kernel and of the frame.
#[pyfunction]
#[allow(clippy::type_complexity)]
pub fn zstd_frame<'py>(
    py: Python<'py>,
    data: &[u8],
    level: i32,
    digests: bool,
) -> PyResult<(
    Bound<'py, PyBytes>,
    Option<Bound<'py, PyBytes>>,
    Option<Bound<'py, PyBytes>>,
)> {
    let (frame, kd, fd) = py
        .allow_threads(|| {
            let frame = encode(data, level)?;
            let (kd, fd) = if digests {
                (
                    Some(*blake3::hash(data).as_bytes()),
                    Some(*blake3::hash(&frame).as_bytes()),
                )
            } else {
                (None, None)
            };
            Ok::<_, String>((frame, kd, fd))
        })
        .map_err(PyValueError::new_err)?;
    Ok((
        PyBytes::new(py, &frame),
        kd.map(|d| PyBytes::new(py, &d)),
        fd.map(|d| PyBytes::new(py, &d)),
    ))
}

/// `blake3_digest(data) -> bytes`: the 32-byte BLAKE3 digest, computed with the GIL released.
#[pyfunction]
pub fn blake3_digest<'py>(py: Python<'py>, data: &[u8]) -> Bound<'py, PyBytes> {
    let d = py.allow_threads(|| *blake3::hash(data).as_bytes());
    PyBytes::new(py, &d)
}
