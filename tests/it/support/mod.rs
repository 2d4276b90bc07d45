//! Shared fixtures for the integration tests.

pub mod bundles;
pub mod fat_host;
pub mod faulty_source;
pub mod mount;
pub mod mount_env;

use std::path::PathBuf;

// The library as `faulty_source.rs` names it (it is also included by the library's own tests).
use rocm_kpack as kpack;

/// A xorshift64 stream from `seed` (made odd, so never the all-zero state): cheap, repeatable
/// pseudo-random numbers for test data and read offsets.
pub fn xorshift(seed: u64) -> impl FnMut() -> u64 {
    let mut x = seed | 1;
    move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    }
}

/// Every file below `dir`, relative to it, sorted.
pub fn files_below(dir: &std::path::Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                files.push(p.strip_prefix(dir).unwrap().to_path_buf());
            }
        }
    }
    files.sort();
    files
}

/// A file under `tests/fixtures/`.
pub fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// The golden archives' contents, in ordinal order: (key, arch, bytes).
pub fn golden_noop_kernels() -> Vec<(&'static str, &'static str, Vec<u8>)> {
    vec![
        (
            "lib/libtest.so#0",
            "gfx900",
            [&b"KERNEL1_GFX900_DATA"[..], &[0u8; 100]].concat(),
        ),
        (
            "lib/libtest.so#0",
            "gfx906",
            [&b"KERNEL2_GFX906_DATA"[..], &[0u8; 200]].concat(),
        ),
        (
            "bin/testapp#0",
            "gfx900",
            [&b"KERNEL3_APP_GFX900"[..], &[0xffu8; 150]].concat(),
        ),
    ]
}

pub fn golden_zstd_kernels() -> Vec<(&'static str, &'static str, Vec<u8>)> {
    vec![
        (
            "lib/libhip.so#0",
            "gfx1100",
            [&b"HIP_KERNEL_GFX1100_"[..], &[b'A'; 500], &[b'B'; 500]].concat(),
        ),
        (
            "lib/libhip.so#0",
            "gfx1101",
            [&b"HIP_KERNEL_GFX1101_"[..], &[b'X'; 300], &[b'Y'; 300]].concat(),
        ),
        (
            "bin/hiptest#0",
            "gfx1100",
            [&b"TEST_APP_KERNEL___"[..], &[0x42u8; 1000]].concat(),
        ),
    ]
}

pub mod cc;
pub mod cmatrix;
pub mod craft;
pub mod layout;
