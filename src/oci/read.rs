//! Reading from a registry: manifests by tag or digest (checked against the digest asked for
//! and against `Docker-Content-Digest`), small blobs whole (for the caller to check against
//! their digest), and one byte range of a blob per request, accepted only as a 206 whose
//! `Content-Range` is the range asked. Blob GETs follow redirects by hand (`Authorization`
//! only to the registry's origin) and reuse a redirect target for later ranges while it
//! answers.

use std::ops::Range;
use std::sync::atomic::Ordering;

use reqwest::header::{self, HeaderValue};
use reqwest::{Method, Url};

use super::manifest::{
    DOCKER_LIST_MEDIA_TYPE, DOCKER_MANIFEST_MEDIA_TYPE, INDEX_MEDIA_TYPE, MANIFEST_MEDIA_TYPE,
    MAX_MANIFEST,
};
use super::reference::{Digest, Target};
use super::registry::{
    BodyError, Live, MAX_HOPS, Registry, Req, one_line, origin, read_limited, status_failure,
};
use crate::remote::client::FetchError;
use crate::remote::retry::{Class, Failure};

/// A fetched manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchedManifest {
    pub bytes: Vec<u8>,
    /// The `Content-Type` it was served with (empty when none).
    pub media_type: String,
    /// `sha256:` of `bytes`.
    pub digest: Digest,
}

/// How a redirected GET ended.
pub(super) enum Followed {
    Answer(reqwest::Response, Url),
    /// 401/403 from a host other than the registry: a signed URL that expired.
    StorageDenied(String),
}

impl Registry {
    /// Fetches the manifest `target` names (a tag or a digest), at most 4 MiB.
    pub fn get_manifest(&self, target: &Target) -> Result<FetchedManifest, FetchError> {
        let live = self.live()?;
        let what = format!(
            "manifest {}{}{}",
            self.name(),
            if matches!(target, Target::Digest(_)) {
                "@"
            } else {
                ":"
            },
            target.as_path()
        );
        let accept = [
            MANIFEST_MEDIA_TYPE,
            INDEX_MEDIA_TYPE,
            DOCKER_MANIFEST_MEDIA_TYPE,
            DOCKER_LIST_MEDIA_TYPE,
        ]
        .join(", ");
        let url = self.url(&live, &format!("manifests/{}", target.as_path()));
        let req = Req::new(Method::GET, url).header(header::ACCEPT, &accept);
        let (bytes, media_type, sent) = self.with_retries(&what, false, || {
            live.rt.block_on(async {
                let r = self.send(&live, &req).await?;
                if !r.status().is_success() {
                    return Err(status_failure(r).await);
                }
                let media_type = header_str(r.headers().get(header::CONTENT_TYPE));
                let sent = header_str(r.headers().get("docker-content-digest"));
                let bytes = read_limited(r, MAX_MANIFEST as u64).await?;
                Ok((bytes, media_type, sent))
            })
        })?;
        self.stats
            .bytes
            .fetch_add(bytes.len() as u64, Ordering::Relaxed);
        let digest = Digest::of(&bytes);
        if let Target::Digest(want) = target {
            if *want != digest {
                return Err(FetchError::Failed(format!(
                    "{what}: the registry sent a manifest whose digest is {digest}"
                )));
            }
        }
        if sent.starts_with("sha256:") && sent != digest.as_str() {
            return Err(FetchError::Failed(format!(
                "{what}: the manifest's digest is {digest}, but the registry says {sent}"
            )));
        }
        let media_type = media_type.split(';').next().unwrap_or("").trim().to_owned();
        Ok(FetchedManifest {
            bytes,
            media_type,
            digest,
        })
    }

    /// Fetches a whole blob of at most `max` bytes, for the caller to check against `digest`
    /// (and to say what a mismatch means).
    pub fn get_blob_unchecked(&self, digest: &Digest, max: u64) -> Result<Vec<u8>, FetchError> {
        let live = self.live()?;
        let what = format!("blob {}@{digest}", self.name());
        let bytes = self.with_retries(&what, false, || {
            live.rt.block_on(async {
                match self.follow(&live, digest, None, None).await? {
                    Followed::Answer(r, _) if r.status().is_success() => {
                        read_limited(r, max).await.map_err(|e| match e {
                            BodyError::TooLong(_) => Failure::new(
                                Class::Fatal,
                                format!("the blob is larger than {max} bytes"),
                            ),
                            BodyError::Failed(f) => f,
                        })
                    }
                    Followed::Answer(r, _) => Err(status_failure(r).await),
                    Followed::StorageDenied(why) => Err(Failure::new(Class::Denied, why)),
                }
            })
        })?;
        self.stats
            .bytes
            .fetch_add(bytes.len() as u64, Ordering::Relaxed);
        Ok(bytes)
    }

    /// Reads `range` of a blob in one request: the bytes and the blob's total size. Only a 206
    /// whose `Content-Range` is exactly `range` is accepted; a 200 (the whole blob) or another
    /// range is never used: it is retried, then [`FetchError::Failed`]. With `shrinkable`, a
    /// timeout returns [`FetchError::TimedOut`] at once, for the caller to ask for less.
    pub fn get_blob_range(
        &self,
        digest: &Digest,
        range: Range<u64>,
        shrinkable: bool,
    ) -> Result<(Vec<u8>, u64), FetchError> {
        let live = self.live()?;
        let what = format!(
            "blob {}@{digest} bytes {}-{}",
            self.name(),
            range.start,
            range.end.saturating_sub(1)
        );
        if range.start >= range.end {
            return Err(FetchError::Failed(format!("{what}: an empty range")));
        }
        let got = self.with_retries(&what, shrinkable, || {
            live.rt.block_on(async {
                let cached = self
                    .redirects
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get(digest.as_str())
                    .cloned();
                if let Some(u) = cached {
                    match self.ranged(&live, digest, &range, Some(u)).await {
                        Ok(Ok(v)) => return Ok(v),
                        // Refused (a signed URL expired): ask the registry again at once.
                        Ok(Err(_)) => self.forget_redirect(digest),
                        // Any other failure: the next try asks the registry.
                        Err(f) => {
                            self.forget_redirect(digest);
                            return Err(f);
                        }
                    }
                }
                self.ranged(&live, digest, &range, None)
                    .await?
                    .map_err(|why| Failure::new(Class::Denied, why))
            })
        })?;
        self.stats
            .bytes
            .fetch_add(got.0.len() as u64, Ordering::Relaxed);
        Ok(got)
    }

    fn forget_redirect(&self, digest: &Digest) {
        self.redirects
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(digest.as_str());
    }

    /// One ranged GET from `start` (a remembered target) or the registry. The inner `Err` is a
    /// refusal by the storage host.
    async fn ranged(
        &self,
        live: &Live,
        digest: &Digest,
        range: &Range<u64>,
        start: Option<Url>,
    ) -> Result<Result<(Vec<u8>, u64), String>, Failure> {
        let (r, at) = match self.follow(live, digest, Some(range), start).await? {
            Followed::Answer(r, at) => (r, at),
            Followed::StorageDenied(why) => return Ok(Err(why)),
        };
        let status = r.status().as_u16();
        // Neither answer is ever used as data, but both come from caches and proxies that
        // may answer properly the next time: retried, within the retries.
        if status == 200 {
            return Err(Failure::new(
                Class::Retry,
                "HTTP 200: the whole blob was sent instead of the range asked",
            ));
        }
        if status != 206 {
            return Err(status_failure(r).await);
        }
        let cr = header_str(r.headers().get(header::CONTENT_RANGE));
        let total = match content_range_total(&cr, range) {
            Some(total) => total,
            None => {
                return Err(Failure::new(
                    Class::Retry,
                    format!(
                        "HTTP 206 with Content-Range {cr:?}, not bytes {}-{}/SIZE",
                        range.start,
                        range.end - 1
                    ),
                ));
            }
        };
        let len = range.end - range.start;
        let body = read_limited(r, len).await?;
        if body.len() as u64 != len {
            return Err(Failure::new(
                Class::Retry,
                format!("the answer ended after {} of {len} bytes", body.len()),
            ));
        }
        if origin(&at) != origin(&live.base) || at.path() != self.blob_path(digest) {
            self.redirects
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(digest.to_string(), at);
        }
        Ok(Ok((body, total)))
    }

    fn blob_path(&self, digest: &Digest) -> String {
        format!("/v2/{}/blobs/{digest}", self.repository)
    }

    /// GETs (or, without a range and with `head`, HEADs) the blob from `start` or the
    /// registry, following at most [`MAX_HOPS`] redirects; the `Range` header is kept on every
    /// hop. The answer comes with the URL that gave it.
    async fn follow(
        &self,
        live: &Live,
        digest: &Digest,
        range: Option<&Range<u64>>,
        start: Option<Url>,
    ) -> Result<Followed, Failure> {
        self.follow_method(live, Method::GET, digest, range, start)
            .await
    }

    pub(super) async fn follow_method(
        &self,
        live: &Live,
        method: Method,
        digest: &Digest,
        range: Option<&Range<u64>>,
        start: Option<Url>,
    ) -> Result<Followed, Failure> {
        let mut url = start.unwrap_or_else(|| self.url(live, &format!("blobs/{digest}")));
        for _ in 0..=MAX_HOPS {
            let mut req = Req::new(method.clone(), url.clone());
            if let Some(r) = range {
                req.headers.insert(
                    header::RANGE,
                    HeaderValue::from_str(&format!("bytes={}-{}", r.start, r.end - 1))
                        .expect("ASCII"),
                );
            }
            let r = self.send(live, &req).await?;
            let status = r.status().as_u16();
            if matches!(status, 301 | 302 | 303 | 307 | 308) {
                let loc = header_str(r.headers().get(header::LOCATION));
                if loc.is_empty() {
                    // Joining "" would ask the same URL again, until the hops run out.
                    return Err(Failure::new(
                        Class::Fatal,
                        format!("HTTP {status} without a Location"),
                    ));
                }
                url = url.join(&loc).map_err(|e| {
                    Failure::new(
                        Class::Fatal,
                        format!(
                            "HTTP {status} to an unusable Location {:?}: {e}",
                            one_line(&loc, 100)
                        ),
                    )
                })?;
                if !matches!(url.scheme(), "http" | "https") {
                    return Err(Failure::new(
                        Class::Fatal,
                        format!("HTTP {status} to a {} URL", url.scheme()),
                    ));
                }
                continue;
            }
            if matches!(status, 401 | 403) && origin(&url) != origin(&live.base) {
                let host = url.host_str().unwrap_or("").to_owned();
                return Ok(Followed::StorageDenied(format!(
                    "HTTP {} from the storage host {host} the registry redirected to",
                    r.status()
                )));
            }
            return Ok(Followed::Answer(r, url));
        }
        Err(Failure::new(
            Class::Fatal,
            format!("more than {MAX_HOPS} redirects"),
        ))
    }

    /// The blob's size when the registry has it (`HEAD`), `None` when it does not.
    pub fn blob_size(&self, digest: &Digest) -> Result<Option<u64>, FetchError> {
        let live = self.live()?;
        let what = format!("blob {}@{digest}", self.name());
        self.with_retries(&what, false, || {
            live.rt.block_on(async {
                match self
                    .follow_method(&live, Method::HEAD, digest, None, None)
                    .await?
                {
                    Followed::Answer(r, _) if r.status().is_success() => {
                        let n = r
                            .headers()
                            .get(header::CONTENT_LENGTH)
                            .and_then(|v| v.to_str().ok())
                            .and_then(|v| v.parse::<u64>().ok());
                        Ok(Some(n.unwrap_or(0)))
                    }
                    Followed::Answer(r, _) if r.status().as_u16() == 404 => Ok(None),
                    Followed::Answer(r, _) => Err(status_failure(r).await),
                    Followed::StorageDenied(why) => Err(Failure::new(Class::Denied, why)),
                }
            })
        })
    }
}

fn header_str(v: Option<&HeaderValue>) -> String {
    v.and_then(|v| v.to_str().ok()).unwrap_or("").to_owned()
}

/// The blob's total size from `Content-Range` value `cr` when it is exactly `range`.
pub(super) fn content_range_total(cr: &str, range: &Range<u64>) -> Option<u64> {
    match parse_content_range(cr) {
        // `range` is not empty, so `range.end - 1` cannot wrap; `e + 1` could (a hostile
        // `bytes S-18446744073709551615/…` overflowed it).
        Some((s, e, total)) if s == range.start && e == range.end - 1 && e < total => Some(total),
        _ => None,
    }
}

/// `bytes START-END/TOTAL` (inclusive end; TOTAL a number).
fn parse_content_range(v: &str) -> Option<(u64, u64, u64)> {
    let rest = v.trim().strip_prefix("bytes ")?;
    let (span, total) = rest.split_once('/')?;
    let (s, e) = span.split_once('-')?;
    let num = |x: &str| {
        let x = x.trim();
        (!x.is_empty() && x.bytes().all(|b| b.is_ascii_digit()))
            .then(|| x.parse::<u64>().ok())
            .flatten()
    };
    let (s, e, t) = (num(s)?, num(e)?, num(total)?);
    (s <= e).then_some((s, e, t))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_ranges_parse_strictly() {
        assert_eq!(parse_content_range("bytes 0-9/100"), Some((0, 9, 100)));
        assert_eq!(parse_content_range("bytes 5-5/6"), Some((5, 5, 6)));
        assert_eq!(parse_content_range("bytes 0-9/*"), None);
        assert_eq!(parse_content_range("bytes 9-0/100"), None);
        assert_eq!(parse_content_range("bytes -9/100"), None);
        assert_eq!(parse_content_range("items 0-9/100"), None);
        assert_eq!(parse_content_range("bytes +1-9/100"), None);
    }
}

/// The client against a fake registry that wants a bearer token and redirects blob GETs to a
/// storage host on another port (another origin), as hosted registries do.
#[cfg(test)]
mod redirect_tests {
    use std::sync::Arc;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::super::fake::{Answer, Fake, Seen};
    use super::super::reference::{Digest, Reference, Target};
    use super::super::registry::{Options, Registry};
    use crate::remote::client::{FetchError, Stats};
    use crate::remote::settings::Settings;

    /// How the storage host misbehaves.
    #[derive(Clone, Copy, PartialEq, Eq)]
    enum Mode {
        Good,
        Whole,
        WrongRange,
    }

    struct World {
        registry: Fake,
        storage: Fake,
        client: Registry,
        digest: Digest,
        blob: Vec<u8>,
        /// Signatures the storage host refuses (expired URLs).
        expired: Arc<Mutex<Vec<u64>>>,
        mode: Arc<Mutex<Mode>>,
    }

    fn h(k: &str, v: &str) -> (String, String) {
        (k.to_owned(), v.to_owned())
    }

    fn world() -> World {
        let blob: Vec<u8> = (0..10_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let digest = Digest::of(&blob);
        let expired = Arc::new(Mutex::new(Vec::new()));
        let mode = Arc::new(Mutex::new(Mode::Good));
        let storage = {
            let (blob, expired, mode) = (blob.clone(), expired.clone(), mode.clone());
            Fake::start(move |s: &Seen| -> Answer {
                let sig: u64 = s
                    .path
                    .split("sig=")
                    .nth(1)
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
                if expired.lock().unwrap().contains(&sig) {
                    return (403, vec![], b"<Error>expired</Error>".to_vec());
                }
                let range = s.header("range").unwrap_or("");
                let (a, b) = range
                    .strip_prefix("bytes=")
                    .and_then(|r| r.split_once('-'))
                    .map(|(a, b)| (a.parse::<usize>().unwrap(), b.parse::<usize>().unwrap()))
                    .unwrap_or((0, blob.len() - 1));
                match *mode.lock().unwrap() {
                    Mode::Whole => (200, vec![], blob.clone()),
                    _ if range.is_empty() => (200, vec![], blob.clone()),
                    m => {
                        let shown = if m == Mode::WrongRange { a + 1 } else { a };
                        let cr = format!("bytes {shown}-{b}/{}", blob.len());
                        (206, vec![h("Content-Range", &cr)], blob[a..=b].to_vec())
                    }
                }
            })
        };
        let sp = storage.port;
        let sig = Arc::new(AtomicU64::new(0));
        let registry = Fake::start(move |s: &Seen| -> Answer {
            if s.path.starts_with("/token") {
                return (200, vec![], br#"{"token":"T1","expires_in":300}"#.to_vec());
            }
            if s.header("authorization") != Some("Bearer T1") {
                // The realm is this registry's /token: its port is in the Host header.
                let host = s.header("host").unwrap_or("").to_owned();
                let c = format!("Bearer realm=\"http://{host}/token\",service=\"fake\"");
                let body = br#"{"errors":[{"code":"UNAUTHORIZED","message":"no"}]}"#;
                return (401, vec![h("WWW-Authenticate", &c)], body.to_vec());
            }
            if s.path == "/v2/" {
                return (200, vec![], b"{}".to_vec());
            }
            if let Some(d) = s.path.strip_prefix("/v2/r/blobs/") {
                let n = sig.fetch_add(1, Ordering::SeqCst) + 1;
                let loc = format!("http://127.0.0.1:{sp}/store/{d}?sig={n}");
                return (307, vec![h("Location", &loc)], vec![]);
            }
            let body = br#"{"errors":[{"code":"MANIFEST_UNKNOWN","message":"manifest unknown"}]}"#;
            (404, vec![], body.to_vec())
        });
        let reference = Reference::parse(&format!("oci://127.0.0.1:{}/r", registry.port)).unwrap();
        let settings = Settings {
            retries: 0,
            ..Settings::default()
        };
        let client = Registry::new(
            &reference,
            Options {
                tls_verify: true,
                push: false,
            },
            settings,
            Arc::new(Stats::default()),
        )
        .unwrap();
        World {
            registry,
            storage,
            client,
            digest,
            blob,
            expired,
            mode,
        }
    }

    #[test]
    fn ranges_follow_the_redirect_without_authorization_and_reuse_it() {
        let w = world();
        let (bytes, total) = w.client.get_blob_range(&w.digest, 100..600, true).unwrap();
        assert_eq!((bytes.as_slice(), total), (&w.blob[100..600], 10_000));
        // /v2/ asked for a token, so the first blob GET already carried it.
        assert_eq!(w.registry.count("GET", "/v2/r/blobs/"), 1);
        let (bytes, _) = w
            .client
            .get_blob_range(&w.digest, 9_000..10_000, true)
            .unwrap();
        assert_eq!(bytes, &w.blob[9_000..]);
        // The second range went straight to the remembered target.
        assert_eq!(w.registry.count("GET", "/v2/r/blobs/"), 1);
        assert_eq!(w.storage.count("GET", "/store/"), 2);
        // The storage host, another origin, never saw the registry's token.
        for s in w.storage.seen.lock().unwrap().iter() {
            assert_eq!(s.header("authorization"), None, "{s:?}");
            assert!(s.header("range").is_some());
        }
        // The signed URL expires: a 403 from storage asks the registry for a fresh one.
        w.expired.lock().unwrap().push(1);
        let (bytes, _) = w.client.get_blob_range(&w.digest, 0..10, true).unwrap();
        assert_eq!(bytes, &w.blob[..10]);
        assert_eq!(w.registry.count("GET", "/v2/r/blobs/"), 2);
        // A whole blob, by the same route (its caller checks its digest).
        let whole = w.client.get_blob_unchecked(&w.digest, 1 << 20).unwrap();
        assert_eq!(
            (Digest::of(&whole), whole),
            (w.digest.clone(), w.blob.clone())
        );
        let e = w.client.get_blob_unchecked(&w.digest, 100).unwrap_err();
        assert!(e.to_string().contains("larger than 100 bytes"), "{e}");
        let s = w.client.stats();
        assert!(s.requests.load(Ordering::Relaxed) >= 8);
        assert_eq!(s.bytes.load(Ordering::Relaxed), 500 + 1000 + 10 + 10_000);
    }

    #[test]
    fn only_an_exact_206_is_a_range() {
        let w = world();
        *w.mode.lock().unwrap() = Mode::Whole;
        let e = w.client.get_blob_range(&w.digest, 0..10, true).unwrap_err();
        assert!(matches!(e, FetchError::Failed(_)), "{e:?}");
        assert!(e.to_string().contains("HTTP 200: the whole blob"), "{e}");
        *w.mode.lock().unwrap() = Mode::WrongRange;
        let e = w.client.get_blob_range(&w.digest, 0..10, true).unwrap_err();
        assert!(matches!(e, FetchError::Failed(_)), "{e:?}");
        assert!(
            e.to_string().contains("Content-Range \"bytes 1-9/10000\""),
            "{e}"
        );
        // Every storage request failed, so no target is remembered.
        assert!(w.client.redirects.lock().unwrap().is_empty());
    }

    #[test]
    fn manifests_errors_name_the_registry_code() {
        let w = world();
        let e = w
            .client
            .get_manifest(&Target::Tag("nope".into()))
            .unwrap_err();
        assert!(matches!(e, FetchError::NotFound(_)), "{e:?}");
        assert_eq!(
            e.to_string(),
            format!(
                "manifest 127.0.0.1:{}/r:nope: HTTP 404 Not Found: MANIFEST_UNKNOWN: manifest \
                 unknown",
                w.registry.port
            )
        );
    }
}
