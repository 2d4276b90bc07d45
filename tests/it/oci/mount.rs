//! Reading pushed artifacts: mount, list, cat, extract and verify of `oci://` references give
//! the union of the archives byte for byte; `--gpu` fetches only the layers it chooses (seen in
//! the registry's access log); a reference-layout layer opens through its kernel index; and
//! `--cache-dir` serves a blob it kept from any repository.

use std::path::{Path, PathBuf};

use rocm_kpack::Archive;

use super::servers::TestRegistry;
use super::{env, layer_digest, our_archive, push, run};
use crate::remote::servers::Nginx;
use crate::remote::{expected_dir, mount, reference_archive, refused_mount, stats};
use crate::support::mount::fuse_available;

/// Three archives of three arches: `a` (our layout, gfx90a), `b` (reference layout, gfx942:
/// pushed with a kernel index), `c` (our layout, gfx1100).
fn per_arch(dir: &Path) -> Vec<PathBuf> {
    our_archive(&dir.join("a.kpack"), 1, 3, 30_000, &["gfx90a"]);
    reference_archive(&dir.join("b.kpack"), 5, 20_000);
    our_archive(&dir.join("c.kpack"), 9, 2, 25_000, &["gfx1100"]);
    ["a", "b", "c"]
        .iter()
        .map(|n| dir.join(format!("{n}.kpack")))
        .collect()
}

fn paths(v: &[PathBuf]) -> Vec<&Path> {
    v.iter().map(PathBuf::as_path).collect()
}

/// Every kernel of `archives`, `(key, arch)`, first archive first.
fn kernels(archives: &[PathBuf]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for p in archives {
        let a = Archive::open(p).unwrap();
        for (key, entry) in a.entries() {
            out.push((key.to_owned(), entry.arch.to_owned()));
        }
    }
    out
}

#[test]
fn oci_artifact_mounts_as_the_union_of_its_archives() {
    if !fuse_available() {
        return;
    }
    let reg = TestRegistry::start();
    let src = tempfile::tempdir().unwrap();
    let archives = per_arch(src.path());
    let pushed = push(src.path(), &format!("oci://{}/kpack/set:v1", reg.host()));
    let digest = pushed["digest"].as_str().unwrap();
    let want = tempfile::tempdir().unwrap();
    expected_dir(&paths(&archives), want.path());
    let url = format!("oci://{}/kpack/set:v1", reg.host());
    let m = mount(&url, &[], &env());
    m.check("tree", want.path().to_str().unwrap());
    // Each file names the layer it comes from, under the reference pinned to the digest.
    for (file, title) in [
        ("lib/o.so#0/gfx90a.hsaco", "a.kpack"),
        ("lib/r.so#4/gfx942.hsaco", "b.kpack"),
        ("lib/o.so#1/gfx1100.hsaco", "c.kpack"),
    ] {
        m.check(
            "remote_xattr",
            &format!(
                "{file}|user.kpack.archive|oci://{}/kpack/set@{digest}/{title}",
                reg.host()
            ),
        );
    }
    let s = stats(&m);
    assert_eq!(s["remote_failures"], 0, "{s:?}");
    m.stop();

    // list: every kernel of every layer, once.
    let (code, out, err) = run(&["list", &url, "--json"], &[]);
    assert_eq!(code, Some(0), "{err}");
    let doc: serde_json::Value = serde_json::from_str(&out).unwrap();
    let layers: Vec<&str> = doc["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["archive"].as_str().unwrap())
        .collect();
    let pinned = format!("oci://{}/kpack/set@{digest}", reg.host());
    assert_eq!(
        layers,
        ["a", "b", "c"].map(|n| format!("{pinned}/{n}.kpack")),
        "{out}"
    );
    let mut listed: Vec<(String, String)> = doc["kernels"]
        .as_array()
        .unwrap_or_else(|| panic!("no kernels: {out}"))
        .iter()
        .map(|k| {
            (
                k["key"].as_str().unwrap().to_owned(),
                k["arch"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let mut all = kernels(&archives);
    listed.sort();
    all.sort();
    assert_eq!(listed, all);

    // cat: one kernel of each layer, exact bytes.
    for (key, arch, archive) in [
        ("lib/o.so#2", "gfx90a", &archives[0]),
        ("lib/r.so#3", "gfx942", &archives[1]),
        ("lib/o.so#0", "gfx1100", &archives[2]),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_kpack-fuse"))
            .args(["cat", &url, key, arch])
            .env("HOME", "/nonexistent")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "cat {key} {arch}");
        let want = Archive::open(archive)
            .unwrap()
            .get_kernel(key, arch)
            .unwrap();
        assert!(out.stdout == want, "cat {key} {arch}: other bytes");
    }

    // extract: the same tree as the mount.
    let dest = tempfile::tempdir().unwrap();
    let (code, _, err) = run(&["extract", &url, dest.path().to_str().unwrap()], &[]);
    assert_eq!(code, Some(0), "{err}");
    let files = crate::support::files_below(want.path());
    assert_eq!(files, crate::support::files_below(dest.path()));
    for rel in &files {
        assert!(
            std::fs::read(dest.path().join(rel)).unwrap()
                == std::fs::read(want.path().join(rel)).unwrap(),
            "{}",
            rel.display()
        );
    }

    // verify: every kernel of every layer checks.
    let (code, out, err) = run(&["verify", &url], &[]);
    assert_eq!(code, Some(0), "{out}{err}");
    eprintln!("verify:\n{out}{err}");
}

#[test]
fn oci_gpu_fetches_only_the_layers_that_serve_it() {
    if !fuse_available() {
        return;
    }
    let reg = TestRegistry::start();
    let src = tempfile::tempdir().unwrap();
    let archives = per_arch(src.path());
    let pushed = push(src.path(), &format!("oci://{}/kpack/arch", reg.host()));
    let url = format!("oci://{}/kpack/arch", reg.host());
    let blob_gets =
        |title: &str| reg.requests("GET", &format!("/blobs/{}", layer_digest(&pushed, title)));
    let before: Vec<usize> = ["a.kpack", "b.kpack", "b.kpack.index", "c.kpack"]
        .iter()
        .map(|t| blob_gets(t))
        .collect();
    assert_eq!(before, [0, 0, 0, 0], "push GETs no blob");

    let want = tempfile::tempdir().unwrap();
    expected_dir(&[archives[1].as_path()], want.path());
    let m = mount(&url, &["--gpu", "gfx942"], &env());
    m.check("tree", want.path().to_str().unwrap());
    m.stop();
    assert_eq!(blob_gets("a.kpack"), 0, "{}", reg.log());
    assert_eq!(blob_gets("c.kpack"), 0, "{}", reg.log());
    assert!(blob_gets("b.kpack") > 0, "{}", reg.log());
    assert_eq!(blob_gets("b.kpack.index"), 1, "{}", reg.log());

    // The same for list, and for a GPU served by a generic or by two layers.
    let (code, out, err) = run(&["list", &url, "--gpu", "gfx90a", "--gpu", "gfx1100"], &[]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains("gfx90a") && out.contains("gfx1100") && !out.contains("gfx942"),
        "{out}"
    );
    assert_eq!(blob_gets("b.kpack.index"), 1, "{}", reg.log());

    // No layer serves the GPU: exit 5, naming the layers and their arches.
    let (code, err) = refused_mount(&url, &["--gpu", "gfx1030"], &env());
    assert_eq!(code, Some(5), "{err}");
    assert!(
        err.contains("none of its 3 archive layers has code for gfx1030")
            && err.contains("a.kpack (gfx90a); b.kpack (gfx942); c.kpack (gfx1100)"),
        "{err}"
    );
    let (code, _, err) = run(&["list", &url, "--gpu", "gfx1030"], &[]);
    assert_eq!(code, Some(5), "{err}");

    // `auto` on a node without a GPU (this machine has no KFD topology): a usage error.
    if !Path::new("/sys/class/kfd/kfd/topology/nodes").exists() {
        let (code, err) = refused_mount(&url, &["--gpu", "auto"], &env());
        assert_eq!(code, Some(2), "{err}");
        assert!(err.contains("--gpu auto: this node has no GPU"), "{err}");
        let (code, _, err) = run(&["list", &url, "--gpu", "auto"], &[]);
        assert_eq!(code, Some(2), "{err}");
        assert!(err.contains("has no GPU"), "{err}");
    }
}

/// 64 frames of 256 KiB of incompressible bytes (16 MiB): through its kernel index, one kernel
/// costs the manifest, the index, the TOC and its frame; over plain HTTP the same archive is
/// opened by walking its frame chain, which reads most of the file.
#[test]
fn oci_reference_layout_opens_through_its_index_fetching_little() {
    if !fuse_available() {
        return;
    }
    let reg = TestRegistry::start();
    let www = tempfile::tempdir().unwrap();
    let path = www.path().join("ref.kpack");
    reference_archive(&path, 64, 256 << 10);
    let len = std::fs::metadata(&path).unwrap().len();
    let one = www.path().join("one");
    std::fs::write(
        &one,
        Archive::open(&path)
            .unwrap()
            .get_kernel("lib/r.so#37", "gfx942")
            .unwrap(),
    )
    .unwrap();
    let read_one = format!("lib/r.so#37/gfx942.hsaco|{}", one.display());

    push(&path, &format!("oci://{}/kpack/ref", reg.host()));
    let m = mount(&format!("oci://{}/kpack/ref", reg.host()), &[], &env());
    let at_mount = stats(&m);
    m.check("remote_same", &read_one);
    let oci = stats(&m);
    m.stop();

    let nginx = Nginx::start(www.path());
    let m = mount(&nginx.url("ref.kpack"), &[], &[]);
    m.check("remote_same", &read_one);
    let http = stats(&m);
    m.stop();
    eprintln!(
        "one 256 KiB kernel of a {len}-byte reference-layout archive: oci:// (kernel index) \
         {} bytes in {} requests ({} bytes at mount); http:// (frame chain walk) {} bytes in {} \
         requests",
        oci["remote_bytes_fetched"],
        oci["remote_requests"],
        at_mount["remote_bytes_fetched"],
        http["remote_bytes_fetched"],
        http["remote_requests"]
    );
    assert!(
        oci["remote_bytes_fetched"] * 10 < len,
        "oci:// fetched {} of {len} bytes: {oci:?}\n{}",
        oci["remote_bytes_fetched"],
        reg.log()
    );
    assert!(
        http["remote_bytes_fetched"] * 2 > len,
        "http:// fetched only {} of {len} bytes: the comparison means nothing",
        http["remote_bytes_fetched"]
    );
}

/// A blob's kernels kept in `--cache-dir` by one mount are served to a mount of another
/// repository holding the same blob (same digest), without fetching them again.
#[test]
fn oci_cache_dir_serves_the_same_blob_from_another_repository() {
    if !fuse_available() {
        return;
    }
    let reg = TestRegistry::start();
    let src = tempfile::tempdir().unwrap();
    our_archive(
        &src.path().join("a.kpack"),
        3,
        4,
        60_000,
        &["gfx942", "gfx90a"],
    );
    reference_archive(&src.path().join("b.kpack"), 5, 40_000);
    let archives = [src.path().join("a.kpack"), src.path().join("b.kpack")];
    let want = tempfile::tempdir().unwrap();
    expected_dir(&paths(&archives), want.path());
    let n = crate::support::files_below(want.path()).len() as u64;
    let one = push(src.path(), &format!("oci://{}/kpack/one", reg.host()));
    let two = push(src.path(), &format!("oci://{}/other/two", reg.host()));
    assert_eq!(one["digest"], two["digest"], "same archives, same manifest");
    let cache = tempfile::tempdir().unwrap();
    let cache_arg = cache.path().to_str().unwrap();

    let first = mount(
        &format!("oci://{}/kpack/one", reg.host()),
        &["--cache-dir", cache_arg],
        &env(),
    );
    first.check("tree", want.path().to_str().unwrap());
    first.stop();

    let gets = |d: &str| reg.requests("GET", &format!("/v2/other/two/blobs/{d}"));
    let (a, b) = (layer_digest(&two, "a.kpack"), layer_digest(&two, "b.kpack"));
    let second = mount(
        &format!("oci://{}/other/two", reg.host()),
        &["--cache-dir", cache_arg],
        &env(),
    );
    let at_mount = stats(&second);
    let gets_at_mount = (gets(&a), gets(&b));
    second.check("tree", want.path().to_str().unwrap());
    let s = stats(&second);
    second.stop();
    eprintln!(
        "second repository, same blobs: {} requests, {} bytes at mount; {} requests, {} bytes \
         in all; {} cache-dir hits of {n} files",
        at_mount["remote_requests"],
        at_mount["remote_bytes_fetched"],
        s["remote_requests"],
        s["remote_bytes_fetched"],
        s["cache_dir_hits"]
    );
    assert_eq!(
        (gets(&a), gets(&b)),
        gets_at_mount,
        "blob GETs after the open:\n{}",
        reg.log()
    );
    assert_eq!(
        s["remote_requests"], at_mount["remote_requests"],
        "no request after the open: {s:?}"
    );
    assert_eq!(s["cache_dir_hits"], n, "{s:?}");
}
