//! `split` over a real install tree (Debian's librocrand1, with a separated debug file, a
//! symlink, documentation and a FIFO): directories are walked, everything that is not a fat
//! binary is carried over as it is and counted, a second run over the output gives the same
//! tree, and a malformed ELF file stops the run with its name before anything is written.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::cli::kpack_fuse;
use crate::fatbin::rocrand;

/// Every entry below `root`: files with their bytes, symlinks with their targets, other
/// entries by name, sorted.
pub fn snapshot(root: &Path) -> Vec<(PathBuf, Result<Vec<u8>, PathBuf>)> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let rel = p.strip_prefix(root).unwrap().to_owned();
            let kind = std::fs::symlink_metadata(&p).unwrap().file_type();
            if kind.is_symlink() {
                out.push((rel, Err(std::fs::read_link(&p).unwrap())));
            } else if kind.is_dir() {
                stack.push(p);
            } else if kind.is_file() {
                out.push((rel, Ok(std::fs::read(&p).unwrap())));
            } else {
                // A FIFO: its name only (reading it would wait for a writer).
                out.push((rel, Ok(Vec::new())));
            }
        }
    }
    out.sort();
    out
}

/// The install tree of Debian's package holding `so` (a library in `<tree>/usr/lib/<triplet>/`)
/// as the package ships it below `dest/root`: the library (hard-linked where it can be: the
/// tools only read it), its soname symlink `soname`, and its documentation. Built file by file,
/// since other tests leave files beside the fetched library.
pub fn debian_tree(dest: &Path, so: &Path, soname: &str) -> PathBuf {
    let usr = so.ancestors().nth(3).unwrap();
    let root = dest.join("root");
    let lib = root.join("lib/x86_64-linux-gnu");
    std::fs::create_dir_all(&lib).unwrap();
    let file = so.file_name().unwrap();
    if std::fs::hard_link(so, lib.join(file)).is_err() {
        std::fs::copy(so, lib.join(file)).unwrap();
    }
    std::os::unix::fs::symlink(file, lib.join(soname)).unwrap();
    let status = Command::new("cp")
        .arg("-a")
        .arg(usr.join("share"))
        .arg(root.join("share"))
        .status()
        .unwrap();
    assert!(status.success());
    root
}

/// Debian's rocRAND install tree ([`debian_tree`]) plus a separated debug file of the library
/// as `-dbgsym` packages hold it.
pub fn rocrand_tree(dest: &Path) -> Option<PathBuf> {
    let so = rocrand()?;
    let root = debian_tree(dest, &so, "librocrand.so.1");
    std::fs::create_dir_all(root.join("lib/debug")).unwrap();
    let status = Command::new("objcopy")
        .arg("--only-keep-debug")
        .arg(&so)
        .arg(root.join("lib/debug/librocrand.so.1.debug"))
        .status()
        .expect("objcopy (binutils) must be installed");
    assert!(status.success());
    Some(root)
}

fn stdout_of(o: &std::process::Output) -> String {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout.clone()).unwrap()
}

#[test]
fn split_tree_walks_a_real_install_and_reruns_over_its_output() {
    let dir = tempfile::tempdir().unwrap();
    let Some(root) = rocrand_tree(dir.path()) else {
        return;
    };
    let fifo = root.join("share/fifo");
    let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a NUL-terminated path and a mode.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    let before = snapshot(&root);

    let out = dir.path().join("out");
    let text = stdout_of(&kpack_fuse(&[
        &"split", &root, &"--root", &root, &"-o", &out,
    ]));
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines[0].starts_with(&format!(
            "{}: 1 wrapper now HIPK, 7 code objects moved out, 25384336 -> ",
            out.join("lib/x86_64-linux-gnu/librocrand.so.1.1").display()
        )),
        "{text}"
    );
    assert_eq!(
        lines[lines.len() - 2..],
        [
            format!(
                "skipped {}: not a regular file, directory or symlink",
                fifo.display()
            )
            .as_str(),
            "1 binary split; 4 files copied as they are (3 not ELF, 1 separated debug file); \
             1 symlink recreated; 1 skipped"
        ]
    );
    assert_eq!(snapshot(&root), before, "the input changed");
    let split = snapshot(&out);
    let kept = |rel: &str| {
        let find = |s: &[(PathBuf, Result<Vec<u8>, PathBuf>)]| {
            s.iter().find(|(p, _)| p == Path::new(rel)).cloned()
        };
        assert_eq!(find(&split), find(&before), "{rel}");
        assert!(find(&split).is_some(), "{rel}");
    };
    kept("lib/x86_64-linux-gnu/librocrand.so.1");
    kept("lib/debug/librocrand.so.1.debug");
    kept("share/doc/librocrand1/copyright");
    assert_eq!(
        split
            .iter()
            .filter(|(p, _)| p.starts_with(".kpack"))
            .count(),
        7
    );
    let o = kpack_fuse(&[&"verify", &"--split", &out, &"--original", &root]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));

    // Split again over the output: the same tree, and nothing split.
    let again = dir.path().join("again");
    let text = stdout_of(&kpack_fuse(&[
        &"split", &out, &"--root", &out, &"-o", &again,
    ]));
    assert_eq!(
        text,
        "0 binaries split; 12 files copied as they are (10 not ELF, 1 separated debug file, \
         1 already split); 1 symlink recreated; 0 skipped\n"
    );
    assert_eq!(snapshot(&again), split);

    // A tree holding both a fat library and the archives of an earlier split of it: the run
    // would write the archives it copies, and refuses.
    let mixed = dir.path().join("mixed");
    let status = Command::new("cp")
        .arg("-a")
        .arg(&out)
        .arg(&mixed)
        .status()
        .unwrap();
    assert!(status.success());
    let lib = "lib/x86_64-linux-gnu/librocrand.so.1.1";
    std::fs::remove_file(mixed.join(lib)).unwrap();
    std::fs::copy(root.join(lib), mixed.join(lib)).unwrap();
    let refused = dir.path().join("refused");
    let o = kpack_fuse(&[&"split", &mixed, &"--root", &mixed, &"-o", &refused]);
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(
        String::from_utf8_lossy(&o.stderr),
        format!(
            "kpack-fuse: {}: this split writes this archive, and would also copy {} there; \
             give another --prefix or leave the old archive out\n",
            refused.join(".kpack/rocrand_gfx1030.kpack").display(),
            mixed.join(".kpack/rocrand_gfx1030.kpack").display()
        )
    );
    assert!(!refused.exists());

    // A malformed ELF file stops the run, naming it; nothing is written.
    std::fs::remove_file(&fifo).unwrap();
    let broken = root.join("lib/libbroken.so");
    let mut bytes = b"\x7fELF\x02\x01\x01".to_vec();
    bytes.resize(200, 0xff);
    std::fs::write(&broken, &bytes).unwrap();
    let fresh = dir.path().join("fresh");
    let o = kpack_fuse(&[&"split", &root, &"--root", &root, &"-o", &fresh]);
    assert_eq!(o.status.code(), Some(4));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.starts_with(&format!(
            "kpack-fuse: {}: not an ELF host binary: malformed ELF file: ",
            broken.display()
        )),
        "{err}"
    );
    assert!(!fresh.exists());
}
