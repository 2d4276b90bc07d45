//! The archive half of the C API: open, list, fetch, close.

use std::ffi::{OsStr, c_char, c_void};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use super::alloc::MallocBuf;
use super::guard::{c_str, code, guard, guard_void, non_null_mut};
use super::types::{
    KPACK_ERROR_INVALID_ARGUMENT, c_string, kpack_archive, kpack_archive_t, kpack_error_t,
};
use crate::ErrorKind;
use crate::archive::Archive;

/// Opens an archive and builds the C strings it will hand out.
pub(crate) fn open_handle(path: &Path) -> crate::Result<kpack_archive> {
    let archive = Archive::open(path)?;
    let architectures = archive
        .architectures()
        .iter()
        .map(|a| c_string(a))
        .collect();
    let binaries = archive.binaries().map(|b| c_string(b.key)).collect();
    Ok(kpack_archive {
        archive,
        architectures,
        binaries,
    })
}

/// Borrows the handle behind `archive`.
///
/// # Safety
/// `archive` is NULL or a live handle from `kpack_open`.
unsafe fn handle<'a>(archive: kpack_archive_t) -> Result<&'a kpack_archive, kpack_error_t> {
    // SAFETY: live handle per the contract; NULL is rejected.
    unsafe { archive.as_ref() }.ok_or(KPACK_ERROR_INVALID_ARGUMENT)
}

/// # Safety
/// `path` is NULL or a C string; `archive` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kpack_open(
    path: *const c_char,
    archive: *mut kpack_archive_t,
) -> kpack_error_t {
    guard(|| {
        // SAFETY: argument contract above.
        let path = unsafe { c_str(path)? };
        let out = non_null_mut(archive)?;
        let handle = open_handle(Path::new(OsStr::from_bytes(path.to_bytes()))).map_err(code)?;
        // SAFETY: checked non-null and writable per the contract.
        unsafe { *out = Box::into_raw(Box::new(handle)) };
        Ok(())
    })
}

/// # Safety
/// `archive` is NULL or a live handle, not used again afterwards.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kpack_close(archive: kpack_archive_t) {
    guard_void(|| {
        if !archive.is_null() {
            // SAFETY: a handle from kpack_open, released exactly once per the contract.
            drop(unsafe { Box::from_raw(archive) });
        }
    })
}

/// Which of the handle's string lists a getter reads.
type List = fn(&kpack_archive) -> &[std::ffi::CString];

/// What both count getters do inside their guard.
///
/// # Safety
/// As for the exported getters: `archive` NULL or live, `count` NULL or writable.
unsafe fn list_count(
    archive: kpack_archive_t,
    count: *mut usize,
    list: List,
) -> Result<(), kpack_error_t> {
    // SAFETY: argument contract above.
    let h = unsafe { handle(archive)? };
    let out = non_null_mut(count)?;
    // SAFETY: checked non-null.
    unsafe { *out = list(h).len() };
    Ok(())
}

/// What both indexed getters do inside their guard: an index past the end is an invalid
/// argument.
///
/// # Safety
/// As for the exported getters: `archive` NULL or live, `item` NULL or writable.
unsafe fn list_item(
    archive: kpack_archive_t,
    index: usize,
    item: *mut *const c_char,
    list: List,
) -> Result<(), kpack_error_t> {
    // SAFETY: argument contract above.
    let h = unsafe { handle(archive)? };
    let out = non_null_mut(item)?;
    let s = list(h).get(index).ok_or(KPACK_ERROR_INVALID_ARGUMENT)?;
    // SAFETY: checked non-null; the string lives in the handle until kpack_close.
    unsafe { *out = s.as_ptr() };
    Ok(())
}

/// # Safety
/// `archive` is NULL or a live handle; `count` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kpack_get_architecture_count(
    archive: kpack_archive_t,
    count: *mut usize,
) -> kpack_error_t {
    // SAFETY: same contract.
    guard(|| unsafe { list_count(archive, count, |h| &h.architectures) })
}

/// # Safety
/// `archive` is NULL or a live handle; `arch` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kpack_get_architecture(
    archive: kpack_archive_t,
    index: usize,
    arch: *mut *const c_char,
) -> kpack_error_t {
    // SAFETY: same contract.
    guard(|| unsafe { list_item(archive, index, arch, |h| &h.architectures) })
}

/// # Safety
/// `archive` is NULL or a live handle; `count` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kpack_get_binary_count(
    archive: kpack_archive_t,
    count: *mut usize,
) -> kpack_error_t {
    // SAFETY: same contract.
    guard(|| unsafe { list_count(archive, count, |h| &h.binaries) })
}

/// # Safety
/// `archive` is NULL or a live handle; `binary` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kpack_get_binary(
    archive: kpack_archive_t,
    index: usize,
    binary: *mut *const c_char,
) -> kpack_error_t {
    // SAFETY: same contract.
    guard(|| unsafe { list_item(archive, index, binary, |h| &h.binaries) })
}

/// # Safety
/// `archive` is NULL or a live handle; the names are NULL or C strings; the outputs are NULL or
/// writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kpack_get_kernel(
    archive: kpack_archive_t,
    binary_name: *const c_char,
    arch: *const c_char,
    kernel_data: *mut *mut c_void,
    kernel_size: *mut usize,
) -> kpack_error_t {
    guard(|| {
        // SAFETY: argument contract above.
        let h = unsafe { handle(archive)? };
        // SAFETY: C strings or NULL per the contract above.
        let (name, arch) = unsafe { (c_str(binary_name)?, c_str(arch)?) };
        let data_out = non_null_mut(kernel_data)?;
        let size_out = non_null_mut(kernel_size)?;
        // Every TOC key and arch is UTF-8, so a name that is not cannot match any entry.
        let (Ok(name), Ok(arch)) = (name.to_str(), arch.to_str()) else {
            return Err(ErrorKind::KernelNotFound.code());
        };
        let buf = h
            .archive
            .get_kernel_with(name, arch, MallocBuf::new)
            .map_err(code)?;
        let (ptr, len) = buf.into_raw();
        // SAFETY: checked non-null.
        unsafe {
            *data_out = ptr;
            *size_out = len;
        }
        Ok(())
    })
}

/// # Safety
/// `kernel_data` is NULL or a buffer from `kpack_get_kernel`, not freed before.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kpack_free_kernel(kernel_data: *mut c_void) {
    // SAFETY: malloc'd by this library (or NULL, which free ignores).
    guard_void(|| unsafe { libc::free(kernel_data) })
}
