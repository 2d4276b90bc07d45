//! What a person reads when a command fails on a common mistake: one phrasing for a missing file
//! in every command, a bad magic shown as bytes, the output path (never a temporary name) in a
//! write error, and counts in the singular when there is one.

use std::path::{Path, PathBuf};

use crate::cli::kpack_fuse;

/// The exit code and standard error of a run.
fn run(args: &[&dyn AsRef<std::ffi::OsStr>]) -> (i32, String) {
    let o = kpack_fuse(args);
    (
        o.status.code().expect("exited normally"),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// The exit code, standard output and standard error of a run in `cwd`.
fn run_in(cwd: &Path, args: &[&dyn AsRef<std::ffi::OsStr>]) -> (i32, String, String) {
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_kpack-fuse"))
        .args(args.iter().map(|a| a.as_ref()))
        .current_dir(cwd)
        .output()
        .expect("run kpack-fuse");
    (
        o.status.code().expect("exited normally"),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn sample() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("samples/rocrand-sample.kpack")
}

/// clap's answer to an unknown command, with its tip when a command is like it.
fn unrecognized(word: &str, tip: Option<&str>) -> String {
    let tip = tip.map_or(String::new(), |t| {
        format!("  tip: a similar subcommand exists: '{t}'\n\n")
    });
    format!(
        "error: unrecognized subcommand '{word}'\n\n{tip}Usage: kpack-fuse <COMMAND>\n\n\
         For more information, try '--help'.\n"
    )
}

/// The mount-helper form `kpack-fuse SRC DIR` is taken only where mount.fuse3 could have
/// written it: a mistyped command gets clap's answer, not a mount's error.
#[test]
fn a_mistyped_command_is_not_taken_for_a_mount() {
    let dir = tempfile::tempdir().unwrap();
    let cwd = dir.path();
    let sample = sample();
    let mnt = cwd.join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let cases: Vec<(Vec<&dyn AsRef<std::ffi::OsStr>>, String)> = vec![
        (vec![&"lst", &sample], unrecognized("lst", Some("list"))),
        (vec![&"lst"], unrecognized("lst", Some("list"))),
        (vec![&"mnt", &sample, &mnt], unrecognized("mnt", None)),
        (
            vec![&"mout", &sample, &mnt, &"-o", &"ro"],
            unrecognized("mout", Some("mount")),
        ),
        (
            vec![&"verfy", &sample, &mnt],
            unrecognized("verfy", Some("verify")),
        ),
    ];
    for (args, want) in cases {
        assert_eq!(
            run_in(cwd, &args),
            (2, String::new(), want),
            "{:?}",
            args[0].as_ref()
        );
    }
}

/// Where it can be meant, the helper form is still a mount: a source that exists (even one
/// named like a mistyped command) or that is no plain word, followed by a mount point.
#[test]
fn the_mount_helper_form_is_taken_where_it_can_be_meant() {
    let dir = tempfile::tempdir().unwrap();
    let cwd = dir.path();
    std::fs::copy(sample(), cwd.join("lst")).unwrap();
    let gone = cwd.join("gone");
    let want = format!(
        "kpack-fuse: {}: mount point does not exist\n",
        gone.display()
    );
    for source in [&"lst" as &dyn AsRef<std::ffi::OsStr>, &"./lst", &sample()] {
        assert_eq!(
            run_in(cwd, &[source, &gone, &"-o", &"ro"]),
            (8, String::new(), want.clone())
        );
    }
}

#[test]
fn a_mistyped_mount_option_gets_the_nearest_one() {
    let dir = tempfile::tempdir().unwrap();
    let mnt = dir.path();
    let cases = [
        (
            "allow_othr",
            "kpack-fuse: unknown mount option \"allow_othr\"; a similar option exists: \
             \"allow_other\"\n",
        ),
        (
            "ro,auto-unmout",
            "kpack-fuse: unknown mount option \"auto-unmout\"; a similar option exists: \
             \"auto_unmount\"\n",
        ),
        ("fsname=x", "kpack-fuse: unknown mount option \"fsname\"\n"),
    ];
    for (options, want) in cases {
        assert_eq!(
            run(&[&"mount", &sample(), &mnt, &"-o", &options]),
            (2, want.to_owned()),
            "{options}"
        );
    }
}

/// `unmount` of a path that does not exist says so, as `mount` does, not "not a mount point".
#[test]
fn unmount_of_a_missing_path_says_it_does_not_exist() {
    let dir = tempfile::tempdir().unwrap();
    let gone = dir.path().join("gone");
    assert_eq!(
        run(&[&"unmount", &gone]),
        (
            8,
            format!(
                "kpack-fuse: {}: mount point does not exist\n",
                gone.display()
            )
        )
    );
    assert_eq!(
        run(&[&"unmount", &dir.path()]),
        (
            8,
            format!("kpack-fuse: {}: not a mount point\n", dir.path().display())
        )
    );
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

/// Counts of one in the singular; results on standard output, and nothing on standard error
/// when all is well.
#[test]
fn one_of_a_thing_is_singular_and_results_go_to_standard_output() {
    let dir = tempfile::tempdir().unwrap();
    let cwd = dir.path();
    let tree = cwd.join("tree");
    std::fs::create_dir_all(tree.join("lib/libx.so#0")).unwrap();
    std::fs::write(tree.join("lib/libx.so#0/gfx900.hsaco"), b"k").unwrap();
    let out = cwd.join("x.kpack");
    let (code, stdout, stderr) = run_in(
        cwd,
        &[&"pack", &tree, &"-o", &out, &"--compression", &"none"],
    );
    assert_eq!((code, stderr.as_str()), (0, ""));
    assert!(
        stdout.starts_with(&format!(
            "packed 1 kernel (1 byte) from {} into {} (",
            tree.display(),
            out.display()
        )),
        "{stdout}"
    );
    assert_eq!(
        run_in(cwd, &[&"verify", &out]),
        (
            0,
            "ok: 1 kernel in 1 archive, each decoded to its recorded size and BLAKE3 digest\n"
                .to_owned(),
            String::new()
        )
    );
    let dest = cwd.join("dest");
    assert_eq!(
        run_in(cwd, &[&"extract", &out, &dest]),
        (
            0,
            format!("extracted 1 kernel (1 byte) into {}\n", dest.display()),
            String::new()
        )
    );
}
