//! `pack --from-fatbin` and `verify --against` end to end on gcc-built fat binaries, called
//! through `run`/`verify_against` (the clap wiring lives in pack.rs/verify.rs).

use std::path::{Path, PathBuf};
use std::process::Command;

use rocm_kpack::{Archive, ArchiveWriter};

use super::*;

#[path = "../../../tests/it/support/bundles.rs"]
mod bundles;
use bundles::{build_ccob, build_uncompressed};

const GFX900: &str = "hipv4-amdgcn-amd-amdhsa--gfx900";
const GFX90A: &str = "hipv4-amdgcn-amd-amdhsa--gfx90a:xnack+";

/// Builds `dir/rel` as a shared library whose `.hip_fatbin` holds `blob`.
fn fat_lib(dir: &Path, rel: &str, blob: &[u8]) -> PathBuf {
    let out = dir.join(rel);
    std::fs::create_dir_all(out.parent().unwrap()).unwrap();
    let stem = rel.replace('/', "_");
    let blob_path = dir.join(format!("{stem}.blob"));
    std::fs::write(&blob_path, blob).unwrap();
    let c_path = dir.join(format!("{stem}.c"));
    std::fs::write(
        &c_path,
        format!(
            "__asm__(\".section .hip_fatbin,\\\"a\\\",@progbits\\n.p2align 12\\n.incbin \\\"{}\\\"\\n.previous\\n\");\nint f(void) {{ return 0; }}\n",
            blob_path.display()
        ),
    )
    .unwrap();
    let ok = Command::new("gcc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&out)
        .arg(&c_path)
        .status()
        .unwrap()
        .success();
    assert!(ok, "gcc failed");
    out
}

/// Two TUs: uncompressed (gfx900 "A0", gfx90a:xnack+ "B0") and CCOB v3 (gfx900 "A1").
fn two_tu_blob(tag: &str) -> Vec<u8> {
    let a0 = format!("{tag}-A0").repeat(50);
    let b0 = format!("{tag}-B0").repeat(70);
    let a1 = format!("{tag}-A1").repeat(30);
    let mut s = build_uncompressed(
        &[
            ("host-x86_64-unknown-linux", &[]),
            (GFX900, a0.as_bytes()),
            (GFX90A, b0.as_bytes()),
        ],
        4096,
    );
    s.resize(s.len().next_multiple_of(4096), 0);
    s.extend_from_slice(
        &build_ccob(3, &build_uncompressed(&[(GFX900, a1.as_bytes())], 4096), 3).unwrap(),
    );
    s
}

fn request(hosts: Vec<PathBuf>, out_dir: PathBuf) -> ImportRequest {
    ImportRequest {
        hosts,
        out_dir,
        prefix: None,
        root: None,
        single: false,
        emit_metadata: false,
        pins: true,
        compression: Compression::Zstd { level: 3 },
        reference_layout: false,
    }
}

#[test]
fn import_with_root_writes_archives_and_metadata() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("install");
    let lib = fat_lib(&root, "lib/libsynth.so", &two_tu_blob("lib"));
    let app = fat_lib(&root, "lib/hip/libother.so.2", &two_tu_blob("other"));
    let kpack = root.join(".kpack");
    let mut req = request(vec![lib.clone(), app.clone()], kpack.clone());
    req.root = Some(root.clone());
    req.emit_metadata = true;
    run(req).unwrap();

    let mut files: Vec<String> = std::fs::read_dir(&kpack)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    files.sort();
    assert_eq!(
        files,
        [
            "libother.so.2.hipk.msgpack",
            "libsynth.so.hipk.msgpack",
            "synth_gfx900.kpack",
            "synth_gfx90a:xnack+.kpack"
        ]
    );
    let a = Archive::open(kpack.join("synth_gfx900.kpack")).unwrap();
    assert_eq!(a.architectures(), ["gfx900"]);
    assert_eq!(
        a.binaries().map(|b| b.key).collect::<Vec<_>>(),
        [
            "lib/hip/libother.so.2#0",
            "lib/hip/libother.so.2#1",
            "lib/libsynth.so#0",
            "lib/libsynth.so#1"
        ]
    );
    assert_eq!(
        a.get_kernel("lib/libsynth.so#1", "gfx900").unwrap(),
        "lib-A1".repeat(30).into_bytes()
    );
    assert_eq!(
        a.get_kernel("lib/hip/libother.so.2#0", "gfx900").unwrap(),
        "other-A0".repeat(50).into_bytes()
    );
    let b = Archive::open(kpack.join("synth_gfx90a:xnack+.kpack")).unwrap();
    assert_eq!(
        b.get_kernel("lib/libsynth.so#0", "gfx90a:xnack+").unwrap(),
        "lib-B0".repeat(70).into_bytes()
    );

    // Each binary is pinned to the TOC digests of the archives holding its code objects.
    let pins = [a.toc_digest(), b.toc_digest()];
    assert_eq!(
        std::fs::read(kpack.join("libother.so.2.hipk.msgpack")).unwrap(),
        rocm_kpack::host::hipk::metadata::encode_pinned(
            &["../../.kpack/synth_@GFXARCH@.kpack".into()],
            "lib/hip/libother.so.2",
            Some(&pins)
        )
    );
    assert_eq!(
        std::fs::read(kpack.join("libsynth.so.hipk.msgpack")).unwrap(),
        rocm_kpack::host::hipk::metadata::encode_pinned(
            &["../.kpack/synth_@GFXARCH@.kpack".into()],
            "lib/libsynth.so",
            Some(&pins)
        )
    );

    let archives = vec![
        kpack.join("synth_gfx900.kpack"),
        kpack.join("synth_gfx90a:xnack+.kpack"),
    ];
    verify_against(&archives, &[lib.clone(), app]).unwrap();

    // Without the gfx90a archive one code object per binary is missing.
    let e = verify_against(&archives[..1], &[lib]).unwrap_err();
    assert_eq!(e.exit, Exit::Corrupt);
    assert_eq!(e.message, "1 of 3 code objects are missing or differ");
}

#[test]
fn import_single_default_prefix_and_names() {
    let dir = tempfile::tempdir().unwrap();
    let lib = fat_lib(dir.path(), "librocfoo.so.1.2", &two_tu_blob("x"));
    let out = dir.path().join("out");
    let mut req = request(vec![lib.clone()], out.clone());
    req.single = true;
    req.emit_metadata = true;
    req.compression = Compression::None;
    run(req).unwrap();
    let a = Archive::open(out.join("rocfoo.kpack")).unwrap();
    assert_eq!(a.architectures(), ["gfx900", "gfx90a:xnack+"]);
    assert_eq!(
        a.binaries().map(|b| b.key).collect::<Vec<_>>(),
        ["librocfoo.so.1.2#0", "librocfoo.so.1.2#1"]
    );
    // No root: kernel_name is the file name and the archives sit in .kpack/ beside it.
    assert_eq!(
        std::fs::read(out.join("librocfoo.so.1.2.hipk.msgpack")).unwrap(),
        rocm_kpack::host::hipk::metadata::encode_pinned(
            &[".kpack/rocfoo.kpack".into()],
            "librocfoo.so.1.2",
            Some(&[a.toc_digest()])
        )
    );
    verify_against(&[out.join("rocfoo.kpack")], std::slice::from_ref(&lib)).unwrap();

    // --no-pins: exactly the reference tooling's metadata bytes.
    let plain = dir.path().join("plain");
    let mut req = request(vec![lib], plain.clone());
    req.single = true;
    req.emit_metadata = true;
    req.pins = false;
    run(req).unwrap();
    assert_eq!(
        std::fs::read(plain.join("librocfoo.so.1.2.hipk.msgpack")).unwrap(),
        rocm_kpack::host::hipk::metadata::encode(
            &[".kpack/rocfoo.kpack".into()],
            "librocfoo.so.1.2"
        )
    );
}

#[test]
fn verify_names_each_mismatch() {
    let dir = tempfile::tempdir().unwrap();
    let lib = fat_lib(dir.path(), "libsynth.so", &two_tu_blob("v"));
    // An archive holding one right, one wrong and no third code object.
    let mut w = ArchiveWriter::new(
        "synth",
        "gfx900",
        vec!["gfx900".into(), "gfx90a:xnack+".into()],
        Compression::None,
    )
    .unwrap();
    w.add_kernel("libsynth.so#0", "gfx900", "v-A0".repeat(50).into_bytes())
        .unwrap();
    let mut wrong = "v-B0".repeat(70).into_bytes();
    wrong[7] ^= 1;
    w.add_kernel("libsynth.so#0", "gfx90a:xnack+", wrong)
        .unwrap();
    let path = dir.path().join("bad.kpack");
    w.write(&path, &|_| {}).unwrap();
    let e = verify_against(std::slice::from_ref(&path), std::slice::from_ref(&lib)).unwrap_err();
    assert_eq!(
        (e.exit, e.message.as_str()),
        (Exit::Corrupt, "2 of 3 code objects are missing or differ")
    );
    let lines: Vec<String> = [0, 1]
        .iter()
        .map(|i| {
            let bytes = std::fs::read(&lib).unwrap();
            let co = &fatbin::host_code_objects("libsynth.so", &bytes).unwrap()[*i + 1];
            check_one(
                &[Archive::open(&path).unwrap()],
                &lib,
                "libsynth.so",
                co,
                &mut Vec::new(),
            )
            .unwrap()
        })
        .collect();
    assert_eq!(
        lines[0],
        format!(
            "{}: libsynth.so#0 [gfx90a:xnack+]: {} holds 280 bytes, the fat binary 280; first difference at byte 7",
            lib.display(),
            path.display()
        )
    );
    assert_eq!(
        lines[1],
        format!(
            "{}: libsynth.so#1 [gfx900]: not in any archive",
            lib.display()
        )
    );

    let e = verify_against(&[path], &[dir.path().join("libsynth.so.blob")]).unwrap_err();
    assert_eq!(e.exit, Exit::Corrupt);
}

#[test]
fn usage_and_format_errors() {
    let dir = tempfile::tempdir().unwrap();
    let lib = fat_lib(dir.path(), "a/libx.so", &two_tu_blob("a"));
    let lib2 = fat_lib(dir.path(), "b/libx.so", &two_tu_blob("b"));
    let out = dir.path().join("out");

    let e = run(request(vec![lib.clone(), lib2.clone()], out.clone())).unwrap_err();
    assert_eq!(e.exit, Exit::Usage);
    assert!(
        e.message.contains("would both be named \"libx.so\""),
        "{}",
        e.message
    );

    let mut req = request(vec![lib.clone()], out.clone());
    req.root = Some(dir.path().join("b"));
    let e = run(req).unwrap_err();
    assert_eq!(e.exit, Exit::Usage);
    assert!(
        e.message.ends_with(&format!(
            "is not below --root {}",
            dir.path().join("b").display()
        )),
        "{}",
        e.message
    );

    let mut req = request(vec![lib.clone()], out.clone());
    req.prefix = Some("a/b".into());
    assert_eq!(run(req).unwrap_err().exit, Exit::Usage);

    let blob = dir.path().join("a_libx.so.blob");
    let e = run(request(vec![blob.clone()], out.clone())).unwrap_err();
    assert_eq!(e.exit, Exit::BadFormat);
    assert_eq!(
        e.message,
        format!(
            "{}: not an ELF host binary: not an ELF file",
            blob.display()
        )
    );

    let e = run(request(vec![dir.path().join("missing.so")], out.clone())).unwrap_err();
    assert_eq!(e.exit, Exit::Unreadable);
    assert!(!out.exists(), "nothing is written when an input fails");
}
