//! `oci://` mounts with something between them and the registry: the fault proxy of the remote
//! tests (`remote::fault_proxy`: resets, short bodies, wrong `Content-Range`s, whole blobs
//! instead of ranges, answers held past the timeout, flipped bytes), through which every file
//! reads exactly or fails with EIO, never other bytes; and a front that redirects blob GETs to
//! a storage host (`redirect`), which serves the right bytes and never sees the registry's
//! credentials, basic or bearer.

use base64::Engine;

use super::redirect::RedirectFront;
use super::servers::TestRegistry;
use super::token_proxy::TokenProxy;
use super::{env, layer_digest, our_archive, push, run};
use crate::remote::fault_proxy::FaultProxy;
use crate::remote::{expected_dir, mount, reference_archive, stats};
use crate::support::mount::fuse_available;

const SEED: u64 = 0x6f63_6921;

#[test]
fn oci_reads_through_injected_faults_are_exact_or_eio() {
    if !fuse_available() {
        return;
    }
    let reg = TestRegistry::start();
    let src = tempfile::tempdir().unwrap();
    // Our layout (frames located by the TOC) and the reference layout (by its kernel index).
    let a = src.path().join("a.kpack");
    let b = src.path().join("b.kpack");
    our_archive(&a, 50, 8, 120_000, &["gfx942", "gfx90a"]);
    reference_archive(&b, 8, 150_000);
    let pushed = push(src.path(), &format!("oci://{}/kpack/faults", reg.host()));
    let want = tempfile::tempdir().unwrap();
    expected_dir(&[a.as_path(), b.as_path()], want.path());

    let proxy = FaultProxy::start(
        reg.port,
        SEED,
        300,
        std::time::Duration::from_millis(2500),
        Vec::new(),
    );
    for (path, title) in [(&a, "a.kpack"), (&b, "b.kpack")] {
        let digest = layer_digest(&pushed, title);
        proxy.add_object(&format!("/blobs/{digest}"), std::fs::read(path).unwrap());
    }
    let url = format!("oci://127.0.0.1:{}/kpack/faults", proxy.port);
    let m = mount(
        &url,
        &[
            "--remote-timeout",
            "1",
            "--remote-retries",
            "3",
            "--backing",
            "memory",
            "--memory-cache-size",
            "64K",
        ],
        &env(),
    );
    proxy.arm(true);
    let out = m.child(
        "remote_faulty_reads",
        &format!("4|2|{}", want.path().display()),
    );
    proxy.arm(false);
    assert!(
        out.success,
        "faulty reads failed (a WRONG BYTES line is a kernel served with other bytes):\n{}\n\
         daemon log:\n{}",
        out.output,
        m.daemon_log()
    );
    let line = out
        .output
        .lines()
        .find_map(|l| l.split_once("READS ").map(|(_, c)| c.to_owned()))
        .unwrap_or_else(|| panic!("no counts:\n{}", out.output));
    let words: Vec<&str> = line.split_whitespace().collect();
    let (ok, eio): (u64, u64) = (words[1].parse().unwrap(), words[3].parse().unwrap());
    let counts = proxy.counts();
    let s = stats(&m);
    eprintln!(
        "oci:// through faults: {ok} reads exact, {eio} EIO, 0 wrong; injected {counts:?}; \
         {} answers untouched; {s:?}",
        proxy.passed()
    );
    assert!(ok > eio, "most reads succeed with retries: {line}");
    for (fault, n) in &counts {
        assert!(*n > 0, "no {fault:?} was injected: {counts:?}");
    }
    // With the faults gone, every file reads exactly.
    let again = m.child(
        "remote_faulty_reads",
        &format!("1|1|{}", want.path().display()),
    );
    assert!(
        again.output.contains(" eio 0 "),
        "EIO after the faults stopped:\n{}\ndaemon log:\n{}",
        again.output,
        m.daemon_log()
    );
    m.stop();
}

fn basic(user: &str, password: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
}

/// An auth file with `user:password` for each of `hosts`.
fn auth_file(dir: &std::path::Path, hosts: &[String], user: &str, password: &str) -> String {
    let auths: serde_json::Map<String, serde_json::Value> = hosts
        .iter()
        .map(|h| {
            (
                h.clone(),
                serde_json::json!({ "auth": basic(user, password) }),
            )
        })
        .collect();
    let path = dir.join("auth.json");
    std::fs::write(&path, serde_json::json!({ "auths": auths }).to_string()).unwrap();
    path.display().to_string()
}

/// Mounts `url` with the credentials of `auth` and reads every file; the storage host served
/// the blobs and never saw an `Authorization` header.
fn mount_through_redirects(url: &str, auth: &str, front: &RedirectFront, want: &std::path::Path) {
    let mut e = env();
    e.push(("REGISTRY_AUTH_FILE".into(), auth.into()));
    let m = mount(url, &[], &e);
    m.check("tree", want.to_str().unwrap());
    let s = stats(&m);
    m.stop();
    assert!(front.redirected() > 0, "no blob GET was redirected");
    assert!(
        front.storage_requests() > 0,
        "the storage host served nothing"
    );
    assert_eq!(
        front.storage_saw_authorization(),
        0,
        "the registry's credentials reached the storage host"
    );
    assert_eq!(s["remote_failures"], 0, "{s:?}");
    eprintln!(
        "{url}: {} blob requests redirected, {} served by the storage host, none with \
         Authorization",
        front.redirected(),
        front.storage_requests()
    );
}

#[test]
fn oci_redirected_blobs_never_get_the_registry_credentials() {
    if !fuse_available() {
        return;
    }
    let src = tempfile::tempdir().unwrap();
    let a = src.path().join("a.kpack");
    let b = src.path().join("b.kpack");
    our_archive(&a, 60, 4, 80_000, &["gfx942"]);
    reference_archive(&b, 4, 60_000);
    let want = tempfile::tempdir().unwrap();
    expected_dir(&[a.as_path(), b.as_path()], want.path());
    let dir = tempfile::tempdir().unwrap();

    // Basic authentication: the registry asks for it; the storage host has its own access.
    let reg = TestRegistry::start_with(Some(("kuser", "kpass")));
    let front = RedirectFront::start(
        reg.port,
        reg.port,
        Some(format!("Basic {}", basic("kuser", "kpass"))),
    );
    let auth = auth_file(dir.path(), &[reg.host(), front.host()], "kuser", "kpass");
    let (code, _, err) = run(
        &[
            "push",
            src.path().to_str().unwrap(),
            &format!("oci://{}/kpack/redir", reg.host()),
        ],
        &[("REGISTRY_AUTH_FILE", &auth)],
    );
    assert_eq!(code, Some(0), "{err}");
    let url = format!("oci://{}/kpack/redir", front.host());
    mount_through_redirects(&url, &auth, &front, want.path());
    let (code, _, err) = run(&["verify", &url], &[("REGISTRY_AUTH_FILE", &auth)]);
    assert_eq!(code, Some(0), "{err}");
    drop(front);
    drop(reg);

    // Bearer tokens: a token front before an anonymous registry; the storage host reads the
    // registry directly.
    let reg = TestRegistry::start();
    push(src.path(), &format!("oci://{}/kpack/redir", reg.host()));
    let tokens = TokenProxy::start(reg.port, "kuser", "kpass", 300, 1_000_000);
    let front = RedirectFront::start(tokens.port, reg.port, None);
    let auth = auth_file(dir.path(), &[front.host()], "kuser", "kpass");
    let url = format!("oci://{}/kpack/redir", front.host());
    mount_through_redirects(&url, &auth, &front, want.path());
    assert!(tokens.issued() > 0, "no token was asked for");
}
