//! Reading sections of ELF host binaries: the HIPK marker `.rocm_kpack_ref`, the wrapper array
//! `.hipFatBinSegment` and the device code in `.hip_fatbin`. Parsing is done by `object`, which
//! bounds-checks every header against the file; this module only names what we look for.

use object::{Object, ObjectSection};

/// The section holding the HIPK msgpack marker.
pub const KPACK_REF_SECTION: &str = ".rocm_kpack_ref";
/// The section holding `__CudaFatBinaryWrapper` structs.
pub const FATBIN_SEGMENT_SECTION: &str = ".hipFatBinSegment";
/// The section holding offload bundles (device code).
pub const HIP_FATBIN_SECTION: &str = ".hip_fatbin";

/// ELF files start with these bytes.
pub(crate) const ELF_MAGIC: &[u8; 4] = b"\x7fELF";

/// One section: its bytes in the file (empty for `SHT_NOBITS`), load address and file offset.
#[derive(Debug, Clone, Copy)]
pub struct Section<'a> {
    pub data: &'a [u8],
    pub address: u64,
    pub file_offset: Option<u64>,
}

/// A parsed ELF file borrowing its bytes.
pub struct ElfFile<'a> {
    file: object::File<'a>,
}

impl<'a> ElfFile<'a> {
    /// Parses `bytes` as ELF; anything else is an error with a reason.
    pub fn parse(bytes: &'a [u8]) -> Result<ElfFile<'a>, String> {
        if !bytes.starts_with(ELF_MAGIC) {
            return Err("not an ELF file".into());
        }
        let file = object::File::parse(bytes).map_err(|e| format!("malformed ELF file: {e}"))?;
        Ok(ElfFile { file })
    }

    /// The named section, if present.
    pub fn section(&self, name: &str) -> Option<Section<'a>> {
        let s = self.file.section_by_name(name)?;
        Some(Section {
            data: s.data().unwrap_or(&[]),
            address: s.address(),
            file_offset: s.file_range().map(|(off, _)| off),
        })
    }

    pub fn is_little_endian(&self) -> bool {
        self.file.is_little_endian()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_non_elf() {
        assert!(ElfFile::parse(b"KPAK....").is_err());
        assert!(ElfFile::parse(b"\x7fELF\x02\x01").is_err());
    }

    #[test]
    fn reads_own_test_binary() {
        let exe = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let elf = ElfFile::parse(&exe).unwrap();
        assert!(elf.section(".text").is_some());
        assert!(elf.section(KPACK_REF_SECTION).is_none());
    }
}
