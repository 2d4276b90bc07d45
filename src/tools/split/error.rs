//! Why a binary cannot be split ([`SplitError`]), shared by every step of the rewrite.

use std::fmt;

use crate::host::fatbin::FatbinError;
use crate::host::hipk::{HIPF_MAGIC, HIPK_MAGIC};

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
