//! `kpack-fuse push` to a real registry.

use std::path::Path;
use std::time::Instant;

use base64::Engine;
use rocm_kpack::{Archive, KernelIndex};
use serde_json::Value;

use super::servers::TestRegistry;
use super::token_proxy::TokenProxy;
use super::{curl, our_archive, run};

const MANIFEST_ACCEPT: &str = "Accept: application/vnd.oci.image.manifest.v1+json";

fn sha256(data: &[u8]) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, data);
    let hex: String = d.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Three archives: `a` and `c` in our layout, `b` in the reference layout (needs an index).
fn sources(dir: &Path) {
    our_archive(&dir.join("a.kpack"), 1, 3, 3000, &["gfx942", "gfx90a"]);
    crate::remote::reference_archive(&dir.join("b.kpack"), 4, 2500);
    our_archive(&dir.join("c.kpack"), 9, 2, 2000, &["gfx1100"]);
    std::fs::write(dir.join("notes.txt"), "not an archive, not pushed").unwrap();
}

fn json(stdout: &str) -> Value {
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn a_directory_becomes_the_exact_artifact_and_pushing_again_sends_nothing() {
    let reg = TestRegistry::start();
    let src = tempfile::tempdir().unwrap();
    sources(src.path());
    let dest = format!("oci://{}/kpack/set:v1", reg.host());
    let (code, out, err) = run(
        &["push", src.path().to_str().unwrap(), &dest, "--json"],
        &[],
    );
    assert_eq!(code, Some(0), "{err}");
    let first = json(&out);

    let base = format!("http://{}/v2/kpack/set", reg.host());
    let manifest = curl(&format!("{base}/manifests/v1"), &["-H", MANIFEST_ACCEPT]);
    let digest = sha256(&manifest);
    assert_eq!(first["digest"], digest.as_str());
    assert_eq!(first["reference"], dest.as_str());
    assert_eq!(
        first["pinned"],
        format!("{}/kpack/set@{digest}", reg.host()).as_str()
    );
    let m: Value = serde_json::from_slice(&manifest).unwrap();
    assert_eq!(m["schemaVersion"], 2);
    assert_eq!(m["mediaType"], "application/vnd.oci.image.manifest.v1+json");
    assert_eq!(m["artifactType"], "application/vnd.kpack-fuse.pack.v1");
    assert_eq!(
        m["config"],
        serde_json::json!({
            "mediaType": "application/vnd.oci.empty.v1+json",
            "digest": "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a",
            "size": 2
        })
    );
    assert_eq!(
        curl(
            &format!("{base}/blobs/{}", m["config"]["digest"].as_str().unwrap()),
            &[]
        ),
        b"{}"
    );
    let layers = m["layers"].as_array().unwrap();
    let titles: Vec<&str> = layers
        .iter()
        .map(|l| {
            l["annotations"]["org.opencontainers.image.title"]
                .as_str()
                .unwrap()
        })
        .collect();
    assert_eq!(titles, ["a.kpack", "b.kpack", "b.kpack.index", "c.kpack"]);
    for (layer, name) in [
        (&layers[0], "a.kpack"),
        (&layers[1], "b.kpack"),
        (&layers[3], "c.kpack"),
    ] {
        let path = src.path().join(name);
        let bytes = std::fs::read(&path).unwrap();
        let a = Archive::open(&path).unwrap();
        let toc_offset = u64::from_le_bytes(bytes[8..16].try_into().unwrap());
        assert_eq!(layer["mediaType"], "application/vnd.kpack-fuse.archive.v1");
        assert_eq!(layer["digest"], sha256(&bytes).as_str());
        assert_eq!(layer["size"], bytes.len() as u64);
        let ann = &layer["annotations"];
        assert_eq!(
            ann["dev.kpack-fuse.arches"],
            a.architectures().join(",").as_str()
        );
        assert_eq!(
            ann["dev.kpack-fuse.toc.offset"],
            toc_offset.to_string().as_str()
        );
        assert_eq!(
            ann["dev.kpack-fuse.toc.length"],
            (bytes.len() as u64 - toc_offset).to_string().as_str()
        );
        assert_eq!(
            ann["dev.kpack-fuse.toc.blake3"],
            hex(&a.toc_digest()).as_str()
        );
        let blob = curl(
            &format!("{base}/blobs/{}", layer["digest"].as_str().unwrap()),
            &[],
        );
        assert!(blob == bytes, "{name}: the blob differs from the file");
    }
    assert_eq!(
        layers[0]["annotations"]["dev.kpack-fuse.arches"],
        "gfx942,gfx90a"
    );
    assert_eq!(layers[0]["annotations"]["dev.kpack-fuse.frames"], "toc");
    assert_eq!(layers[3]["annotations"]["dev.kpack-fuse.frames"], "toc");
    assert!(
        layers[0]["annotations"]
            .get("dev.kpack-fuse.kernel-index")
            .is_none()
    );
    // The reference-layout archive has its kernel index right after it.
    let index = &layers[2];
    assert_eq!(layers[1]["annotations"]["dev.kpack-fuse.frames"], "index");
    assert_eq!(
        layers[1]["annotations"]["dev.kpack-fuse.kernel-index"],
        index["digest"]
    );
    assert_eq!(
        index["mediaType"],
        "application/vnd.kpack-fuse.kernel-index.v1"
    );
    assert_eq!(index["annotations"]["dev.kpack-fuse.index-of"], "b.kpack");
    let want = KernelIndex::build(&Archive::open(src.path().join("b.kpack")).unwrap())
        .unwrap()
        .encode();
    assert_eq!(index["digest"], sha256(&want).as_str());
    assert!(
        curl(
            &format!("{base}/blobs/{}", index["digest"].as_str().unwrap()),
            &[]
        ) == want
    );

    let mut all = vec![m["config"]["digest"].as_str().unwrap().to_owned()];
    all.extend(
        layers
            .iter()
            .map(|l| l["digest"].as_str().unwrap().to_owned()),
    );
    assert_eq!(strings(&first["uploaded"]), all);
    assert!(strings(&first["present"]).is_empty());
    assert_eq!(first["layers"].as_array().unwrap().len(), 4);
    assert_eq!(first["layers"][1]["title"], "b.kpack");
    assert_eq!(
        first["layers"][2]["mediaType"],
        "application/vnd.kpack-fuse.kernel-index.v1"
    );

    // Again, as files and without a tag (latest): the same digest, and nothing uploaded.
    let posts = reg.requests("POST", "/blobs/uploads/");
    let files: Vec<String> = ["a", "b", "c"]
        .iter()
        .map(|n| {
            src.path()
                .join(format!("{n}.kpack"))
                .to_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    let bare = format!("oci://{}/kpack/set", reg.host());
    let mut args = vec!["push"];
    args.extend(files.iter().map(String::as_str));
    args.extend([bare.as_str(), "--json"]);
    let (code, out, err) = run(&args, &[]);
    assert_eq!(code, Some(0), "{err}");
    let again = json(&out);
    assert_eq!(again["digest"], digest.as_str());
    assert_eq!(again["reference"], format!("{bare}:latest").as_str());
    assert!(strings(&again["uploaded"]).is_empty());
    assert_eq!(strings(&again["present"]), all);
    assert_eq!(reg.requests("POST", "/blobs/uploads/"), posts);
    assert!(
        curl(
            &format!("{base}/manifests/latest"),
            &["-H", MANIFEST_ACCEPT]
        ) == manifest
    );

    // The plain output: the digest, then REGISTRY/REPOSITORY@DIGEST.
    let (code, out, err) = run(&["push", src.path().to_str().unwrap(), &dest], &[]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(
        out,
        format!("{digest}\n{}/kpack/set@{digest}\n", reg.host())
    );

    // Another client reads our manifest as we wrote it.
    let sk = std::process::Command::new("skopeo")
        .args(["inspect", "--raw", "--tls-verify=false"])
        .arg(format!("docker://{}/kpack/set:v1", reg.host()))
        .output()
        .unwrap_or_else(|e| panic!("cannot run skopeo ({e}): scripts/setup-deps.sh installs it"));
    assert!(
        sk.status.success(),
        "{}",
        String::from_utf8_lossy(&sk.stderr)
    );
    assert!(sk.stdout == manifest, "skopeo sees other bytes");
}

#[test]
fn large_archives_go_up_in_chunks() {
    let reg = TestRegistry::start();
    let src = tempfile::tempdir().unwrap();
    let path = src.path().join("big.kpack");
    our_archive(&path, 3, 4, 60_000, &["gfx942"]);
    let size = std::fs::metadata(&path).unwrap().len();
    let dest = format!("oci://{}/big:t", reg.host());
    let (code, _, err) = run(
        &["push", path.to_str().unwrap(), &dest],
        &[("KPACK_FUSE_OCI_CHUNK", "65536")],
    );
    assert_eq!(code, Some(0), "{err}");
    let patches = reg.requests("PATCH", "/v2/big/blobs/uploads/");
    assert_eq!(patches as u64, size.div_ceil(65536), "{}", reg.log());
    let bytes = std::fs::read(&path).unwrap();
    let blob = curl(
        &format!("http://{}/v2/big/blobs/{}", reg.host(), sha256(&bytes)),
        &[],
    );
    assert!(blob == bytes);
    let (code, _, err) = run(
        &["push", path.to_str().unwrap(), &dest],
        &[("KPACK_FUSE_OCI_CHUNK", "0")],
    );
    assert_eq!(code, Some(2));
    assert!(
        err.contains("KPACK_FUSE_OCI_CHUNK=\"0\" is not a positive number"),
        "{err}"
    );
}

fn auth_file(dir: &Path, host: &str, user: &str, password: &str) -> String {
    let f = dir.join("auth.json");
    let auth = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    std::fs::write(
        &f,
        format!(r#"{{"auths":{{"{host}":{{"auth":"{auth}"}}}}}}"#),
    )
    .unwrap();
    f.to_str().unwrap().to_owned()
}

#[test]
fn basic_authentication_reads_the_auth_file() {
    let reg = TestRegistry::start_with(Some(("kp", "s3cret-pw")));
    let src = tempfile::tempdir().unwrap();
    let path = src.path().join("a.kpack");
    our_archive(&path, 5, 1, 1000, &["gfx942"]);
    let dest = format!("oci://{}/auth/x:1", reg.host());
    let good = auth_file(src.path(), &reg.host(), "kp", "s3cret-pw");
    let (code, out, err) = run(
        &["push", path.to_str().unwrap(), &dest],
        &[("REGISTRY_AUTH_FILE", good.as_str())],
    );
    assert_eq!(code, Some(0), "{err}");
    assert!(out.starts_with("sha256:"), "{out}");

    // No credentials, then a wrong password: exit 3, one line naming UNAUTHORIZED and 401.
    let (code, _, err) = run(&["push", path.to_str().unwrap(), &dest], &[]);
    assert_eq!(code, Some(3), "{err}");
    assert!(err.contains("UNAUTHORIZED") && err.contains("401"), "{err}");
    let bad_dir = tempfile::tempdir().unwrap();
    let bad = auth_file(bad_dir.path(), &reg.host(), "kp", "wrong-pw");
    let (code, _, err) = run(
        &["push", path.to_str().unwrap(), &dest],
        &[("REGISTRY_AUTH_FILE", bad.as_str())],
    );
    assert_eq!(code, Some(3), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.starts_with("kpack-fuse: "), "{err}");
    assert!(
        err.contains("UNAUTHORIZED") && err.contains("HTTP 401"),
        "{err}"
    );
    assert!(err.contains(&format!("{}/auth/x", reg.host())), "{err}");
    assert!(!err.contains("wrong-pw"), "{err}");
}

/// A `credHelpers` entry runs `docker-credential-NAME get` from PATH with the registry on
/// standard input, and its `Username`/`Secret` answer logs in; a helper that answers a wrong
/// secret fails as a wrong password does, without showing it.
#[test]
fn credential_helpers_answer_for_their_registry() {
    use std::os::unix::fs::PermissionsExt;
    let reg = TestRegistry::start_with(Some(("kp", "helper-pw")));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.kpack");
    our_archive(&path, 9, 1, 1000, &["gfx942"]);
    let dest = format!("oci://{}/helped/x:1", reg.host());
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    let asked = dir.path().join("asked");
    let helper = |name: &str, secret: &str| {
        let script = bin.join(format!("docker-credential-{name}"));
        std::fs::write(
            &script,
            format!(
                "#!/bin/sh
[ \"$1\" = get ] || exit 1
cat > '{}'
\
                 printf '{{\"ServerURL\":\"x\",\"Username\":\"kp\",\"Secret\":\"{secret}\"}}'
",
                asked.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    };
    helper("kpgood", "helper-pw");
    helper("kpbad", "not-the-pw");
    let path_var = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    for (name, want) in [("kpgood", Some(0)), ("kpbad", Some(3))] {
        let auth = dir.path().join(format!("{name}.json"));
        std::fs::write(
            &auth,
            format!(r#"{{"credHelpers":{{"{}":"{name}"}}}}"#, reg.host()),
        )
        .unwrap();
        let (code, out, err) = run(
            &["push", path.to_str().unwrap(), &dest],
            &[
                ("REGISTRY_AUTH_FILE", auth.to_str().unwrap()),
                ("PATH", path_var.as_str()),
            ],
        );
        assert_eq!(code, want, "{name}: {out}{err}");
        assert_eq!(
            std::fs::read_to_string(&asked).unwrap().trim(),
            reg.host(),
            "{name}: the helper is asked for the registry"
        );
        if want == Some(3) {
            assert!(err.contains("UNAUTHORIZED"), "{err}");
            assert!(!err.contains("not-the-pw"), "{err}");
        }
    }
}

#[test]
fn bearer_tokens_expire_and_429_is_honoured() {
    let reg = TestRegistry::start();
    let src = tempfile::tempdir().unwrap();
    let path = src.path().join("a.kpack");
    our_archive(&path, 7, 3, 40_000, &["gfx942"]);
    let chunk = [("KPACK_FUSE_OCI_CHUNK", "16384")];

    // Tokens said to live 1 s; one 429 with Retry-After: 1 makes the client wait past it, so
    // it fetches a new token before it is refused.
    let proxy = TokenProxy::start(reg.port, "tok-user", "tok-pw", 1, u64::MAX);
    let dir = tempfile::tempdir().unwrap();
    let auth = auth_file(dir.path(), &proxy.host(), "tok-user", "tok-pw");
    let mut env = vec![("REGISTRY_AUTH_FILE", auth.as_str())];
    env.extend(chunk);
    proxy.throttle(1);
    let started = Instant::now();
    let dest = format!("oci://{}/tok/x:1", proxy.host());
    let (code, _, err) = run(&["push", path.to_str().unwrap(), &dest], &env);
    assert_eq!(code, Some(0), "{err}");
    assert!(started.elapsed().as_millis() >= 1000);
    assert_eq!(proxy.throttled(), 1);
    assert!(proxy.issued() >= 2, "issued {}", proxy.issued());
    assert_eq!(proxy.refused_tokens(), 0);

    // Tokens the server stops accepting after 3 requests, though said to live 60 s: each 401
    // gets a new token and the request again.
    let proxy = TokenProxy::start(reg.port, "tok-user", "tok-pw", 60, 3);
    let auth = auth_file(dir.path(), &proxy.host(), "tok-user", "tok-pw");
    let mut env = vec![("REGISTRY_AUTH_FILE", auth.as_str())];
    env.extend(chunk);
    let dest = format!("oci://{}/tok/y:1", proxy.host());
    let (code, _, err) = run(&["push", path.to_str().unwrap(), &dest], &env);
    assert_eq!(code, Some(0), "{err}");
    assert!(proxy.refused_tokens() >= 1);
    assert!(proxy.issued() >= 3, "issued {}", proxy.issued());

    // Credentials the token service refuses.
    let bad = auth_file(dir.path(), &proxy.host(), "tok-user", "nope");
    let (code, _, err) = run(
        &["push", path.to_str().unwrap(), &dest],
        &[("REGISTRY_AUTH_FILE", bad.as_str())],
    );
    assert_eq!(code, Some(3), "{err}");
    assert!(
        err.contains("token service http://127.0.0.1") && err.contains("401"),
        "{err}"
    );
    assert!(proxy.bad_credentials() >= 1);
}

#[test]
fn bad_arguments_and_unreachable_registries_are_refused_clearly() {
    let src = tempfile::tempdir().unwrap();
    let a = src.path().join("a.kpack");
    our_archive(&a, 1, 1, 100, &["gfx942"]);
    let a = a.to_str().unwrap();
    let hexd = "0".repeat(64);
    let digest_ref = format!("oci://127.0.0.1:1/r@sha256:{hexd}");
    for (dest, code, why) in [
        ("docker://127.0.0.1:1/r", 2, "must start with oci://"),
        (
            "oci://127.0.0.1:1/Upper",
            2,
            "repository component \"Upper\"",
        ),
        ("oci://127.0.0.1:1/r:bad/tag", 2, "repository component"),
        (digest_ref.as_str(), 2, "push needs a tag"),
    ] {
        let (c, _, err) = run(&["push", a, dest], &[]);
        assert_eq!(c, Some(code), "{dest}: {err}");
        assert!(err.contains(why), "{dest}: {err}");
    }
    // Two sources with the same file name; a directory without archives; not an archive;
    // a missing file.
    let other = tempfile::tempdir().unwrap();
    std::fs::copy(a, other.path().join("a.kpack")).unwrap();
    let dup = other.path().join("a.kpack");
    let (c, _, err) = run(
        &["push", a, dup.to_str().unwrap(), "oci://127.0.0.1:1/r"],
        &[],
    );
    assert_eq!(c, Some(2), "{err}");
    assert!(err.contains("same file name \"a.kpack\""), "{err}");
    let empty = tempfile::tempdir().unwrap();
    let (c, _, err) = run(
        &[
            "push",
            empty.path().to_str().unwrap(),
            "oci://127.0.0.1:1/r",
        ],
        &[],
    );
    assert_eq!(c, Some(5), "{err}");
    assert!(err.contains("no *.kpack file directly inside"), "{err}");
    let junk = src.path().join("junk.kpack");
    std::fs::write(&junk, b"not a kpack at all, just bytes").unwrap();
    let (c, _, err) = run(
        &["push", junk.to_str().unwrap(), "oci://127.0.0.1:1/r"],
        &[],
    );
    assert_eq!(c, Some(4), "{err}");
    assert!(err.contains("junk.kpack"), "{err}");
    let (c, _, err) = run(
        &["push", "/nonexistent/x.kpack", "oci://127.0.0.1:1/r"],
        &[],
    );
    assert_eq!(c, Some(3), "{err}");

    // Nothing listens on a loopback port: exit 3 after trying HTTPS, then plain HTTP.
    let port = super::servers::free_port();
    let dest = format!("oci://127.0.0.1:{port}/r");
    let (c, _, err) = run(&["push", a, &dest, "--remote-retries", "0"], &[]);
    assert_eq!(c, Some(3), "{err}");
    assert!(
        err.contains(&format!("http://127.0.0.1:{port}/v2/")),
        "{err}"
    );

    // A registry that is not loopback is only ever asked over HTTPS (192.0.2.0/24 is
    // TEST-NET-1: nothing answers there), and the message says how to allow plain HTTP.
    let (c, _, err) = run(
        &[
            "push",
            a,
            "oci://192.0.2.1:9/r",
            "--remote-retries",
            "0",
            "--remote-connect-timeout",
            "1",
        ],
        &[],
    );
    assert_eq!(c, Some(3), "{err}");
    assert!(err.contains("https://192.0.2.1:9/v2/"), "{err}");
    assert!(err.contains("--tls-verify=false"), "{err}");
    assert!(!err.contains("http://192.0.2.1"), "{err}");
}
