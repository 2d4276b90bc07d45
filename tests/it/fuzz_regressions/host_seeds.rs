//! Seeds of the host-binary targets (`split_elf`, `hipk_host`, `host_walk`): small fat binaries
//! built by gcc the way `tests/it/split.rs` builds them (libraries with RELA and packed RELR
//! relocations, PIE and fixed executables, plain and CCOB bundles, wrong wrapper magics, a stray
//! pointer into the device code), the HIPK binaries `split` makes of them, and a binary without
//! device code. gcc's output differs between versions, so unlike the archive seeds these are not
//! compared with a generator: `KPACK_BLESS_FUZZ_SEEDS=1` writes them when they are missing, and
//! `host_seeds_reach_the_deep_paths` checks that the committed ones still exercise what they are
//! for. Debian's librocrand is replayed through the same checks by `real_rocrand_*`.

use std::path::Path;
use std::process::Command;

use crate::support::bundles::{build_ccob, build_uncompressed};
use rocm_kpack::host::hipk::metadata::Pin;
use rocm_kpack::tools::split;

use crate::split::{HIPF, Kind, build};

/// Two translation units with small code objects for three arches (one repeated).
fn blobs() -> Vec<Vec<u8>> {
    let a = b"\x7fELF-gfx900-code-object".repeat(4);
    let b = b"\x7fELF-gfx90a-code-object".repeat(3);
    let c = b"\x7fELF-gfx1100-code-object".repeat(2);
    vec![
        build_uncompressed(
            &[
                ("host-x86_64-unknown-linux", &[]),
                ("hipv4-amdgcn-amd-amdhsa--gfx900", &a),
                ("hipv4-amdgcn-amd-amdhsa--gfx90a:xnack-", &b),
            ],
            16,
        ),
        build_uncompressed(
            &[
                ("host-x86_64-unknown-linux", &[]),
                ("hipv4-amdgcn-amd-amdhsa--gfx900", &c),
                ("hipv4-amdgcn-amd-amdhsa--gfx1100", &c),
            ],
            16,
        ),
    ]
}

fn ccob_blobs() -> Vec<Vec<u8>> {
    blobs()
        .iter()
        .zip([2u16, 3])
        .map(|(b, v)| build_ccob(v, b, 3).unwrap())
        .collect()
}

/// A fat seed to build: file name, blobs, bundle magic, kind of binary, extra C source.
type FatCase = (&'static str, Vec<Vec<u8>>, u32, Kind, &'static str);

/// (file name, bytes) of every fat seed.
fn fat_binaries(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let stray = "const void *stray_pointer __attribute__((used)) = kp_tu0 + 16;";
    let cases: Vec<FatCase> = vec![
        ("fat-library.so", blobs(), HIPF, Kind::Library, ""),
        ("fat-relr-library.so", blobs(), HIPF, Kind::RelrLibrary, ""),
        ("fat-pie-executable", blobs(), HIPF, Kind::Executable, ""),
        (
            "fat-fixed-executable",
            blobs(),
            HIPF,
            Kind::FixedExecutable,
            "",
        ),
        ("fat-ccob-library.so", ccob_blobs(), HIPF, Kind::Library, ""),
        (
            "bad-magic-library.so",
            blobs(),
            0x1234_5678,
            Kind::Library,
            "",
        ),
        (
            "stray-pointer-library.so",
            blobs(),
            HIPF,
            Kind::Library,
            stray,
        ),
        (
            "stray-pointer-relr.so",
            blobs(),
            HIPF,
            Kind::RelrLibrary,
            stray,
        ),
    ];
    cases
        .into_iter()
        .map(|(name, blobs, magic, kind, extra)| {
            let path = build(dir, name, &blobs, magic, kind, extra);
            (name.to_owned(), std::fs::read(path).unwrap())
        })
        .collect()
}

/// What `split` makes of the fat seeds it accepts, with plain and pinned markers.
fn split_binaries(fat: &[(String, Vec<u8>)]) -> Vec<(String, Vec<u8>)> {
    let pins: Vec<Pin> = vec![[7u8; 32], [9u8; 32]];
    let mut out = Vec::new();
    for (name, bytes) in fat.iter().filter(|(n, _)| n.starts_with("fat-")) {
        let plain = split::split_binary(bytes, "lib/seed.so", "seed").unwrap();
        out.push((format!("split-{name}"), plain.result.bytes));
        let marker = split::marker("lib/seed.so", "seed", Some(&pins));
        let pinned = split::split_elf(bytes, &marker).unwrap();
        out.push((format!("split-pinned-{name}"), pinned.bytes));
    }
    out
}

/// A shared library without device code.
fn plain_library(dir: &Path) -> Vec<u8> {
    let c = dir.join("plain.c");
    std::fs::write(&c, "int kp_plain(void) { return 7; }\n").unwrap();
    let so = dir.join("plain.so");
    let o = Command::new("gcc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&so)
        .arg(&c)
        .output()
        .expect("gcc must be installed");
    assert!(
        o.status.success(),
        "gcc: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    std::fs::read(so).unwrap()
}

/// A separated debug file of `bytes` (`objcopy --only-keep-debug`: `.hip_fatbin` is NOBITS),
/// as `-dbgsym` packages ship them and a walked install tree meets them.
fn separated_debug(dir: &Path, bytes: &[u8]) -> Vec<u8> {
    let so = dir.join("for-debug.so");
    let debug = dir.join("for-debug.so.debug");
    std::fs::write(&so, bytes).unwrap();
    let o = Command::new("objcopy")
        .arg("--only-keep-debug")
        .arg(&so)
        .arg(&debug)
        .output()
        .expect("objcopy (binutils) must be installed");
    assert!(
        o.status.success(),
        "objcopy: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    std::fs::read(debug).unwrap()
}

/// Every host seed by target: (target, file name, bytes).
pub fn host_seeds() -> Vec<(&'static str, String, Vec<u8>)> {
    let dir = tempfile::tempdir().unwrap();
    let fat = fat_binaries(dir.path());
    let split = split_binaries(&fat);
    let plain = ("no-device-code.so".to_owned(), plain_library(dir.path()));
    let mut out = Vec::new();
    for (name, bytes) in fat.iter().chain([&plain]) {
        out.push(("split_elf", name.clone(), bytes.clone()));
        out.push(("host_walk", name.clone(), bytes.clone()));
    }
    for (name, bytes) in &split {
        out.push(("hipk_host", name.clone(), bytes.clone()));
        out.push(("split_elf", name.clone(), bytes.clone()));
        out.push(("host_walk", name.clone(), bytes.clone()));
    }
    out.push((
        "host_walk",
        "debug-fat-library.so".to_owned(),
        separated_debug(dir.path(), &fat[0].1),
    ));
    out.push(("hipk_host", plain.0.clone(), plain.1.clone()));
    out.push(("hipk_host", fat[0].0.clone(), fat[0].1.clone()));
    out
}
