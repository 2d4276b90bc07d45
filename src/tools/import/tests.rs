//! Unit tests for key naming, search paths and the assignment of code objects to archives.

use std::path::Path;

use super::*;
use crate::archive::writer::Compression;
use crate::host::bundle::fixtures::{build_ccob, build_uncompressed};
use crate::host::fatbin::{
    FatbinError, HostFile, StreamError, archive_file_name, code_objects, default_prefix,
    host_code_objects, kernel_name_from_relative, search_path, validate_prefix,
};

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
            matches!(code_objects("a", &s), Err(FatbinError::BadArch { triple, .. }) if triple == bad),
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
        Err(FatbinError::NotElf(_))
    ));
    // This test binary is an ELF file without device code.
    let me = std::fs::read(std::env::current_exe().unwrap()).unwrap();
    assert_eq!(host_code_objects("x", &me), Err(FatbinError::NoDeviceCode));
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

/// Per archive: file name, arches, binaries, code objects.
type Summary = Vec<(String, Vec<String>, Vec<String>, usize)>;

/// Streams two binaries' code objects (as the pipeline hands them over, stored as is) into an
/// [`ArchiveSet`]; returns per archive (file name, arches, binaries, count), and the directory.
fn assign(single: bool) -> (Summary, tempfile::TempDir) {
    let b_section = build_uncompressed(&[(GFX90A, b"b-90a")], 8);
    let cos = [
        code_objects("lib/liba.so", &three_tu_section()).unwrap(),
        code_objects("bin/b", &b_section).unwrap(),
    ];
    let dir = tempfile::tempdir().unwrap();
    let mut set = ArchiveSet::new(dir.path(), "x", single, Compression::None, false);
    for (kernel_name, cos) in ["lib/liba.so", "bin/b"].iter().zip(cos) {
        for co in cos {
            let (tag, data) = Tag::split(co, kernel_name);
            let encoded = crate::tools::pack_pipeline::Encoded {
                original_size: data.len() as u64,
                stored: data,
                digest: None,
                frame_digest: None,
            };
            set.append(tag, encoded, |p| {
                std::fs::File::create(p).map_err(|e| crate::Error::io(p, "cannot create", e))
            })
            .unwrap();
        }
    }
    let summary = set
        .finish()
        .unwrap()
        .into_iter()
        .map(|a| {
            let name = a.path.file_name().unwrap().to_string_lossy().into_owned();
            (name, a.arches, a.kernel_names, a.count)
        })
        .collect();
    (summary, dir)
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[test]
fn archive_set_assigns_per_arch_in_first_seen_order() {
    let (summary, dir) = assign(false);
    assert_eq!(
        summary,
        vec![
            (
                "x_gfx900.kpack".to_string(),
                strings(&["gfx900"]),
                strings(&["lib/liba.so"]),
                3
            ),
            (
                "x_gfx90a:xnack-.kpack".to_string(),
                strings(&["gfx90a:xnack-"]),
                strings(&["lib/liba.so", "bin/b"]),
                3
            ),
        ]
    );
    let a = crate::Archive::open(dir.path().join("x_gfx90a:xnack-.kpack")).unwrap();
    assert_eq!(a.architectures(), ["gfx90a:xnack-"]);
    assert_eq!(a.get_kernel("bin/b#0", "gfx90a:xnack-").unwrap(), b"b-90a");
    assert_eq!(
        a.get_kernel("lib/liba.so#1", "gfx90a:xnack-").unwrap(),
        b"tu2-90a"
    );
}

#[test]
fn archive_set_single_holds_every_arch() {
    let (summary, dir) = assign(true);
    assert_eq!(
        summary,
        vec![(
            "x.kpack".to_string(),
            strings(&["gfx900", "gfx90a:xnack-"]),
            strings(&["lib/liba.so", "bin/b"]),
            6
        )]
    );
    let a = crate::Archive::open(dir.path().join("x.kpack")).unwrap();
    assert_eq!(a.architectures(), ["gfx900", "gfx90a:xnack-"]);
    assert_eq!(a.get_kernel("lib/liba.so#2", "gfx900").unwrap(), b"tu2-900");
}

/// Builds a shared library in `dir` whose `.hip_fatbin` holds `section` (needs gcc).
fn fat_library(dir: &Path, section: &[u8]) -> std::path::PathBuf {
    let blob = dir.join("fatbin.blob");
    std::fs::write(&blob, section).unwrap();
    let c = dir.join("fat.c");
    std::fs::write(
        &c,
        format!(
            "__asm__(\".section .hip_fatbin,\\\"a\\\",@progbits\\n.p2align 12\\n.incbin \\\"{}\\\"\\n.previous\\n\");\nint f(void) {{ return 0; }}\n",
            blob.display()
        ),
    )
    .unwrap();
    let out = dir.join("libfat.so");
    let ok = std::process::Command::new("gcc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&out)
        .arg(&c)
        .status()
        .unwrap()
        .success();
    assert!(ok, "gcc failed");
    out
}

#[test]
fn checks_come_back_in_code_object_order_whatever_the_threads() {
    let dir = tempfile::tempdir().unwrap();
    let mut section = Vec::new();
    let mut expect = Vec::new();
    let mut bundle_bytes = 0u64;
    for tu in 0..20usize {
        let a = vec![tu as u8; 100 + tu * 37];
        let b = vec![!(tu as u8); 900 - tu * 11];
        let bundle = build_uncompressed(&[(HOST, &[]), (GFX900, &a), (GFX90A, &b)], 64);
        bundle_bytes += bundle.len() as u64;
        section.extend_from_slice(&bundle);
        section.resize(section.len().next_multiple_of(256), 0);
        expect.push(format!("lib/libfat.so#{tu} gfx900 {}", a.len()));
        expect.push(format!("lib/libfat.so#{tu} gfx90a:xnack- {}", b.len()));
    }
    let host = HostFile::open(&fat_library(dir.path(), &section)).unwrap();
    for threads in [1, 3] {
        let read = std::sync::atomic::AtomicU64::new(0);
        let got = check_host_code_objects(
            "lib/libfat.so",
            &host,
            threads,
            |co, scratch| {
                // Early code objects take longest, so with several workers they finish last.
                std::thread::sleep(std::time::Duration::from_micros(
                    2000u64.saturating_sub(co.index as u64 * 100),
                ));
                // The scratch buffer is the worker's own: nobody else wrote to it meanwhile.
                scratch.clear();
                scratch.extend_from_slice(&co.data);
                std::thread::yield_now();
                assert!(*scratch == co.data);
                format!("{} {} {}", co.key, co.arch, co.data.len())
            },
            &|n| {
                read.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
            },
        )
        .unwrap();
        assert_eq!(got, expect, "threads {threads}");
        // Every bundle's bytes are reported read once.
        assert_eq!(read.into_inner(), bundle_bytes, "threads {threads}");
    }

    // A section that stops being a bundle is the walk's error, whatever was checked before.
    let mut broken = section.clone();
    let at = section.len() - 200;
    broken.truncate(at);
    broken.extend_from_slice(b"__CLANG_OFFLOAD_BUNDLE__\xff\xff\xff\xff\xff\xff\xff\xff");
    let sub = tempfile::tempdir().unwrap();
    let host = HostFile::open(&fat_library(sub.path(), &broken)).unwrap();
    let r = check_host_code_objects("x", &host, 2, |co, _| co.index, &|_| {});
    assert!(
        matches!(r, Err(StreamError::Fatbin(FatbinError::Bundle(_)))),
        "{r:?}"
    );
}

#[test]
fn open_tables_reads_only_what_lists_the_sections() {
    let dir = tempfile::tempdir().unwrap();
    let section = build_uncompressed(&[(HOST, &[]), (GFX900, &[0x5a; 5000])], 64);
    let lib = fat_library(dir.path(), &section);
    let whole = std::fs::read(&lib).unwrap();
    let tables = HostFile::open_tables(&lib).unwrap();
    assert_eq!(tables.len(), whole.len() as u64);
    // The device code is located (from the section headers read), not read.
    let full = HostFile::open(&lib).unwrap();
    let range = |h: &HostFile| h.fatbin().map(|r| (r.offset, r.len));
    assert!(range(&tables).is_some());
    assert_eq!(range(&tables), range(&full));
    let (t, w) = (
        crate::host::elf::ElfFile::parse(tables.image()).unwrap(),
        crate::host::elf::ElfFile::parse(&whole).unwrap(),
    );
    for name in [
        ".text",
        ".hip_fatbin",
        ".dynsym",
        ".shstrtab",
        ".rocm_kpack_ref",
    ] {
        let (ts, ws) = (t.section(name), w.section(name));
        assert_eq!(
            ts.as_ref().map(|s| (s.address, s.file_offset)),
            ws.as_ref().map(|s| (s.address, s.file_offset)),
            "{name}"
        );
    }
    // Section contents were not read (the device code least of all), the name table was.
    assert!(
        t.section(".hip_fatbin")
            .unwrap()
            .data
            .iter()
            .all(|b| *b == 0)
    );
    assert!(w.section(".hip_fatbin").unwrap().data.contains(&0x5a));
    assert!(t.section(".text").unwrap().data.iter().all(|b| *b == 0));
    assert_eq!(
        t.section(".shstrtab").unwrap().data,
        w.section(".shstrtab").unwrap().data
    );

    // A file whose tables do not read as ELF64 is read whole, for the parser to judge.
    let odd = dir.path().join("odd");
    let mut bytes = whole.clone();
    bytes[4] = 1; // ELFCLASS32
    std::fs::write(&odd, &bytes).unwrap();
    assert!(HostFile::open_tables(&odd).unwrap().image() == &bytes[..]);
}
