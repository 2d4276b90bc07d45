//! An archive's TOC as Python values, decoded by the core's bounded msgpack parser and converted
//! as the reference reader sees it (`msgpack.unpack(raw=False)`): str as `str`, bin as `bytes`,
//! arrays as lists, maps as dicts whose keys must be `str` or `bytes`.

use std::os::unix::fs::FileExt;

use crate::kpack_core::msgpack::{self, Value};
use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};

/// The raw TOC of one archive. Its parts are converted when asked for, so reading an archive's
/// header fields does not build a Python dict for every one of its kernels.
#[pyclass(frozen, module = "kpack_fuse._native")]
pub struct TocData {
    bytes: Vec<u8>,
    /// Every top-level field but `toc`, converted at open.
    head: Py<PyDict>,
    /// Whether the (last) `toc` field holds a map.
    has_toc: bool,
}

fn bad(msg: impl Into<String>) -> PyErr {
    PyValueError::new_err(msg.into())
}

fn to_py<'py>(py: Python<'py>, v: &Value<'_>) -> PyResult<Bound<'py, PyAny>> {
    Ok(match v {
        Value::Nil => py.None().into_bound(py),
        Value::Bool(b) => b.into_pyobject(py)?.to_owned().into_any(),
        Value::Uint(u) => u.into_pyobject(py)?.into_any(),
        Value::Int(i) => i.into_pyobject(py)?.into_any(),
        Value::Float(f) => f.into_pyobject(py)?.into_any(),
        Value::Str(s) => std::str::from_utf8(s)
            .map_err(|_| bad("TOC string is not valid UTF-8"))?
            .into_pyobject(py)?
            .into_any(),
        Value::Bin(b) => PyBytes::new(py, b).into_any(),
        Value::Array(items) => {
            let list = PyList::empty(py);
            for item in items {
                list.append(to_py(py, item)?)?;
            }
            list.into_any()
        }
        Value::Map(pairs) => {
            let dict = PyDict::new(py);
            for (k, val) in pairs {
                if !matches!(k, Value::Str(_) | Value::Bin(_)) {
                    return Err(bad(format!(
                        "TOC map key of type {} (only str and bytes keys are allowed)",
                        k.type_name()
                    )));
                }
                dict.set_item(to_py(py, k)?, to_py(py, val)?)?;
            }
            dict.into_any()
        }
        Value::Ext(code, _) => {
            return Err(bad(format!(
                "TOC holds a msgpack extension value (type {code})"
            )));
        }
    })
}

/// Checks that every part of `v` converts ([`to_py`] would succeed), so that a TOC converted
/// late (when `toc` is first used) can no longer fail.
fn check(v: &Value<'_>) -> PyResult<()> {
    match v {
        Value::Str(s) if std::str::from_utf8(s).is_err() => {
            Err(bad("TOC string is not valid UTF-8"))
        }
        Value::Array(items) => items.iter().try_for_each(check),
        Value::Map(pairs) => pairs.iter().try_for_each(|(k, val)| {
            if !matches!(k, Value::Str(_) | Value::Bin(_)) {
                return Err(bad(format!(
                    "TOC map key of type {} (only str and bytes keys are allowed)",
                    k.type_name()
                )));
            }
            check(k)?;
            check(val)
        }),
        Value::Ext(code, _) => Err(bad(format!(
            "TOC holds a msgpack extension value (type {code})"
        ))),
        _ => Ok(()),
    }
}

impl TocData {
    fn decode(&self) -> PyResult<Value<'_>> {
        let (value, _) =
            msgpack::decode_slice(&self.bytes).map_err(|e| bad(format!("Invalid TOC: {e}")))?;
        if !matches!(value, Value::Map(_)) {
            return Err(bad(format!(
                "Invalid TOC: a {} instead of a map",
                value.type_name()
            )));
        }
        Ok(value)
    }
}

#[pymethods]
impl TocData {
    /// Reads the TOC that starts at `toc_offset` of the file at `path` (to the end of the file)
    /// and checks that it is one msgpack map.
    #[new]
    fn new(py: Python<'_>, path: std::path::PathBuf, toc_offset: u64) -> PyResult<TocData> {
        let bytes = py.allow_threads(|| -> std::io::Result<Option<Vec<u8>>> {
            let file = std::fs::File::open(&path)?;
            let len = file.metadata()?.len();
            if toc_offset >= len {
                return Ok(None);
            }
            let mut buf = vec![0u8; (len - toc_offset) as usize];
            file.read_exact_at(&mut buf, toc_offset)?;
            Ok(Some(buf))
        });
        let bytes = match bytes {
            Ok(Some(b)) => b,
            Ok(None) => {
                return Err(bad(format!(
                    "Invalid TOC offset: {toc_offset} is not inside the file"
                )));
            }
            Err(e) => return Err(PyOSError::new_err(e.to_string())),
        };
        let (head, has_toc) = {
            let (value, _) =
                msgpack::decode_slice(&bytes).map_err(|e| bad(format!("Invalid TOC: {e}")))?;
            let Value::Map(pairs) = &value else {
                return Err(bad(format!(
                    "Invalid TOC: a {} instead of a map",
                    value.type_name()
                )));
            };
            check(&value)?;
            let head = PyDict::new(py);
            let mut has_toc = false;
            for (k, v) in pairs {
                if matches!(k, Value::Str(b) if *b == b"toc") {
                    has_toc = matches!(v, Value::Map(_));
                    continue;
                }
                head.set_item(to_py(py, k)?, to_py(py, v)?)?;
            }
            (head, has_toc)
        };
        let head = head.unbind();
        Ok(TocData {
            bytes,
            head,
            has_toc,
        })
    }

    /// Every top-level field but `toc`, as a dict in file order (a new dict each time).
    fn head<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        self.head.bind(py).copy()
    }

    /// Whether the TOC has a `toc` field holding a map (the last one, when repeated).
    fn has_toc(&self) -> bool {
        self.has_toc
    }

    /// The `toc` field (path -> arch -> entry), or `None` when there is none. With repeated
    /// `toc` keys the last one counts, as in a dict built from the map.
    fn toc<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        let Value::Map(pairs) = self.decode()? else {
            return Ok(None);
        };
        match pairs
            .iter()
            .rev()
            .find(|(k, _)| matches!(k, Value::Str(b) if *b == b"toc"))
        {
            Some((_, v)) => Ok(Some(to_py(py, v)?)),
            None => Ok(None),
        }
    }
}
