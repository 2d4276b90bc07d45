//! `hipk_metadata`: arbitrary bytes as the HIPK metadata of a host binary, read both from a
//! slice and from a length-less pointer.
//!
//! The pointer case is the dangerous one: the C entry point gets no length, so the decoder must
//! stop at the end of the first object. When the bytes hold a complete object, that object is
//! copied so it ends exactly at an inaccessible guard page; any read past its last byte faults,
//! which the fuzzer reports as a crash. Invariants: both readings agree; an accepted document has
//! a kernel name and at least one search path; errors are `InvalidMetadata`.

use rocm_kpack::ErrorKind;
use rocm_kpack::archive::msgpack;
use rocm_kpack::host::hipk::metadata::HipkMetadata;

pub fn run(data: &[u8]) {
    let from_slice = HipkMetadata::parse(data);
    match &from_slice {
        Ok(m) => {
            assert!(!m.search_paths.is_empty());
            assert_eq!(m.lookup_key(7), format!("{}#7", m.kernel_name));
        }
        Err(e) => assert_eq!(e.kind(), ErrorKind::InvalidMetadata, "{e}"),
    }
    let limit = &data[..data
        .len()
        .min(rocm_kpack::host::hipk::metadata::MAX_METADATA_BYTES)];
    let Ok((_, used)) = msgpack::decode_slice(limit) else {
        return;
    };
    let guarded = GuardedCopy::new(&limit[..used]);
    // SAFETY: every byte of the object is readable; the page after it is not, on purpose.
    let from_pointer = unsafe { HipkMetadata::parse_pointer(guarded.ptr()) };
    match (&from_slice, &from_pointer) {
        (Ok(a), Ok(b)) => assert_eq!(a, b),
        (Err(a), Err(b)) => assert_eq!(a.kind(), b.kind()),
        _ => panic!("slice and pointer readings disagree: {from_slice:?} vs {from_pointer:?}"),
    }
}

/// A copy of some bytes placed so that they end right before a `PROT_NONE` page.
pub struct GuardedCopy {
    map: *mut libc::c_void,
    map_len: usize,
    start: usize,
}

impl GuardedCopy {
    pub fn new(bytes: &[u8]) -> GuardedCopy {
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        let body = bytes.len().div_ceil(page).max(1) * page;
        let map_len = body + page;
        // SAFETY: an anonymous private mapping; the result is checked.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(map, libc::MAP_FAILED, "mmap failed");
        // SAFETY: the guard page lies inside the mapping we just made.
        let guard =
            unsafe { libc::mprotect(map.cast::<u8>().add(body).cast(), page, libc::PROT_NONE) };
        assert_eq!(guard, 0, "mprotect failed");
        let start = body - bytes.len();
        // SAFETY: `start + bytes.len() == body`, inside the writable part of the mapping.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), map.cast::<u8>().add(start), bytes.len())
        };
        GuardedCopy {
            map,
            map_len,
            start,
        }
    }

    pub fn ptr(&self) -> *const u8 {
        // SAFETY: `start` is inside the mapping.
        unsafe { self.map.cast::<u8>().add(self.start) }
    }
}

impl Drop for GuardedCopy {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly what `new` mapped.
        unsafe { libc::munmap(self.map, self.map_len) };
    }
}
