//! Every command that prints, with its standard output a pipe whose reader goes away, as in
//! `kpack-fuse list --json a.kpack | head -c 1`: the command stops quietly, prints nothing on
//! standard error and exits 141 (what a shell reports for `cat` in the same place), never the
//! panic and backtrace of `println!`. `--help` and `--version` are the parser's: exit 0. With
//! standard error closed too (`2>&1 | head -c 1`), a failing command keeps its exit status.

use std::ffi::OsStr;
use std::io::Read;
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::Path;
use std::process::{Command, Stdio};

use rocm_kpack::{ArchiveWriter, Compression};

use crate::support::craft::flipped_archive;
use crate::support::mount::{Mount, fuse_available};

const BIN: &str = env!("CARGO_BIN_EXE_kpack-fuse");

/// The exit status of a command whose standard output was closed by its reader.
const BROKEN_PIPE: i32 = 141;

/// When the reader of the command's standard output goes away.
#[derive(Debug, Clone, Copy)]
enum Reader {
    /// After one byte, as `head -c 1`: for output larger than a pipe holds (64 KiB), which
    /// then meets the closed end.
    HeadByte,
    /// Before the command starts: for output small enough that a pipe would take it whole
    /// while a real `head` is still reading.
    Gone,
}

/// A pipe as (read end, write end).
fn pipe() -> (OwnedFd, OwnedFd) {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 writes.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: both descriptors are new and owned by nobody else.
    unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
}

/// Runs `kpack-fuse ARGS` (bounded in time) with its standard output closed as `reader` says,
/// and checks it ended as `expected` says, quietly: no panic, no backtrace, nothing on standard
/// error.
fn check(args: &[&dyn AsRef<OsStr>], reader: Reader, expected: i32) {
    let mut cmd = Command::new("timeout");
    cmd.arg("60").arg(BIN).args(args.iter().map(|a| a.as_ref()));
    cmd.env("RUST_BACKTRACE", "1").stderr(Stdio::piped());
    let what = format!(
        "kpack-fuse {} ({reader:?})",
        args.iter()
            .map(|a| a.as_ref().to_string_lossy())
            .collect::<Vec<_>>()
            .join(" ")
    );
    let mut child = match reader {
        Reader::HeadByte => {
            let mut child = cmd.stdout(Stdio::piped()).spawn().unwrap();
            let mut out = child.stdout.take().unwrap();
            let mut byte = [0u8; 1];
            let read = out.read_exact(&mut byte);
            drop(out);
            if let Err(e) = read {
                let out = child.wait_with_output().unwrap();
                panic!(
                    "{what}: no output ({e}): {}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            child
        }
        Reader::Gone => {
            let (read, write) = pipe();
            drop(read);
            cmd.stdout(Stdio::from(write)).spawn().unwrap()
        }
    };
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    let status = child.wait().unwrap();
    assert!(
        !stderr.contains("panicked") && !stderr.contains("RUST_BACKTRACE"),
        "{what} panicked: {stderr}"
    );
    assert_eq!(status.code(), Some(expected), "{what}: {status}: {stderr}");
    assert_eq!(stderr, "", "{what}: says something on standard error");
}

/// An archive of 2000 small kernels and one of 1 MiB: its listing (as a table and as JSON) and
/// the large kernel are each more than a pipe holds.
fn big_archive(dir: &Path) -> std::path::PathBuf {
    let mut w =
        ArchiveWriter::new("g", "gfx900", vec!["gfx900".into()], Compression::None).unwrap();
    for i in 0..2000 {
        w.add_kernel(&format!("lib/libmany.so#{i}"), "gfx900", vec![i as u8; 3])
            .unwrap();
    }
    w.add_kernel("lib/libhuge.so#0", "gfx900", vec![7u8; 1 << 20])
        .unwrap();
    let path = dir.join("big.kpack");
    w.write(&path, &|_| {}).unwrap();
    path
}

#[test]
fn archive_commands_stop_quietly_on_a_closed_pipe() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let big = big_archive(dir);
    check(&[&"list", &"--json", &big], Reader::HeadByte, BROKEN_PIPE);
    check(&[&"list", &big], Reader::HeadByte, BROKEN_PIPE);
    check(
        &[&"cat", &big, &"lib/libhuge.so#0", &"gfx900"],
        Reader::HeadByte,
        BROKEN_PIPE,
    );
    check(&[&"verify", &big], Reader::Gone, BROKEN_PIPE);
    check(
        &[&"extract", &big, &dir.join("x")],
        Reader::Gone,
        BROKEN_PIPE,
    );
    let tree = dir.join("tree/lib/libfoo.so#0");
    std::fs::create_dir_all(&tree).unwrap();
    std::fs::write(tree.join("gfx900.hsaco"), [1, 2, 3]).unwrap();
    check(
        &[&"pack", &dir.join("tree"), &"-o", &dir.join("p.kpack")],
        Reader::Gone,
        BROKEN_PIPE,
    );
    // What was written before the pipe closed is complete: the pack finished, then said so.
    assert!(dir.join("p.kpack").is_file());
}

#[test]
fn fat_binary_commands_stop_quietly_on_a_closed_pipe() {
    let tmp = tempfile::tempdir().unwrap();
    let (dir, root, lib, _app) = crate::split::fat_tree(&tmp);
    check(&[&"list", &lib], Reader::Gone, BROKEN_PIPE);
    let out = dir.join("out");
    check(
        &[&"split", &lib, &"--root", &root, &"-o", &out],
        Reader::Gone,
        BROKEN_PIPE,
    );
    // Without -o it first says where it writes.
    check(
        &[&"split", &lib, &"--root", &root],
        Reader::Gone,
        BROKEN_PIPE,
    );
    check(
        &[&"verify", &"--split", &out, &"--original", &root],
        Reader::Gone,
        BROKEN_PIPE,
    );
    let kpack = dir.join("packed");
    check(
        &[
            &"pack",
            &"--from-fatbin",
            &lib,
            &"--root",
            &root,
            &"-o",
            &kpack,
        ],
        Reader::Gone,
        BROKEN_PIPE,
    );
    let mut verify: Vec<&dyn AsRef<OsStr>> = vec![&"verify"];
    let archives: Vec<std::path::PathBuf> = std::fs::read_dir(&kpack)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "kpack"))
        .collect();
    assert!(!archives.is_empty());
    verify.extend(archives.iter().map(|p| p as &dyn AsRef<OsStr>));
    verify.extend([&"--against" as &dyn AsRef<OsStr>, &lib]);
    check(&verify, Reader::Gone, BROKEN_PIPE);
}

#[test]
fn loader_commands_stop_quietly_on_a_closed_pipe() {
    let tmp = tempfile::tempdir().unwrap();
    let prefix = std::fs::canonicalize(tmp.path()).unwrap();
    let exe = crate::c_api::build_host(&prefix, crate::support::cc::Lang::C);
    let gpu = "amdgcn-amd-amdhsa--gfx90a:xnack+";
    check(
        &[&"resolve", &exe, &"--gpu", &gpu],
        Reader::Gone,
        BROKEN_PIPE,
    );
    check(
        &[&"resolve", &exe, &"--gpu", &gpu, &"--json"],
        Reader::Gone,
        BROKEN_PIPE,
    );
    check(
        &[
            &"load",
            &exe,
            &"--gpu",
            &gpu,
            &"--co",
            &"0",
            &"-o",
            &prefix.join("co.hsaco"),
        ],
        Reader::Gone,
        BROKEN_PIPE,
    );
    check(&[&"list", &exe, &"--gpu", &gpu], Reader::Gone, BROKEN_PIPE);
}

#[test]
fn stats_stops_quietly_on_a_closed_pipe() {
    if !fuse_available() {
        return;
    }
    let m = Mount::start(&crate::support::fixture("test_noop.kpack"), &[]);
    check(&[&"stats", &m.mountpoint], Reader::Gone, BROKEN_PIPE);
    check(
        &[&"stats", &"--json", &m.mountpoint],
        Reader::Gone,
        BROKEN_PIPE,
    );
}

/// Help and version text are clap's, which ignores a closed pipe and exits 0.
#[test]
fn help_and_version_stop_quietly_on_a_closed_pipe() {
    check(&[&"--help"], Reader::Gone, 0);
    check(&[&"list", &"--help"], Reader::Gone, 0);
    check(&[&"--version"], Reader::Gone, 0);
}

/// The exit status of `kpack-fuse ARGS` with standard output and standard error one pipe whose
/// reader is gone.
fn status_with_both_closed(args: &[&dyn AsRef<OsStr>]) -> Option<i32> {
    let (read, write) = pipe();
    drop(read);
    Command::new("timeout")
        .arg("60")
        .arg(BIN)
        .args(args.iter().map(|a| a.as_ref()))
        .env("RUST_BACKTRACE", "1")
        .stderr(Stdio::from(write.try_clone().unwrap()))
        .stdout(Stdio::from(write))
        .status()
        .unwrap()
        .code()
}

/// Its messages are lost, but a failing command still says how it failed (not 101, a panic).
#[test]
fn errors_keep_their_status_when_standard_error_is_closed_too() {
    let tmp = tempfile::tempdir().unwrap();
    let bad = tmp.path().join("bad.kpack");
    let kernels = [("lib/liba.so#0", "gfx900", vec![5u8; 64])];
    std::fs::write(&bad, flipped_archive(Compression::None, &kernels, 0)).unwrap();
    // BAD lines on standard error, then the verdict.
    assert_eq!(status_with_both_closed(&[&"verify", &bad]), Some(6));
    // Only the message.
    let missing = tmp.path().join("missing.kpack");
    assert_eq!(status_with_both_closed(&[&"list", &missing]), Some(3));
}
