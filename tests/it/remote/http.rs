//! `http://` sources served by nginx: a mount reads every file byte-identical, reading one
//! kernel of a 200 MB archive fetches under 2% of it (counted from nginx's access log),
//! refusals exit 3 with the server's reason, and list/verify/extract take the URL.

use std::path::Path;

use rocm_kpack::Compression;

use super::servers::{Nginx, tls_files};
use super::{expected_dir, mount, reference_archive, refused_mount, run, stats};
use crate::mount::{pattern, rich_archive, write_archive};
use crate::support::craft::incompressible;
use crate::support::mount::fuse_available;

#[test]
fn http_mount_serves_every_file_byte_identical() {
    if !fuse_available() {
        return;
    }
    let www = tempfile::tempdir().unwrap();
    let zstd = rich_archive(
        &www.path().join("rich.kpack"),
        Compression::Zstd { level: 3 },
    );
    let plain = rich_archive(&www.path().join("plain.kpack"), Compression::None);
    let nginx = Nginx::start(www.path());
    for archive in [&zstd, &plain] {
        let name = archive.file_name().unwrap().to_str().unwrap();
        let want = tempfile::tempdir().unwrap();
        expected_dir(&[archive.as_path()], want.path());
        let url = nginx.url(name);
        let m = mount(&url, &[], &[]);
        m.check("tree", want.path().to_str().unwrap());
        m.check(
            "remote_xattr",
            &format!("lib/librich.so#0/gfx900.hsaco|user.kpack.archive|{url}"),
        );
        // Times come from the server's Last-Modified (whole seconds), not the epoch.
        let mtime = {
            use std::os::unix::fs::MetadataExt;
            std::fs::metadata(archive).unwrap().mtime()
        };
        m.check(
            "remote_mtime",
            &format!("lib/librich.so#0/gfx900.hsaco|{mtime}"),
        );
        let s = stats(&m);
        assert!(s["remote_requests"] >= 1, "{s:?}");
        assert!(s["remote_bytes_fetched"] > 0, "{s:?}");
        assert_eq!(s["remote_failures"], 0, "{s:?}");
        m.stop();
    }
    assert!(
        nginx.access_log().lines().all(|l| l.contains(" 206 ")),
        "every request was a range request:\n{}",
        nginx.access_log()
    );
}

#[test]
fn http_one_kernel_of_a_200mb_archive_fetches_under_2_percent() {
    if !fuse_available() {
        return;
    }
    let kernels: Vec<(String, Vec<u8>)> = (0..200)
        .map(|i| (format!("lib/libbig.so#{i}"), incompressible(i, 1 << 20)))
        .collect();
    let list: Vec<(&str, &str, Vec<u8>)> = kernels
        .iter()
        .map(|(k, b)| (k.as_str(), "gfx942", b.clone()))
        .collect();
    // Stored blobs (located by the TOC) and zstd frames located by their TOC frame positions.
    for compression in [Compression::None, Compression::Zstd { level: 1 }] {
        let www = tempfile::tempdir().unwrap();
        let archive = write_archive(&www.path().join("big.kpack"), compression, &list);
        let len = std::fs::metadata(&archive).unwrap().len();
        assert!(len >= 200 << 20, "{len}");
        let nginx = Nginx::start(www.path());
        let m = mount(&nginx.url("big.kpack"), &[], &[]);
        let at_mount = stats(&m);
        let one = www.path().join("one");
        std::fs::write(&one, &kernels[137].1).unwrap();
        m.check(
            "remote_same",
            &format!("lib/libbig.so#137/gfx942.hsaco|{}", one.display()),
        );
        let sent = nginx.bytes_sent();
        let s = stats(&m);
        m.stop();
        assert!(
            sent * 50 < len,
            "{compression:?}: fetched {sent} of {len} bytes (>= 2%):\n{}",
            nginx.access_log()
        );
        assert_eq!(
            s["remote_bytes_fetched"], sent,
            "the stats count what nginx sent"
        );
        assert_eq!(
            s["remote_requests"] - at_mount["remote_requests"],
            1,
            "{compression:?}: one request for the kernel:\n{}",
            nginx.access_log()
        );
        eprintln!(
            "{compression:?}: one 1 MiB kernel of a {len}-byte archive: {sent} bytes fetched \
             ({:.2}%) in {} requests ({} at mount)",
            sent as f64 * 100.0 / len as f64,
            s["remote_requests"],
            at_mount["remote_requests"]
        );
    }
}

#[test]
fn http_refusals_exit_3_with_the_reason() {
    let www = tempfile::tempdir().unwrap();
    let nginx = Nginx::start(www.path());
    let (code, err) = refused_mount(&nginx.url("missing.kpack"), &[], &[]);
    assert_eq!(code, Some(3), "{err}");
    assert!(err.contains("missing.kpack: HTTP 404 Not Found"), "{err}");
    // Nothing listens on the port of a server that was stopped.
    let port = nginx.port;
    drop(nginx);
    let url = format!("http://127.0.0.1:{port}/a.kpack");
    let (code, err) = refused_mount(&url, &["-o", "remote_retries=1"], &[]);
    assert_eq!(code, Some(3), "{err}");
    assert!(err.contains("cannot connect"), "{err}");
    assert!(err.contains("after 1 retries"), "{err}");
    let (code, err) = refused_mount(&format!("http://127.0.0.1:{port}/dir/"), &[], &[]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("names one archive"), "{err}");
}

#[test]
fn http_list_verify_and_extract_take_the_url() {
    let www = tempfile::tempdir().unwrap();
    let archive = write_archive(
        &www.path().join("x.kpack"),
        Compression::Zstd { level: 3 },
        &[
            ("lib/a.so#0", "gfx942", pattern(300_000, 1)),
            ("lib/a.so#0", "gfx90a", pattern(5_000, 2)),
            ("bin/b#0", "gfx942", pattern(123_457, 3)),
        ],
    );
    let nginx = Nginx::start(www.path());
    let url = nginx.url("x.kpack");
    let (code, out, err) = run(&["list", &url], &[]);
    assert_eq!(code, Some(0), "{err}");
    let (_, local, _) = run(&["list", archive.to_str().unwrap()], &[]);
    assert_eq!(out, local, "list of the URL and of the file agree");
    let (code, out, err) = run(&["verify", &url], &[]);
    assert_eq!(code, Some(0), "{err}");
    assert!((out + &err).contains("3 kernels"), "verify's summary");
    let dest = tempfile::tempdir().unwrap();
    let (code, _, err) = run(&["extract", &url, dest.path().to_str().unwrap()], &[]);
    assert_eq!(code, Some(0), "{err}");
    let local_dest = tempfile::tempdir().unwrap();
    let (code, _, err) = run(
        &[
            "extract",
            archive.to_str().unwrap(),
            local_dest.path().to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(code, Some(0), "{err}");
    for rel in [
        "lib/a.so#0/gfx942.hsaco",
        "lib/a.so#0/gfx90a.hsaco",
        "bin/b#0/gfx942.hsaco",
    ] {
        let (a, b) = (dest.path().join(rel), local_dest.path().join(rel));
        assert!(
            Path::new(&a).exists() && std::fs::read(&a).unwrap() == std::fs::read(&b).unwrap(),
            "{rel}"
        );
    }
    let (code, _, err) = run(&["list", &nginx.url("nope.kpack")], &[]);
    assert_eq!(code, Some(3), "{err}");
}

#[test]
fn http_background_mount_opens_the_source_in_the_daemon() {
    if !fuse_available() {
        return;
    }
    let www = tempfile::tempdir().unwrap();
    let archive = write_archive(
        &www.path().join("bg.kpack"),
        Compression::None,
        &[("lib/bg.so#0", "gfx942", incompressible(5, 200_000))],
    );
    let want = tempfile::tempdir().unwrap();
    expected_dir(&[archive.as_path()], want.path());
    let nginx = Nginx::start(www.path());
    // The command forks before it opens the source (`daemonize` refuses to fork a process with
    // other threads); the daemon's requests fetch the tree it serves.
    let m = crate::support::mount::Mount::start_background(Path::new(&nginx.url("bg.kpack")), &[]);
    m.check("tree", want.path().to_str().unwrap());
    m.stop();
}

#[test]
fn http_remount_with_a_cache_dir_fetches_no_kernel_again() {
    if !fuse_available() {
        return;
    }
    let www = tempfile::tempdir().unwrap();
    let archive = write_archive(
        &www.path().join("c.kpack"),
        Compression::Zstd { level: 3 },
        &[
            ("lib/c.so#0", "gfx942", incompressible(31, 300_000)),
            ("lib/c.so#0", "gfx90a", incompressible(32, 200_000)),
            ("lib/d.so#0", "gfx942", incompressible(33, 100_000)),
        ],
    );
    let want = tempfile::tempdir().unwrap();
    expected_dir(&[archive.as_path()], want.path());
    let cache = tempfile::tempdir().unwrap();
    let cache_arg = cache.path().to_str().unwrap();
    let nginx = Nginx::start(www.path());
    let url = nginx.url("c.kpack");
    let first = mount(&url, &["--cache-dir", cache_arg], &[]);
    first.check("tree", want.path().to_str().unwrap());
    let s = stats(&first);
    assert!(s["remote_requests"] >= 4, "{s:?}");
    first.stop();
    let second = mount(&url, &["--cache-dir", cache_arg], &[]);
    let at_mount = stats(&second);
    second.check("tree", want.path().to_str().unwrap());
    let s = stats(&second);
    second.stop();
    assert_eq!(
        s["remote_requests"], at_mount["remote_requests"],
        "no request after the remount's open: {s:?}"
    );
    assert_eq!(s["cache_dir_hits"], 3, "{s:?}");
}

#[test]
fn http_without_etags_tells_a_replaced_object_by_its_modification_time() {
    if !fuse_available() {
        return;
    }
    let www = tempfile::tempdir().unwrap();
    let kernels = |seed: u64| -> Vec<(&'static str, &'static str, Vec<u8>)> {
        vec![
            ("lib/x.so#0", "gfx942", incompressible(seed, 300_000)),
            ("lib/x.so#0", "gfx90a", incompressible(seed + 1, 300_000)),
        ]
    };
    let served = write_archive(&www.path().join("x.kpack"), Compression::None, &kernels(1));
    let want = tempfile::tempdir().unwrap();
    expected_dir(&[served.as_path()], want.path());
    let nginx = Nginx::start_with(www.path(), false, None);
    let m = mount(&nginx.url("x.kpack"), &[], &[]);
    let file = "lib/x.so#0/gfx942.hsaco";
    m.check(
        "remote_same",
        &format!("{file}|{}", want.path().join(file).display()),
    );
    // Same length and layout, other bytes, a later modification time; renamed into place.
    let staged = write_archive(&www.path().join("x.new"), Compression::None, &kernels(10));
    let later = std::time::SystemTime::now() + std::time::Duration::from_secs(60);
    std::fs::File::options()
        .write(true)
        .open(&staged)
        .unwrap()
        .set_modified(later)
        .unwrap();
    std::fs::rename(&staged, &served).unwrap();
    m.check("remote_eio", "lib/x.so#0/gfx90a.hsaco");
    let log = m.daemon_log();
    assert!(
        log.contains("changed since it was opened (modified:"),
        "{log}"
    );
    m.stop();
    assert!(
        !nginx.access_log().is_empty() && !nginx.access_log().contains(" 200 "),
        "only range requests:\n{}",
        nginx.access_log()
    );
}

#[test]
fn http_reference_layout_blob_comes_in_a_few_large_ranges() {
    if !fuse_available() {
        return;
    }
    // No frame positions: opening walks the chain of 64 frame size words.
    let www = tempfile::tempdir().unwrap();
    let path = www.path().join("ref.kpack");
    reference_archive(&path, 64, 100_000);
    let len = std::fs::metadata(&path).unwrap().len();
    let want = tempfile::tempdir().unwrap();
    expected_dir(&[path.as_path()], want.path());
    let nginx = Nginx::start(www.path());
    let m = mount(&nginx.url("ref.kpack"), &[], &[]);
    let at_mount = stats(&m);
    m.check("tree", want.path().to_str().unwrap());
    let s = stats(&m);
    m.stop();
    // 64 KiB, then windows doubling while the walk moves forward: about log2(len / 64 KiB).
    assert!(
        at_mount["remote_requests"] <= 10,
        "{at_mount:?}\n{}",
        nginx.access_log()
    );
    // Every frame read afterwards lies in ranges already fetched, but a frame straddling two
    // windows: at most one request per window boundary.
    assert!(
        s["remote_requests"] - at_mount["remote_requests"] <= at_mount["remote_requests"],
        "{s:?}\n{}",
        nginx.access_log()
    );
    assert!(s["remote_bytes_fetched"] < 2 * len, "{s:?} for {len} bytes");
    eprintln!(
        "reference layout, 64 frames, {len} bytes: {} requests at mount, {} in all, {} bytes",
        at_mount["remote_requests"], s["remote_requests"], s["remote_bytes_fetched"]
    );
}

#[test]
fn https_mount_verifies_the_server_certificate() {
    if !fuse_available() {
        return;
    }
    let www = tempfile::tempdir().unwrap();
    let archive = rich_archive(
        &www.path().join("tls.kpack"),
        Compression::Zstd { level: 3 },
    );
    let want = tempfile::tempdir().unwrap();
    expected_dir(&[archive.as_path()], want.path());
    let tls = tempfile::tempdir().unwrap();
    tls_files(tls.path());
    let nginx = Nginx::start_with(www.path(), true, Some(tls.path()));
    let url = nginx.https_url("tls.kpack");
    // Trusted through SSL_CERT_FILE (read by the client's native root store).
    let ca = tls.path().join("ca.pem").display().to_string();
    let m = mount(&url, &[], &[("SSL_CERT_FILE".to_owned(), ca)]);
    m.check("tree", want.path().to_str().unwrap());
    m.stop();
    // A certificate nobody vouches for is refused at open, at once: with the default retry
    // count, a refused certificate is not retried like a lost connection.
    let unknown = tls.path().join("cert.pem").display().to_string();
    let (code, err) = refused_mount(&url, &[], &[("SSL_CERT_FILE".to_owned(), unknown)]);
    assert_eq!(code, Some(3), "{err}");
    assert!(err.to_lowercase().contains("certificate"), "{err}");
    assert!(
        !err.contains("retry"),
        "a certificate failure was retried: {err}"
    );
}
