//! Buffers handed to C, which frees them with `free` (the free functions take no length).

use std::ffi::c_void;
use std::ptr::NonNull;

use crate::archive::codec::KernelBuf;

/// A `malloc`'d byte buffer. Freed on drop unless given away with [`MallocBuf::into_raw`].
///
/// Not cleared: kernels are decoded straight into it (see [`KernelBuf`]); a reader that copies
/// into it asks for it cleared (`init_mut`). `calloc` would clear every buffer, and glibc reuses
/// freed heap memory for the next one, so that clearing is a real pass over each kernel.
/// A zero-length buffer still gets a unique non-NULL pointer, as `malloc(0)` does on glibc.
pub struct MallocBuf {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the buffer is uniquely owned heap memory.
unsafe impl Send for MallocBuf {}

impl MallocBuf {
    /// `None` when the allocation fails.
    pub fn new(len: usize) -> Option<MallocBuf> {
        // SAFETY: plain allocation; the result is checked for NULL.
        let ptr = unsafe { libc::malloc(len.max(1)) } as *mut u8;
        NonNull::new(ptr).map(|ptr| MallocBuf { ptr, len })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Gives the buffer to C: the pointer must later be passed to `free`.
    pub fn into_raw(self) -> (*mut c_void, usize) {
        let out = (self.ptr.as_ptr() as *mut c_void, self.len);
        std::mem::forget(self);
        out
    }
}

// SAFETY: `len` bytes of heap memory owned by `self` until drop or `into_raw`.
unsafe impl KernelBuf for MallocBuf {
    fn size(&self) -> usize {
        self.len
    }
    fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }
    fn init_mut(&mut self) -> &mut [u8] {
        // SAFETY: `len` writable bytes owned by `self`, cleared here so the slice is initialised.
        unsafe {
            std::ptr::write_bytes(self.ptr.as_ptr(), 0, self.len);
            std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len)
        }
    }
    unsafe fn filled_mut(&mut self) -> &mut [u8] {
        // SAFETY: `len` bytes owned by `self`, all written (the caller's promise).
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for MallocBuf {
    fn drop(&mut self) {
        // SAFETY: allocated by malloc and not given away.
        unsafe { libc::free(self.ptr.as_ptr() as *mut c_void) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_length_buffers_are_non_null_and_freeable() {
        let b = MallocBuf::new(0).unwrap();
        let (p, n) = b.into_raw();
        assert!(!p.is_null());
        assert_eq!(n, 0);
        unsafe { libc::free(p) };
        let mut b = MallocBuf::new(3).unwrap();
        assert_eq!(b.size(), 3);
        assert_eq!(b.init_mut(), [0, 0, 0]);
    }
}
