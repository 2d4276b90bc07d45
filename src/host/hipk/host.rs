//! A HIPK host binary as the loader, `resolve` and the mount see it: the metadata in
//! `.rocm_kpack_ref` and the wrapper array in `.hipFatBinSegment`, read from the ELF file.

use crate::error::{Error, Result};
use crate::host::elf::{ElfFile, FATBIN_SEGMENT_SECTION, KPACK_REF_SECTION};

use super::metadata::HipkMetadata;
use super::wrapper::{Wrapper, parse_wrappers};

/// What a host binary carries for the loader.
#[derive(Debug, Clone)]
pub struct HipkHost {
    pub metadata: HipkMetadata,
    /// Wrappers found in `.hipFatBinSegment` (empty when the section is absent).
    pub wrappers: Vec<Wrapper>,
}

impl HipkHost {
    /// Reads the HIPK parts of an ELF file's bytes.
    pub fn read(bytes: &[u8]) -> Result<HipkHost> {
        let elf = ElfFile::parse(bytes).map_err(Error::InvalidMetadata)?;
        let section = elf.section(KPACK_REF_SECTION).ok_or_else(|| {
            Error::InvalidMetadata(format!("no {KPACK_REF_SECTION} section: not a HIPK binary"))
        })?;
        let metadata = HipkMetadata::parse(section.data)?;
        let wrappers = elf
            .section(FATBIN_SEGMENT_SECTION)
            .map(|s| parse_wrappers(s.data, elf.is_little_endian()))
            .unwrap_or_default();
        Ok(HipkHost { metadata, wrappers })
    }

    /// Code-object indices of the HIPK wrappers, in section order.
    pub fn hipk_code_objects(&self) -> Vec<u32> {
        self.wrappers
            .iter()
            .filter(|w| w.is_hipk())
            .map(|w| w.co_index)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn non_hipk_files_are_invalid_metadata() {
        let exe = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let e = HipkHost::read(&exe).unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::InvalidMetadata);
        assert!(e.to_string().contains(".rocm_kpack_ref"), "{e}");
        assert_eq!(
            HipkHost::read(b"KPAK").unwrap_err().kind(),
            crate::ErrorKind::InvalidMetadata
        );
    }
}
