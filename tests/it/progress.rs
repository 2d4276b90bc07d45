//! Progress bars of long commands: shown on a terminal (run under `script`, which gives the
//! command a pseudo-terminal), absent in a pipe. One large fat binary serves split and
//! `pack --from-fatbin`, and the archive packed from it verify and extract.

use std::path::Path;
use std::process::Command;

use crate::support::fat_host;

const BIN: &str = env!("CARGO_BIN_EXE_kpack-fuse");

/// Runs `args` on a pseudo-terminal; returns what the terminal showed, carriage returns as
/// newlines.
fn on_terminal(dir: &Path, args: &[&str]) -> String {
    let line = std::iter::once(BIN)
        .chain(args.iter().copied())
        .map(|a| format!("'{a}'"))
        .collect::<Vec<_>>()
        .join(" ");
    let typescript = dir.join("typescript");
    let out = Command::new("timeout")
        .args(["300", "script", "-qefc", &line])
        .arg(&typescript)
        .output()
        .unwrap();
    let shown = std::fs::read_to_string(&typescript).unwrap_or_default();
    assert!(out.status.success(), "{line}: {out:?}\n{shown}");
    shown.replace('\r', "\n")
}

/// A bar line as the progress module draws it: `... 12.00 MiB/80.00 MiB ... eta ...`.
fn has_bar(shown: &str) -> bool {
    shown
        .lines()
        .any(|l| l.contains(" MiB/") && l.contains("eta"))
}

#[test]
fn long_commands_show_progress_on_a_terminal_only() {
    let d = tempfile::tempdir().unwrap();
    let root = d.path().join("root");
    let host = fat_host::build(&root.join("lib"), "libbig.so", 80 << 20, 20, 3);
    let host = host.path.to_str().unwrap().to_owned();
    let out_root = d.path().join("out");
    let out = out_root.to_str().unwrap();

    let shown = on_terminal(
        d.path(),
        &["split", &host, "--root", root.to_str().unwrap(), "-o", out],
    );
    assert!(has_bar(&shown), "split drew no bar:\n{shown}");

    // One archive of every code object is large enough for a bar of its own.
    let single = d.path().join("single");
    let shown = on_terminal(
        d.path(),
        &[
            "pack",
            "--from-fatbin",
            &host,
            "--root",
            root.to_str().unwrap(),
            "--single",
            "-o",
            single.to_str().unwrap(),
        ],
    );
    assert!(has_bar(&shown), "pack --from-fatbin drew no bar:\n{shown}");
    let biggest = std::fs::read_dir(&single)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "kpack"))
        .unwrap();
    let archive = biggest.to_str().unwrap();
    let kernels: u64 = rocm_kpack::Archive::open(&biggest)
        .unwrap()
        .entries()
        .map(|(_, e)| e.original_size)
        .sum();
    assert!(
        kernels >= 64 << 20,
        "the test needs a larger archive: {kernels}"
    );
    let shown = on_terminal(d.path(), &["verify", archive]);
    assert!(has_bar(&shown), "verify drew no bar:\n{shown}");
    let dest = d.path().join("extracted");
    let shown = on_terminal(d.path(), &["extract", archive, dest.to_str().unwrap()]);
    assert!(has_bar(&shown), "extract drew no bar:\n{shown}");

    // In a pipe, no progress at all: the closing line alone, on standard output.
    let piped = Command::new(BIN)
        .args(["verify", archive])
        .output()
        .unwrap();
    assert!(piped.status.success());
    let err = String::from_utf8_lossy(&piped.stderr);
    assert_eq!(err, "", "verify drew progress into a pipe");
    let out = String::from_utf8_lossy(&piped.stdout);
    assert_eq!(out.lines().count(), 1, "{out}");
    assert!(out.starts_with("ok: "), "{out}");
}
