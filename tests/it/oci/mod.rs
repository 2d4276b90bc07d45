//! `oci://` against a real registry on 127.0.0.1 (`servers`), anonymous, with basic
//! authentication, and behind a bearer-token front (`token_proxy`):
//!
//! - `push`: the artifact's exact manifest, blobs byte for byte, idempotent pushes, chunked
//!   uploads, interop with skopeo, credentials, token expiry, 429s, and the errors of bad
//!   references and refused pushes;
//! - `mount`: mount, list, cat, extract and verify of a pushed artifact give the union of its
//!   archives byte for byte; `--gpu` fetches only the layers it chooses; a reference-layout
//!   layer opens through its kernel index (a few bytes fetched, not the frame chain);
//!   `--cache-dir` serves the same blob from another repository without fetching it again;
//! - `hostile`: artifacts made without kpack-fuse (curl), blobs damaged in the registry's
//!   storage, manifests that are not kernel packs, unknown tags and repositories;
//! - `wire`: faults injected between the mount and the registry (`remote::fault_proxy`), and
//!   blob GETs redirected to a storage host (`redirect`) that must never see credentials.

mod hostile;
mod mount;
mod push;
pub mod redirect;
pub mod servers;
pub mod token_proxy;
mod wire;

use std::path::Path;
use std::process::Command;

use serde_json::Value;

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

/// `sha256:HEX` of `data`.
pub fn sha256(data: &[u8]) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, data);
    let hex: String = d.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

/// The environment of every mount here: no credentials of the machine's user.
pub fn env() -> Vec<(String, String)> {
    vec![("HOME".into(), "/nonexistent".into())]
}

/// `kpack-fuse push SOURCE DEST --json`, which must succeed: its JSON answer.
pub fn push(source: &Path, dest: &str) -> Value {
    let (code, out, err) = run(&["push", source.to_str().unwrap(), dest, "--json"], &[]);
    assert_eq!(code, Some(0), "push {dest}: {err}");
    serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"))
}

/// The digest of the layer titled `title` in a push's JSON answer.
pub fn layer_digest(pushed: &Value, title: &str) -> String {
    pushed["layers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["title"] == title)
        .unwrap_or_else(|| panic!("no layer {title}: {pushed}"))["digest"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// Uploads `bytes` as a blob of `host/repo` with curl, as the distribution specification
/// says (`POST /v2/NAME/blobs/uploads/`, then `PUT LOCATION` with `digest=`): its digest.
pub fn put_blob(host: &str, repo: &str, bytes: &[u8]) -> String {
    let digest = sha256(bytes);
    let out = Command::new("curl")
        .args(["-sf", "-o", "/dev/null", "-D", "-", "-X", "POST"])
        .arg(format!("http://{host}/v2/{repo}/blobs/uploads/"))
        .output()
        .unwrap();
    assert!(out.status.success(), "POST uploads: {:?}", out.status);
    let head = String::from_utf8_lossy(&out.stdout).into_owned();
    let location = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("location")
                .then(|| v.trim().to_owned())
        })
        .unwrap_or_else(|| panic!("no Location:\n{head}"));
    let mut url = if location.starts_with('/') {
        format!("http://{host}{location}")
    } else {
        location
    };
    url.push(if url.contains('?') { '&' } else { '?' });
    url.push_str(&format!("digest={digest}"));
    let dir = tempfile::tempdir().unwrap();
    let body = dir.path().join("blob");
    std::fs::write(&body, bytes).unwrap();
    let out = Command::new("curl")
        .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "-X", "PUT"])
        .args(["-H", "Content-Type: application/octet-stream"])
        .arg("--data-binary")
        .arg(format!("@{}", body.display()))
        .arg(&url)
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "201", "PUT {url}");
    digest
}

/// PUTs `manifest` as `host/repo:tag` with `media_type` as its `Content-Type`: its digest.
pub fn put_manifest(
    host: &str,
    repo: &str,
    tag: &str,
    media_type: &str,
    manifest: &Value,
) -> String {
    let bytes = serde_json::to_vec(manifest).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let body = dir.path().join("manifest");
    std::fs::write(&body, &bytes).unwrap();
    let out = Command::new("curl")
        .args(["-s", "-w", "\n%{http_code}", "-X", "PUT"])
        .args(["-H", &format!("Content-Type: {media_type}")])
        .arg("--data-binary")
        .arg(format!("@{}", body.display()))
        .arg(format!("http://{host}/v2/{repo}/manifests/{tag}"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(text.ends_with("\n201"), "PUT manifest {repo}:{tag}: {text}");
    sha256(&bytes)
}

/// A descriptor of `bytes` with `media_type` and, when given, `annotations`.
pub fn descriptor(media_type: &str, bytes: &[u8], annotations: Option<Value>) -> Value {
    let mut d = serde_json::json!({
        "mediaType": media_type,
        "digest": sha256(bytes),
        "size": bytes.len(),
    });
    if let Some(a) = annotations {
        d["annotations"] = a;
    }
    d
}
