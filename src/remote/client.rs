//! One object store (an S3 bucket or an HTTP server) and the requests made to it: ranged GETs
//! and listings, with our own retry loop (so retries can be counted and logged), a bound on
//! requests in flight, and counters for `user.kpack.stats`.
//!
//! The client library (`object_store`) runs on a tokio runtime, built lazily on the first
//! request. A runtime owns threads: the mount forks into the background before it opens a
//! remote source, so they only ever start in the daemon.

use std::fmt;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use object_store::aws::AmazonS3Builder;
use object_store::http::HttpBuilder;
use object_store::path::Path as ObjectPath;
use object_store::{
    BackoffConfig, ClientOptions, GetOptions, GetRange, ObjectMeta, ObjectStore, RetryConfig,
};

use super::credentials;
use super::retry::{Class, Failure, Retries};
use super::settings::Settings;

/// Where requests go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    S3 { bucket: String },
    Http { base: String },
}

/// Request counters, shared by every object of a mount (or a command).
#[derive(Debug, Default)]
pub struct Stats {
    pub requests: AtomicU64,
    pub bytes: AtomicU64,
    pub retries: AtomicU64,
    pub failures: AtomicU64,
}

impl Stats {
    /// Numeric `name value` lines for `user.kpack.stats`.
    pub fn to_text(&self) -> String {
        format!(
            "remote_requests {}\nremote_bytes_fetched {}\nremote_retries {}\nremote_failures {}\n",
            self.requests.load(Ordering::Relaxed),
            self.bytes.load(Ordering::Relaxed),
            self.retries.load(Ordering::Relaxed),
            self.failures.load(Ordering::Relaxed),
        )
    }
}

/// Why a request failed, after any retries. Each carries the server's reason (or the
/// transport's), never credentials.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FetchError {
    /// 404: the object (or bucket) does not exist.
    NotFound(String),
    /// 401/403: credentials refused or missing.
    Denied(String),
    /// 412, or a response whose version differs: the object changed.
    Changed(String),
    /// No answer within the request timeout, after the retries (or at once for a request the
    /// caller can shrink: see [`Client::get`]).
    TimedOut(String),
    /// Still failing after the retries (connection errors, 5xx, 429), or a non-retryable
    /// answer.
    Failed(String),
    /// The client could not be set up (bad endpoint, no credentials).
    Config(String),
}

impl fmt::Display for FetchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FetchError::NotFound(m)
            | FetchError::Denied(m)
            | FetchError::Changed(m)
            | FetchError::TimedOut(m)
            | FetchError::Failed(m)
            | FetchError::Config(m) => f.write_str(m),
        }
    }
}

/// What identifies one version of an object: the ETag when the server sends one, else the
/// modification time and length.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Version {
    pub etag: Option<String>,
    pub last_modified: String,
    /// The same time, for the mount's directory and file times.
    pub modified: std::time::SystemTime,
    pub size: u64,
}

impl Version {
    pub fn of(meta: &ObjectMeta) -> Version {
        Version {
            etag: meta.e_tag.clone(),
            last_modified: meta.last_modified.to_rfc3339(),
            modified: meta.last_modified.into(),
            size: meta.size,
        }
    }

    /// Whether `other` is the same version (ETags when both have one).
    pub fn same(&self, other: &Version) -> bool {
        match (&self.etag, &other.etag) {
            (Some(a), Some(b)) => a == b && self.size == other.size,
            _ => self.last_modified == other.last_modified && self.size == other.size,
        }
    }

    pub fn token(&self) -> String {
        match &self.etag {
            Some(e) => format!("etag:{e}:{}", self.size),
            None => format!("modified:{}:{}", self.last_modified, self.size),
        }
    }
}

/// One object of a [`Client`]'s store, read by range.
#[derive(Debug)]
pub struct StoreObject {
    client: Arc<Client>,
    path: ObjectPath,
}

impl StoreObject {
    pub fn new(client: Arc<Client>, path: ObjectPath) -> StoreObject {
        StoreObject { client, path }
    }
}

impl super::object::Ranges for StoreObject {
    fn get(
        &self,
        what: &str,
        range: Range<u64>,
        expect: Option<&Version>,
        shrinkable: bool,
    ) -> Result<Fetched, FetchError> {
        self.client.get(what, &self.path, range, expect, shrinkable)
    }
}

/// A ranged GET's answer.
pub struct Fetched {
    pub bytes: Vec<u8>,
    pub version: Version,
    /// The object's total length.
    pub size: u64,
}

struct Live {
    rt: tokio::runtime::Runtime,
    store: Arc<dyn ObjectStore>,
}

/// The runtime a network client runs its requests on, built on its first request (the mount
/// forks before opening a source, and a runtime owns threads): two workers named `name`.
pub(crate) fn network_runtime(name: &str) -> Result<tokio::runtime::Runtime, FetchError> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name(name)
        .enable_all()
        .build()
        .map_err(|e| FetchError::Config(format!("cannot start the network runtime: {e}")))
}

/// A counting semaphore bounding requests in flight (blocking threads wait on it); the
/// `oci://` registry client bounds its requests with the same.
#[derive(Debug)]
pub(crate) struct Permits {
    free: Mutex<u32>,
    cv: Condvar,
}

pub(crate) struct Permit<'a>(&'a Permits);

impl Permits {
    /// `n` permits (at least one).
    pub(crate) fn new(n: u32) -> Permits {
        Permits {
            free: Mutex::new(n.max(1)),
            cv: Condvar::new(),
        }
    }

    pub(crate) fn acquire(&self) -> Permit<'_> {
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        while *free == 0 {
            free = self.cv.wait(free).unwrap_or_else(|p| p.into_inner());
        }
        *free -= 1;
        Permit(self)
    }
}

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        *self.0.free.lock().unwrap_or_else(|p| p.into_inner()) += 1;
        self.0.cv.notify_one();
    }
}

/// Requests to one endpoint.
pub struct Client {
    endpoint: Endpoint,
    settings: Settings,
    live: Mutex<Option<Arc<Live>>>,
    permits: Permits,
    stats: Arc<Stats>,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("endpoint", &self.endpoint)
            .finish_non_exhaustive()
    }
}

impl Client {
    pub fn new(endpoint: Endpoint, settings: Settings, stats: Arc<Stats>) -> Client {
        Client {
            permits: Permits::new(settings.requests),
            endpoint,
            settings,
            live: Mutex::new(None),
            stats,
        }
    }

    fn live(&self) -> Result<Arc<Live>, FetchError> {
        let mut slot = self.live.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(l) = &*slot {
            return Ok(l.clone());
        }
        let rt = network_runtime("kpack-remote")?;
        let store = self.build_store()?;
        let live = Arc::new(Live { rt, store });
        *slot = Some(live.clone());
        Ok(live)
    }

    fn client_options(&self, allow_http: bool) -> ClientOptions {
        ClientOptions::new()
            .with_timeout(self.settings.timeout)
            .with_connect_timeout(self.settings.connect_timeout)
            .with_allow_http(allow_http)
    }

    fn build_store(&self) -> Result<Arc<dyn ObjectStore>, FetchError> {
        // Retries are ours (counted, logged, and classified the same for every store).
        let no_retry = RetryConfig {
            backoff: BackoffConfig::default(),
            max_retries: 0,
            retry_timeout: self.settings.timeout,
        };
        match &self.endpoint {
            Endpoint::Http { base } => HttpBuilder::new()
                .with_url(base.clone())
                .with_client_options(self.client_options(true))
                .with_retry(no_retry)
                .build()
                .map(|s| Arc::new(s) as Arc<dyn ObjectStore>)
                .map_err(|e| FetchError::Config(format!("{base}: {}", reason(&e)))),
            Endpoint::S3 { bucket } => {
                let allow_http = env_true("AWS_ALLOW_HTTP");
                let mut b = AmazonS3Builder::from_env()
                    .with_bucket_name(bucket.clone())
                    .with_virtual_hosted_style_request(false)
                    .with_client_options(self.client_options(allow_http))
                    .with_retry(no_retry);
                let files = credentials::from_files();
                if std::env::var_os("AWS_ACCESS_KEY_ID").is_none() {
                    if let Some(c) = &files.credentials {
                        b = b
                            .with_access_key_id(c.access_key_id.clone())
                            .with_secret_access_key(c.secret_access_key.clone());
                        if let Some(t) = &c.session_token {
                            b = b.with_token(t.clone());
                        }
                    } else if env_true("AWS_EC2_METADATA_DISABLED")
                        && std::env::var_os("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI").is_none()
                        && std::env::var_os("AWS_CONTAINER_CREDENTIALS_FULL_URI").is_none()
                        && std::env::var_os("AWS_WEB_IDENTITY_TOKEN_FILE").is_none()
                    {
                        return Err(FetchError::Config(
                            "no AWS credentials: set AWS_ACCESS_KEY_ID and \
                             AWS_SECRET_ACCESS_KEY, or a profile in ~/.aws/credentials \
                             (instance metadata is disabled by AWS_EC2_METADATA_DISABLED)"
                                .into(),
                        ));
                    }
                }
                if std::env::var_os("AWS_REGION").is_none()
                    && std::env::var_os("AWS_DEFAULT_REGION").is_none()
                {
                    if let Some(r) = &files.region {
                        b = b.with_region(r.clone());
                    }
                }
                let endpoint = self.settings.endpoint_url.clone().or_else(|| {
                    std::env::var("AWS_ENDPOINT_URL")
                        .ok()
                        .or_else(|| files.endpoint_url.clone())
                });
                if let Some(ep) = endpoint {
                    if ep.to_ascii_lowercase().starts_with("http://") && !allow_http {
                        return Err(FetchError::Config(format!(
                            "endpoint {ep} is plain http: set AWS_ALLOW_HTTP=true to allow it"
                        )));
                    }
                    b = b.with_endpoint(ep);
                }
                b.build()
                    .map(|s| Arc::new(s) as Arc<dyn ObjectStore>)
                    .map_err(|e| FetchError::Config(format!("s3://{bucket}: {}", reason(&e))))
            }
        }
    }

    /// Runs `attempt` with the retry policy: retried after timeouts, connection errors, 5xx and
    /// 429, with exponential backoff; `what` names the request in log lines and messages. With
    /// `shrinkable`, a timeout is returned at once ([`FetchError::TimedOut`]): the caller asks
    /// for fewer bytes rather than for the same ones again.
    fn with_retries<T>(
        &self,
        what: &str,
        shrinkable: bool,
        attempt: impl Fn(&Live) -> Result<T, object_store::Error>,
    ) -> Result<T, FetchError> {
        let live = self.live()?;
        let retries = Retries {
            permits: &self.permits,
            stats: &self.stats,
            retries: self.settings.retries,
            timeout: self.settings.timeout,
        };
        retries.run(what, shrinkable, || {
            self.stats.requests.fetch_add(1, Ordering::Relaxed);
            attempt(&live).map_err(|e| Failure::new(classify(&e), reason(&e)))
        })
    }

    /// GETs `range` of `path`; with `expect`, only that version (`If-Match`, and the answer's
    /// version is compared too, for servers that ignore it). With `shrinkable`, a timeout
    /// returns [`FetchError::TimedOut`] at once, for the caller to ask for a smaller range.
    pub fn get(
        &self,
        what: &str,
        path: &ObjectPath,
        range: Range<u64>,
        expect: Option<&Version>,
        shrinkable: bool,
    ) -> Result<Fetched, FetchError> {
        let fetched = self.with_retries(what, shrinkable, |live| {
            let opts = GetOptions {
                range: Some(GetRange::Bounded(range.clone())),
                if_match: expect.and_then(|v| v.etag.clone()),
                ..GetOptions::default()
            };
            live.rt.block_on(async {
                let r = live.store.get_opts(path, opts).await?;
                let meta = r.meta.clone();
                let bytes = r.bytes().await?;
                Ok(Fetched {
                    bytes: bytes.to_vec(),
                    version: Version::of(&meta),
                    size: meta.size,
                })
            })
        })?;
        self.stats
            .bytes
            .fetch_add(fetched.bytes.len() as u64, Ordering::Relaxed);
        if let Some(v) = expect {
            if !v.same(&fetched.version) {
                return Err(FetchError::Changed(format!(
                    "{what}: the object changed since it was opened ({} -> {})",
                    v.token(),
                    fetched.version.token()
                )));
            }
        }
        Ok(fetched)
    }

    /// The objects directly under `prefix` (S3 listing with a delimiter).
    pub fn list(&self, what: &str, prefix: &str) -> Result<Vec<ObjectMeta>, FetchError> {
        let p = if prefix.is_empty() {
            None
        } else {
            Some(
                ObjectPath::parse(prefix.trim_end_matches('/'))
                    .map_err(|e| FetchError::Failed(format!("{what}: not a usable prefix: {e}")))?,
            )
        };
        self.with_retries(what, false, |live| {
            live.rt
                .block_on(live.store.list_with_delimiter(p.as_ref()))
                .map(|l| l.objects)
        })
    }
}

fn env_true(name: &str) -> bool {
    std::env::var(name)
        .map(|v| matches!(v.to_ascii_lowercase().as_str(), "true" | "1" | "yes"))
        .unwrap_or(false)
}

/// How a failed attempt is handled, from the error's variant, then from the HTTP status or the
/// transport error found in its chain.
fn classify(e: &object_store::Error) -> Class {
    use object_store::Error as E;
    match e {
        E::NotFound { .. } => return Class::NotFound,
        E::Precondition { .. } => return Class::Changed,
        E::PermissionDenied { .. } | E::Unauthenticated { .. } => return Class::Denied,
        _ => {}
    }
    if let Some(r) = transport_error(e) {
        // A certificate the client does not trust (or one the server rejects) fails the same
        // way on every attempt: retrying only delays the error.
        if certificate_refused(e) {
            return Class::Fatal;
        }
        // A slow answer, not a host that cannot be reached: asking for less may get through.
        if r.is_timeout() && !r.is_connect() {
            return Class::Timeout;
        }
        return if r.is_connect() || r.is_request() || r.is_body() || r.is_timeout() {
            Class::Retry
        } else {
            Class::Fatal
        };
    }
    match status_in(&e.to_string()) {
        Some(404) => Class::NotFound,
        Some(401 | 403) => Class::Denied,
        Some(412) => Class::Changed,
        Some(408 | 429 | 500..=599) => Class::Retry,
        _ => Class::Fatal,
    }
}

/// The HTTP client's error in `e`'s chain: a request that got no (complete) answer.
fn transport_error<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a reqwest::Error> {
    let mut cur = Some(e);
    while let Some(x) = cur {
        if let Some(r) = x.downcast_ref::<reqwest::Error>() {
            return Some(r);
        }
        cur = x.source();
    }
    None
}

/// Whether a TLS handshake failed over a certificate. rustls reports it only as an error value
/// deep in the chain (wrapped in the connector's `io::Error`), so its text is what is stable.
fn certificate_refused(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(x) = cur {
        if x.to_string().to_ascii_lowercase().contains("certificate") {
            return true;
        }
        cur = x.source();
    }
    false
}

/// The HTTP status in an object_store error text ("... status code: 503 Service ...").
fn status_in(text: &str) -> Option<u16> {
    let at = text.find("status code: ")? + "status code: ".len();
    text.get(at..at + 3)?.parse().ok()
}

/// The server's reason in a short form: S3's `<Code>` and `<Message>` when the body has them,
/// else the HTTP status line, else the transport's deepest cause (object_store's texts carry
/// the URL and status, never credentials).
pub fn reason(e: &(dyn std::error::Error + 'static)) -> String {
    let text = e.to_string();
    let tag = |name: &str| {
        let open = format!("<{name}>");
        let close = format!("</{name}>");
        let start = text.find(&open)? + open.len();
        let len = text[start..].find(&close)?;
        Some(text[start..start + len].to_owned())
    };
    let status_line = || {
        let at = text.find("status code: ")? + "status code: ".len();
        let rest = &text[at..];
        Some(
            rest[..rest.find(':').unwrap_or(rest.len())]
                .trim()
                .to_owned(),
        )
    };
    if let Some(line) = status_line() {
        return match (tag("Code"), tag("Message")) {
            (Some(code), Some(msg)) => format!("HTTP {line}: {code}: {msg}"),
            (Some(code), None) => format!("HTTP {line}: {code}"),
            _ => format!("HTTP {line}"),
        };
    }
    let kind = transport_error(e).map(|r| {
        if r.is_timeout() {
            "timed out"
        } else if r.is_connect() {
            "cannot connect"
        } else {
            "request failed"
        }
    });
    let mut deepest = None;
    let mut cur = e.source();
    while let Some(x) = cur {
        deepest = Some(x.to_string());
        cur = x.source();
    }
    match (kind, deepest) {
        (Some(k), Some(d)) => format!("{k}: {d}"),
        (None, Some(d)) if !d.is_empty() => d,
        _ => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn certificate_failures_are_found_anywhere_in_the_chain() {
        #[derive(Debug)]
        struct Outer(std::io::Error);
        impl std::fmt::Display for Outer {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("error sending request")
            }
        }
        impl std::error::Error for Outer {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let tls = std::io::Error::other("invalid peer certificate: UnknownIssuer");
        assert!(certificate_refused(&Outer(tls)));
        let refused = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        assert!(!certificate_refused(&Outer(refused)));
    }

    #[test]
    fn status_and_reason_are_read_from_error_texts() {
        assert_eq!(
            status_in("Server returned non-2xx status code: 503 Service Unavailable: x"),
            Some(503)
        );
        assert_eq!(status_in("connection refused"), None);
        #[derive(Debug)]
        struct T(&'static str);
        impl fmt::Display for T {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.0)
            }
        }
        impl std::error::Error for T {}
        let s3 = T(
            "Error performing GET http://127.0.0.1:1/b/k in 2ms - Server returned \
                    non-2xx status code: 403 Forbidden: <?xml version=\"1.0\"?><Error>\
                    <Code>SignatureDoesNotMatch</Code><Message>The request signature we \
                    calculated does not match</Message></Error>",
        );
        assert_eq!(
            reason(&s3),
            "HTTP 403 Forbidden: SignatureDoesNotMatch: The request signature we calculated does \
             not match"
        );
        let html = T(
            "Error performing GET http://h/x in 1ms - Server returned non-2xx status \
                      code: 404 Not Found: <html><body>404</body></html>",
        );
        assert_eq!(reason(&html), "HTTP 404 Not Found");
        assert_eq!(reason(&T("connect error")), "connect error");
    }

    #[test]
    fn versions_compare_by_etag_else_by_time_and_length() {
        let v = |etag: Option<&str>, lm: &str, size| Version {
            etag: etag.map(str::to_owned),
            last_modified: lm.into(),
            modified: std::time::SystemTime::UNIX_EPOCH,
            size,
        };
        assert!(v(Some("\"a\""), "t1", 5).same(&v(Some("\"a\""), "t2", 5)));
        assert!(!v(Some("\"a\""), "t1", 5).same(&v(Some("\"b\""), "t1", 5)));
        assert!(v(None, "t1", 5).same(&v(Some("\"x\""), "t1", 5)));
        assert!(!v(None, "t1", 5).same(&v(None, "t1", 6)));
        assert!(!v(None, "t1", 5).same(&v(None, "t2", 5)));
        assert_eq!(v(Some("\"a\""), "t", 5).token(), "etag:\"a\":5");
        assert_eq!(v(None, "t", 5).token(), "modified:t:5");
    }

    #[test]
    fn stats_lines_are_numeric() {
        let s = Stats::default();
        s.requests.fetch_add(3, Ordering::Relaxed);
        s.bytes.fetch_add(4096, Ordering::Relaxed);
        assert_eq!(
            s.to_text(),
            "remote_requests 3\nremote_bytes_fetched 4096\nremote_retries 0\nremote_failures 0\n"
        );
    }
}
