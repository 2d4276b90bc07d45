//! Hostile registry answers, one by one, against the fake server: oversized manifests and
//! bodies, wrong digests, endless and unusable redirects, bogus `Content-Range`s, huge or
//! malformed error bodies, token answers and challenges. Each ends in a clear one-line
//! [`FetchError`], never a panic, a hang, wrong bytes or an unbounded read. A short fuzz of the
//! parsers of what a registry sends closes the file.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::fake::{Answer, ENDLESS_CAP, FRAMING, Fake, Seen};
use super::manifest::MAX_MANIFEST;
use super::reference::{Digest, Reference, Target};
use super::registry::{MAX_HOPS, MAX_SMALL_BODY, Options, Registry};
use crate::remote::client::{FetchError, Stats};
use crate::remote::settings::Settings;

fn h(k: &str, v: &str) -> (String, String) {
    (k.to_owned(), v.to_owned())
}

/// The most body bytes a bounded read of `bound` may leave the server to have written: the
/// bound plus what the sockets' buffers take, far below [`ENDLESS_CAP`].
fn bounded(bound: usize) -> u64 {
    let most = bound as u64 + (16 << 20);
    assert!(most < ENDLESS_CAP);
    most
}

/// An answer's headers and body, and what the message says of it.
type Case = (Vec<(String, String)>, Vec<u8>, &'static str);

/// A client with `retries` for the fake registry at `port`.
fn client(port: u16, retries: u32) -> Registry {
    let reference = Reference::parse(&format!("oci://127.0.0.1:{port}/r")).unwrap();
    let settings = Settings {
        retries,
        timeout: Duration::from_secs(20),
        ..Settings::default()
    };
    let opts = Options {
        tls_verify: true,
        push: false,
    };
    Registry::new(&reference, opts, settings, Arc::new(Stats::default())).unwrap()
}

/// A registry without authentication whose every answer but `/v2/`'s comes from `handler`.
fn registry(
    retries: u32,
    handler: impl Fn(&Seen) -> Answer + Send + Sync + 'static,
) -> (Fake, Registry) {
    let fake = Fake::start(move |s: &Seen| -> Answer {
        if s.path == "/v2/" {
            return (200, vec![], b"{}".to_vec());
        }
        handler(s)
    });
    let c = client(fake.port, retries);
    (fake, c)
}

fn failed(r: Result<impl std::fmt::Debug, FetchError>) -> String {
    match r {
        Err(FetchError::Failed(m)) => {
            assert!(!m.contains('\n'), "{m:?}");
            m
        }
        other => panic!("not Failed: {other:?}"),
    }
}

fn tag(t: &str) -> Target {
    Target::Tag(t.into())
}

fn blob() -> (Vec<u8>, Digest) {
    let b: Vec<u8> = (0..10_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let d = Digest::of(&b);
    (b, d)
}

#[test]
fn a_manifest_of_exactly_the_bound_is_read() {
    let (_f, c) = registry(0, |_| (200, vec![], vec![b' '; MAX_MANIFEST]));
    let m = c.get_manifest(&tag("t")).unwrap();
    assert_eq!(m.bytes.len(), MAX_MANIFEST);
}

#[test]
fn a_manifest_over_the_bound_is_refused_by_its_length() {
    let (f, c) = registry(1, |_| (200, vec![], vec![b' '; MAX_MANIFEST + 1]));
    let m = failed(c.get_manifest(&tag("t")));
    assert_eq!(
        m,
        format!(
            "manifest 127.0.0.1:{}/r:t: the answer is 4194305 bytes, more than the 4194304 read",
            f.port
        )
    );
    // Not retried: the same registry would send the same manifest.
    assert_eq!(f.count("GET", "/v2/r/manifests/"), 1);
}

#[test]
fn an_endless_manifest_is_refused_at_the_bound() {
    for framing in ["endless-chunked", "endless-close"] {
        let (f, c) = registry(1, move |_| {
            (200, vec![h(FRAMING, framing)], vec![b' '; 64 << 10])
        });
        let m = failed(c.get_manifest(&tag("t")));
        assert!(
            m.ends_with(": the answer is longer than the 4194304 bytes read"),
            "{framing}: {m}"
        );
        let sent = f.sent.load(Ordering::Relaxed);
        assert!(sent < bounded(MAX_MANIFEST), "{framing}: {sent} bytes sent");
        assert_eq!(f.count("GET", "/v2/r/manifests/"), 1);
    }
}

#[test]
fn a_manifest_whose_bytes_are_not_the_digest_asked_is_refused() {
    let body = br#"{"schemaVersion":2}"#.to_vec();
    let other = Digest::of(b"another manifest");
    let (f, c) = registry(0, move |_| (200, vec![], body.clone()));
    let m = failed(c.get_manifest(&Target::Digest(other.clone())));
    assert_eq!(
        m,
        format!(
            "manifest 127.0.0.1:{}/r@{other}: the registry sent a manifest whose digest is {}",
            f.port,
            Digest::of(br#"{"schemaVersion":2}"#)
        )
    );
}

#[test]
fn a_manifest_whose_docker_content_digest_disagrees_is_refused() {
    let body = br#"{"schemaVersion":2}"#.to_vec();
    let real = Digest::of(&body);
    let claimed = Digest::of(b"something else");
    let (said, b2) = (claimed.to_string(), body.clone());
    let (f, c) = registry(0, move |s| {
        let sent = if s.path.ends_with("/good") {
            Digest::of(&b2).to_string()
        } else {
            said.clone()
        };
        (200, vec![h("Docker-Content-Digest", &sent)], b2.clone())
    });
    let m = failed(c.get_manifest(&tag("bad")));
    assert_eq!(
        m,
        format!(
            "manifest 127.0.0.1:{}/r:bad: the manifest's digest is {real}, but the registry \
             says {claimed}",
            f.port
        )
    );
    let ok = c.get_manifest(&tag("good")).unwrap();
    assert_eq!((ok.bytes, ok.digest), (body, real));
}

/// A registry whose blob GETs are redirected to `location(path)`.
fn redirecting(location: impl Fn(&str, u16) -> String + Send + Sync + 'static) -> (Fake, Registry) {
    let (b, _) = blob();
    let port = Arc::new(std::sync::OnceLock::<u16>::new());
    let p2 = port.clone();
    let (f, c) = registry(1, move |s| {
        if s.path.starts_with("/v2/r/blobs/") || s.path.starts_with("/elsewhere") {
            let loc = location(&s.path, *p2.get().unwrap());
            return (307, vec![h("Location", &loc)], vec![]);
        }
        (404, vec![], b.clone())
    });
    port.set(f.port).unwrap();
    (f, c)
}

#[test]
fn a_blob_redirected_to_itself_forever_fails_after_the_hops() {
    let (_, d) = blob();
    let (f, c) = redirecting(|path, _| path.to_owned());
    let m = failed(c.get_blob_range(&d, 0..10, true));
    assert!(m.ends_with(": more than 5 redirects"), "{m}");
    assert_eq!(f.count("GET", "/v2/r/blobs/"), MAX_HOPS + 1);
    let m = failed(c.get_blob_unchecked(&d, 1 << 20));
    assert!(m.ends_with(": more than 5 redirects"), "{m}");
    let m = failed(c.blob_size(&d));
    assert!(m.ends_with(": more than 5 redirects"), "{m}");
    assert_eq!(f.count("HEAD", "/v2/r/blobs/"), MAX_HOPS + 1);
    assert!(c.redirects.lock().unwrap().is_empty());
}

#[test]
fn a_redirect_cycle_between_two_hosts_fails_after_the_hops() {
    let (_, d) = blob();
    let other = Arc::new(std::sync::OnceLock::<u16>::new());
    let o2 = other.clone();
    let (f, c) =
        redirecting(move |path, _| format!("http://127.0.0.1:{}/bounce{path}", o2.get().unwrap()));
    let registry_port = f.port;
    let g = Fake::start(move |s: &Seen| -> Answer {
        let back = s.path.strip_prefix("/bounce").unwrap_or("/");
        let loc = format!("http://127.0.0.1:{registry_port}{back}");
        (302, vec![h("Location", &loc)], vec![])
    });
    other.set(g.port).unwrap();
    let m = failed(c.get_blob_range(&d, 0..10, true));
    assert!(m.ends_with(": more than 5 redirects"), "{m}");
    assert_eq!(
        f.count("GET", "/v2/r/blobs/") + g.count("GET", "/bounce/"),
        MAX_HOPS + 1
    );
    // The other host never saw a token or credentials.
    for s in g.seen.lock().unwrap().iter() {
        assert_eq!(s.header("authorization"), None);
    }
}

#[test]
fn redirects_to_other_schemes_or_unusable_locations_are_refused() {
    let (_, d) = blob();
    for (loc, want) in [
        ("file:///etc/passwd", ": HTTP 307 to a file URL"),
        ("ftp://127.0.0.1/x", ": HTTP 307 to a ftp URL"),
        (
            "http://[::1",
            ": HTTP 307 to an unusable Location \"http://[::1\": invalid IPv6 address",
        ),
        (
            "http://",
            ": HTTP 307 to an unusable Location \"http://\": empty host",
        ),
        ("", ": HTTP 307 without a Location"),
    ] {
        let (f, c) = redirecting(move |_, _| loc.to_owned());
        let m = failed(c.get_blob_range(&d, 0..10, true));
        assert!(m.ends_with(want), "{loc:?}: {m}");
        // Not retried, and not followed.
        assert_eq!(f.count("GET", "/v2/r/blobs/"), 1, "{loc:?}");
        let m = failed(c.get_blob_unchecked(&d, 1 << 20));
        assert!(m.ends_with(want), "{loc:?}: {m}");
    }
}

/// A registry that answers every blob GET itself with `answer(range header)`.
fn ranges(
    retries: u32,
    answer: impl Fn(&str) -> Answer + Send + Sync + 'static,
) -> (Fake, Registry) {
    registry(retries, move |s| {
        if s.path.starts_with("/v2/r/blobs/") {
            return answer(s.header("range").unwrap_or(""));
        }
        (404, vec![], vec![])
    })
}

#[test]
fn bogus_content_ranges_are_never_data() {
    let (b, d) = blob();
    let part = b[100..600].to_vec();
    for cr in [
        None,
        Some(""),
        Some("bytes 100-599"),
        Some("bytes 100-599/*"),
        Some("bytes=100-599/10000"),
        Some("bytes 100-599/10000 x"),
        Some("bytes 100 - 599 / 10000 / 1"),
        Some("bytes 0-499/10000"),
        Some("bytes 100-600/10000"),
        Some("bytes 101-599/10000"),
        Some("bytes 100-599/599"),
        Some("bytes 100-599/0"),
        Some("bytes 100-18446744073709551615/18446744073709551615"),
        Some("bytes 100-18446744073709551616/99999999999999999999"),
    ] {
        let p = part.clone();
        let (f, c) = ranges(0, move |_| {
            let hs = cr.map(|v| vec![h("Content-Range", v)]).unwrap_or_default();
            (206, hs, p.clone())
        });
        let m = failed(c.get_blob_range(&d, 100..600, true));
        let shown = format!("{:?}", cr.unwrap_or(""));
        assert!(
            m.ends_with(&format!(
                ": HTTP 206 with Content-Range {shown}, not bytes 100-599/SIZE"
            )),
            "{cr:?}: {m}"
        );
        assert_eq!(f.count("GET", "/v2/r/blobs/"), 1);
    }
}

#[test]
fn a_206_shorter_than_its_range_is_retried_then_refused() {
    let (b, d) = blob();
    let short = b[100..599].to_vec();
    let (f, c) = ranges(1, move |_| {
        (
            206,
            vec![h("Content-Range", "bytes 100-599/10000")],
            short.clone(),
        )
    });
    let m = failed(c.get_blob_range(&d, 100..600, true));
    assert!(
        m.ends_with(": the answer ended after 499 of 500 bytes (after 1 retries)"),
        "{m}"
    );
    assert_eq!(f.count("GET", "/v2/r/blobs/"), 2);
    // A Content-Length that promises the range but a connection that ends early.
    let short = b[100..599].to_vec();
    let (f, c) = ranges(0, move |_| {
        let hs = vec![
            h("Content-Range", "bytes 100-599/10000"),
            h(FRAMING, "length=500"),
        ];
        (206, hs, short.clone())
    });
    let m = failed(c.get_blob_range(&d, 100..600, true));
    assert!(m.contains(": request failed"), "{m}");
    assert_eq!(f.count("GET", "/v2/r/blobs/"), 1);
}

#[test]
fn a_206_longer_than_its_range_is_never_used_beyond_it() {
    let (b, d) = blob();
    let cr = || h("Content-Range", "bytes 100-599/10000");
    // Its length says so: refused before its body is read.
    let long = b[100..601].to_vec();
    let (_f, c) = ranges(1, move |_| (206, vec![cr()], long.clone()));
    let m = failed(c.get_blob_range(&d, 100..600, true));
    assert!(
        m.ends_with(": the answer is 501 bytes, more than the 500 read"),
        "{m}"
    );
    // Without a length, endless: refused at the range's end.
    let long = b[100..].to_vec();
    for framing in ["endless-chunked", "endless-close"] {
        let long = long.clone();
        let (f, c) = ranges(1, move |_| {
            (206, vec![cr(), h(FRAMING, framing)], long.clone())
        });
        let m = failed(c.get_blob_range(&d, 100..600, true));
        assert!(
            m.ends_with(": the answer is longer than the 500 bytes read"),
            "{framing}: {m}"
        );
        assert!(f.sent.load(Ordering::Relaxed) < bounded(500));
    }
    // A Content-Length of the range with more bytes behind it: the range, and only it.
    let long = b[100..700].to_vec();
    let (_f, c) = ranges(0, move |_| {
        (206, vec![cr(), h(FRAMING, "length=500")], long.clone())
    });
    let (got, total) = c.get_blob_range(&d, 100..600, true).unwrap();
    assert_eq!((got.as_slice(), total), (&b[100..600], 10_000));
}

#[test]
fn a_whole_blob_over_its_size_is_refused_at_the_bound() {
    let (b, d) = blob();
    let exact = b.clone();
    let (_f, c) = registry(0, move |_| (200, vec![], exact.clone()));
    assert_eq!(c.get_blob_unchecked(&d, 10_000).unwrap(), b);
    let m = failed(c.get_blob_unchecked(&d, 9_999));
    assert!(m.ends_with(": the blob is larger than 9999 bytes"), "{m}");
    for framing in ["chunked", "close", "endless-chunked", "endless-close"] {
        let body = b.clone();
        let (f, c) = registry(1, move |_| (200, vec![h(FRAMING, framing)], body.clone()));
        let m = failed(c.get_blob_unchecked(&d, 9_999));
        assert!(
            m.ends_with(": the blob is larger than 9999 bytes"),
            "{framing}: {m}"
        );
        assert!(f.sent.load(Ordering::Relaxed) < bounded(10_000));
        assert_eq!(f.count("GET", "/v2/r/blobs/"), 1);
        if !framing.starts_with("endless") {
            // The exact size reads, and its bytes are the caller's to check.
            assert_eq!(Digest::of(&c.get_blob_unchecked(&d, 10_000).unwrap()), d);
        }
    }
}

#[test]
fn huge_or_foreign_error_bodies_make_one_short_line() {
    let json_of = |message: &str| {
        serde_json::to_vec(&serde_json::json!({
            "errors": [{"code": "MANIFEST_UNKNOWN", "message": message}]
        }))
        .unwrap()
    };
    let over = json_of(&"x".repeat(MAX_SMALL_BODY));
    let long = json_of(&format!("a\nb{}", "y".repeat(MAX_SMALL_BODY - 200)));
    let cases: Vec<Case> = vec![
        (vec![], over.clone(), ""),
        (vec![h(FRAMING, "endless-chunked")], over, ""),
        (vec![h(FRAMING, "endless-close")], b"<html>".to_vec(), ""),
        (vec![], b"<html>\n<body>Not here</body>\n".to_vec(), ""),
        (vec![], vec![0xff; 1000], ""),
        (vec![], br#"{"errors":"nope"}"#.to_vec(), ""),
        (vec![], long, ": MANIFEST_UNKNOWN: a by"),
    ];
    for (hs, body, codes) in cases {
        let (f, c) = registry(0, move |_| (404, hs.clone(), body.clone()));
        let e = c.get_manifest(&tag("t")).unwrap_err();
        let FetchError::NotFound(m) = e else {
            panic!("not NotFound: {e:?}");
        };
        let want = format!(
            "manifest 127.0.0.1:{}/r:t: HTTP 404 Not Found{codes}",
            f.port
        );
        assert!(m.starts_with(&want), "{m}");
        assert!(!m.contains('\n') && m.len() < want.len() + 250, "{m}");
        assert!(f.sent.load(Ordering::Relaxed) < bounded(MAX_SMALL_BODY));
    }
}

/// A registry that asks for a bearer token from its `/token`, answered by `token`.
fn with_token(
    challenge: impl Fn(u16) -> String + Send + Sync + 'static,
    token: impl Fn() -> Answer + Send + Sync + 'static,
) -> (Fake, Registry) {
    let fake = Fake::start(move |s: &Seen| -> Answer {
        if s.path.starts_with("/token") {
            return token();
        }
        if s.header("authorization") != Some("Bearer T1") {
            let port: u16 = s
                .header("host")
                .and_then(|h| h.rsplit(':').next())
                .and_then(|p| p.parse().ok())
                .unwrap_or(0);
            return (401, vec![h("WWW-Authenticate", &challenge(port))], vec![]);
        }
        (200, vec![], b"{}".to_vec())
    });
    let c = client(fake.port, 0);
    (fake, c)
}

fn realm(port: u16) -> String {
    format!("Bearer realm=\"http://127.0.0.1:{port}/token\",service=\"fake\"")
}

#[test]
fn huge_or_foreign_token_answers_are_refused() {
    let cases: Vec<Case> = vec![
        (
            vec![],
            vec![b' '; MAX_SMALL_BODY + 1],
            "the answer is 65537 bytes, more than the 65536 read",
        ),
        (
            vec![h(FRAMING, "endless-chunked")],
            br#"{"token":"T1"}"#.to_vec(),
            "the answer is longer than the 65536 bytes read",
        ),
        (
            vec![],
            b"<html>\n".to_vec(),
            "the token service's answer is not JSON of a token: expected value at line 1 column 1",
        ),
        (
            vec![],
            br#"{"token":5}"#.to_vec(),
            "the token service's answer is not JSON of a token: invalid type",
        ),
        (
            vec![],
            format!(r#"{{"token":"T1","expires_in":"{}"}}"#, "9".repeat(60_000)).into_bytes(),
            "the token service's answer is not JSON of a token: invalid type: string",
        ),
        (
            vec![],
            br#"{"token":"T1 x"}"#.to_vec(),
            "the token service's token is not a single header word",
        ),
        (
            vec![],
            br#"{"expires_in":1}"#.to_vec(),
            "the token service's answer holds no token",
        ),
    ];
    for (hs, body, want) in cases {
        let (f, c) = with_token(realm, move || (200, hs.clone(), body.clone()));
        let m = failed(c.get_manifest(&tag("t")));
        let head = format!(
            "manifest 127.0.0.1:{p}/r:t: token service http://127.0.0.1:{p}: {want}",
            p = f.port
        );
        assert!(m.starts_with(&head), "{m}");
        assert!(
            m.len() < head.len() + 250,
            "{} bytes: {}",
            m.len(),
            &m[..300]
        );
        assert!(f.sent.load(Ordering::Relaxed) < bounded(MAX_SMALL_BODY));
    }
    // A token service that refuses, with a huge body: its status, on one line.
    let (f, c) = with_token(realm, || {
        (403, vec![h(FRAMING, "endless-close")], b"no\n".to_vec())
    });
    let e = c.get_manifest(&tag("t")).unwrap_err();
    assert!(matches!(e, FetchError::Denied(_)), "{e:?}");
    assert_eq!(
        e.to_string(),
        format!(
            "manifest 127.0.0.1:{p}/r:t: token service http://127.0.0.1:{p}: HTTP 403 Forbidden",
            p = f.port
        )
    );
}

#[test]
fn garbage_challenges_are_refused() {
    let long = format!("Bearer realm=\"http://h/t\",{}", "x".repeat(20_000));
    let cases: Vec<(String, &str)> = vec![
        (
            "Bearer".into(),
            "HTTP 401: a Bearer challenge without a realm",
        ),
        (
            "Bearer realm=\"".into(),
            "HTTP 401: an unclosed quote in a challenge",
        ),
        (
            "Negotiate abc=\"".into(),
            "HTTP 401: an unsupported authentication scheme \"negotiate\"",
        ),
        (
            "".into(),
            "HTTP 401: an unsupported authentication scheme \"\"",
        ),
        (
            ",,,=,".into(),
            "HTTP 401: an unsupported authentication scheme \",,,=,\"",
        ),
        (
            "Bearer =x".into(),
            "HTTP 401: a malformed challenge parameter near \"=x\"",
        ),
        (
            long,
            "HTTP 401: a malformed challenge parameter near \"xxxx",
        ),
    ];
    for (challenge, want) in cases {
        let ch = challenge.clone();
        let (f, c) = with_token(move |_| ch.clone(), || (500, vec![], vec![]));
        let m = failed(c.get_manifest(&tag("t")));
        let head = format!(
            "127.0.0.1:{p}/r (http://127.0.0.1:{p}/v2/): {want}",
            p = f.port
        );
        assert!(m.starts_with(&head), "{challenge:?}: {m}");
        assert!(m.len() < head.len() + 250, "{} bytes", m.len());
        assert_eq!(f.count("GET", "/token"), 0);
    }
    // Realms that are not URLs, or not HTTP.
    for (r, want) in [
        (
            "nowhere",
            "token realm \"nowhere\" is not a URL: relative URL without a base",
        ),
        ("file:///etc/passwd", "request failed"),
    ] {
        let (f, c) = with_token(
            move |_| format!("Bearer realm=\"{r}\""),
            || (200, vec![], br#"{"token":"T1"}"#.to_vec()),
        );
        let m = failed(c.get_manifest(&tag("t")));
        assert!(m.contains(want), "{r}: {m}");
        assert_eq!(f.count("GET", "/v2/r/"), 0, "{r}");
    }
}

mod fuzz {
    use std::time::Instant;

    use proptest::prelude::*;
    use proptest::test_runner::TestCaseError;

    use super::super::auth::{parse_challenge, parse_token_answer};
    use super::super::manifest::Pack;
    use super::super::read::content_range_total;
    use super::super::registry::error_codes;

    /// A kernel pack manifest to mutate.
    const PACK: &str = concat!(
        r#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","#,
        r#""artifactType":"application/vnd.kpack-fuse.pack.v1","#,
        r#""config":{"mediaType":"application/vnd.oci.empty.v1+json","#,
        r#""digest":"sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a","size":2},"#,
        r#""layers":[{"mediaType":"application/vnd.kpack-fuse.archive.v1","#,
        r#""digest":"sha256:1111111111111111111111111111111111111111111111111111111111111111","size":128,"#,
        r#""annotations":{"dev.kpack-fuse.arches":"gfx942","dev.kpack-fuse.frames":"index","#,
        r#""dev.kpack-fuse.kernel-index":"sha256:3333333333333333333333333333333333333333333333333333333333333333","#,
        r#""dev.kpack-fuse.toc.blake3":"abababababababababababababababababababababababababababababababab","#,
        r#""dev.kpack-fuse.toc.length":"28","dev.kpack-fuse.toc.offset":"100","#,
        r#""org.opencontainers.image.title":"a.kpack"}},"#,
        r#"{"mediaType":"application/vnd.kpack-fuse.kernel-index.v1","#,
        r#""digest":"sha256:3333333333333333333333333333333333333333333333333333333333333333","size":40,"#,
        r#""annotations":{"dev.kpack-fuse.index-of":"a.kpack"}}]}"#
    );

    #[test]
    fn the_sample_is_a_pack() {
        assert!(Pack::parse("x", "", PACK.as_bytes()).is_ok());
    }

    /// Whatever fails, fails on one bounded line.
    fn short(r: Result<impl Sized, String>) -> Result<(), TestCaseError> {
        if let Err(m) = r {
            prop_assert!(!m.contains('\n') && m.len() < 1000, "{m:?}");
        }
        Ok(())
    }

    #[test]
    fn foreign_strings_in_manifests_make_one_short_line() {
        let long = "z".repeat(1 << 20);
        for (from, to) in [
            ("application/vnd.kpack-fuse.pack.v1", "a\nb"),
            ("application/vnd.kpack-fuse.pack.v1", long.as_str()),
            ("a.kpack\"}},", "a\nb\"}},"),
            ("a.kpack\"}},", &format!("{long}\"}},")),
            ("\"gfx942\"", &format!("\"{long}\\n\"")),
            ("\"100\"", &format!("\"{long}\"")),
            ("\"size\":128", &format!("\"size\":\"{long}\"")),
            (
                "\"digest\":\"sha256:1111",
                &format!("\"digest\":\"a\\n{long}\"-\"sha256:1111"),
            ),
            (
                "application/vnd.oci.image.manifest.v1+json",
                &format!("{long}\\n"),
            ),
        ] {
            let bytes = PACK.replacen(from, to, 1);
            assert_ne!(bytes, PACK, "{from}");
            let m = Pack::parse("x", "", bytes.as_bytes()).unwrap_err();
            assert!(
                !m.contains('\n') && m.len() < 400,
                "{from}: {} bytes: {}",
                m.len(),
                &m[..m.len().min(400)]
            );
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

        #[test]
        fn manifests_never_panic(
            edits in prop::collection::vec((0usize..PACK.len(), any::<u8>()), 0..6),
            cut in 0usize..PACK.len() + 10,
            random in prop::collection::vec(any::<u8>(), 0..64),
        ) {
            let mut bytes = PACK.as_bytes().to_vec();
            for (at, b) in edits {
                bytes[at] = b;
            }
            bytes.truncate(cut);
            short(Pack::parse("x", "", &bytes))?;
            short(Pack::parse("x", "application/vnd.oci.image.manifest.v1+json", &random))?;
            let _ = error_codes(&bytes);
            let _ = error_codes(&random);
        }

        #[test]
        fn challenges_never_panic(
            s in r#"(Bearer |Basic |)[a-zA-Z =,"\\\u{e9}\u{1F600}]{0,40}"#,
            any_text in any::<String>(),
        ) {
            short(parse_challenge(&s))?;
            short(parse_challenge(&any_text))?;
        }

        #[test]
        fn token_answers_never_panic(
            s in r#"\{("(token|access_token|expires_in)":("[a-z \\"]{0,5}"|[0-9-]{1,25}|null|\{\}),?){0,3}\}"#,
            random in prop::collection::vec(any::<u8>(), 0..64),
        ) {
            short(parse_token_answer(s.as_bytes(), Instant::now()))?;
            short(parse_token_answer(&random, Instant::now()))?;
        }

        #[test]
        fn content_ranges_never_panic(
            s in r#"(bytes |)[0-9 */+-]{0,30}"#,
            nums in prop::collection::vec(
                prop_oneof![Just(u64::MAX), Just(u64::MAX - 1), Just(0u64), any::<u64>()], 3),
            start in any::<u64>(),
            len in 1u64..1000,
        ) {
            let range = start.saturating_sub(len)..start.saturating_sub(len) + len;
            let _ = content_range_total(&s, &range);
            let first = if nums[0] % 2 == 0 { range.start } else { nums[0] };
            let cr = format!("bytes {first}-{}/{}", nums[1], nums[2]);
            if let Some(total) = content_range_total(&cr, &range) {
                prop_assert_eq!(first, range.start);
                prop_assert_eq!(nums[1], range.end - 1);
                prop_assert!(total > nums[1]);
            }
            let exact = format!("bytes {}-{}/{}", range.start, range.end - 1, range.end);
            prop_assert_eq!(content_range_total(&exact, &range), Some(range.end));
        }
    }
}
