//! The loader half of the C API: caches, code-object loading, path discovery, arch enumeration.

use std::borrow::Cow;
use std::ffi::{CStr, OsStr, c_char, c_void};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use super::alloc::MallocBuf;
use super::guard::{c_str, code, guard, guard_void, non_null, non_null_mut};
use super::types::{
    KPACK_ERROR_INVALID_ARGUMENT, c_string, kpack_arch_callback_t, kpack_cache, kpack_cache_t,
    kpack_error_t,
};
use crate::archive::Archive;
use crate::loader::{
    HipkMetadata, LoadRequest, Loader, LoaderConfig, Silent, StderrLog, Trace, maps,
};

/// # Safety
/// `cache` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kpack_cache_create(cache: *mut kpack_cache_t) -> kpack_error_t {
    guard(|| {
        let out = non_null_mut(cache)?;
        let loader = Loader::new(LoaderConfig::from_env());
        if loader.config().debug {
            StderrLog.record(loader.created_event());
        }
        // SAFETY: checked non-null.
        unsafe { *out = Box::into_raw(Box::new(kpack_cache { loader })) };
        Ok(())
    })
}

/// # Safety
/// `cache` is NULL or a live cache, not used again afterwards.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kpack_cache_destroy(cache: kpack_cache_t) {
    guard_void(|| {
        if !cache.is_null() {
            // SAFETY: a cache from kpack_cache_create, released exactly once per the contract.
            drop(unsafe { Box::from_raw(cache) });
        }
    })
}

/// # Safety
/// `cache` is NULL or a live cache; `hipk_metadata` is NULL or points at a msgpack object (read
/// up to its end, at most 64 KiB); `binary_path` is NULL or a C string; `arch_list` is NULL or
/// holds `arch_count` entries, each NULL or a C string; the outputs are NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kpack_load_code_object(
    cache: kpack_cache_t,
    hipk_metadata: *const c_void,
    binary_path: *const c_char,
    co_index: u32,
    arch_list: *const *const c_char,
    arch_count: usize,
    code_object_out: *mut *mut c_void,
    code_object_size_out: *mut usize,
) -> kpack_error_t {
    guard(|| {
        // SAFETY: argument contract above.
        let cache = unsafe { cache.as_ref() }.ok_or(KPACK_ERROR_INVALID_ARGUMENT)?;
        let metadata = non_null(hipk_metadata)? as *const u8;
        // SAFETY: a C string or NULL per the contract above.
        let binary_path = unsafe { c_str(binary_path)? };
        let arch_list = non_null(arch_list)?;
        if arch_count == 0 {
            return Err(KPACK_ERROR_INVALID_ARGUMENT);
        }
        let data_out = non_null_mut(code_object_out)?;
        let size_out = non_null_mut(code_object_size_out)?;

        // SAFETY: `arch_count` readable entries per the contract.
        let raw = unsafe { std::slice::from_raw_parts(arch_list, arch_count) };
        let owned: Vec<Option<Cow<'_, str>>> = raw
            .iter()
            // SAFETY: each non-NULL entry is a C string per the contract.
            .map(|p| (!p.is_null()).then(|| unsafe { CStr::from_ptr(*p) }.to_string_lossy()))
            .collect();
        let arches: Vec<Option<&str>> = owned.iter().map(|a| a.as_deref()).collect();
        let request = LoadRequest {
            binary_path: Path::new(OsStr::from_bytes(binary_path.to_bytes())),
            co_index,
            arch_list: &arches,
        };
        let mut log = StderrLog;
        let mut silent = Silent;
        let trace: &mut dyn Trace = if cache.loader.config().debug {
            &mut log
        } else {
            &mut silent
        };
        let loaded = cache
            .loader
            // SAFETY: the metadata pointer contract above.
            .load_code_object(
                || unsafe { HipkMetadata::parse_pointer(metadata) },
                &request,
                MallocBuf::new,
                trace,
            )
            .map_err(code)?;
        let (ptr, len) = loaded.data.into_raw();
        // SAFETY: checked non-null.
        unsafe {
            *data_out = ptr;
            *size_out = len;
        }
        Ok(())
    })
}

/// # Safety
/// `code_object` is NULL or a buffer from `kpack_load_code_object`, not freed before.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kpack_free_code_object(code_object: *mut c_void) {
    // SAFETY: malloc'd by this library (or NULL, which free ignores).
    guard_void(|| unsafe { libc::free(code_object) })
}

/// # Safety
/// `path_out` is NULL or writable for `path_out_size` bytes; `offset_out` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kpack_discover_binary_path(
    address_in_binary: *const c_void,
    path_out: *mut c_char,
    path_out_size: usize,
    offset_out: *mut usize,
) -> kpack_error_t {
    guard(|| {
        non_null(address_in_binary)?;
        let out = non_null_mut(path_out)?;
        if path_out_size == 0 {
            return Err(KPACK_ERROR_INVALID_ARGUMENT);
        }
        let (path, offset) = maps::discover(address_in_binary as usize).map_err(code)?;
        let bytes = path.as_os_str().as_bytes();
        if bytes.len() >= path_out_size {
            return Err(KPACK_ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: `bytes.len() + 1 <= path_out_size` writable bytes per the contract.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), out as *mut u8, bytes.len());
            *out.add(bytes.len()) = 0;
            if !offset_out.is_null() {
                *offset_out = offset as usize;
            }
        }
        Ok(())
    })
}

/// # Safety
/// `archive_path` is NULL or a C string; `callback` is NULL or a function safe to call with
/// `user_data`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kpack_enumerate_architectures(
    archive_path: *const c_char,
    callback: kpack_arch_callback_t,
    user_data: *mut c_void,
) -> kpack_error_t {
    guard(|| {
        // SAFETY: argument contract above.
        let path = unsafe { c_str(archive_path)? };
        let callback = callback.ok_or(KPACK_ERROR_INVALID_ARGUMENT)?;
        // Only the arch list is needed: no C strings are built for the binaries.
        let archive = Archive::open(Path::new(OsStr::from_bytes(path.to_bytes()))).map_err(code)?;
        for arch in archive.architectures() {
            let arch = c_string(arch);
            // SAFETY: the caller's callback with the caller's data; the string outlives the call.
            if !unsafe { callback(arch.as_ptr(), user_data) } {
                break;
            }
        }
        Ok(())
    })
}
