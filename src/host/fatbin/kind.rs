//! What an ELF file is to the tools that read device code ([`HostKind`]): a fat binary, a split
//! (HIPK) one, a separated debug file, or one without device code, told from its headers alone.

use super::{FatbinError, HostFile};
use crate::host::elf::{self, ElfFile};

/// What an ELF file is to the tools that read device code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostKind {
    /// A `.hip_fatbin` section with contents and no HIPK marker: its code objects are in it.
    Fat,
    /// A `.rocm_kpack_ref` marker: its code objects are in archives found through it.
    Hipk,
    /// A `.hip_fatbin` section without contents (`SHT_NOBITS`), as `objcopy --only-keep-debug`
    /// leaves it: a separated debug file, which holds no device code.
    SeparatedDebug,
    /// Neither a `.hip_fatbin` section nor a marker.
    NoDeviceCode,
}

impl HostKind {
    /// What the file is, for a message that says why it has no device code to read.
    pub fn describe(self) -> &'static str {
        match self {
            HostKind::Fat => "a fat host binary",
            HostKind::Hipk => "a HIPK host binary (its device code lives in kpack archives)",
            HostKind::SeparatedDebug => {
                "a separated debug file: its .hip_fatbin section has no contents (SHT_NOBITS)"
            }
            HostKind::NoDeviceCode => {
                "an ELF file without device code (no .hip_fatbin section, no .rocm_kpack_ref marker)"
            }
        }
    }
}

/// The kind of an ELF file from its bytes (only its headers and section-name table are looked
/// at, so an image from [`HostFile::open_tables`] will do).
pub fn host_kind(image: &[u8]) -> Result<HostKind, FatbinError> {
    let file = ElfFile::parse(image).map_err(FatbinError::NotElf)?;
    if file.section(elf::KPACK_REF_SECTION).is_some() {
        return Ok(HostKind::Hipk);
    }
    Ok(match file.section(elf::HIP_FATBIN_SECTION) {
        Some(s) if s.file_offset.is_none() => HostKind::SeparatedDebug,
        Some(_) => HostKind::Fat,
        None => HostKind::NoDeviceCode,
    })
}

/// Refuses a host binary that is not ELF, is already split, or has no `.hip_fatbin`.
pub(super) fn check_fat(host: &HostFile) -> Result<(), FatbinError> {
    match host_kind(host.image())? {
        HostKind::Hipk => Err(FatbinError::AlreadySplit),
        HostKind::NoDeviceCode => Err(FatbinError::NoDeviceCode),
        // A section without file contents holds no bundles.
        HostKind::Fat | HostKind::SeparatedDebug => Ok(()),
    }
}
