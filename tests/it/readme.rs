//! The README's commands on the samples, run as they stand: the rocRAND sample's fallback link,
//! and `resolve`, `load` and `mount` of the HIPK sample. Each marked block (`<!-- test: NAME -->`
//! before its fence) runs under bash in a private mount namespace with its own `/tmp`, from a
//! directory laid out like the repository (`samples/`, and `target/release/kpack-fuse` being the
//! program under test), so the README's fixed paths touch nothing outside the test.

use crate::support::mount::{fuse_available, in_private_mount_namespace};
use std::path::Path;

const BIN: &str = env!("CARGO_BIN_EXE_kpack-fuse");

/// The text of the fenced block after `<!-- test: NAME -->` in the README.
fn block(name: &str) -> String {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    let marker = format!("<!-- test: {name} -->");
    let mut lines = readme.lines().skip_while(|l| l.trim() != marker).skip(1);
    assert!(
        lines.next().is_some_and(|l| l.starts_with("```")),
        "README.md: no block after {marker}"
    );
    let body: Vec<&str> = lines.take_while(|l| !l.starts_with("```")).collect();
    body.join("\n") + "\n"
}

/// Runs `before`, the README block `name` (under `bash -euo pipefail`) and `after` in a fresh
/// mount namespace; `unmount` lists the mount points to unmount on the way out, whatever
/// happens. Returns the exit code, standard output and standard error.
fn run_block(before: &str, name: &str, after: &str, unmount: &[&str]) -> (i32, String, String) {
    let root = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    std::os::unix::fs::symlink(repo.join("samples"), root.path().join("samples")).unwrap();
    std::fs::create_dir_all(root.path().join("target/release")).unwrap();
    std::os::unix::fs::symlink(BIN, root.path().join("target/release/kpack-fuse")).unwrap();
    let cleanup: String = unmount
        .iter()
        .map(|m| format!("target/release/kpack-fuse unmount {m} >/dev/null 2>&1 || true; "))
        .collect();
    let script = format!(
        "set -eu\nmount -t tmpfs tmpfs /tmp\ntrap '{cleanup}' EXIT\n{before}\n\
         bash -euo pipefail -c \"$README_BLOCK\"\n{after}\n"
    );
    let out = in_private_mount_namespace(120, &script)
        .current_dir(root.path())
        .env("README_BLOCK", block(name))
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn readme_fallback_link_of_the_rocrand_sample() {
    if !fuse_available() {
        return;
    }
    // The README's first command, without the build: the mount the block looks into.
    let before = "mkdir -p /tmp/kpack && target/release/kpack-fuse mount \
                  samples/rocrand-sample.kpack /tmp/kpack";
    let (code, stdout, stderr) = run_block(before, "fallback", "", &["/tmp/kpack"]);
    assert_eq!((code, stderr.as_str()), (0, ""), "{stdout}");
    assert_eq!(stdout, "gfx90a:xnack+.hsaco\n");
}

#[test]
fn readme_resolve_load_and_mount_of_the_hipk_sample() {
    if !fuse_available() {
        return;
    }
    // The loaded code object is the sample archive's, and the mount shows the same bytes.
    let after = "target/release/kpack-fuse cat samples/rocrand-sample.kpack \
                 'lib/x86_64-linux-gnu/librocrand.so.1.1#0' gfx1030 | cmp - /tmp/hello-gfx1030.hsaco\n\
                 cmp /tmp/hello-gfx1030.hsaco '/tmp/hipk/bin/hello-hipk#0/gfx1030.hsaco'\n\
                 echo identical";
    let (code, stdout, stderr) = run_block("", "hipk-sample", after, &["/tmp/hipk"]);
    assert_eq!((code, stderr.as_str()), (0, ""), "{stdout}");
    let lines: Vec<&str> = stdout.lines().collect();
    let archive = "/samples/hipk/.kpack/hello-hipk_gfx1030.kpack";
    assert!(
        lines.iter().any(|l| l.starts_with("  => gfx1030 from ")
            && l.ends_with(&format!("{archive} (1642416 bytes)"))),
        "{stdout}"
    );
    assert!(
        lines.iter().any(|l| l
            .starts_with("/tmp/hello-gfx1030.hsaco: 1642416 bytes (gfx1030 from ")
            && l.ends_with(&format!("{archive})"))),
        "{stdout}"
    );
    assert_eq!(
        lines[lines.len() - 5..],
        [
            "/tmp/hipk",
            "/tmp/hipk/bin",
            "/tmp/hipk/bin/hello-hipk#0",
            "/tmp/hipk/bin/hello-hipk#0/gfx1030.hsaco",
            "identical",
        ],
        "{stdout}"
    );
}
