//! Python values to msgpack, as the reference writer encodes its TOC (`msgpack.pack` with
//! `use_bin_type=True`): integers in their smallest form, floats as float64, `str` as str,
//! `bytes`-like as bin, lists and tuples as arrays, dicts as maps in their order. Anything else is
//! a `TypeError`, as there.

use pyo3::exceptions::{PyOverflowError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{
    PyBool, PyByteArray, PyBytes, PyDict, PyFloat, PyInt, PyList, PyMemoryView, PyString, PyTuple,
};
use rmp::encode as e;

/// Nesting deeper than this is refused (as the reference's packer does) instead of recursing
/// towards the stack's end.
const NEST_LIMIT: usize = 512;

fn len32(n: usize) -> PyResult<u32> {
    u32::try_from(n).map_err(|_| PyValueError::new_err(format!("{n} is too large for msgpack")))
}

fn pack(out: &mut Vec<u8>, v: &Bound<'_, PyAny>, depth: usize) -> PyResult<()> {
    if depth > NEST_LIMIT {
        return Err(PyValueError::new_err("recursion limit exceeded"));
    }
    // Writing to a Vec cannot fail; the results below are only the encoder's signature.
    if v.is_none() {
        e::write_nil(out).ok();
    } else if let Ok(b) = v.downcast::<PyBool>() {
        e::write_bool(out, b.is_true()).ok();
    } else if v.is_instance_of::<PyInt>() {
        if let Ok(u) = v.extract::<u64>() {
            e::write_uint(out, u).ok();
        } else if let Ok(i) = v.extract::<i64>() {
            e::write_sint(out, i).ok();
        } else {
            return Err(PyOverflowError::new_err("Integer value out of range"));
        }
    } else if let Ok(f) = v.downcast::<PyFloat>() {
        e::write_f64(out, f.value()).ok();
    } else if let Ok(b) = v.downcast::<PyBytes>() {
        write_bin(out, b.as_bytes())?;
    } else if let Ok(b) = v.downcast::<PyByteArray>() {
        write_bin(out, &b.to_vec())?;
    } else if let Ok(s) = v.downcast::<PyString>() {
        let s = s.to_cow()?;
        e::write_str_len(out, len32(s.len())?).ok();
        out.extend_from_slice(s.as_bytes());
    } else if let Ok(d) = v.downcast::<PyDict>() {
        e::write_map_len(out, len32(d.len())?).ok();
        for (k, val) in d.iter() {
            pack(out, &k, depth + 1)?;
            pack(out, &val, depth + 1)?;
        }
    } else if let Ok(l) = v.downcast::<PyList>() {
        e::write_array_len(out, len32(l.len())?).ok();
        for item in l.iter() {
            pack(out, &item, depth + 1)?;
        }
    } else if let Ok(t) = v.downcast::<PyTuple>() {
        e::write_array_len(out, len32(t.len())?).ok();
        for item in t.iter() {
            pack(out, &item, depth + 1)?;
        }
    } else if v.is_instance_of::<PyMemoryView>() {
        let b: Vec<u8> = v.call_method0("tobytes")?.extract()?;
        write_bin(out, &b)?;
    } else {
        let name = v.get_type().name()?;
        return Err(PyTypeError::new_err(format!(
            "can not serialize '{name}' object"
        )));
    }
    Ok(())
}

fn write_bin(out: &mut Vec<u8>, b: &[u8]) -> PyResult<()> {
    e::write_bin_len(out, len32(b.len())?).ok();
    out.extend_from_slice(b);
    Ok(())
}

/// `packb(obj) -> bytes`: `obj` encoded as the reference writer encodes its TOC.
#[pyfunction]
pub fn packb<'py>(py: Python<'py>, obj: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyBytes>> {
    let mut out = Vec::new();
    pack(&mut out, obj, 0)?;
    Ok(PyBytes::new(py, &out))
}
