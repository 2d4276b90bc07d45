//! The C ABI of `librocm_kpack` (`include/rocm_kpack/kpack.h`): the only module with
//! `#[unsafe(no_mangle)]` items, and the only one that knows C types.
//!
//! Every exported function does the same three things in order: catch panics (none may unwind
//! into C: its whole body is one call of `guard.rs`'s `guard` or `guard_void`, which
//! `tests/it/ffi_exports.rs` checks), check every pointer, then call the safe Rust core. Errors
//! become `kpack_error_t` codes through `Error::kind().code()`. Output parameters are written
//! only on success. Buffers the caller frees come from `malloc`; strings an archive hands out
//! live in the archive handle until `kpack_close`.

mod alloc;
mod archive;
mod guard;
mod loader;
mod types;

pub use alloc::MallocBuf;
pub use archive::{
    kpack_close, kpack_free_kernel, kpack_get_architecture, kpack_get_architecture_count,
    kpack_get_binary, kpack_get_binary_count, kpack_get_kernel, kpack_open,
};
pub use guard::PANIC_ERROR;
pub use loader::{
    kpack_cache_create, kpack_cache_destroy, kpack_discover_binary_path,
    kpack_enumerate_architectures, kpack_free_code_object, kpack_load_code_object,
};
pub use types::{
    kpack_arch_callback_t, kpack_archive, kpack_archive_t, kpack_cache, kpack_cache_t,
    kpack_error_t,
};
