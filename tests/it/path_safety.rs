//! Path safety: TOC keys and arch names that would leave a directory never do, in
//! `extract` (also against symlinks planted in the destination) and in the mount (refused before
//! anything is mounted). The loader's `@GFXARCH@` expansion is covered in `loader.rs`
//! (`a_hostile_arch_never_opens_an_archive_outside_the_pattern_directory`) and in
//! `loader::search`'s unit tests.

use std::path::Path;
use std::process::{Command, Output};

use rocm_kpack::fs::setup::mountinfo;
use rocm_kpack::{ArchiveWriter, Compression};

fn run(args: &[&dyn AsRef<std::ffi::OsStr>]) -> (Option<i32>, String) {
    let o: Output = Command::new(env!("CARGO_BIN_EXE_kpack-fuse"))
        .args(args.iter().map(|a| a.as_ref()))
        .output()
        .unwrap();
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// An archive with a harmless kernel first (so a partial extraction would show) and `(key, arch)`.
fn archive(path: &Path, key: &str, arch: &str) {
    let mut w = ArchiveWriter::new("g", "f", vec![arch.into()], Compression::None).unwrap();
    w.add_kernel("aaa#0", arch, vec![1, 2, 3]).unwrap();
    w.add_kernel(key, arch, vec![4, 5, 6]).unwrap();
    w.write(path, &|_| {}).unwrap();
}

/// Names not in `cli::extract_refuses_names_that_escape`.
const HOSTILE: &[(&str, &str)] = &[
    ("./a#0", "gfx900"),
    ("a/./b#0", "gfx900"),
    ("..", "gfx900"),
    ("a/..", "gfx900"),
    ("a/b/../../../x#0", "gfx900"),
    ("a\0b#0", "gfx900"),
    ("ok#0", ".."),
    ("ok#0", "."),
    ("ok#0", "../x"),
    ("ok#0", "x\0y"),
];

#[test]
fn extract_refuses_dot_components_nul_and_dot_arches_writing_nothing() {
    let d = tempfile::tempdir().unwrap();
    for (key, arch) in HOSTILE {
        let path = d.path().join("evil.kpack");
        archive(&path, key, arch);
        let dest = d.path().join("dest");
        let (code, err) = run(&[&"extract", &path, &dest]);
        assert_eq!(code, Some(7), "{key:?} {arch:?}: {err}");
        assert!(err.contains("refusing to extract"), "{err}");
        assert!(!dest.exists(), "{key:?} {arch:?}: nothing is written");
        let mut left: Vec<_> = std::fs::read_dir(d.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        left.sort();
        assert_eq!(left, ["evil.kpack"], "{key:?} {arch:?}");
    }
}

#[test]
fn extract_never_writes_through_symlinks_planted_in_the_destination() {
    let d = tempfile::tempdir().unwrap();
    let outside = d.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("victim"), b"keep").unwrap();
    let path = d.path().join("a.kpack");
    archive(&path, "lib/libx.so#0", "gfx900");

    // A directory symlink where a key's directory goes.
    let dest = d.path().join("dest1");
    std::fs::create_dir(&dest).unwrap();
    std::os::unix::fs::symlink(&outside, dest.join("lib")).unwrap();
    let (code, err) = run(&[&"extract", &path, &dest]);
    assert_eq!(code, Some(7), "{err}");
    assert!(err.contains("symlinks are not followed"), "{err}");

    // A file symlink where a kernel file goes, with and without --force.
    let dest = d.path().join("dest2");
    std::fs::create_dir_all(dest.join("lib/libx.so#0")).unwrap();
    std::os::unix::fs::symlink(
        outside.join("victim"),
        dest.join("lib/libx.so#0/gfx900.hsaco"),
    )
    .unwrap();
    let (code, err) = run(&[&"extract", &path, &dest]);
    assert_eq!(code, Some(7), "{err}");
    assert!(err.contains("already exists"), "{err}");
    let (code, err) = run(&[&"extract", &path, &dest, &"--force"]);
    assert_eq!(code, Some(7), "{err}");
    assert!(err.contains("not a regular file"), "{err}");

    let mut left: Vec<_> = std::fs::read_dir(&outside)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    left.sort();
    assert_eq!(left, ["victim"]);
    assert_eq!(std::fs::read(outside.join("victim")).unwrap(), b"keep");
}

/// The mount builds its tree with the same rules; refusal happens before `mount(2)`, so this
/// needs no FUSE.
#[test]
fn mount_refuses_hostile_names_before_mounting() {
    let d = tempfile::tempdir().unwrap();
    let mp = d.path().join("mnt");
    std::fs::create_dir(&mp).unwrap();
    let cases = HOSTILE.iter().chain(&[
        ("../escape#0", "gfx900"),
        ("/abs#0", "gfx900"),
        ("a//b#0", "gfx900"),
        ("ok#0", "a/b"),
    ]);
    for (key, arch) in cases {
        let path = d.path().join("evil.kpack");
        archive(&path, key, arch);
        let (code, err) = run(&[&"mount", &path, &mp]);
        assert_eq!(code, Some(4), "{key:?} {arch:?}: {err}");
        let named = if names_ok(key) {
            format!("{arch:?}")
        } else {
            format!("{key:?}")
        };
        assert!(
            err.contains(&named),
            "{key:?} {arch:?}: the message names it: {err}"
        );
        assert_eq!(
            mountinfo::mount_at(&mp.canonicalize().unwrap()).unwrap(),
            None
        );
    }
}

fn names_ok(key: &str) -> bool {
    rocm_kpack::names::key_components(key).is_ok()
}
