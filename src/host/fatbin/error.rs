//! The errors of reading a fat binary's device code: [`FatbinError`], why a host binary's code
//! objects cannot be read, and [`StreamError`], why visiting them one at a time stopped (that, a
//! failed read, or the visitor's own error).

use std::fmt;

use crate::host::bundle::BundleError;
use crate::host::elf;

/// Why the device code of a host binary cannot be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FatbinError {
    /// Not a readable ELF file.
    NotElf(String),
    /// The ELF file has no `.hip_fatbin` section.
    NoDeviceCode,
    /// The binary already carries a `.rocm_kpack_ref` marker: its device code was moved out.
    AlreadySplit,
    /// The section's bundles are malformed.
    Bundle(BundleError),
    /// A bundle names a target that cannot be used in a file name.
    BadArch { triple: String, reason: String },
}

impl fmt::Display for FatbinError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FatbinError::NotElf(why) => write!(f, "not an ELF host binary: {why}"),
            FatbinError::NoDeviceCode => write!(
                f,
                "has no {} section (no device code to import)",
                elf::HIP_FATBIN_SECTION
            ),
            FatbinError::AlreadySplit => write!(
                f,
                "already split: it has a {} marker and its device code lives in kpack archives",
                elf::KPACK_REF_SECTION
            ),
            FatbinError::Bundle(e) => write!(f, "{}: {e}", elf::HIP_FATBIN_SECTION),
            FatbinError::BadArch { triple, reason } => {
                write!(
                    f,
                    "bundle triple {triple:?} names a target that cannot be a file name: {reason}"
                )
            }
        }
    }
}

impl std::error::Error for FatbinError {}

/// Why visiting a binary's code objects stopped.
#[derive(Debug)]
pub enum StreamError<E> {
    Fatbin(FatbinError),
    /// Reading the file failed.
    Read(std::io::Error),
    /// The visitor's own error.
    Visit(E),
}
