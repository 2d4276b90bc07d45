//! The `kpack-fuse` archive commands on good and bad input: exact output bytes and exit codes.

use std::path::Path;
use std::process::{Command, Output};

use rocm_kpack::{Archive, ArchiveWriter, Compression};

use crate::support::craft::*;
use crate::support::*;

pub fn kpack_fuse(args: &[&dyn AsRef<std::ffi::OsStr>]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kpack-fuse"))
        .args(args.iter().map(|a| a.as_ref()))
        .output()
        .expect("run kpack-fuse")
}

fn code(o: &Output) -> i32 {
    o.status.code().expect("exited normally")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn make_tree(root: &Path, kernels: &[(&str, &str, Vec<u8>)]) {
    for (key, arch, data) in kernels {
        let dir = root.join(key);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(format!("{arch}.hsaco")), data).unwrap();
    }
}

#[test]
fn every_command_has_help() {
    for cmd in [
        "pack", "list", "cat", "extract", "verify", "mount", "unmount", "resolve", "load", "split",
        "push",
    ] {
        let o = kpack_fuse(&[&cmd, &"--help"]);
        assert_eq!(code(&o), 0, "{cmd}");
        assert!(
            String::from_utf8_lossy(&o.stdout).contains("Usage:"),
            "{cmd}"
        );
    }
    let o = kpack_fuse(&[&"--version"]);
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        format!("kpack-fuse {}", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn pack_list_cat_extract_verify_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let tree = dir.path().join("tree");
    let kernels = golden_noop_kernels();
    make_tree(&tree, &kernels);
    // A symlink in the tree is ignored.
    std::os::unix::fs::symlink("gfx900.hsaco", tree.join("bin/testapp#0/gfx1100.hsaco")).unwrap();
    let out = dir.path().join("test.kpack");
    let o = kpack_fuse(&[
        &"pack",
        &tree,
        &"-o",
        &out,
        &"--compression",
        &"none",
        &"--group",
        &"test",
        &"--family",
        &"gfx900X",
    ]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let a = Archive::open(&out).unwrap();
    assert_eq!(a.architectures(), ["gfx900", "gfx906"]);
    assert_eq!(a.group_name(), Some("test"));
    // Sorted by key, then arch: bin/testapp#0 gets ordinal 0.
    let ordinals: Vec<(String, String, u32)> = a
        .entries()
        .map(|(k, e)| (k.to_owned(), e.arch.to_owned(), e.ordinal))
        .collect();
    assert_eq!(
        ordinals,
        vec![
            ("bin/testapp#0".into(), "gfx900".into(), 0),
            ("lib/libtest.so#0".into(), "gfx900".into(), 1),
            ("lib/libtest.so#0".into(), "gfx906".into(), 2)
        ]
    );

    let o = kpack_fuse(&[&"list", &out]);
    assert_eq!(code(&o), 0);
    let text = String::from_utf8(o.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 4);
    assert!(lines[0].starts_with("KEY "), "{}", lines[0]);
    assert!(
        lines[1].starts_with("bin/testapp#0     gfx900")
            && lines[1].ends_with("168           168    1.00"),
        "{:?}",
        lines[1]
    );

    let o = kpack_fuse(&[&"list", &"--json", &out]);
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(doc["scheme"], "none");
    assert_eq!(doc["kernels"][2]["key"], "lib/libtest.so#0");
    assert_eq!(doc["kernels"][2]["binary"], "lib/libtest.so#0");
    assert_eq!(doc["kernels"][2]["arch"], "gfx906");
    assert_eq!(doc["kernels"][2]["size"], 219);

    let o = kpack_fuse(&[&"cat", &out, &"lib/libtest.so#0", &"gfx906"]);
    assert_eq!(code(&o), 0);
    assert_eq!(o.stdout, kernels[1].2);

    let dest = dir.path().join("x");
    let o = kpack_fuse(&[&"extract", &out, &dest]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    for (key, arch, data) in &kernels {
        assert_eq!(
            &std::fs::read(dest.join(key).join(format!("{arch}.hsaco"))).unwrap(),
            data
        );
    }
    // Extracting again refuses to overwrite; --force does.
    let o = kpack_fuse(&[&"extract", &out, &dest]);
    assert_eq!(code(&o), 7);
    assert!(stderr(&o).contains("already exists"), "{}", stderr(&o));
    assert_eq!(code(&kpack_fuse(&[&"extract", &"--force", &out, &dest])), 0);

    let o = kpack_fuse(&[&"verify", &out, &fixture("test_zstd.kpack")]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));

    // pack -> extract -> pack gives the same archive bytes.
    let again = dir.path().join("again.kpack");
    let o = kpack_fuse(&[
        &"pack",
        &dest,
        &"-o",
        &again,
        &"--compression",
        &"none",
        &"--group",
        &"test",
        &"--family",
        &"gfx900X",
    ]);
    assert_eq!(code(&o), 0);
    assert_eq!(std::fs::read(&again).unwrap(), std::fs::read(&out).unwrap());
}

#[test]
fn pack_arch_order_and_coverage() {
    let dir = tempfile::tempdir().unwrap();
    let tree = dir.path().join("tree");
    make_tree(&tree, &golden_zstd_kernels());
    let out = dir.path().join("o.kpack");
    let o = kpack_fuse(&[
        &"pack", &tree, &"-o", &out, &"--arch", &"gfx1101", &"--arch", &"gfx1100",
    ]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let a = Archive::open(&out).unwrap();
    assert_eq!(a.architectures(), ["gfx1101", "gfx1100"]);
    assert_eq!(a.group_name(), Some("o"));
    assert_eq!(a.gfx_arch_family(), Some("mixed"));
    let lib: Vec<(&str, u32)> = a
        .binary(1)
        .unwrap()
        .arches()
        .map(|e| (e.arch, e.ordinal))
        .collect();
    assert_eq!(lib, vec![("gfx1101", 1), ("gfx1100", 2)]);

    let o = kpack_fuse(&[&"pack", &tree, &"-o", &out, &"--arch", &"gfx1100"]);
    assert_eq!(code(&o), 2);
    assert!(stderr(&o).contains("gfx1101"), "{}", stderr(&o));
    let o = kpack_fuse(&[&"pack", &tree, &"-o", &out, &"--level", &"23"]);
    assert_eq!(code(&o), 2);
}

#[test]
fn pack_refuses_stray_files() {
    let dir = tempfile::tempdir().unwrap();
    let tree = dir.path().join("tree");
    make_tree(&tree, &golden_noop_kernels());
    std::fs::write(tree.join("lib/README"), b"x").unwrap();
    let o = kpack_fuse(&[&"pack", &tree, &"-o", &dir.path().join("o.kpack")]);
    assert_eq!(code(&o), 4);
    assert!(stderr(&o).contains("lib/README"), "{}", stderr(&o));
    assert!(!dir.path().join("o.kpack").exists());
}

/// The workers read the files of a pack: one that cannot be read, listed among many, fails the
/// pack with the read error's code and name whatever the threads, and leaves nothing behind.
#[test]
fn pack_stops_at_an_unreadable_input_and_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut lines = String::new();
    for i in 0..40 {
        let name = format!("k{i}.hsaco");
        if i == 25 {
            // A directory: its size is known, reading it fails (EISDIR).
            std::fs::create_dir(dir.path().join(&name)).unwrap();
        } else {
            std::fs::write(dir.path().join(&name), vec![i as u8; 1000 + i * 517]).unwrap();
        }
        lines.push_str(&format!("lib/x.so#{i}\tgfx942\t{name}\n"));
    }
    let manifest = dir.path().join("list.txt");
    std::fs::write(&manifest, lines).unwrap();
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    for threads in ["1", "2", "4"] {
        let o = kpack_fuse(&[
            &"pack",
            &"--manifest",
            &manifest,
            &"--threads",
            &threads,
            &"-o",
            &out.join("o.kpack"),
        ]);
        assert_eq!(code(&o), 3, "threads {threads}: {}", stderr(&o));
        assert!(stderr(&o).contains("k25.hsaco"), "{}", stderr(&o));
        let left: Vec<_> = std::fs::read_dir(&out).unwrap().collect();
        assert!(left.is_empty(), "threads {threads}: {left:?}");
    }
}

#[test]
fn errors_name_the_file_and_use_distinct_codes() {
    let dir = tempfile::tempdir().unwrap();
    let o = kpack_fuse(&[&"list", &"/nonexistent/a.kpack"]);
    assert_eq!(code(&o), 3);
    assert!(stderr(&o).contains("/nonexistent/a.kpack"));

    let bad = dir.path().join("bad.kpack");
    std::fs::write(&bad, b"XPAK\x01\0\0\0\x10\0\0\0\0\0\0\0").unwrap();
    let o = kpack_fuse(&[&"list", &bad]);
    assert_eq!(code(&o), 4);
    assert!(
        stderr(&o).contains("bad.kpack") && stderr(&o).contains("magic"),
        "{}",
        stderr(&o)
    );

    let o = kpack_fuse(&[
        &"cat",
        &fixture("test_noop.kpack"),
        &"lib/libtest.so#0",
        &"gfx1100",
    ]);
    assert_eq!(code(&o), 5);
    assert!(o.stdout.is_empty());
    assert!(
        stderr(&o).contains("lib/libtest.so#0 [gfx1100]"),
        "{}",
        stderr(&o)
    );

    let o = kpack_fuse(&[&"frobnicate"]);
    assert_eq!(code(&o), 2);
}

#[test]
fn verify_names_each_bad_entry() {
    let dir = tempfile::tempdir().unwrap();
    let data = sample_kernel();
    let (blob, mut toc) = zstd_parts(&data);
    toc.at("toc").set(
        "other#0",
        m(vec![(
            "gfx900",
            m(vec![("ordinal", V::U(7)), ("original_size", V::U(3))]),
        )]),
    );
    toc.at("toc")
        .at("k#0")
        .at("gfx900")
        .set("original_size", V::U(data.len() as u64 + 1));
    let path = dir.path().join("bad.kpack");
    std::fs::write(&path, archive_bytes(&blob, &toc.encode())).unwrap();
    let o = kpack_fuse(&[&"verify", &path]);
    assert_eq!(code(&o), 6);
    let err = stderr(&o);
    assert!(
        err.contains("k#0 [gfx900]") && err.contains("other#0 [gfx900]"),
        "{err}"
    );
    // Each BAD line names the archive and the entry once; the reason does not repeat them.
    let file = path.display();
    assert_eq!(
        err,
        format!(
            "BAD {file}: k#0 [gfx900]: frame at byte 72 failed to decode: the frame records {} bytes, the TOC says {}\n\
             BAD {file}: other#0 [gfx900]: not found: ordinal 7 has no stored blob (1 present)\n\
             kpack-fuse: 2 of 2 entries are bad\n",
            data.len(),
            data.len() + 1
        )
    );
}

#[test]
fn extract_refuses_names_that_escape() {
    let dir = tempfile::tempdir().unwrap();
    for (key, arch) in [
        ("../escape#0", "gfx900"),
        ("/abs#0", "gfx900"),
        ("a//b#0", "gfx900"),
        ("ok#0", "../../x"),
        ("ok#0", "a/b"),
    ] {
        let mut w = ArchiveWriter::new("g", "f", vec![arch.into()], Compression::None).unwrap();
        w.add_kernel("fine#0", arch, vec![1, 2, 3]).unwrap();
        w.add_kernel(key, arch, vec![4, 5, 6]).unwrap();
        let path = dir.path().join("evil.kpack");
        w.write(&path, &|_| {}).unwrap();
        let dest = dir.path().join("dest");
        let o = kpack_fuse(&[&"extract", &path, &dest]);
        assert_eq!(code(&o), 7, "{key} {arch}");
        assert!(stderr(&o).contains("refusing"), "{}", stderr(&o));
        assert!(!dest.exists(), "nothing is written for {key} {arch}");
        assert!(!dir.path().join("escape#0").exists());
    }
}

/// A FIFO given as the input is told at once to be no archive, instead of waiting for a writer
/// (the kind of an input is read without blocking).
#[test]
fn list_and_extract_of_a_fifo_do_not_block() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo.kpack");
    let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid C string and mode.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let dest = dir.path().join("dest");
    for args in [
        vec![&"list" as &dyn AsRef<std::ffi::OsStr>, &fifo],
        vec![&"extract", &fifo, &dest],
    ] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_kpack-fuse"))
            .args(args.iter().map(|a| a.as_ref()))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let start = std::time::Instant::now();
        while child.try_wait().unwrap().is_none() {
            if start.elapsed() > std::time::Duration::from_secs(20) {
                let _ = child.kill();
                panic!("{:?} on a FIFO blocked", args[0].as_ref());
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let o = child.wait_with_output().unwrap();
        assert_eq!(code(&o), 3, "{}", stderr(&o));
        assert!(
            stderr(&o).contains("fifo.kpack: file is empty"),
            "{}",
            stderr(&o)
        );
    }
}
