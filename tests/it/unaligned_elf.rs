//! Host binaries laid out as the reference Python rewriter (`elf/surgery.py`) writes them: the
//! section header table appended at the very end of the file, at whatever offset the file
//! ended (`e_shoff` = the old file length, here odd). `readelf`, `ld.so` and the HIP runtime
//! accept such files; so must `resolve`, `load`, the mount, `verify --split` and the C library.
//!
//! Fixtures: a gcc-built fat shared library and PIE executable, split by us, then re-laid out
//! the reference's way ([`relayout_like_reference`]).

use std::path::{Path, PathBuf};
use std::process::Command;

use rocm_kpack::Compression;
use rocm_kpack::host::fatbin::{self, CodeObject};
use rocm_kpack::tools::split::{Outcome, SplitRequest, split_tree};

use crate::split::{HIPF, Kind, assert_readelf_clean, build, tu_blobs};
use crate::support::mount::{Mount, fuse_available};

/// Moves the section header table to the end of the file at an odd offset, as the reference
/// does when it appends sections: the table is written at `len(data)`, with no alignment.
/// Returns the new `e_shoff`.
fn relayout_like_reference(path: &Path) -> u64 {
    let mut b = std::fs::read(path).unwrap();
    let le64 = |b: &[u8], at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
    let le16 = |b: &[u8], at: usize| u16::from_le_bytes(b[at..at + 2].try_into().unwrap());
    let shoff = le64(&b, 40) as usize;
    let len = le16(&b, 58) as usize * le16(&b, 60) as usize;
    let table = b[shoff..shoff + len].to_vec();
    // The reference appends the new section's bytes first: any length, here one that leaves
    // the file at an odd size.
    b.extend_from_slice(b"\x82\xa1k\xa1v");
    if b.len() % 2 == 0 {
        b.push(0);
    }
    let new_shoff = b.len() as u64;
    b.extend_from_slice(&table);
    b[40..48].copy_from_slice(&new_shoff.to_le_bytes());
    std::fs::write(path, &b).unwrap();
    assert_eq!(new_shoff % 2, 1);
    new_shoff
}

struct Fixture {
    _tmp: tempfile::TempDir,
    input_root: PathBuf,
    out_root: PathBuf,
    binary: PathBuf,
    kernel_name: &'static str,
    originals: Vec<CodeObject>,
}

fn fixture(kind: Kind, kernel_name: &'static str) -> Fixture {
    let tmp = tempfile::tempdir().unwrap();
    let dir = std::fs::canonicalize(tmp.path()).unwrap();
    let input = build(
        &dir,
        &format!("in/{kernel_name}"),
        &tu_blobs(),
        HIPF,
        kind,
        "",
    );
    let out_root = dir.join("out");
    let report = split_tree(&SplitRequest {
        hosts: vec![input.clone()],
        root: dir.join("in"),
        out_root: out_root.clone(),
        prefix: Some("ua".into()),
        compression: Compression::Zstd { level: 3 },
        reference_layout: false,
        pins: true,
    })
    .unwrap();
    assert!(matches!(report.binaries[0].outcome, Outcome::Split { .. }));
    let binary = out_root.join(kernel_name);
    let shoff = relayout_like_reference(&binary);
    assert_readelf_clean(&binary);
    let originals =
        fatbin::host_code_objects(kernel_name, &std::fs::read(&input).unwrap()).unwrap();
    assert_eq!(originals.len(), 6);
    eprintln!("{}: e_shoff {shoff}", binary.display());
    Fixture {
        _tmp: tmp,
        input_root: dir.join("in"),
        out_root,
        binary,
        kernel_name,
        originals,
    }
}

fn kpack(args: &[&std::ffi::OsStr]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_kpack-fuse"))
        .args(args)
        .env_remove("ROCM_KPACK_PATH")
        .env_remove("ROCM_KPACK_PATH_PREFIX")
        .output()
        .unwrap()
}

/// resolve, load (every code object, both arches), verify --split and the mount.
fn check_cli(f: &Fixture) {
    let out = kpack(&[
        "resolve".as_ref(),
        f.binary.as_os_str(),
        "--gpu".as_ref(),
        "gfx90a:xnack-".as_ref(),
        "--json".as_ref(),
    ]);
    assert!(
        out.status.success(),
        "resolve: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["kernel_name"], f.kernel_name);
    let cos = doc["code_objects"].as_array().unwrap();
    assert_eq!(cos.len(), 3);
    for (i, co) in cos.iter().enumerate() {
        assert_eq!(co["co_index"], i);
        assert_eq!(co["result"]["ok"], true, "{co}");
        assert_eq!(co["result"]["target"], "gfx90a:xnack-");
    }

    let got = f.out_root.join("got.hsaco");
    for co in &f.originals {
        let out = kpack(&[
            "load".as_ref(),
            f.binary.as_os_str(),
            "--gpu".as_ref(),
            co.arch.as_ref(),
            "--co".as_ref(),
            co.index.to_string().as_ref(),
            "-o".as_ref(),
            got.as_os_str(),
        ]);
        assert!(
            out.status.success(),
            "load {} {}: {}",
            co.key,
            co.arch,
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            std::fs::read(&got).unwrap() == co.data,
            "{} {}",
            co.key,
            co.arch
        );
    }

    let out = kpack(&[
        "verify".as_ref(),
        "--split".as_ref(),
        f.out_root.as_os_str(),
        "--original".as_ref(),
        f.input_root.as_os_str(),
    ]);
    assert_eq!(
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned()
        ),
        (
            Some(0),
            "1 split binaries: 6 code objects loaded through their markers, byte-identical to the originals\n"
                .to_string()
        ),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    if !fuse_available() {
        return;
    }
    let want = f.out_root.join("../want");
    for co in f.originals.iter().filter(|c| c.arch == "gfx900") {
        let p = want.join(&co.key).join("gfx900.hsaco");
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, &co.data).unwrap();
    }
    let m = Mount::start(&f.binary, &["--gpu", "gfx900"]);
    m.check("tree", want.to_str().unwrap());
    m.stop();
}

#[test]
fn reference_laid_out_library_resolves_loads_mounts_and_verifies() {
    let f = fixture(Kind::Library, "lib/libua.so");
    check_cli(&f);
    // Through the .so, the way the HIP runtime uses it, from the dlopened library.
    crate::split_c::run_split_load_for(&f.binary, &f.originals, "dlopen");
}

#[test]
fn reference_laid_out_executable_resolves_loads_mounts_and_verifies() {
    let f = fixture(Kind::Executable, "bin/ua");
    check_cli(&f);
    crate::split_c::run_split_load_for(&f.binary, &f.originals, "file");
}

/// An ELF file that does not parse is reported by `verify --split` as a problem naming it,
/// never as "no split binaries found".
#[test]
fn verify_split_names_an_elf_file_that_does_not_parse() {
    let tmp = tempfile::tempdir().unwrap();
    let out_root = tmp.path().join("out");
    std::fs::create_dir_all(out_root.join("lib")).unwrap();
    let bad = out_root.join("lib/libbad.so");
    let mut bytes = b"\x7fELF\x02\x01\x01".to_vec();
    bytes.resize(64, 0);
    bytes[40..48].copy_from_slice(&u64::MAX.to_le_bytes()); // e_shoff far past the end
    bytes[58..60].copy_from_slice(&64u16.to_le_bytes());
    bytes[60..62].copy_from_slice(&3u16.to_le_bytes());
    std::fs::write(&bad, &bytes).unwrap();
    std::fs::write(out_root.join("README"), b"not a binary").unwrap();
    let out = kpack(&[
        "verify".as_ref(),
        "--split".as_ref(),
        out_root.as_os_str(),
        "--original".as_ref(),
        tmp.path().as_os_str(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(6), "{stderr}");
    assert!(
        stderr.starts_with(&format!("BAD {}: malformed ELF file: ", bad.display())),
        "{stderr}"
    );
    assert!(!stderr.contains("no split binaries found"), "{stderr}");
}
