//! A HIPK host binary as the loader sees it: the metadata in `.rocm_kpack_ref` and the
//! `__CudaFatBinaryWrapper` array in `.hipFatBinSegment`, read from the ELF file.
//!
//! Each wrapper is 24 bytes: `u32 magic`, `u32 version`, `u64 binary` (a pointer, relocated at
//! load time), `u64 reserved1`. The kpack transform sets the magic to `HIPK`, points `binary` at
//! the metadata and stores the wrapper's index (the code-object index, `#N` in TOC keys) in the
//! low 32 bits of `reserved1`. Untransformed wrappers keep the `HIPF` magic.

use crate::elf::{ElfFile, FATBIN_SEGMENT_SECTION, KPACK_REF_SECTION};
use crate::error::{Error, Result};

use super::metadata::HipkMetadata;

/// Magic of a wrapper whose device code is still embedded.
pub const HIPF_MAGIC: u32 = 0x4849_5046;
/// Magic of a wrapper whose device code lives in kpack archives.
pub const HIPK_MAGIC: u32 = 0x4B50_4948;
/// Bytes per wrapper.
pub const WRAPPER_SIZE: usize = 24;

/// One wrapper of `.hipFatBinSegment`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Wrapper {
    /// Position in the section.
    pub index: usize,
    pub magic: u32,
    pub version: u32,
    /// Low 32 bits of `reserved1`: the code-object index of a HIPK wrapper.
    pub co_index: u32,
}

impl Wrapper {
    pub fn is_hipk(&self) -> bool {
        self.magic == HIPK_MAGIC
    }

    /// `HIPK`, `HIPF`, or the magic in hex.
    pub fn magic_name(&self) -> String {
        match self.magic {
            HIPK_MAGIC => "HIPK".into(),
            HIPF_MAGIC => "HIPF".into(),
            other => format!("{other:#010x}"),
        }
    }
}

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

/// Splits a `.hipFatBinSegment` into wrappers; a trailing partial wrapper is ignored.
pub fn parse_wrappers(data: &[u8], little_endian: bool) -> Vec<Wrapper> {
    let u32_at = |b: &[u8], at: usize| {
        let raw: [u8; 4] = b[at..at + 4].try_into().expect("4 bytes");
        if little_endian {
            u32::from_le_bytes(raw)
        } else {
            u32::from_be_bytes(raw)
        }
    };
    data.chunks_exact(WRAPPER_SIZE)
        .enumerate()
        .map(|(index, w)| Wrapper {
            index,
            magic: u32_at(w, 0),
            version: u32_at(w, 4),
            // The low half of the u64 at 16 sits first in little-endian order, last in big.
            co_index: if little_endian {
                u32_at(w, 16)
            } else {
                u32_at(w, 20)
            },
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrappers_are_24_byte_records() {
        let mut data = Vec::new();
        for (magic, co) in [
            (HIPK_MAGIC, 0u64),
            (HIPF_MAGIC, 0),
            (HIPK_MAGIC, 7 | (5 << 32)),
        ] {
            data.extend_from_slice(&magic.to_le_bytes());
            data.extend_from_slice(&1u32.to_le_bytes());
            data.extend_from_slice(&0x1234u64.to_le_bytes());
            data.extend_from_slice(&co.to_le_bytes());
        }
        data.extend_from_slice(&[0xff; 10]);
        let w = parse_wrappers(&data, true);
        assert_eq!(w.len(), 3);
        assert_eq!(
            (w[0].magic_name(), w[0].co_index, w[0].version),
            ("HIPK".to_string(), 0, 1)
        );
        assert_eq!(w[1].magic_name(), "HIPF");
        assert!(!w[1].is_hipk());
        assert_eq!((w[2].index, w[2].co_index), (2, 7));
    }

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
