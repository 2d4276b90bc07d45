//! `archive_mutate`: structured mutations of the golden archives, so the fuzzer spends its time
//! past the header and TOC checks that random bytes rarely get through.
//!
//! Input: one byte choosing the base archive, then 4-byte edits `[op, pos_hi, pos_lo, arg]`
//! applied in order (`pos` is taken modulo the current length):
//! - op 0: set the byte at `pos` to `arg`;
//! - op 1: write a boundary value (chosen by `arg`) as a little-endian u32 at `pos`;
//! - op 2: the same as a u64 (header TOC offset, msgpack uint64 fields);
//! - op 3: cut the file at `pos`;
//! - op 4: insert `arg` copies of the byte at `pos` (grows containers, nests arrays).
//!
//! The result goes through the `archive` check with all its invariants.

use super::archive::{self, Outcome};

const BASES: &[&[u8]] = &[
    include_bytes!("../../../tests/fixtures/test_noop.kpack"),
    include_bytes!("../../../tests/fixtures/test_zstd.kpack"),
];

/// Values that sit on the parser's limits: zero, type-width edges, the frame-count limit
/// (2^20) on both sides, 4 GiB, and the sign bit.
const BOUNDARY: &[u64] = &[
    0,
    1,
    15,
    16,
    0x7f,
    0x80,
    0xff,
    0xffff,
    0x1_0000,
    1 << 20,
    (1 << 20) + 1,
    0x7fff_ffff,
    0xffff_ffff,
    1 << 32,
    1 << 60,
    u64::MAX,
];

/// Edits larger than this are ignored, so one input cannot grow the file without bound.
const MAX_LEN: usize = 1 << 20;

pub fn mutate(data: &[u8]) -> Vec<u8> {
    let Some((&base, edits)) = data.split_first() else {
        return BASES[0].to_vec();
    };
    let mut bytes = BASES[usize::from(base) % BASES.len()].to_vec();
    for edit in edits.chunks_exact(4) {
        if bytes.is_empty() {
            break;
        }
        let (op, arg) = (edit[0] % 5, edit[3]);
        let pos = usize::from(u16::from_be_bytes([edit[1], edit[2]])) % bytes.len();
        let value = BOUNDARY[usize::from(arg) % BOUNDARY.len()];
        match op {
            0 => bytes[pos] = arg,
            1 => overwrite(&mut bytes, pos, &(value as u32).to_le_bytes()),
            2 => overwrite(&mut bytes, pos, &value.to_le_bytes()),
            3 => bytes.truncate(pos),
            _ => {
                if bytes.len() + usize::from(arg) <= MAX_LEN {
                    let b = bytes[pos];
                    bytes.splice(pos..pos, std::iter::repeat_n(b, usize::from(arg)));
                }
            }
        }
    }
    bytes
}

fn overwrite(bytes: &mut [u8], pos: usize, with: &[u8]) {
    let end = (pos + with.len()).min(bytes.len());
    bytes[pos..end].copy_from_slice(&with[..end - pos]);
}

pub fn run(data: &[u8]) -> Outcome {
    archive::run(&mutate(data))
}
