//! `archive`: arbitrary bytes as a whole `.kpack` file, opened through a memfd (no disk I/O, and
//! a real path so `Archive::open` runs exactly as it does for users).
//!
//! Invariants: open fails only with the open matrix's error kinds; on success every entry either
//! locates or fails as not-found/I/O, and every read either returns exactly `size` bytes (the
//! stored bytes themselves for `none`) or fails with a decode, I/O or out-of-memory kind. Reading
//! the same kernel twice gives the same answer (the per-thread buffers keep no state); a refused
//! allocation is OutOfMemory, never a crash; a caller buffer of the wrong size is refused.

use std::fs::File;
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd};

use rocm_kpack::{Archive, ErrorKind, Scheme};

/// Entries read per input: enough for every crafted case, few enough that a TOC with thousands
/// of entries does not slow the fuzzer to a crawl.
const MAX_ENTRIES: usize = 64;

/// What happened: the open result, each entry's read (size or error kind), and the open
/// matrix's probe `get_kernel("k#0", "gfx900")`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub open: Result<(), ErrorKind>,
    pub reads: Vec<Result<usize, ErrorKind>>,
    pub probe: Option<Result<usize, ErrorKind>>,
}

/// An anonymous in-memory file holding `data`.
pub fn memfd_with(data: &[u8]) -> File {
    // SAFETY: the name is a valid C string; a non-negative result is a new fd we now own.
    let fd = unsafe { libc::memfd_create(c"kpack-fuzz".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(
        fd >= 0,
        "memfd_create failed: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: `fd` is open and owned by nobody else.
    let mut file = unsafe { File::from_raw_fd(fd) };
    file.write_all(data).expect("write to memfd");
    file
}

pub fn run(data: &[u8]) -> Outcome {
    let file = memfd_with(data);
    let path = format!("/proc/self/fd/{}", file.as_raw_fd());
    let archive = match Archive::open(&path) {
        Ok(a) => a,
        Err(e) => {
            let kind = e.kind();
            let allowed = [
                ErrorKind::IoError,
                ErrorKind::InvalidFormat,
                ErrorKind::UnsupportedVersion,
                ErrorKind::MsgpackParseFailed,
            ];
            assert!(allowed.contains(&kind), "open failed with {kind:?}: {e}");
            if data.is_empty() {
                assert_eq!(kind, ErrorKind::IoError);
            } else if data.len() < 16 || &data[..4] != b"KPAK" {
                assert_eq!(kind, ErrorKind::InvalidFormat, "{e}");
            }
            return Outcome {
                open: Err(kind),
                reads: Vec::new(),
                probe: None,
            };
        }
    };
    assert!(
        data.len() >= 17 && &data[..4] == b"KPAK",
        "opened a file without a header and a TOC"
    );
    assert_eq!(archive.file_len(), data.len() as u64);

    let entries: Vec<(String, String, u32)> = archive
        .entries()
        .take(MAX_ENTRIES)
        .map(|(k, e)| (k.to_owned(), e.arch.to_owned(), e.ordinal))
        .collect();
    let reads = entries
        .iter()
        .map(|(k, a, ord)| read_one(&archive, data, k, a, *ord))
        .collect();
    let probe = Some(
        archive
            .get_kernel("k#0", "gfx900")
            .map(|v| v.len())
            .map_err(|e| e.kind()),
    );
    Outcome {
        open: Ok(()),
        reads,
        probe,
    }
}

fn read_one(
    archive: &Archive,
    data: &[u8],
    key: &str,
    arch: &str,
    ordinal: u32,
) -> Result<usize, ErrorKind> {
    let kref = match archive.locate(key, arch) {
        Ok(k) => k,
        Err(e) => {
            let kind = e.kind();
            assert!(
                matches!(kind, ErrorKind::KernelNotFound | ErrorKind::IoError),
                "locate: {kind:?}: {e}"
            );
            return Err(kind);
        }
    };
    assert_eq!(kref.ordinal, ordinal);
    let stored_end = kref
        .stored
        .offset
        .checked_add(kref.stored.size)
        .expect("located span overflows");
    assert!(
        stored_end <= data.len() as u64,
        "located span {:?} is outside the file",
        kref.stored
    );
    let first = archive.get_kernel(key, arch);
    let second = archive.get_kernel(key, arch);
    match (&first, &second) {
        (Ok(a), Ok(b)) => assert_eq!(a, b, "two reads of {key} [{arch}] differ"),
        (Err(a), Err(b)) => assert_eq!(a.kind(), b.kind()),
        _ => panic!("two reads of {key} [{arch}] disagree: {first:?} vs {second:?}"),
    }
    // An allocator that refuses must give OutOfMemory whenever the read would have worked.
    let refused = archive
        .get_kernel_with(key, arch, |_| None::<Vec<u8>>)
        .expect_err("refused allocation succeeded");
    if first.is_ok() {
        assert_eq!(refused.kind(), ErrorKind::OutOfMemory, "{refused}");
    }
    // A caller buffer of the wrong size is refused before anything is read.
    if kref.size < 1 << 16 {
        let mut wrong = vec![0u8; kref.size as usize + 1];
        let e = archive
            .read_into(&kref, &mut wrong)
            .expect_err("wrong-size buffer accepted");
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    }
    match first {
        Ok(bytes) => {
            assert_eq!(bytes.len() as u64, kref.size);
            if archive.scheme() == Scheme::None {
                let range = kref.stored.offset as usize..stored_end as usize;
                assert_eq!(
                    bytes, &data[range],
                    "stored kernel {key} [{arch}] came back changed"
                );
            }
            Ok(bytes.len())
        }
        Err(e) => {
            let kind = e.kind();
            let allowed = [
                ErrorKind::DecompressionFailed,
                ErrorKind::IoError,
                ErrorKind::OutOfMemory,
            ];
            assert!(allowed.contains(&kind), "get: {kind:?}: {e}");
            assert_eq!(
                archive.scheme(),
                Scheme::ZstdPerKernel,
                "a located plain kernel failed to read: {e}"
            );
            Err(kind)
        }
    }
}
