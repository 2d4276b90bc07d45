//! What a person reads when a command fails on a common mistake: one phrasing for a missing file
//! in every command, a bad magic shown as bytes, the output path (never a temporary name) in a
//! write error, and counts in the singular when there is one.

use crate::cli::kpack_fuse;

/// The exit code and standard error of a run.
fn run(args: &[&dyn AsRef<std::ffi::OsStr>]) -> (i32, String) {
    let o = kpack_fuse(args);
    (
        o.status.code().expect("exited normally"),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn a_missing_input_reads_the_same_in_every_command() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.kpack");
    let m = missing.display();
    let out = dir.path().join("out");
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let want = format!("kpack-fuse: {m}: no such file\n");
    let cases: Vec<Vec<&dyn AsRef<std::ffi::OsStr>>> = vec![
        vec![&"list", &missing],
        vec![&"cat", &missing, &"k#0", &"gfx900"],
        vec![&"extract", &missing, &out],
        vec![&"verify", &missing],
        vec![&"mount", &missing, &mnt],
        vec![&"resolve", &"--gpu", &"gfx900", &missing],
        vec![
            &"load",
            &"--gpu",
            &"gfx900",
            &"--co",
            &"0",
            &"--output",
            &out,
            &missing,
        ],
        vec![&"pack", &missing, &"-o", &out],
    ];
    for args in cases {
        assert_eq!(run(&args), (3, want.clone()), "{:?}", args[0].as_ref());
    }
}

#[test]
fn a_bad_magic_is_shown_as_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.kpack");
    let mut bytes = vec![0xff, 0xfe, 0x00, 0x01];
    bytes.resize(64, 0);
    std::fs::write(&path, &bytes).unwrap();
    assert_eq!(
        run(&[&"list", &path]),
        (
            4,
            format!(
                "kpack-fuse: {}: not a kpack archive: magic is ff fe 00 01 (hex), expected \"KPAK\"\n",
                path.display()
            )
        )
    );
}

#[test]
fn pack_into_a_missing_directory_names_the_output() {
    let dir = tempfile::tempdir().unwrap();
    let tree = dir.path().join("tree");
    std::fs::create_dir_all(tree.join("lib/libx.so#0")).unwrap();
    std::fs::write(tree.join("lib/libx.so#0/gfx900.hsaco"), b"\x7fELF kernel").unwrap();
    let out = dir.path().join("missing/dir/x.kpack");
    assert_eq!(
        run(&[&"pack", &tree, &"-o", &out]),
        (
            7,
            format!(
                "kpack-fuse: {}: cannot create: no such file\n",
                out.display()
            )
        )
    );
    assert!(!dir.path().join("missing").exists());
}

#[test]
fn one_of_a_thing_is_singular() {
    let dir = tempfile::tempdir().unwrap();
    let tree = dir.path().join("tree");
    std::fs::create_dir_all(tree.join("lib/libx.so#0")).unwrap();
    std::fs::write(tree.join("lib/libx.so#0/gfx900.hsaco"), b"k").unwrap();
    let out = dir.path().join("one.kpack");
    let (code, err) = run(&[&"pack", &tree, &"-o", &out, &"--compression", &"none"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.starts_with(&format!(
            "packed 1 kernel (1 byte) from {} into {} (",
            tree.display(),
            out.display()
        )),
        "{err}"
    );
    assert_eq!(
        run(&[&"verify", &out]),
        (
            0,
            "ok: 1 kernel in 1 archive, each decoded to its recorded size and BLAKE3 digest\n"
                .to_owned()
        )
    );
    let dest = dir.path().join("dest");
    assert_eq!(
        run(&[&"extract", &out, &dest]),
        (
            0,
            format!("extracted 1 kernel (1 byte) into {}\n", dest.display())
        )
    );
}
