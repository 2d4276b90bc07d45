//! Shared by the benchmark targets: synthetic code-like kernels and timing helpers.

#![allow(dead_code)] // Each benchmark target uses its own subset.

use std::time::Duration;

/// Code-like bytes: 4-byte "instructions" drawn from a small vocabulary with random operands,
/// which zstd compresses about 2:1 to 3:1, close to real AMDGPU code objects.
pub fn kernel_bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = move || {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    };
    let vocab: Vec<u32> = (0..64).map(|_| next() as u32).collect();
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        let r = next();
        out.extend_from_slice(&vocab[(r % 64) as usize].to_le_bytes());
        if r & 0x300 == 0 {
            out.extend_from_slice(&((r >> 32) as u32).to_le_bytes());
        }
    }
    out.truncate(len);
    out
}

/// The fastest of `runs` timings: the run least disturbed by the rest of the machine.
pub fn best_of<F: FnMut() -> Duration>(runs: usize, mut f: F) -> Duration {
    (0..runs).map(|_| f()).min().expect("at least one run")
}

/// What a comparison is against, as printed: a smoke run (`--quick`) is not a measurement, so
/// it states no target and passes no verdict (a trailing "(target ...)" is left out).
pub fn against_for_print(against: &str, quick: bool) -> String {
    match against.find("(target") {
        Some(at) if quick => against[..at].trim_end().to_owned(),
        _ => against.to_owned(),
    }
}
