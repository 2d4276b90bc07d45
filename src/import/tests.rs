//! Unit tests for key naming, search paths and archive planning.

use std::path::Path;

use super::*;
use crate::bundle::{build_ccob, build_uncompressed};

const GFX900: &str = "hipv4-amdgcn-amd-amdhsa--gfx900";
const GFX90A: &str = "hipv4-amdgcn-amd-amdhsa--gfx90a:xnack-";
const HOST: &str = "host-x86_64-unknown-linux";

/// Three translation units: (gfx900, gfx90a:xnack-), (gfx900), CCOB (gfx90a:xnack-, gfx900).
fn three_tu_section() -> Vec<u8> {
    let mut s = build_uncompressed(
        &[(HOST, &[]), (GFX900, b"tu0-900"), (GFX90A, b"tu0-90a")],
        64,
    );
    s.resize(s.len().next_multiple_of(256), 0);
    s.extend_from_slice(&build_uncompressed(
        &[(HOST, &[]), (GFX900, b"tu1-900")],
        64,
    ));
    s.resize(s.len().next_multiple_of(256), 0);
    let inner = build_uncompressed(
        &[(HOST, &[]), (GFX90A, b"tu2-90a"), (GFX900, b"tu2-900")],
        64,
    );
    s.extend_from_slice(&build_ccob(3, &inner, 3).unwrap());
    s
}

#[test]
fn keys_count_per_arch_in_bundle_order() {
    let cos = code_objects("lib/libx.so", &three_tu_section()).unwrap();
    let got: Vec<(&str, &str, u32, &[u8])> = cos
        .iter()
        .map(|c| (c.key.as_str(), c.arch.as_str(), c.index, &c.data[..]))
        .collect();
    assert_eq!(
        got,
        vec![
            ("lib/libx.so#0", "gfx900", 0, &b"tu0-900"[..]),
            ("lib/libx.so#0", "gfx90a:xnack-", 0, &b"tu0-90a"[..]),
            ("lib/libx.so#1", "gfx900", 1, &b"tu1-900"[..]),
            ("lib/libx.so#1", "gfx90a:xnack-", 1, &b"tu2-90a"[..]),
            ("lib/libx.so#2", "gfx900", 2, &b"tu2-900"[..]),
        ]
    );
    assert_eq!(cos[1].triple, GFX90A);
}

#[test]
fn unusable_arch_strings_are_refused() {
    for bad in [
        "hipv4-amdgcn-amd-amdhsa--gfx/../../etc",
        "hipv4-amdgcn-amd-amdhsa--..",
    ] {
        let s = build_uncompressed(&[(bad, b"x")], 8);
        assert!(
            matches!(code_objects("a", &s), Err(ImportError::BadArch { triple, .. }) if triple == bad),
            "{bad}"
        );
    }
    let e = code_objects(
        "a",
        &build_uncompressed(&[("hipv4-amdgcn-amd-amdhsa--..", b"x")], 8),
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "bundle triple \"hipv4-amdgcn-amd-amdhsa--..\" names a target that cannot be a file name: \
         arch \"..\" has a '..' component"
    );
}

/// `pack` (names::check_arch) and `pack --from-fatbin` once disagreed: arches with a space, an
/// `@` or `=` were packed from a tree but refused from a fat binary. Both follow one rule now.
#[test]
fn every_arch_pack_accepts_is_imported() {
    for arch in [
        "gfx90a:xnack-",
        "gfx942:sramecc+:xnack-",
        "gfx9-4-generic",
        "gfx1250-strict",
        "gfx 900",
        "gfx900@x",
        "gfx=900",
    ] {
        assert_eq!(crate::names::check_arch(arch), Ok(()), "{arch}");
        let triple = format!("hipv4-amdgcn-amd-amdhsa--{arch}");
        let s = build_uncompressed(&[(triple.as_str(), b"x")], 8);
        let cos = code_objects("a", &s).unwrap();
        assert_eq!((cos[0].arch.as_str(), cos[0].key.as_str()), (arch, "a#0"));
    }
}

#[test]
fn host_binaries_are_checked() {
    assert!(matches!(
        host_code_objects("x", b"KPAK"),
        Err(ImportError::NotElf(_))
    ));
    // This test binary is an ELF file without device code.
    let me = std::fs::read(std::env::current_exe().unwrap()).unwrap();
    assert_eq!(host_code_objects("x", &me), Err(ImportError::NoDeviceCode));
}

#[test]
fn kernel_names_from_relative_paths() {
    assert_eq!(
        kernel_name_from_relative(Path::new("lib/librocrand.so.1.1")).unwrap(),
        "lib/librocrand.so.1.1"
    );
    assert_eq!(
        kernel_name_from_relative(Path::new("./bin/app")).unwrap(),
        "bin/app"
    );
    assert!(kernel_name_from_relative(Path::new("../x")).is_err());
    assert!(kernel_name_from_relative(Path::new("/abs/x")).is_err());
    assert!(kernel_name_from_relative(Path::new("")).is_err());
}

#[test]
fn prefixes() {
    assert_eq!(default_prefix("librocrand.so.1.1"), "rocrand");
    assert_eq!(default_prefix("hipcc_app"), "hipcc_app");
    assert_eq!(default_prefix("lib.so"), "lib");
    assert!(validate_prefix("rocrand").is_ok());
    for bad in ["", "a/b", "..", ".", "a@b", "a\0b", &"p".repeat(256)] {
        assert!(validate_prefix(bad).is_err(), "{bad:?}");
    }
    assert!(validate_prefix("roc rand+2").is_ok());
}

#[test]
fn search_paths_climb_one_level_per_directory() {
    assert_eq!(
        search_path("librocrand.so.1.1", "rocrand", false),
        ".kpack/rocrand_@GFXARCH@.kpack"
    );
    assert_eq!(
        search_path("lib/librocrand.so.1.1", "rocrand", false),
        "../.kpack/rocrand_@GFXARCH@.kpack"
    );
    assert_eq!(
        search_path("a/b/c/libx.so", "blas_lib", false),
        "../../../.kpack/blas_lib_@GFXARCH@.kpack"
    );
    assert_eq!(search_path("lib/libx.so", "x", true), "../.kpack/x.kpack");
    assert_eq!(
        archive_file_name("torch", Some("gfx90a:xnack+")),
        "torch_gfx90a:xnack+.kpack"
    );
}

#[test]
fn plans_per_arch_and_single_archives() {
    let a = ImportedHost {
        kernel_name: "lib/liba.so".into(),
        code_objects: code_objects("lib/liba.so", &three_tu_section()).unwrap(),
    };
    let b_section = build_uncompressed(&[(GFX90A, b"b-90a")], 8);
    let b = ImportedHost {
        kernel_name: "bin/b".into(),
        code_objects: code_objects("bin/b", &b_section).unwrap(),
    };

    let plans = plan_archives(vec![a.clone(), b.clone()], "x", false, Compression::None).unwrap();
    let summary: Vec<(&str, Vec<String>, usize)> = plans
        .iter()
        .map(|p| (p.file_name.as_str(), p.arches.clone(), p.writer.len()))
        .collect();
    assert_eq!(
        summary,
        vec![
            ("x_gfx900.kpack", vec!["gfx900".to_string()], 3),
            (
                "x_gfx90a:xnack-.kpack",
                vec!["gfx90a:xnack-".to_string()],
                3
            )
        ]
    );

    let single = plan_archives(vec![a, b], "x", true, Compression::None).unwrap();
    assert_eq!(single.len(), 1);
    assert_eq!(single[0].file_name, "x.kpack");
    assert_eq!(
        single[0].arches,
        vec!["gfx900".to_string(), "gfx90a:xnack-".to_string()]
    );
    assert_eq!(single[0].writer.len(), 6);
}
