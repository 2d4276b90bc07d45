//! `kpack-fuse push` against a real registry on 127.0.0.1 (`servers`), anonymous, with basic
//! authentication, and behind a bearer-token front (`token_proxy`): the artifact's exact
//! manifest, blobs byte for byte, idempotent pushes, chunked uploads, interop with skopeo,
//! credentials, token expiry, 429s, and the errors of bad references and refused pushes.

mod push;
pub mod servers;
pub mod token_proxy;

use std::path::Path;
use std::process::Command;

/// `kpack-fuse ARGS` with `env`: exit code, stdout, stderr.
pub fn run(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kpack-fuse"))
        .args(args)
        // No credentials of the machine's user leak into a test.
        .env("HOME", "/nonexistent")
        .env_remove("XDG_RUNTIME_DIR")
        .env_remove("REGISTRY_AUTH_FILE")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// An archive in our layout (frames positioned, digests in the TOC) of `n` kernels of `size`
/// incompressible bytes for `arches`.
pub fn our_archive(path: &Path, seed: u64, n: u64, size: usize, arches: &[&str]) {
    let mut w = rocm_kpack::ArchiveWriter::new(
        "ours",
        "gfx9",
        arches.iter().map(|a| (*a).to_owned()).collect(),
        rocm_kpack::Compression::Zstd { level: 1 },
    )
    .unwrap();
    for i in 0..n {
        for a in arches {
            w.add_kernel(
                &format!("lib/o.so#{i}"),
                a,
                crate::support::craft::incompressible(seed + i, size),
            )
            .unwrap();
        }
    }
    w.write(path, &|_| {}).unwrap();
}

/// GETs `url` with curl: the body, or a panic naming the status.
pub fn curl(url: &str, extra: &[&str]) -> Vec<u8> {
    let out = Command::new("curl")
        .args(["-sf"])
        .args(extra)
        .arg(url)
        .output()
        .unwrap();
    assert!(out.status.success(), "curl {url} failed: {:?}", out.status);
    out.stdout
}
