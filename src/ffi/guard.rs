//! The panic boundary and pointer checks every exported function goes through.

use std::ffi::{CStr, c_char};
use std::panic::{AssertUnwindSafe, catch_unwind};

use super::types::{KPACK_ERROR_INVALID_ARGUMENT, KPACK_SUCCESS, kpack_error_t};
use crate::Error;

/// Returned when Rust code panicked (a bug): the C API has no "internal error" code, and
/// `KPACK_ERROR_IO_ERROR` is the code callers already treat as "the operation failed, nothing was
/// returned".
pub const PANIC_ERROR: kpack_error_t = crate::ErrorKind::IoError as kpack_error_t;

/// Runs `body`, turning its result into a code and a panic into [`PANIC_ERROR`].
pub(crate) fn guard(body: impl FnOnce() -> Result<(), kpack_error_t>) -> kpack_error_t {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => KPACK_SUCCESS,
        Ok(Err(code)) => code,
        Err(_) => PANIC_ERROR,
    }
}

/// Runs a function with no result; a panic is swallowed.
pub(crate) fn guard_void(body: impl FnOnce()) {
    let _ = catch_unwind(AssertUnwindSafe(body));
}

/// The error code of a core error.
pub(crate) fn code(e: Error) -> kpack_error_t {
    e.kind().code()
}

/// `Err(INVALID_ARGUMENT)` for a NULL pointer.
pub(crate) fn non_null<T>(p: *const T) -> Result<*const T, kpack_error_t> {
    if p.is_null() {
        Err(KPACK_ERROR_INVALID_ARGUMENT)
    } else {
        Ok(p)
    }
}

/// `Err(INVALID_ARGUMENT)` for a NULL output pointer.
pub(crate) fn non_null_mut<T>(p: *mut T) -> Result<*mut T, kpack_error_t> {
    if p.is_null() {
        Err(KPACK_ERROR_INVALID_ARGUMENT)
    } else {
        Ok(p)
    }
}

/// Borrows a C string argument.
///
/// # Safety
/// `p` is NULL or points at a NUL-terminated string that outlives `'a`.
pub(crate) unsafe fn c_str<'a>(p: *const c_char) -> Result<&'a CStr, kpack_error_t> {
    // SAFETY: non-null checked; termination is the caller's contract.
    Ok(unsafe { CStr::from_ptr(non_null(p)?) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn panics_become_a_code() {
        assert_eq!(guard(|| panic!("boom")), PANIC_ERROR);
        assert_eq!(guard(|| Err(5)), 5);
        assert_eq!(guard(|| Ok(())), KPACK_SUCCESS);
        guard_void(|| panic!("boom"));
    }
}
