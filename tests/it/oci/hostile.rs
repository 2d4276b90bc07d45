//! What a registry may hold besides our own pushes: an artifact made without kpack-fuse (curl,
//! following the distribution specification), blobs damaged in the registry's storage after
//! the push (served under their digest as if nothing happened), manifests that are not kernel
//! packs, unknown tags and repositories. Nothing damaged is ever served: a damaged frame reads
//! as EIO, a damaged TOC, index or foreign blob refuses the mount.

use std::path::Path;

use rocm_kpack::Archive;
use serde_json::json;

use super::servers::TestRegistry;
use super::{
    descriptor, env, layer_digest, our_archive, push, put_blob, put_manifest, run, sha256,
};
use crate::remote::{expected_dir, mount, reference_archive, refused_mount, stats};
use crate::support::mount::fuse_available;

const MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const INDEX: &str = "application/vnd.oci.image.index.v1+json";
const EMPTY: &str = "application/vnd.oci.empty.v1+json";
const PACK: &str = "application/vnd.kpack-fuse.pack.v1";

/// Where the TOC of the archive file `path` starts, and its length.
fn toc_span(path: &Path) -> (u64, u64) {
    let bytes = std::fs::read(path).unwrap();
    let offset = u64::from_le_bytes(bytes[8..16].try_into().unwrap());
    (offset, bytes.len() as u64 - offset)
}

/// The `#` of the first `key` in the TOC of the archive file `path`: flipping its low bit
/// turns it into `"`, which leaves the TOC well formed (another key), so only its digest tells.
fn toc_key_byte(path: &Path, key: &str) -> u64 {
    let bytes = std::fs::read(path).unwrap();
    let (offset, _) = toc_span(path);
    let toc = &bytes[offset as usize..];
    let at = toc
        .windows(key.len())
        .position(|w| w == key.as_bytes())
        .unwrap_or_else(|| panic!("{key} not in the TOC"));
    offset + at as u64 + key.find('#').unwrap() as u64
}

/// The middle byte of the stored frame (or blob) of `key`/`arch` in the archive file `path`.
fn frame_middle(path: &Path, key: &str, arch: &str) -> u64 {
    let a = Archive::open(path).unwrap();
    let k = a.locate(key, arch).unwrap();
    k.stored.offset + k.stored.size / 2
}

#[test]
fn oci_artifact_made_with_curl_reads_through_the_whole_blob_check() {
    if !fuse_available() {
        return;
    }
    let reg = TestRegistry::start();
    let host = reg.host();
    let src = tempfile::tempdir().unwrap();
    let ours = src.path().join("x.kpack");
    our_archive(&ours, 5, 3, 40_000, &["gfx942", "gfx90a"]);
    let refl = src.path().join("r.kpack");
    reference_archive(&refl, 4, 30_000);
    let want = tempfile::tempdir().unwrap();
    expected_dir(&[ours.as_path(), refl.as_path()], want.path());

    // As another tool would push it: the empty config, the two files as layers with a title
    // and nothing else, a manifest naming the pack's artifact type.
    let repo = "foreign/pack";
    put_blob(&host, repo, b"{}");
    let mut layers = Vec::new();
    for (path, title) in [(&ours, "x.kpack"), (&refl, "r.kpack")] {
        let bytes = std::fs::read(path).unwrap();
        put_blob(&host, repo, &bytes);
        layers.push(descriptor(
            "application/vnd.oci.image.layer.v1.tar",
            &bytes,
            Some(json!({ "org.opencontainers.image.title": title })),
        ));
    }
    let manifest = json!({
        "schemaVersion": 2,
        "mediaType": MANIFEST,
        "artifactType": PACK,
        "config": descriptor(EMPTY, b"{}", None),
        "layers": layers,
    });
    let digest = put_manifest(&host, repo, "v1", MANIFEST, &manifest);
    let url = format!("oci://{host}/{repo}:v1");

    let m = mount(&url, &[], &env());
    m.check("tree", want.path().to_str().unwrap());
    m.check(
        "remote_xattr",
        &format!("lib/r.so#1/gfx942.hsaco|user.kpack.archive|oci://{host}/{repo}@{digest}/r.kpack"),
    );
    let s = stats(&m);
    m.stop();
    // Each layer was fetched whole (to check its digest) before any of it was used.
    let whole = std::fs::metadata(&ours).unwrap().len() + std::fs::metadata(&refl).unwrap().len();
    assert!(
        s["remote_bytes_fetched"] >= whole,
        "{s:?}, {whole} bytes of layers"
    );
    let (code, out, err) = run(&["verify", &url], &[]);
    assert_eq!(code, Some(0), "{out}{err}");

    // One flipped byte in the registry's copy of a layer: refused, naming both digests.
    let x = sha256(&std::fs::read(&ours).unwrap());
    reg.damage_blob(&x, 1000);
    let (code, err) = refused_mount(&url, &[], &env());
    assert_eq!(code, Some(4), "{err}");
    assert!(
        err.contains(&format!("{repo}@{digest}/x.kpack"))
            && err.contains(&format!(", not {x}: the registry's copy is damaged")),
        "{err}"
    );
    let (code, _, err) = run(&["list", &url], &[]);
    assert_eq!(code, Some(4), "{err}");
}

#[test]
fn oci_damaged_blobs_of_our_layout_never_serve_other_bytes() {
    if !fuse_available() {
        return;
    }
    let reg = TestRegistry::start();
    let src = tempfile::tempdir().unwrap();
    let path = src.path().join("a.kpack");
    our_archive(&path, 21, 4, 60_000, &["gfx942"]);
    let pushed = push(&path, &format!("oci://{}/kpack/ours", reg.host()));
    let blob = layer_digest(&pushed, "a.kpack");
    let want = tempfile::tempdir().unwrap();
    expected_dir(&[path.as_path()], want.path());
    let url = format!("oci://{}/kpack/ours", reg.host());

    reg.damage_blob(&blob, frame_middle(&path, "lib/o.so#1", "gfx942"));
    let m = mount(&url, &[], &env());
    m.check("remote_eio", "lib/o.so#1/gfx942.hsaco");
    for i in [0, 2, 3] {
        let rel = format!("lib/o.so#{i}/gfx942.hsaco");
        m.check(
            "remote_same",
            &format!("{rel}|{}", want.path().join(&rel).display()),
        );
    }
    // Still EIO when read again: the damaged frame is not kept as if it were good.
    m.check("remote_eio", "lib/o.so#1/gfx942.hsaco");
    m.stop();

    // A TOC that no longer parses, and one that parses but is not the TOC pushed.
    let (offset, len) = toc_span(&path);
    reg.damage_blob(&blob, offset + len / 2);
    let (code, err) = refused_mount(&url, &[], &env());
    assert_eq!(code, Some(4), "{err}");
    assert!(err.contains("/a.kpack: "), "{err}");
    eprintln!("damaged TOC, our layout: {err}");
    reg.damage_blob(&blob, offset + len / 2);
    reg.damage_blob(&blob, toc_key_byte(&path, "lib/o.so#3"));
    let (code, err) = refused_mount(&url, &[], &env());
    assert_eq!(code, Some(4), "{err}");
    assert!(
        err.contains("/a.kpack: the archive's TOC is not the one its layer annotations name")
            && err.contains("the registry's copy is damaged"),
        "{err}"
    );
}

#[test]
fn oci_damaged_blobs_of_the_index_layout_never_serve_other_bytes() {
    if !fuse_available() {
        return;
    }
    let reg = TestRegistry::start();
    let src = tempfile::tempdir().unwrap();
    let path = src.path().join("b.kpack");
    reference_archive(&path, 6, 40_000);
    let pushed = push(&path, &format!("oci://{}/kpack/refs", reg.host()));
    let blob = layer_digest(&pushed, "b.kpack");
    let index = layer_digest(&pushed, "b.kpack.index");
    let want = tempfile::tempdir().unwrap();
    expected_dir(&[path.as_path()], want.path());
    let url = format!("oci://{}/kpack/refs", reg.host());

    reg.damage_blob(&blob, frame_middle(&path, "lib/r.so#2", "gfx942"));
    let m = mount(&url, &[], &env());
    m.check("remote_eio", "lib/r.so#2/gfx942.hsaco");
    for i in [0, 1, 3, 4, 5] {
        let rel = format!("lib/r.so#{i}/gfx942.hsaco");
        m.check(
            "remote_same",
            &format!("{rel}|{}", want.path().join(&rel).display()),
        );
    }
    m.check("remote_eio", "lib/r.so#2/gfx942.hsaco");
    m.stop();

    let (offset, len) = toc_span(&path);
    reg.damage_blob(&blob, offset + len / 2);
    let (code, err) = refused_mount(&url, &[], &env());
    assert_eq!(code, Some(4), "{err}");
    assert!(err.contains("/b.kpack: "), "{err}");
    eprintln!("damaged TOC, index layout: {err}");
    reg.damage_blob(&blob, offset + len / 2);
    let key = toc_key_byte(&path, "lib/r.so#5");
    reg.damage_blob(&blob, key);
    let (code, err) = refused_mount(&url, &[], &env());
    assert_eq!(code, Some(4), "{err}");
    assert!(
        err.contains("/b.kpack: TOC does not match its kernel index"),
        "{err}"
    );
    // Undo it: the index alone is damaged now.
    reg.damage_blob(&blob, key);
    let index_len = std::fs::metadata(reg.blob_file(&index)).unwrap().len();
    reg.damage_blob(&index, index_len / 2);
    let (code, err) = refused_mount(&url, &[], &env());
    assert_eq!(code, Some(4), "{err}");
    assert!(
        err.contains(&format!(
            "/b.kpack: kernel index {index}: the blob's bytes have digest"
        )) && err.ends_with("the registry's copy is damaged\n"),
        "{err}"
    );
    eprintln!("damaged kernel index: {err}");
}

#[test]
fn oci_what_is_not_a_kernel_pack_is_named_for_what_it_is() {
    let reg = TestRegistry::start();
    let host = reg.host();
    let repo = "img/app";
    // A container image, as a builder pushes it.
    let config =
        br#"{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":[]}}"#;
    let layer = b"not really a tar, the registry does not look".to_vec();
    put_blob(&host, repo, config);
    put_blob(&host, repo, &layer);
    let image = json!({
        "schemaVersion": 2,
        "mediaType": MANIFEST,
        "config": descriptor("application/vnd.oci.image.config.v1+json", config, None),
        "layers": [descriptor("application/vnd.oci.image.layer.v1.tar+gzip", &layer, None)],
    });
    let image_digest = put_manifest(&host, repo, "v1", MANIFEST, &image);
    let url = format!("oci://{host}/{repo}:v1");
    let (code, _, err) = run(&["list", &url], &[]);
    assert_eq!(code, Some(4), "{err}");
    assert!(
        err.contains(&format!(
            "{url}: is a container image (config application/vnd.oci.image.config.v1+json), not \
             a kernel pack"
        )),
        "{err}"
    );
    if fuse_available() {
        let (code, err) = refused_mount(&url, &[], &env());
        assert_eq!(code, Some(4), "{err}");
        assert!(err.contains("is a container image"), "{err}");
    }

    // An image index of that image and a kernel pack (both in the repository, as the registry
    // requires).
    let src = tempfile::tempdir().unwrap();
    our_archive(&src.path().join("a.kpack"), 1, 1, 1000, &["gfx942"]);
    let pack = push(src.path(), &format!("oci://{host}/{repo}:pack"));
    let pack_bytes = super::curl(
        &format!("http://{host}/v2/{repo}/manifests/pack"),
        &["-H", &format!("Accept: {MANIFEST}")],
    );
    assert_eq!(sha256(&pack_bytes), pack["digest"].as_str().unwrap());
    let image_bytes = serde_json::to_vec(&image).unwrap();
    assert_eq!(sha256(&image_bytes), image_digest);
    let index = json!({
        "schemaVersion": 2,
        "mediaType": INDEX,
        "manifests": [
            {
                "mediaType": MANIFEST,
                "digest": image_digest,
                "size": image_bytes.len(),
                "platform": {"architecture": "amd64", "os": "linux"},
            },
            {
                "mediaType": MANIFEST,
                "artifactType": PACK,
                "digest": sha256(&pack_bytes),
                "size": pack_bytes.len(),
            },
        ],
    });
    put_manifest(&host, repo, "multi", INDEX, &index);
    let url = format!("oci://{host}/{repo}:multi");
    let (code, _, err) = run(&["list", &url], &[]);
    assert_eq!(code, Some(4), "{err}");
    assert!(
        err.contains(&format!(
            "{url}: is an image index of 2 manifests, not a kernel pack"
        )),
        "{err}"
    );

    // An unknown tag of a known repository, and an unknown repository.
    let (code, _, err) = run(&["list", &format!("oci://{host}/{repo}:nope")], &[]);
    assert_eq!(code, Some(3), "{err}");
    assert!(
        err.contains(&format!("manifest {host}/{repo}:nope"))
            && err.contains("HTTP 404 Not Found: MANIFEST_UNKNOWN"),
        "{err}"
    );
    // docker-registry 2.8.2 answers a manifest GET in a repository it does not know with
    // MANIFEST_UNKNOWN (NAME_UNKNOWN only for the tag list), by tag and by digest alike.
    for target in [":v1".to_owned(), format!("@{image_digest}")] {
        let (code, _, err) = run(&["list", &format!("oci://{host}/no/such{target}")], &[]);
        assert_eq!(code, Some(3), "{err}");
        assert!(
            err.contains(&format!("manifest {host}/no/such{target}: "))
                && err.contains("HTTP 404 Not Found: MANIFEST_UNKNOWN: manifest unknown"),
            "{err}"
        );
    }
    let out = std::process::Command::new("curl")
        .args(["-s", &format!("http://{host}/v2/no/such/tags/list")])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("NAME_UNKNOWN"),
        "the registry's own word for an unknown repository"
    );
}
