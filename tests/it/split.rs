//! `split`, ELF side: gcc-built fat libraries and executables whose wrappers point into
//! `.hip_fatbin` through dynamic relocations are rewritten, then checked with readelf, loaded
//! with dlopen (wrappers inspected in memory) or run, and Debian's librocrand.so.1.1 is split.

use std::ffi::{CStr, CString};
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::support::bundles::build_uncompressed;
use rocm_kpack::host::hipk::HIPK_MAGIC;
use rocm_kpack::tools::split::{self, SplitError};

pub(crate) const HIPF: u32 = 0x4849_5046;

/// Three translation units, each a bundle with two arches (64 KiB code objects, so the device
/// code spans many pages).
pub(crate) fn tu_blobs() -> Vec<Vec<u8>> {
    (0..3)
        .map(|tu| {
            let a = vec![b'a' + tu as u8; 65536];
            let b = vec![b'x' + tu as u8; 70000];
            build_uncompressed(
                &[
                    ("host-x86_64-unknown-linux", &[]),
                    ("hipv4-amdgcn-amd-amdhsa--gfx900", &a),
                    ("hipv4-amdgcn-amd-amdhsa--gfx90a:xnack-", &b),
                ],
                4096,
            )
        })
        .collect()
}

#[derive(Clone, Copy, PartialEq)]
pub(crate) enum Kind {
    Library,
    Executable,
    /// Non-PIE: wrapper pointers are absolute values in the file, with no relocation.
    FixedExecutable,
    /// A library whose relative relocations are packed in `.relr.dyn` (DT_RELR).
    RelrLibrary,
}

/// Builds a fat binary: each blob is one bundle in `.hip_fatbin` (labels `kp_tuN`; `kp_tu1` is
/// global, so in a library its wrapper pointer is set by a symbol relocation, the others by
/// RELATIVE ones). `extra_c` is appended to the C source.
pub(crate) fn build(
    dir: &Path,
    rel: &str,
    blobs: &[Vec<u8>],
    magic: u32,
    kind: Kind,
    extra_c: &str,
) -> PathBuf {
    let out = dir.join(rel);
    std::fs::create_dir_all(out.parent().unwrap()).unwrap();
    let stem = rel.replace('/', "_");
    let mut asm = String::from(".section .hip_fatbin,\\\"a\\\",@progbits\\n.globl kp_tu1\\n");
    let mut decls = String::new();
    let mut wrappers = String::new();
    for (i, blob) in blobs.iter().enumerate() {
        let p = dir.join(format!("{stem}.tu{i}"));
        std::fs::write(&p, blob).unwrap();
        asm.push_str(&format!(
            ".p2align 12\\nkp_tu{i}:\\n.incbin \\\"{}\\\"\\n",
            p.display()
        ));
        decls.push_str(&format!("extern const unsigned char kp_tu{i}[];\n"));
        wrappers.push_str(&format!("{{ {magic:#x}u, 1u, kp_tu{i}, 0ull }},"));
    }
    asm.push_str(".previous\\n");
    let main = if matches!(kind, Kind::Executable | Kind::FixedExecutable) {
        r#"
#include <stdio.h>
#include <stdlib.h>
int main(int argc, char **argv) {
    size_t n = (size_t)atoi(argv[1]);
    for (int i = 0; i < (int)(sizeof hip_wrappers / sizeof hip_wrappers[0]); i++) {
        const unsigned char *p = hip_wrappers[i].binary;
        printf("%08x %u %llu ", hip_wrappers[i].magic, hip_wrappers[i].version, hip_wrappers[i].reserved1);
        for (size_t k = 0; k < n; k++) printf("%02x", p[k]);
        printf("\n");
    }
    return 0;
}
"#
    } else {
        ""
    };
    let c = format!(
        "__asm__(\"{asm}\");\n{decls}\
         struct wrapper {{ unsigned int magic; unsigned int version; const void *binary; unsigned long long reserved1; }};\n\
         __attribute__((section(\".hipFatBinSegment\"), used, aligned(8))) struct wrapper hip_wrappers[] = {{ {wrappers} }};\n\
         {extra_c}\n{main}"
    );
    let c_path = dir.join(format!("{stem}.c"));
    std::fs::write(&c_path, c).unwrap();
    let mut cmd = Command::new("gcc");
    match kind {
        Kind::Library => cmd.args(["-shared", "-fPIC"]),
        Kind::RelrLibrary => cmd.args(["-shared", "-fPIC", "-Wl,-z,pack-relative-relocs"]),
        Kind::Executable => cmd.args(["-fPIE", "-pie"]),
        Kind::FixedExecutable => cmd.args(["-fno-pie", "-no-pie"]),
    };
    let o = cmd
        .arg("-o")
        .arg(&out)
        .arg(&c_path)
        .output()
        .expect("gcc must be installed");
    assert!(
        o.status.success(),
        "gcc: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    out
}

/// `readelf -a` must succeed without a single warning or error.
pub(crate) fn assert_readelf_clean(path: &Path) {
    let o = Command::new("readelf")
        .arg("-a")
        .arg("-W")
        .arg(path)
        .output()
        .expect("readelf (binutils) must be installed");
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "readelf failed: {err}");
    assert_eq!(err, "", "readelf complained about {}", path.display());
    // readelf reports problems as "readelf: Warning: ..." / "readelf: Error: ..." (symbol names
    // such as hipGetLastError must not count).
    assert!(
        !out.contains("readelf: "),
        "readelf output mentions a problem:\n{out}"
    );
}

/// (offset, type, addend-or-symbol-value) of every dynamic relocation, as readelf prints them.
fn readelf_relocs(path: &Path) -> Vec<(u64, String, u64)> {
    let o = Command::new("readelf")
        .args(["-rW"])
        .arg(path)
        .output()
        .unwrap();
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.len() < 4 || !f[2].starts_with("R_X86_64_") {
                return None;
            }
            let off = u64::from_str_radix(f[0], 16).ok()?;
            let val = u64::from_str_radix(f[3], 16).ok()?;
            Some((off, f[2].to_string(), val))
        })
        .collect()
}

/// (address, size) of a section, from readelf.
pub(crate) fn section_addr(path: &Path, name: &str) -> (u64, u64) {
    let o = Command::new("readelf")
        .args(["-SW"])
        .arg(path)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    let line = text
        .lines()
        .find(|l| l.split_whitespace().any(|w| w == name))
        .unwrap_or_else(|| panic!("no {name}"));
    let f: Vec<&str> = line.split(']').nth(1).unwrap().split_whitespace().collect();
    (
        u64::from_str_radix(f[2], 16).unwrap(),
        u64::from_str_radix(f[4], 16).unwrap(),
    )
}

fn split_to(input: &Path, out: &Path, kernel_name: &str, prefix: &str) -> split::SplitBinary {
    let s = split::split_binary(&std::fs::read(input).unwrap(), kernel_name, prefix).unwrap();
    std::fs::create_dir_all(out.parent().unwrap()).unwrap();
    std::fs::write(out, &s.result.bytes).unwrap();
    std::fs::set_permissions(out, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    s
}

#[test]
fn split_library_loads_with_hipk_wrappers() {
    split_library(Kind::Library);
}

#[test]
fn split_relr_library_loads_with_hipk_wrappers() {
    split_library(Kind::RelrLibrary);
}

fn split_library(kind: Kind) {
    let dir = tempfile::tempdir().unwrap();
    let lib = build(
        dir.path(),
        "in/lib/libsplit.so",
        &tu_blobs(),
        HIPF,
        kind,
        "",
    );
    let relr = kind == Kind::RelrLibrary;
    let sections = Command::new("readelf")
        .args(["-SW"])
        .arg(&lib)
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&sections.stdout).contains(" .relr.dyn "),
        relr,
        "RELR section as requested"
    );
    let out = dir.path().join("out/lib/libsplit.so");
    let s = split_to(&lib, &out, "lib/libsplit.so", "splt");
    assert_eq!(s.result.wrappers, 3);
    // With RELR, the two local-label pointers are packed (no RELA entry to rewrite; their
    // in-place values are rewritten); the global one keeps a RELA symbol relocation.
    assert_eq!(s.result.relocations_rewritten, if relr { 1 } else { 3 });
    assert_eq!(
        s.metadata,
        rocm_kpack::host::hipk::metadata::encode(
            &["../.kpack/splt_@GFXARCH@.kpack".into()],
            "lib/libsplit.so"
        )
    );
    let keys: Vec<(&str, &str)> = s
        .code_objects
        .iter()
        .map(|c| (c.key.as_str(), c.arch.as_str()))
        .collect();
    assert_eq!(
        keys,
        [
            ("lib/libsplit.so#0", "gfx900"),
            ("lib/libsplit.so#0", "gfx90a:xnack-"),
            ("lib/libsplit.so#1", "gfx900"),
            ("lib/libsplit.so#1", "gfx90a:xnack-"),
            ("lib/libsplit.so#2", "gfx900"),
            ("lib/libsplit.so#2", "gfx90a:xnack-"),
        ]
    );

    assert_readelf_clean(&out);
    let before = std::fs::metadata(&lib).unwrap().len();
    let after = std::fs::metadata(&out).unwrap().len();
    let (fb_addr, fb_size) = section_addr(&lib, ".hip_fatbin");
    assert!(
        before - after >= fb_size * 9 / 10,
        "shrank by {} of {fb_size} device-code bytes",
        before - after
    );

    // Relocations: the three wrapper pointers are RELATIVE to the marker; nothing points into
    // the old device code.
    let (seg_addr, _) = section_addr(&lib, ".hipFatBinSegment");
    let (marker_addr, marker_size) = section_addr(&out, ".rocm_kpack_ref");
    assert_eq!(
        (marker_addr, marker_size),
        (s.result.marker_vaddr, s.metadata.len() as u64)
    );
    let relocs = readelf_relocs(&out);
    for i in 0..3 {
        let slot = seg_addr + 24 * i + 8;
        let r: Vec<_> = relocs.iter().filter(|r| r.0 == slot).collect();
        if relr && i != 1 {
            assert_eq!(
                r,
                Vec::<&(u64, String, u64)>::new(),
                "wrapper {i} is relocated through RELR"
            );
        } else {
            assert_eq!(
                r,
                [&(slot, "R_X86_64_RELATIVE".to_string(), marker_addr)],
                "wrapper {i}"
            );
        }
    }
    assert!(
        relocs
            .iter()
            .all(|r| r.2 < fb_addr || r.2 >= fb_addr + fb_size),
        "{relocs:?}"
    );

    // Load it and look at the wrappers in memory.
    let path = CString::new(out.to_str().unwrap()).unwrap();
    unsafe {
        let h = libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
        assert!(
            !h.is_null(),
            "dlopen: {:?}",
            CStr::from_ptr(libc::dlerror())
        );
        let w = libc::dlsym(h, c"hip_wrappers".as_ptr()) as *const u8;
        assert!(!w.is_null());
        for i in 0..3usize {
            let rec = std::slice::from_raw_parts(w.add(24 * i), 24);
            assert_eq!(
                u32::from_le_bytes(rec[0..4].try_into().unwrap()),
                HIPK_MAGIC
            );
            assert_eq!(u32::from_le_bytes(rec[4..8].try_into().unwrap()), 1);
            assert_eq!(
                u64::from_le_bytes(rec[16..24].try_into().unwrap()),
                i as u64
            );
            let p = u64::from_le_bytes(rec[8..16].try_into().unwrap()) as *const u8;
            assert_eq!(
                std::slice::from_raw_parts(p, s.metadata.len()),
                s.metadata.as_slice()
            );
            // The marker lies inside the rewritten library's own mapping.
            let mut info: libc::Dl_info = std::mem::zeroed();
            assert_ne!(libc::dladdr(p as *const libc::c_void, &mut info), 0);
            assert_eq!(
                CStr::from_ptr(info.dli_fname).to_str().unwrap(),
                out.to_str().unwrap()
            );
            assert_eq!(p as u64 - info.dli_fbase as u64, marker_addr);
        }
        libc::dlclose(h);
    }

    // Splitting the result again is refused; the input was not touched.
    assert_eq!(
        split::split_binary(&std::fs::read(&out).unwrap(), "x", "p").unwrap_err(),
        SplitError::AlreadySplit
    );
    assert_eq!(std::fs::metadata(&lib).unwrap().len(), before);
}

#[test]
fn split_executable_runs_with_hipk_wrappers() {
    for kind in [Kind::Executable, Kind::FixedExecutable] {
        split_executable(kind);
    }
}

fn split_executable(kind: Kind) {
    let dir = tempfile::tempdir().unwrap();
    let exe = build(dir.path(), "in/bin/app", &tu_blobs(), HIPF, kind, "");
    let out = dir.path().join("out/bin/app");
    let s = split_to(&exe, &out, "bin/app", "splt");
    assert_eq!(
        s.result.relocations_rewritten,
        if kind == Kind::Executable { 3 } else { 0 }
    );
    assert_readelf_clean(&out);
    let o = Command::new(&out)
        .arg(s.metadata.len().to_string())
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "split executable failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let hex: String = s.metadata.iter().map(|b| format!("{b:02x}")).collect();
    let want: String = (0..3).map(|i| format!("4b504948 1 {i} {hex}\n")).collect();
    assert_eq!(String::from_utf8_lossy(&o.stdout), want);
    let (_, fb_size) = section_addr(&exe, ".hip_fatbin");
    let shrink = std::fs::metadata(&exe).unwrap().len() - std::fs::metadata(&out).unwrap().len();
    assert!(shrink >= fb_size * 9 / 10);
}

#[test]
fn split_refuses_bad_wrappers_and_other_pointers_into_device_code() {
    let dir = tempfile::tempdir().unwrap();
    let bad = build(
        dir.path(),
        "bad.so",
        &tu_blobs()[..1],
        0x1234_5678,
        Kind::Library,
        "",
    );
    assert_eq!(
        split::split_binary(&std::fs::read(&bad).unwrap(), "bad.so", "p").unwrap_err(),
        SplitError::BadWrapper {
            index: 0,
            magic: 0x1234_5678
        }
    );
    // Another pointer into the device code, as a RELA and as a packed RELR relocation.
    let extra = "const void *stray_pointer __attribute__((used)) = kp_tu0 + 16;";
    for (name, kind) in [
        ("stray.so", Kind::Library),
        ("stray-relr.so", Kind::RelrLibrary),
    ] {
        let stray = build(dir.path(), name, &tu_blobs()[..1], HIPF, kind, extra);
        let (fb_addr, _) = section_addr(&stray, ".hip_fatbin");
        match split::split_binary(&std::fs::read(&stray).unwrap(), name, "p") {
            Err(SplitError::DanglingReloc { target, .. }) => {
                assert_eq!(target, fb_addr + 16, "{name}")
            }
            other => panic!(
                "{name}: expected a refusal, got {:?}",
                other.map(|s| s.result.wrappers)
            ),
        }
    }
}

#[test]
fn split_real_rocrand() {
    let Some(so) = crate::fatbin::rocrand() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("lib/librocrand.so.1.1");
    let s = split_to(&so, &out, "lib/librocrand.so.1.1", "rocrand");
    assert_eq!((s.result.wrappers, s.result.relocations_rewritten), (1, 1));
    assert_eq!(s.code_objects.len(), 7);
    assert!(
        s.code_objects
            .iter()
            .all(|c| c.key == "lib/librocrand.so.1.1#0")
    );
    assert_readelf_clean(&out);
    let (fb_addr, fb_size) = section_addr(&so, ".hip_fatbin");
    assert_eq!((fb_addr, fb_size), (0xc53000, 0xbbf229));
    let shrink = std::fs::metadata(&so).unwrap().len() - std::fs::metadata(&out).unwrap().len();
    assert!(shrink >= fb_size * 9 / 10, "{shrink}");
    let (marker, _) = section_addr(&out, ".rocm_kpack_ref");
    let relocs = readelf_relocs(&out);
    assert!(relocs.contains(&(0x1834c68, "R_X86_64_RELATIVE".to_string(), marker)));
    assert!(
        relocs
            .iter()
            .all(|r| r.2 < fb_addr || r.2 >= fb_addr + fb_size)
    );
    // The dynamic loader accepts it as a shared object (exit status 2 of --verify); it cannot be
    // dlopened here because libamdhip64 is not installed.
    let o = Command::new("/lib64/ld-linux-x86-64.so.2")
        .arg("--verify")
        .arg(&out)
        .status()
        .unwrap();
    assert_eq!(o.code(), Some(2));
}

/// A tree `in/` with a fat library (three wrappers) and a fat executable (two); returns
/// (canonical temp dir, root, library, executable).
pub(crate) fn fat_tree(tmp: &tempfile::TempDir) -> (PathBuf, PathBuf, PathBuf, PathBuf) {
    let dir = std::fs::canonicalize(tmp.path()).unwrap();
    let lib = build(
        &dir,
        "in/lib/libsplit.so",
        &tu_blobs(),
        HIPF,
        Kind::Library,
        "",
    );
    let app = build(
        &dir,
        "in/bin/app",
        &tu_blobs()[1..],
        HIPF,
        Kind::Executable,
        "",
    );
    (dir.clone(), dir.join("in"), lib, app)
}

#[test]
fn split_tree_shares_archives_copies_plain_binaries_and_verifies() {
    use rocm_kpack::tools::split::{
        Kept, Outcome, SplitRequest, TreeError, split_tree, verify_split,
    };
    use rocm_kpack::{Archive, Compression};

    let tmp = tempfile::tempdir().unwrap();
    let (dir, root, lib, app) = fat_tree(&tmp);
    let plain = root.join("lib/libplain.so");
    let c = dir.join("plain.c");
    std::fs::write(&c, "int plain(void) { return 7; }\n").unwrap();
    assert!(
        Command::new("gcc")
            .args(["-shared", "-fPIC", "-o"])
            .arg(&plain)
            .arg(&c)
            .status()
            .unwrap()
            .success()
    );
    let inputs: Vec<Vec<u8>> = [&lib, &app, &plain]
        .iter()
        .map(|p| std::fs::read(p).unwrap())
        .collect();

    let out = dir.join("out");
    let req = SplitRequest {
        hosts: vec![lib.clone(), app.clone(), plain.clone()],
        root: root.clone(),
        out_root: out.clone(),
        prefix: Some("splt".into()),
        compression: Compression::Zstd { level: 3 },
        reference_layout: false,
        // Unpinned, so that a swapped archive below reaches verify's own byte comparison
        // (pinned binaries refuse it earlier: split_cli and pins.rs).
        pins: false,
    };
    let report = split_tree(&req).unwrap();
    let outcomes: Vec<(&str, bool)> = report
        .binaries
        .iter()
        .map(|b| {
            (
                b.kernel_name.as_str(),
                b.outcome == Outcome::Copied(Kept::NoDeviceCode),
            )
        })
        .collect();
    assert_eq!(
        outcomes,
        [
            ("lib/libsplit.so", false),
            ("bin/app", false),
            ("lib/libplain.so", true)
        ]
    );
    assert_eq!(
        report
            .archives
            .iter()
            .map(|(p, n)| (p.file_name().unwrap().to_str().unwrap().to_owned(), *n))
            .collect::<Vec<_>>(),
        [
            ("splt_gfx900.kpack".to_owned(), 5),
            ("splt_gfx90a:xnack-.kpack".to_owned(), 5)
        ]
    );
    let a = Archive::open(out.join(".kpack/splt_gfx900.kpack")).unwrap();
    assert_eq!(
        a.binaries().map(|b| b.key).collect::<Vec<_>>(),
        [
            "bin/app#0",
            "bin/app#1",
            "lib/libsplit.so#0",
            "lib/libsplit.so#1",
            "lib/libsplit.so#2"
        ]
    );
    // The executable's first TU is the library's second one.
    assert_eq!(
        a.get_kernel("bin/app#0", "gfx900").unwrap(),
        vec![b'b'; 65536]
    );

    // Inputs untouched, the plain library copied byte for byte, outputs executable and valid.
    for (p, b) in [&lib, &app, &plain].iter().zip(&inputs) {
        assert_eq!(&std::fs::read(p).unwrap(), b);
    }
    assert_eq!(
        std::fs::read(out.join("lib/libplain.so")).unwrap(),
        inputs[2]
    );
    for p in ["lib/libsplit.so", "bin/app"] {
        assert_readelf_clean(&out.join(p));
    }
    // The tree writes each binary file to file (kept ranges by copy_file_range); the in-memory
    // rewrite of the same input gives the same bytes.
    for (input, name) in [(&inputs[0], "lib/libsplit.so"), (&inputs[1], "bin/app")] {
        let in_memory = split::split_binary(input, name, "splt")
            .unwrap()
            .result
            .bytes;
        assert!(
            std::fs::read(out.join(name)).unwrap() == in_memory,
            "{name}"
        );
    }
    let meta = rocm_kpack::host::hipk::metadata::encode(
        &["../.kpack/splt_@GFXARCH@.kpack".into()],
        "bin/app",
    );
    let o = Command::new(out.join("bin/app"))
        .arg(meta.len().to_string())
        .output()
        .unwrap();
    assert!(o.status.success());
    assert_eq!(String::from_utf8_lossy(&o.stdout).lines().count(), 2);

    let check = verify_split(&out, &root).unwrap();
    assert_eq!(
        (check.binaries, check.code_objects, check.problems.clone()),
        (2, 10, Vec::<String>::new())
    );
    // Progress: the total is the three originals' bytes (the plain library's too, skipped as
    // not split), and exactly that much is reported read.
    let mut total = 0;
    let read = std::cell::Cell::new(0u64);
    let with_progress = rocm_kpack::tools::split::verify_split_with_progress(
        &out,
        &root,
        &mut |t| total = t,
        &|n| read.set(read.get() + n),
    )
    .unwrap();
    assert_eq!(with_progress, check);
    let originals: u64 = inputs.iter().map(|b| b.len() as u64).sum();
    assert_eq!((total, read.get()), (originals, originals));

    // A wrong archive is caught, naming the key and arch.
    let mut w =
        rocm_kpack::ArchiveWriter::new("splt", "gfx900", vec!["gfx900".into()], Compression::None)
            .unwrap();
    w.add_kernel("bin/app#0", "gfx900", vec![b'b'; 65536])
        .unwrap();
    w.add_kernel("bin/app#1", "gfx900", vec![0; 10]).unwrap();
    w.write(&out.join(".kpack/splt_gfx900.kpack"), &|_| {})
        .unwrap();
    let check = verify_split(&out, &root).unwrap();
    let app_out = out.join("bin/app");
    let lib_out = out.join("lib/libsplit.so");
    let archive = out.join(".kpack/splt_gfx900.kpack");
    let mut want = vec![format!(
        "{}: bin/app#1 [gfx900]: {} holds 10 bytes that differ from the original's 65536",
        app_out.display(),
        archive.display()
    )];
    for i in 0..3 {
        want.push(format!(
            "{}: lib/libsplit.so#{i} [gfx900]: does not load: KPACK_ERROR_KERNEL_NOT_FOUND \
             ({}: no kernel lib/libsplit.so#{i} [gfx900]: no such entry in the TOC)",
            lib_out.display(),
            archive.display()
        ));
    }
    assert_eq!(check.problems, want);

    // Refusals: output root = input root, an already split input.
    let same = SplitRequest {
        out_root: root.clone(),
        ..req.clone()
    };
    assert!(
        matches!(split_tree(&same), Err(TreeError::Usage(m)) if m.contains("is the input root"))
    );
    let again = SplitRequest {
        hosts: vec![out.join("bin/app")],
        root: out.clone(),
        out_root: dir.join("again"),
        ..req
    };
    // An already split input is carried over as it is.
    let report = split_tree(&again).unwrap();
    assert_eq!(
        report.binaries[0].outcome,
        Outcome::Copied(Kept::AlreadySplit)
    );
    assert!(report.archives.is_empty());
    assert_eq!(
        std::fs::read(dir.join("again/bin/app")).unwrap(),
        std::fs::read(out.join("bin/app")).unwrap()
    );
}
