//! `s3://` sources served by moto (signatures checked): a prefix mount merges the archives
//! directly under it, a wrong secret exits 3 with the server's reason, an object replaced while
//! mounted fails reads with EIO (never mixed bytes), a stopped server fails reads with EIO after
//! the retries and the mount serves again once it is back, and slow answers hit the timeout.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rocm_kpack::Compression;

use super::servers::{Moto, SlowProxy};
use super::{expected_dir, mount, refused_mount, run, stats};
use crate::mount::{pattern, write_archive};
use crate::support::craft;
use crate::support::mount::fuse_available;

/// Three archives with distinct and overlapping keys, as `dir/{a,b,c}.kpack`.
fn three_archives(dir: &Path) -> Vec<PathBuf> {
    vec![
        write_archive(
            &dir.join("a.kpack"),
            Compression::Zstd { level: 3 },
            &[
                ("lib/liba.so#0", "gfx942", pattern(200_000, 1)),
                ("lib/liba.so#0", "gfx90a", pattern(7_000, 2)),
                ("lib/shared.so#0", "gfx942", pattern(9_000, 3)),
            ],
        ),
        write_archive(
            &dir.join("b.kpack"),
            Compression::None,
            &[
                ("lib/libb.so#0", "gfx942", pattern(90_000, 4)),
                ("lib/shared.so#0", "gfx942", pattern(9_500, 5)),
            ],
        ),
        write_archive(
            &dir.join("c.kpack"),
            Compression::Zstd { level: 3 },
            &[("bin/tool#0", "gfx1100", pattern(33_333, 6))],
        ),
    ]
}

/// An archive larger than the first fetch window, whose kernels each need a request.
fn incompressible(dir: &Path) -> PathBuf {
    write_archive(
        &dir.join("a.kpack"),
        Compression::None,
        &[
            (
                "lib/liba.so#0",
                "gfx942",
                craft::incompressible(21, 300_000),
            ),
            (
                "lib/liba.so#0",
                "gfx90a",
                craft::incompressible(22, 200_000),
            ),
        ],
    )
}

/// [`incompressible`]'s archive served as `s3://kernels/a.kpack`, and the directory (in `work`)
/// of the files a mount of it must show.
fn served_incompressible(work: &Path) -> (Moto, PathBuf) {
    let archive = incompressible(work);
    let want = work.join("want");
    expected_dir(&[archive.as_path()], &want);
    let mut moto = Moto::start("kernels");
    moto.put("a.kpack", &archive);
    (moto, want)
}

#[test]
fn s3_prefix_mount_merges_the_archives_directly_under_it() {
    if !fuse_available() {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let archives = three_archives(work.path());
    let other = write_archive(
        &work.path().join("d.kpack"),
        Compression::None,
        &[("lib/deeper.so#0", "gfx942", pattern(1_000, 7))],
    );
    let mut moto = Moto::start("kernels");
    for a in &archives {
        let name = a.file_name().unwrap().to_str().unwrap();
        moto.put(&format!("rocm/{name}"), a);
    }
    moto.put("rocm/sub/d.kpack", &other); // not directly under the prefix
    moto.put("rocm/README", &other); // not *.kpack
    moto.put("elsewhere.kpack", &other);
    let env = moto.env(moto.port, None);

    let want = tempfile::tempdir().unwrap();
    let refs: Vec<&Path> = archives.iter().map(PathBuf::as_path).collect();
    expected_dir(&refs, want.path());
    let m = mount("s3://kernels/rocm/", &[], &env);
    m.check("tree", want.path().to_str().unwrap());
    m.check(
        "remote_xattr",
        "lib/libb.so#0/gfx942.hsaco|user.kpack.archive|s3://kernels/rocm/b.kpack",
    );
    m.stop();

    // One object, and the commands.
    let one = tempfile::tempdir().unwrap();
    expected_dir(&[archives[2].as_path()], one.path());
    let m = mount("s3://kernels/rocm/c.kpack", &[], &env);
    m.check("tree", one.path().to_str().unwrap());
    m.stop();
    let (code, out, err) = run(&["verify", "s3://kernels/rocm/"], &env);
    assert_eq!(code, Some(0), "{err}");
    let said = out + &err;
    assert!(said.contains("6 kernels in 3 archives"), "{said}");
    let (code, _, err) = run(&["list", "s3://kernels/rocm/"], &env);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("names a prefix"), "{err}");
    let (code, err) = refused_mount("s3://kernels/empty/", &[], &env);
    assert_eq!(code, Some(5), "{err}");
    assert!(err.contains("no *.kpack object"), "{err}");
}

#[test]
fn s3_wrong_or_missing_credentials_exit_3_with_the_reason() {
    let work = tempfile::tempdir().unwrap();
    let archives = three_archives(work.path());
    let mut moto = Moto::start("kernels");
    moto.put("rocm/a.kpack", &archives[0]);
    let wrong = "wRongSecretWRONGsecret0123456789abcdefghi";
    for source in ["s3://kernels/rocm/", "s3://kernels/rocm/a.kpack"] {
        let (code, err) = refused_mount(source, &[], &moto.env(moto.port, Some(wrong)));
        assert_eq!(code, Some(3), "{err}");
        assert!(
            err.contains("HTTP 403 Forbidden: SignatureDoesNotMatch"),
            "{err}"
        );
        assert!(
            !err.contains(wrong) && !err.contains(&moto.secret),
            "no secret shown: {err}"
        );
    }
    let (code, err) = refused_mount(
        "s3://kernels/rocm/missing.kpack",
        &[],
        &moto.env(moto.port, None),
    );
    assert_eq!(code, Some(3), "{err}");
    assert!(err.contains("NoSuchKey"), "{err}");
    let mut env = moto.env(moto.port, None);
    env.retain(|(k, _)| !k.starts_with("AWS_ACCESS_KEY_ID") && !k.starts_with("AWS_SECRET"));
    let (code, err) = refused_mount("s3://kernels/rocm/a.kpack", &[], &env);
    assert_eq!(code, Some(3), "{err}");
    assert!(err.contains("no AWS credentials"), "{err}");
}

#[test]
fn s3_object_replaced_while_mounted_fails_reads_with_eio() {
    if !fuse_available() {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let kernels = |seed: u64| -> Vec<(&'static str, &'static str, Vec<u8>)> {
        vec![
            ("lib/x.so#0", "gfx942", craft::incompressible(seed, 300_000)),
            (
                "lib/x.so#0",
                "gfx90a",
                craft::incompressible(seed + 1, 300_000),
            ),
        ]
    };
    let old = write_archive(
        &work.path().join("old.kpack"),
        Compression::None,
        &kernels(1),
    );
    let new = write_archive(
        &work.path().join("new.kpack"),
        Compression::None,
        &kernels(10),
    );
    let want = work.path().join("want");
    expected_dir(&[old.as_path()], &want);
    let mut moto = Moto::start("kernels");
    moto.put("x.kpack", &old);
    let m = mount("s3://kernels/x.kpack", &[], &moto.env(moto.port, None));
    m.check(
        "remote_same",
        &format!(
            "lib/x.so#0/gfx942.hsaco|{}",
            want.join("lib/x.so#0/gfx942.hsaco").display()
        ),
    );
    moto.put("x.kpack", &new); // same layout, other bytes
    m.check("remote_eio", "lib/x.so#0/gfx90a.hsaco");
    m.check("remote_eio", "lib/x.so#0/gfx90a.hsaco");
    let log = m.daemon_log();
    assert!(log.contains("changed since it was opened"), "{log}");
    assert_eq!(
        log.matches("reads fail with EIO from now on").count(),
        1,
        "one log line for the change:\n{log}"
    );
    m.stop();
}

#[test]
fn s3_stopped_server_fails_reads_after_retries_and_the_mount_recovers() {
    if !fuse_available() {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let (moto, want) = served_incompressible(work.path());
    let m = mount(
        "s3://kernels/a.kpack",
        &["-o", "remote_timeout=1,remote_retries=2"],
        &moto.env(moto.port, None),
    );
    moto.signal(libc::SIGSTOP);
    let started = Instant::now();
    m.check("remote_eio", "lib/liba.so#0/gfx942.hsaco");
    let took = started.elapsed();
    // Three attempts of 1 s each, 0.2 + 0.4 s of backoff, after the smaller pieces' timeouts.
    assert!(took >= Duration::from_millis(3000), "{took:?}");
    assert!(took < Duration::from_secs(20), "{took:?}");
    moto.signal(libc::SIGCONT);
    m.check(
        "remote_same",
        &format!(
            "lib/liba.so#0/gfx942.hsaco|{}",
            want.join("lib/liba.so#0/gfx942.hsaco").display()
        ),
    );
    let s = stats(&m);
    // Each failed request was retried twice (the kernel may have asked for the file twice),
    // after being asked for in smaller pieces first (a timed-out request larger than 64 KiB).
    assert!(s["remote_failures"] >= 1, "{s:?}");
    assert!(s["remote_retries"] >= 2 * s["remote_failures"], "{s:?}");
    let log = m.daemon_log();
    assert!(log.contains("timed out"), "{log}");
    assert!(log.contains("retry 2 of 2"), "{log}");
    m.stop();
}

#[test]
fn s3_slow_answers_hit_the_request_timeout() {
    if !fuse_available() {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let (moto, want) = served_incompressible(work.path());
    let proxy = SlowProxy::start(moto.port);
    let m = mount(
        "s3://kernels/a.kpack",
        &["--remote-timeout", "1", "--remote-retries", "1"],
        &moto.env(proxy.port, None),
    );
    proxy.set_delay(Duration::from_millis(2500));
    let started = Instant::now();
    m.check("remote_eio", "lib/liba.so#0/gfx942.hsaco");
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(10),
        "timeouts honoured: {took:?}"
    );
    let log = m.daemon_log();
    assert!(log.contains("timed out"), "{log}");
    proxy.set_delay(Duration::ZERO);
    m.check(
        "remote_same",
        &format!(
            "lib/liba.so#0/gfx942.hsaco|{}",
            want.join("lib/liba.so#0/gfx942.hsaco").display()
        ),
    );
    m.stop();
}

#[test]
fn s3_5xx_and_429_answers_are_retried_with_backoff() {
    if !fuse_available() {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let (moto, want) = served_incompressible(work.path());
    let proxy = SlowProxy::start(moto.port);
    let m = mount(
        "s3://kernels/a.kpack",
        &["-o", "remote_retries=3"],
        &moto.env(proxy.port, None),
    );
    let before = stats(&m);
    let file = "lib/liba.so#0/gfx942.hsaco";
    let expected = format!("{file}|{}", want.join(file).display());
    proxy.fail_next(2, 503);
    m.check("remote_same", &expected);
    let mid = stats(&m);
    assert_eq!(
        mid["remote_retries"] - before["remote_retries"],
        2,
        "{mid:?}"
    );
    proxy.fail_next(1, 429);
    let other = "lib/liba.so#0/gfx90a.hsaco";
    m.check(
        "remote_same",
        &format!("{other}|{}", want.join(other).display()),
    );
    let s = stats(&m);
    assert_eq!(s["remote_retries"] - mid["remote_retries"], 1, "{s:?}");
    assert_eq!(s["remote_failures"], 0, "{s:?}");
    let log = m.daemon_log();
    assert!(
        log.contains("HTTP 503 Service Unavailable; retry 1 of 3 in 200 ms"),
        "{log}"
    );
    assert!(
        log.contains("HTTP 503 Service Unavailable; retry 2 of 3 in 400 ms"),
        "{log}"
    );
    assert!(
        log.contains("HTTP 429 Too Many Requests; retry 1 of 3"),
        "{log}"
    );
    // A 4xx other than 429 is not retried.
    proxy.fail_next(1, 400);
    let (code, _, err) = run(
        &["list", "--remote-retries", "3", "s3://kernels/a.kpack"],
        &moto.env(proxy.port, None),
    );
    assert_eq!(code, Some(3), "{err}");
    assert!(
        err.contains("HTTP 400 Bad Request") && !err.contains("retries"),
        "{err}"
    );
    m.stop();
}

#[test]
fn s3_credentials_from_the_shared_files_and_endpoint_from_the_flag() {
    let work = tempfile::tempdir().unwrap();
    let archive = incompressible(work.path());
    let mut moto = Moto::start("kernels");
    moto.put("a.kpack", &archive);
    let creds = work.path().join("credentials");
    std::fs::write(
        &creds,
        format!(
            "[default]\naws_access_key_id = AKIAWRONGWRONGWRONG\naws_secret_access_key = x\n\n\
             [ci]\naws_access_key_id = {}\naws_secret_access_key = {}\n",
            moto.key_id, moto.secret
        ),
    )
    .unwrap();
    let endpoint = format!("http://127.0.0.1:{}", moto.port);
    let mut env: Vec<(String, String)> = moto
        .env(moto.port, None)
        .into_iter()
        .filter(|(k, _)| !k.starts_with("AWS_ACCESS") && !k.starts_with("AWS_SECRET"))
        .filter(|(k, _)| k != "AWS_ENDPOINT_URL" && k != "AWS_SHARED_CREDENTIALS_FILE")
        .collect();
    env.push((
        "AWS_SHARED_CREDENTIALS_FILE".into(),
        creds.display().to_string(),
    ));
    env.push(("AWS_PROFILE".into(), "ci".into()));
    let (code, out, err) = run(
        &["list", "--endpoint-url", &endpoint, "s3://kernels/a.kpack"],
        &env,
    );
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains("lib/liba.so#0") && out.contains("gfx90a"),
        "{out}"
    );
    // The default profile's key is refused by the server.
    env.retain(|(k, _)| k != "AWS_PROFILE");
    let (code, _, err) = run(
        &["list", "--endpoint-url", &endpoint, "s3://kernels/a.kpack"],
        &env,
    );
    assert_eq!(code, Some(3), "{err}");
    assert!(err.contains("InvalidAccessKeyId"), "{err}");
    // A plain-http endpoint needs AWS_ALLOW_HTTP=true.
    env.retain(|(k, _)| k != "AWS_ALLOW_HTTP");
    env.push(("AWS_PROFILE".into(), "ci".into()));
    let (code, _, err) = run(
        &["list", "--endpoint-url", &endpoint, "s3://kernels/a.kpack"],
        &env,
    );
    assert_eq!(code, Some(3), "{err}");
    assert!(err.contains("AWS_ALLOW_HTTP=true"), "{err}");
}

#[test]
fn s3_requests_in_flight_are_bounded() {
    if !fuse_available() {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let kernels: Vec<(String, Vec<u8>)> = (0..8)
        .map(|i| {
            (
                format!("lib/p{i}.so#0"),
                craft::incompressible(50 + i, 150_000),
            )
        })
        .collect();
    let list: Vec<(&str, &str, Vec<u8>)> = kernels
        .iter()
        .map(|(k, b)| (k.as_str(), "gfx942", b.clone()))
        .collect();
    let archive = write_archive(&work.path().join("p.kpack"), Compression::None, &list);
    let want = work.path().join("want");
    expected_dir(&[archive.as_path()], &want);
    let mut moto = Moto::start("kernels");
    moto.put("p.kpack", &archive);
    // Slow answers make concurrent readers' requests overlap as much as the bound lets them;
    // the default bound (8) shows that they do overlap here, so the bound of 1 is what holds.
    for (bound, most) in [("1", 1), ("8", 2)] {
        let proxy = SlowProxy::start(moto.port);
        let m = mount(
            "s3://kernels/p.kpack",
            &["--remote-requests", bound, "--threads", "8"],
            &moto.env(proxy.port, None),
        );
        proxy.set_delay(Duration::from_millis(300));
        m.check("remote_parallel", &format!("8|{}", want.display()));
        m.stop();
        if bound == "1" {
            assert_eq!(proxy.max_in_flight(), most, "--remote-requests 1");
        } else {
            assert!(
                proxy.max_in_flight() >= most,
                "readers overlap: {}",
                proxy.max_in_flight()
            );
        }
    }
}
