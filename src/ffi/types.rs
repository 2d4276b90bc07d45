//! The C-visible types: the error code, the two opaque handles and the callback type.

#![allow(non_camel_case_types)]

use std::ffi::{CString, c_char, c_int, c_void};

use crate::archive::Archive;
use crate::loader::Loader;

/// `kpack_error_t`: a C enum, passed as `int`. Values are `ErrorKind::code()`, 0 for success.
pub type kpack_error_t = c_int;

pub const KPACK_SUCCESS: kpack_error_t = 0;
pub const KPACK_ERROR_INVALID_ARGUMENT: kpack_error_t = crate::ErrorKind::InvalidArgument as c_int;

/// What a `kpack_archive_t` points at: the archive plus the C strings it hands out, built once at
/// open so that every call returns the same, stable pointers.
pub struct kpack_archive {
    pub(crate) archive: Archive,
    pub(crate) architectures: Vec<CString>,
    pub(crate) binaries: Vec<CString>,
}

pub type kpack_archive_t = *mut kpack_archive;

/// What a `kpack_cache_t` points at.
pub struct kpack_cache {
    pub(crate) loader: Loader,
}

pub type kpack_cache_t = *mut kpack_cache;

/// `kpack_arch_callback_t`; `None` is a NULL function pointer.
pub type kpack_arch_callback_t =
    Option<unsafe extern "C" fn(arch: *const c_char, user_data: *mut c_void) -> bool>;

/// A C string for `s`. TOC strings may contain NUL bytes, which C cannot represent; such a string
/// is cut at its first NUL, which is what a C reader would see anyway.
pub(crate) fn c_string(s: &str) -> CString {
    let cut = s.split('\0').next().unwrap_or("");
    CString::new(cut).unwrap_or_default()
}
