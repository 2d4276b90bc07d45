//! Split: turn a fat ROCm host binary into a HIPK host binary (device code removed, wrappers
//! pointing at a `.rocm_kpack_ref` msgpack marker) plus the code objects for its kpack archives.
//!
//! Pure functions over bytes; the caller reads the input and writes the outputs (to a temporary
//! name, renamed into place). Only x86-64 ELF64 host binaries are rewritten, which is what ROCm
//! ships on Linux. The rewrite is described step by step in [`rewrite`].

mod check;
mod elf64;
mod emit;
mod relocs;
mod rewrite;
mod stage;
mod tree;

use std::fmt;

pub use check::{SplitCheck, verify_split, verify_split_with_progress};
pub use emit::Rewrite;
pub use rewrite::{Prepared, is_split, prepare, split_elf};
pub use stage::{StageError, Staging};
pub use tree::{
    BinaryReport, Kept, Outcome, SplitReport, SplitRequest, TreeError, default_out_root,
    split_tree, split_tree_with_progress,
};

use crate::host::fatbin::{self, CodeObject, FatbinError};
use crate::host::hipk::{self, HIPF_MAGIC, HIPK_MAGIC};

/// Why a binary cannot be split.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SplitError {
    /// Not a 64-bit little-endian ELF file.
    NotElf64(String),
    /// A well-formed ELF file in a shape we do not rewrite.
    Unsupported(String),
    /// Headers or tables that contradict the file.
    Malformed(String),
    /// No `.hip_fatbin` section: nothing to split (callers copy such binaries unchanged).
    NoDeviceCode,
    /// A `.hip_fatbin` but no `.hipFatBinSegment` wrappers pointing at it.
    NoWrappers,
    /// The binary already has a `.rocm_kpack_ref` marker.
    AlreadySplit,
    /// A wrapper whose magic is neither `HIPF` nor `HIPK`.
    BadWrapper { index: usize, magic: u32 },
    /// A relocation other than a wrapper pointer targets the device code being removed.
    DanglingReloc { at: u64, target: u64 },
    /// The device code itself could not be read.
    Fatbin(FatbinError),
}

impl fmt::Display for SplitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SplitError::NotElf64(why) => write!(f, "cannot split: {why}"),
            SplitError::Unsupported(why) => write!(f, "cannot split this binary: {why}"),
            SplitError::Malformed(why) => write!(f, "malformed ELF file: {why}"),
            SplitError::NoDeviceCode => write!(f, "has no .hip_fatbin section (no device code)"),
            SplitError::NoWrappers => {
                write!(f, "has .hip_fatbin but no .hipFatBinSegment wrappers")
            }
            SplitError::AlreadySplit => {
                write!(
                    f,
                    "already split (it has a .rocm_kpack_ref marker); split the original fat binary instead"
                )
            }
            SplitError::BadWrapper { index, magic } => write!(
                f,
                "wrapper {index} has magic {magic:#010x}, neither HIPF ({HIPF_MAGIC:#010x}) nor HIPK ({HIPK_MAGIC:#010x})"
            ),
            SplitError::DanglingReloc { at, target } => write!(
                f,
                "the relocation at {at:#x} points into .hip_fatbin ({target:#x}) but is not a wrapper's pointer; \
                 removing the device code would break it"
            ),
            SplitError::Fatbin(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for SplitError {}

/// The rewritten binary and what was done to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SplitResult {
    pub bytes: Vec<u8>,
    /// Wrappers rewritten to HIPK (wrapper `i` carries index `i`).
    pub wrappers: usize,
    /// Dynamic relocations that set a wrapper pointer and now point at the marker.
    pub relocations_rewritten: usize,
    /// File bytes removed (whole pages of device code).
    pub removed: u64,
    /// Size of the original `.hip_fatbin` section.
    pub device_code: u64,
    /// Where the marker is loaded (before relocation by the load bias).
    pub marker_vaddr: u64,
}

/// A split binary: the new host binary and the code objects for its archives.
#[derive(Debug, Clone)]
pub struct SplitBinary {
    pub result: SplitResult,
    pub metadata: Vec<u8>,
    pub code_objects: Vec<CodeObject>,
}

/// The HIPK metadata a binary split for archives `<prefix>_<arch>.kpack` carries, pinned to
/// the TOC digests `pins` when given (without, byte-identical to the reference tooling's).
pub fn marker(kernel_name: &str, prefix: &str, pins: Option<&[hipk::metadata::Pin]>) -> Vec<u8> {
    hipk::metadata::encode_pinned(
        &[fatbin::search_path(kernel_name, prefix, false)],
        kernel_name,
        pins,
    )
}

impl SplitError {
    /// A failure to read the device code, as a reason not to split.
    pub fn from_fatbin(e: FatbinError) -> SplitError {
        match e {
            FatbinError::NoDeviceCode => SplitError::NoDeviceCode,
            FatbinError::AlreadySplit => SplitError::AlreadySplit,
            other => SplitError::Fatbin(other),
        }
    }
}

/// Splits one host binary whose path below the install root is `kernel_name`, for archives
/// named `<prefix>_<arch>.kpack` in `<root>/.kpack/`. The archives do not exist yet, so the
/// marker carries no pins ([`split_tree`] pins what it writes).
pub fn split_binary(
    bytes: &[u8],
    kernel_name: &str,
    prefix: &str,
) -> Result<SplitBinary, SplitError> {
    if is_split(bytes)? {
        return Err(SplitError::AlreadySplit);
    }
    let code_objects =
        fatbin::host_code_objects(kernel_name, bytes).map_err(SplitError::from_fatbin)?;
    let metadata = marker(kernel_name, prefix, None);
    let result = split_elf(bytes, &metadata)?;
    Ok(SplitBinary {
        result,
        metadata,
        code_objects,
    })
}

#[cfg(test)]
mod tests;
