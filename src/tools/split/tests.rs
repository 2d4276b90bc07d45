//! Unit tests for the inputs the split refuses. End-to-end rewrites (gcc-built libraries and
//! executables, dlopen, readelf, rocRAND) are in `tests/it/split.rs`.

use super::*;

#[test]
fn refuses_what_it_cannot_rewrite() {
    assert!(matches!(
        split_elf(b"KPAK", b"m"),
        Err(SplitError::NotElf64(_))
    ));
    assert!(matches!(
        split_elf(b"\x7fELF\x02\x01", b"m"),
        Err(SplitError::NotElf64(_))
    ));
    let mut elf32 = vec![0u8; 64];
    elf32[..6].copy_from_slice(b"\x7fELF\x01\x01");
    assert_eq!(
        split_elf(&elf32, b"m"),
        Err(SplitError::NotElf64(
            "only 64-bit little-endian ELF is rewritten (class 1, data 1)".into()
        ))
    );
    // This test binary is x86-64 ELF without device code.
    let me = std::fs::read(std::env::current_exe().unwrap()).unwrap();
    assert_eq!(split_elf(&me, b"m"), Err(SplitError::NoDeviceCode));
    assert_eq!(
        split_binary(&me, "x", "p").unwrap_err(),
        SplitError::NoDeviceCode
    );
    assert!(!is_split(&me).unwrap());
}

#[test]
fn truncated_and_mutated_headers_are_errors_not_panics() {
    let me = std::fs::read(std::env::current_exe().unwrap()).unwrap();
    for len in [0, 4, 16, 63, 64, 100, 4096] {
        assert!(split_elf(&me[..len], b"m").is_err(), "{len}");
    }
    let mut state = 0x1234_5678_9abc_def1u64;
    for _ in 0..400 {
        let mut m = me[..me.len().min(1 << 16)].to_vec();
        // Section and program header fields live in the first 64 bytes and at e_shoff; mutate the
        // header and a few random bytes anywhere.
        for _ in 0..3 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let i = if state % 2 == 0 {
                (state >> 8) as usize % 64
            } else {
                (state >> 8) as usize % m.len()
            };
            m[i] = (state >> 40) as u8;
        }
        let _ = split_elf(&m, b"marker");
    }
}
