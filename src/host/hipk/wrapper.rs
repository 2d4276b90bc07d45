//! The `__CudaFatBinaryWrapper` records of `.hipFatBinSegment`.
//!
//! Each record is 24 bytes: `u32 magic`, `u32 version`, `u64 binary` (a pointer, relocated at
//! load time), `u64 reserved1`. The kpack transform sets the magic to `HIPK`, points `binary` at
//! the metadata and stores the record's index (the code-object index, `#N` in TOC keys) in the
//! low 32 bits of `reserved1`, keeping its high 32 bits. Untransformed records keep `HIPF`.

use crate::bytes;

/// Magic of a wrapper whose device code is still embedded (`HIPF` as a little-endian u32).
pub(crate) const HIPF_MAGIC: u32 = 0x4849_5046;
/// Magic of a wrapper whose device code lives in kpack archives (`HIPK` as a little-endian u32).
pub const HIPK_MAGIC: u32 = 0x4B50_4948;
/// Bytes per wrapper.
pub(crate) const WRAPPER_SIZE: usize = 24;

/// One wrapper of `.hipFatBinSegment`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Wrapper {
    /// Position in the section.
    pub index: usize,
    pub magic: u32,
    pub version: u32,
    /// The `binary` pointer as stored in the file (before load-time relocation).
    #[serde(skip)]
    pub pointer: u64,
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

/// Splits a `.hipFatBinSegment` into wrappers; a trailing partial wrapper is ignored.
pub fn parse_wrappers(data: &[u8], little_endian: bool) -> Vec<Wrapper> {
    let u32_at = |b: &[u8], at: usize| {
        let v = if little_endian {
            bytes::le_u32(b, at)
        } else {
            bytes::be_u32(b, at)
        };
        v.expect("inside a 24-byte record")
    };
    let u64_at = |b: &[u8], at: usize| {
        let (lo, hi) = if little_endian {
            (u32_at(b, at), u32_at(b, at + 4))
        } else {
            (u32_at(b, at + 4), u32_at(b, at))
        };
        u64::from(lo) | u64::from(hi) << 32
    };
    data.chunks_exact(WRAPPER_SIZE)
        .enumerate()
        .map(|(index, w)| Wrapper {
            index,
            magic: u32_at(w, 0),
            version: u32_at(w, 4),
            pointer: u64_at(w, 8),
            co_index: u64_at(w, 16) as u32,
        })
        .collect()
}

/// Turns one little-endian wrapper record into a HIPK wrapper for code object `co_index` whose
/// `binary` points at `marker_address`; its version and the high half of `reserved1` are kept.
/// Returns the magic it had.
pub(crate) fn make_hipk(
    record: &mut [u8; WRAPPER_SIZE],
    marker_address: u64,
    co_index: u32,
) -> u32 {
    let old_magic = bytes::le_u32(record, 0).expect("24-byte record");
    let reserved = bytes::le_u64(record, 16).expect("24-byte record");
    record[0..4].copy_from_slice(&HIPK_MAGIC.to_le_bytes());
    record[8..16].copy_from_slice(&marker_address.to_le_bytes());
    let reserved = (reserved & !0xffff_ffff) | u64::from(co_index);
    record[16..24].copy_from_slice(&reserved.to_le_bytes());
    old_magic
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
            (w[0].magic_name(), w[0].co_index, w[0].version, w[0].pointer),
            ("HIPK".to_string(), 0, 1, 0x1234)
        );
        assert_eq!(w[1].magic_name(), "HIPF");
        assert!(!w[1].is_hipk());
        assert_eq!((w[2].index, w[2].co_index), (2, 7));
        assert_eq!(&b"HIPK"[..], &HIPK_MAGIC.to_le_bytes());
        assert_eq!(&b"FPIH"[..], &HIPF_MAGIC.to_le_bytes());
    }

    #[test]
    fn big_endian_records_take_the_low_half_of_reserved1() {
        let mut rec = Vec::new();
        rec.extend_from_slice(&HIPK_MAGIC.to_be_bytes());
        rec.extend_from_slice(&2u32.to_be_bytes());
        rec.extend_from_slice(&0xAABB_CCDD_0011_2233u64.to_be_bytes());
        rec.extend_from_slice(&(9u64 | 3 << 32).to_be_bytes());
        let w = parse_wrappers(&rec, false);
        assert_eq!(
            (w[0].magic, w[0].version, w[0].pointer, w[0].co_index),
            (HIPK_MAGIC, 2, 0xAABB_CCDD_0011_2233, 9)
        );
    }

    #[test]
    fn make_hipk_encodes_what_parse_reads() {
        let mut rec = [0u8; WRAPPER_SIZE];
        rec[0..4].copy_from_slice(&HIPF_MAGIC.to_le_bytes());
        rec[4..8].copy_from_slice(&1u32.to_le_bytes());
        rec[16..24].copy_from_slice(&(0xdead_beef_0000_0005u64).to_le_bytes());
        assert_eq!(make_hipk(&mut rec, 0x4000, 3), HIPF_MAGIC);
        let w = parse_wrappers(&rec, true)[0];
        assert_eq!(
            (w.magic, w.version, w.pointer, w.co_index),
            (HIPK_MAGIC, 1, 0x4000, 3)
        );
        assert_eq!(&rec[20..24], &0xdead_beefu32.to_le_bytes());
    }
}
