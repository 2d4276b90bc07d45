//! `kpack-fuse split` and `verify --split` from the command line: the whole-tree run, its
//! safety rules (inputs never modified or replaced, already split binaries copied, nothing left
//! behind by a failed run, `-o` defaulting to `ROOT.split`) and the exit codes.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Output;
use std::time::SystemTime;

use crate::cli::kpack_fuse;
use crate::split::{HIPF, Kind, build, fat_tree, tu_blobs};

fn code(o: &Output) -> i32 {
    o.status.code().expect("exited normally")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Bytes, permissions and modification time: what "never modified" means.
fn fingerprint(p: &Path) -> (Vec<u8>, u32, SystemTime) {
    let m = std::fs::metadata(p).unwrap();
    (
        std::fs::read(p).unwrap(),
        m.permissions().mode(),
        m.modified().unwrap(),
    )
}

/// Every entry below `root` (relative, sorted), directories included.
fn entries(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            out.push(p.strip_prefix(root).unwrap().display().to_string());
            if p.is_dir() && !p.is_symlink() {
                stack.push(p);
            }
        }
    }
    out.sort();
    out
}

#[test]
fn split_cli_tree_then_verify_split_through_the_loader() {
    let tmp = tempfile::tempdir().unwrap();
    let (dir, root, lib, app) = fat_tree(&tmp);
    let before = [fingerprint(&lib), fingerprint(&app)];
    let out = dir.join("out");
    let o = kpack_fuse(&[
        &"split",
        &lib,
        &app,
        &"--root",
        &root,
        &"--prefix",
        &"splt",
        &"-o",
        &out,
    ]);
    assert_eq!(code(&o), 0, "{}", text(&o.stderr));
    let lib_size = std::fs::metadata(out.join("lib/libsplit.so"))
        .unwrap()
        .len();
    let app_size = std::fs::metadata(out.join("bin/app")).unwrap().len();
    let k900 = out.join(".kpack/splt_gfx900.kpack");
    let k90a = out.join(".kpack/splt_gfx90a:xnack-.kpack");
    assert_eq!(
        text(&o.stdout),
        format!(
            "{}: 3 wrappers now HIPK, 6 code objects moved out, {} -> {lib_size} bytes\n\
             {}: 2 wrappers now HIPK, 4 code objects moved out, {} -> {app_size} bytes\n\
             {}: 5 code objects\n{}: 5 code objects\n\
             2 binaries split; 0 files copied as they are; 0 symlinks recreated; 0 skipped\n",
            out.join("lib/libsplit.so").display(),
            before[0].0.len(),
            out.join("bin/app").display(),
            before[1].0.len(),
            k900.display(),
            k90a.display(),
        )
    );
    assert_eq!(
        [fingerprint(&lib), fingerprint(&app)],
        before,
        "inputs modified"
    );
    assert_eq!(
        entries(&out),
        [
            ".kpack",
            ".kpack/splt_gfx900.kpack",
            ".kpack/splt_gfx90a:xnack-.kpack",
            "bin",
            "bin/app",
            "lib",
            "lib/libsplit.so"
        ]
    );
    assert_eq!(
        std::fs::metadata(out.join("bin/app"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        before[1].1 & 0o777
    );

    // Splitting again from the originals gives the same bytes.
    let first: Vec<Vec<u8>> = entries(&out)
        .iter()
        .map(|e| out.join(e))
        .filter(|p| p.is_file())
        .map(|p| std::fs::read(p).unwrap())
        .collect();
    assert_eq!(
        code(&kpack_fuse(&[
            &"split",
            &lib,
            &app,
            &"--root",
            &root,
            &"--prefix",
            &"splt",
            &"-o",
            &out
        ])),
        0
    );
    let second: Vec<Vec<u8>> = entries(&out)
        .iter()
        .map(|e| out.join(e))
        .filter(|p| p.is_file())
        .map(|p| std::fs::read(p).unwrap())
        .collect();
    assert_eq!(first, second);

    let o = kpack_fuse(&[&"verify", &"--split", &out, &"--original", &root]);
    assert_eq!(code(&o), 0, "{}", text(&o.stderr));
    assert_eq!(
        text(&o.stdout),
        "2 split binaries: 10 code objects loaded through their markers, byte-identical to the originals\n"
    );

    // One archive gone, one code object replaced: each mismatch is named, exit 6. The binaries
    // are pinned, so the rewritten gfx900 archive (another TOC) is not used at all.
    std::fs::remove_file(&k90a).unwrap();
    let mut w = rocm_kpack::ArchiveWriter::new(
        "splt",
        "gfx900",
        vec!["gfx900".into()],
        rocm_kpack::Compression::None,
    )
    .unwrap();
    let originals = rocm_kpack::Archive::open(&k900).unwrap();
    for b in originals.binaries() {
        let data = if b.key == "lib/libsplit.so#2" {
            vec![7; 3]
        } else {
            originals.get_kernel(b.key, "gfx900").unwrap()
        };
        w.add_kernel(b.key, "gfx900", data).unwrap();
    }
    drop(originals);
    w.write(&k900, &|_| {}).unwrap();
    let o = kpack_fuse(&[&"verify", &"--split", &out, &"--original", &root]);
    assert_eq!(code(&o), 6, "{}", text(&o.stderr));
    let missing = |bin: &str, key: &str| {
        format!(
            "BAD {}: {key} [gfx90a:xnack-]: does not load: KPACK_ERROR_ARCHIVE_NOT_FOUND \
             (no readable kpack archive found (tried 2 paths; {}; {}))",
            out.join(bin).display(),
            k90a.display(),
            out.join(".kpack/splt_gfx90a.kpack").display()
        )
    };
    let unpinned = |bin: &str, key: &str| {
        format!(
            "BAD {}: {key} [gfx900]: does not load: KPACK_ERROR_ARCHIVE_NOT_FOUND \
             (no readable kpack archive found (tried 1 paths; {}); not pinned by the binary, so not used: {})",
            out.join(bin).display(),
            k900.display(),
            k900.display()
        )
    };
    let mut want = Vec::new();
    for (bin, keys) in [
        ("bin/app", &["bin/app#0", "bin/app#1"][..]),
        (
            "lib/libsplit.so",
            &[
                "lib/libsplit.so#0",
                "lib/libsplit.so#1",
                "lib/libsplit.so#2",
            ][..],
        ),
    ] {
        for key in keys {
            want.push(unpinned(bin, key));
            want.push(missing(bin, key));
        }
    }
    want.push("kpack-fuse: 10 problems in 2 split binaries".into());
    assert_eq!(text(&o.stderr).lines().collect::<Vec<_>>(), want);
}

#[test]
fn split_cli_refuses_split_binaries_and_leaves_nothing_behind() {
    let tmp = tempfile::tempdir().unwrap();
    let (dir, root, lib, app) = fat_tree(&tmp);
    let out = dir.join("out");
    assert_eq!(
        code(&kpack_fuse(&[
            &"split",
            &lib,
            &"--root",
            &root,
            &"--prefix",
            &"splt",
            &"-o",
            &out
        ])),
        0
    );

    // An already split binary is copied as it is.
    let again = dir.join("again");
    let split_lib = out.join("lib/libsplit.so");
    let o = kpack_fuse(&[
        &"split",
        &split_lib,
        &"--root",
        &out,
        &"--prefix",
        &"splt",
        &"-o",
        &again,
    ]);
    assert_eq!(code(&o), 0, "{}", text(&o.stderr));
    assert_eq!(
        text(&o.stdout),
        "0 binaries split; 1 file copied as it is (1 already split); 0 symlinks recreated; 0 skipped\n"
    );
    assert_eq!(
        std::fs::read(again.join("lib/libsplit.so")).unwrap(),
        std::fs::read(&split_lib).unwrap()
    );

    // A refusal after a good binary: nothing is written, not even the output root.
    let bad = build(
        &dir,
        "in/lib/libbad.so",
        &tu_blobs()[..1],
        0x1234_5678,
        Kind::Library,
        "",
    );
    let fresh = dir.join("fresh");
    let o = kpack_fuse(&[
        &"split",
        &app,
        &bad,
        &"--root",
        &root,
        &"--prefix",
        &"splt",
        &"-o",
        &fresh,
    ]);
    assert_eq!(code(&o), 4);
    assert_eq!(
        text(&o.stderr),
        format!(
            "kpack-fuse: {}: wrapper 0 has magic 0x12345678, neither HIPF (0x48495046) nor HIPK (0x4b504948)\n",
            bad.display()
        )
    );
    assert!(!fresh.exists());

    // A write that fails part-way (a file where the lib/ directory must go): the archives and
    // bin/app already written under temporary names are removed with their directories.
    let blocked = dir.join("blocked");
    std::fs::create_dir(&blocked).unwrap();
    std::fs::write(blocked.join("lib"), b"not a directory").unwrap();
    let o = kpack_fuse(&[
        &"split",
        &app,
        &lib,
        &"--root",
        &root,
        &"--prefix",
        &"splt",
        &"-o",
        &blocked,
    ]);
    assert_eq!(code(&o), 7, "{}", text(&o.stderr));
    assert!(text(&o.stderr).starts_with(&format!(
        "kpack-fuse: {}: cannot write: ",
        blocked.join("lib/libsplit.so").display()
    )));
    assert_eq!(entries(&blocked), ["lib"]);
    assert_eq!(
        std::fs::read(blocked.join("lib")).unwrap(),
        b"not a directory"
    );
}

#[test]
fn split_cli_never_replaces_inputs() {
    let tmp = tempfile::tempdir().unwrap();
    let (dir, root, lib, _) = fat_tree(&tmp);
    let before = fingerprint(&lib);

    let o = kpack_fuse(&[
        &"split",
        &lib,
        &"--root",
        &root,
        &"--prefix",
        &"splt",
        &"-o",
        &root,
    ]);
    assert_eq!(code(&o), 2);
    assert_eq!(
        text(&o.stderr),
        format!(
            "kpack-fuse: the output root {} is the input root; split never modifies its inputs, give another -o\n",
            root.display()
        )
    );

    // An output directory that is a symlink to the input's directory.
    let out = dir.join("out");
    std::fs::create_dir(&out).unwrap();
    std::os::unix::fs::symlink(root.join("lib"), out.join("lib")).unwrap();
    let o = kpack_fuse(&[
        &"split",
        &lib,
        &"--root",
        &root,
        &"--prefix",
        &"splt",
        &"-o",
        &out,
    ]);
    assert_eq!(code(&o), 2);
    assert_eq!(
        text(&o.stderr),
        format!(
            "kpack-fuse: {} would replace the input {}; split never modifies its inputs, give another -o\n",
            out.join("lib/libsplit.so").display(),
            lib.display()
        )
    );
    assert_eq!(entries(&out), ["lib"]);
    assert_eq!(fingerprint(&lib), before);
}

#[test]
fn split_cli_default_output_is_root_dot_split() {
    let tmp = tempfile::tempdir().unwrap();
    let (dir, root, lib, _) = fat_tree(&tmp);
    let o = kpack_fuse(&[&"split", &lib, &"--root", &root]);
    assert_eq!(code(&o), 0, "{}", text(&o.stderr));
    let out = dir.join("in.split");
    assert_eq!(
        text(&o.stdout).lines().next().unwrap(),
        format!("writing to {}", out.display())
    );
    assert_eq!(
        entries(&out),
        [
            ".kpack",
            ".kpack/split_gfx900.kpack",
            ".kpack/split_gfx90a:xnack-.kpack",
            "lib",
            "lib/libsplit.so"
        ]
    );
    let o = kpack_fuse(&[&"verify", &"--split", &out, &"--original", &root]);
    assert_eq!(code(&o), 0, "{}", text(&o.stderr));
}

#[test]
fn verify_split_names_a_bad_marker_a_bad_wrapper_and_a_missing_original() {
    use rocm_kpack::host::elf::{ElfFile, FATBIN_SEGMENT_SECTION, KPACK_REF_SECTION};
    use rocm_kpack::tools::split::verify_split;

    let tmp = tempfile::tempdir().unwrap();
    let (dir, root, lib, app) = fat_tree(&tmp);
    let out = dir.join("out");
    assert_eq!(
        code(&kpack_fuse(&[
            &"split",
            &lib,
            &app,
            &"--root",
            &root,
            &"--prefix",
            &"splt",
            &"-o",
            &out
        ])),
        0
    );
    let offsets = |p: &Path| {
        let bytes = std::fs::read(p).unwrap();
        let elf = ElfFile::parse(&bytes).unwrap();
        let at = |name| elf.section(name).unwrap().file_offset.unwrap() as usize;
        (at(KPACK_REF_SECTION), at(FATBIN_SEGMENT_SECTION))
    };
    // bin/app: the marker starts with 0xc1, a byte msgpack never uses.
    let app_out = out.join("bin/app");
    let (marker, _) = offsets(&app_out);
    let mut bytes = std::fs::read(&app_out).unwrap();
    bytes[marker] = 0xc1;
    std::fs::write(&app_out, &bytes).unwrap();
    // lib/libsplit.so: wrapper 1 back to HIPF, with index 9.
    let lib_out = out.join("lib/libsplit.so");
    let (_, seg) = offsets(&lib_out);
    let mut bytes = std::fs::read(&lib_out).unwrap();
    bytes[seg + 24..seg + 28].copy_from_slice(&HIPF.to_le_bytes());
    bytes[seg + 40..seg + 44].copy_from_slice(&9u32.to_le_bytes());
    std::fs::write(&lib_out, &bytes).unwrap();
    // A split binary whose original is gone.
    std::fs::copy(&lib_out, out.join("lib/libother.so")).unwrap();

    let check = verify_split(&out, &root).unwrap();
    assert_eq!((check.binaries, check.code_objects), (3, 4));
    let at = |p: &str| out.join(p).display().to_string();
    assert_eq!(
        check.problems,
        [
            format!(
                "{}: marker: invalid HIPK metadata: reserved byte 0xc1 (at byte 0)",
                at("bin/app")
            ),
            format!(
                "{}: wrapper 1 has magic 0x48495046, not HIPK",
                at("lib/libother.so")
            ),
            format!(
                "{}: original {}: no such file",
                at("lib/libother.so"),
                root.join("lib/libother.so").display()
            ),
            format!(
                "{}: wrapper 1 has magic 0x48495046, not HIPK",
                at("lib/libsplit.so")
            ),
            format!(
                "{}: lib/libsplit.so#1 [gfx900]: no HIPK wrapper carries index 1",
                at("lib/libsplit.so")
            ),
            format!(
                "{}: lib/libsplit.so#1 [gfx90a:xnack-]: no HIPK wrapper carries index 1",
                at("lib/libsplit.so")
            ),
        ]
    );
}
