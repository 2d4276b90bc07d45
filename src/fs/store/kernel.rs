//! What the mount's stores know about one kernel: its identity ([`KernelId`]), what its
//! decoded file must be ([`KernelSpec`]), and how a failed file operation reaches a reader
//! ([`fail`]). A leaf shared by the cache directory, the backing files and the store.

use std::io;

use crate::fs::errno::Errno;

/// Identifies one kernel of the mount: which archive, and its ordinal in that archive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KernelId {
    pub archive: u32,
    pub ordinal: u32,
}

/// What the store needs to know about one kernel.
#[derive(Debug, Clone, Copy)]
pub struct KernelSpec {
    pub id: KernelId,
    /// Decoded size.
    pub len: u64,
    /// Key of the kernel in a persistent cache directory (see `cache_dir.rs`).
    pub cache_key: [u8; 32],
    /// The archive's BLAKE3 of the decoded bytes, when it records one.
    pub digest: Option<[u8; 32]>,
}

/// Logs an I/O failure of a backing file; returns what the reader sees for it.
pub fn fail(what: &str, e: &io::Error) -> Errno {
    log::error!("backing file: {what}: {e}");
    Errno::from(e)
}

/// Why a kernel's backing file could not be made, for the caller to log with the kernel's
/// name (archive, key and arch), and what its readers see.
#[derive(Debug, Clone)]
pub struct FileError {
    pub errno: Errno,
    pub message: String,
    /// The file was made but its space could not be reserved, even with nothing more to
    /// evict (the file system is full).
    pub no_room: bool,
}

impl FileError {
    /// `what` failed with `e`.
    pub fn new(what: &str, e: &io::Error) -> FileError {
        FileError {
            errno: Errno::from(e),
            message: format!("{what}: {e}"),
            no_room: false,
        }
    }
}

impl std::fmt::Display for FileError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}
