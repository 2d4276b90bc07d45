//! One repository of one registry and the requests made to it (distribution API v2 on reqwest):
//! the `/v2/` probe that picks the scheme and learns the authentication challenge, our retry
//! loop (counted in [`Stats`], timeouts reported as [`FetchError::TimedOut`]), the bound on
//! requests in flight, bearer tokens, and redirects followed by hand so `Authorization` never
//! leaves the registry's origin. Reads are in `read.rs`, uploads in `upload.rs`.
//!
//! The API is blocking; a tokio runtime is built on the first request (the mount forks its
//! daemon before it opens remote sources, so threads only ever start in the daemon).

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use reqwest::header::{self, HeaderMap, HeaderValue};
use reqwest::{Method, StatusCode, Url};

use super::auth::{self, Challenge, Token};
use super::credentials::{self, Credentials};
use super::reference::Reference;
use crate::remote::client::{FetchError, Permits, Stats, network_runtime};
use crate::remote::retry::{Class, Failure, Retries};
use crate::remote::settings::Settings;

/// How a registry is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    /// Verify TLS certificates, and use plain HTTP only for loopback hosts. `false` (the
    /// `--tls-verify=false` of podman and skopeo) accepts any certificate and falls back to
    /// plain HTTP when HTTPS fails.
    pub tls_verify: bool,
    /// Ask tokens for `pull,push` rather than `pull`.
    pub push: bool,
}

/// The largest error body or other small answer read.
pub(super) const MAX_SMALL_BODY: usize = 64 << 10;
/// Most redirects followed for one request.
pub(super) const MAX_HOPS: usize = 5;
/// Longest `Retry-After` honoured.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);

pub(super) struct Live {
    pub rt: tokio::runtime::Runtime,
    pub http: reqwest::Client,
    /// `scheme://host:port` of the registry, as the probe found it.
    pub base: Url,
    pub challenge: Option<Challenge>,
}

/// A client for one repository of one registry. `Send + Sync`: share it in an `Arc`.
pub struct Registry {
    pub(super) registry: String,
    pub(super) repository: String,
    opts: Options,
    loopback: bool,
    pub(super) settings: Settings,
    pub(super) stats: Arc<Stats>,
    creds: Option<Credentials>,
    live: Mutex<Option<Arc<Live>>>,
    permits: Permits,
    token: Mutex<Option<Token>>,
    /// Where blob GETs were redirected, by digest, while the target answers.
    pub(super) redirects: Mutex<std::collections::HashMap<String, Url>>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("registry", &self.registry)
            .field("repository", &self.repository)
            .finish_non_exhaustive()
    }
}

/// A request to send (cloned for each retry and redirect).
#[derive(Clone)]
pub(super) struct Req {
    pub method: Method,
    pub url: Url,
    pub headers: HeaderMap,
    pub body: Option<Bytes>,
}

impl Req {
    pub fn new(method: Method, url: Url) -> Req {
        Req {
            method,
            url,
            headers: HeaderMap::new(),
            body: None,
        }
    }

    pub fn header(mut self, name: header::HeaderName, value: &str) -> Req {
        if let Ok(v) = HeaderValue::from_str(value) {
            self.headers.insert(name, v);
        }
        self
    }
}

/// `scheme://host:port` of `u`.
pub(super) fn origin(u: &Url) -> (String, Option<String>, Option<u16>) {
    (
        u.scheme().to_owned(),
        u.host_str().map(str::to_owned),
        u.port_or_known_default(),
    )
}

impl Registry {
    /// A client for `reference`'s registry and repository. Reads credentials (see
    /// `credentials.rs`) but makes no request and starts no thread.
    pub fn new(
        reference: &Reference,
        opts: Options,
        settings: Settings,
        stats: Arc<Stats>,
    ) -> Result<Registry, FetchError> {
        let creds = credentials::lookup(&reference.registry, &reference.repository)
            .map_err(FetchError::Config)?;
        if let Some(c) = &creds {
            log::debug!("{}: credentials of {}", reference.registry, c.origin);
        }
        Ok(Registry {
            registry: reference.registry.clone(),
            repository: reference.repository.clone(),
            opts,
            loopback: reference.is_loopback(),
            permits: Permits::new(settings.requests),
            settings,
            stats,
            creds,
            live: Mutex::new(None),
            token: Mutex::new(None),
            redirects: Mutex::new(Default::default()),
        })
    }

    /// The request counters.
    pub fn stats(&self) -> &Arc<Stats> {
        &self.stats
    }

    /// `REGISTRY/REPOSITORY`, for messages.
    pub(super) fn name(&self) -> String {
        format!("{}/{}", self.registry, self.repository)
    }

    /// The schemes tried, in order: HTTPS, then plain HTTP where it is allowed.
    pub fn schemes(loopback: bool, tls_verify: bool) -> &'static [&'static str] {
        if !tls_verify || loopback {
            &["https", "http"]
        } else {
            &["https"]
        }
    }

    pub(super) fn live(&self) -> Result<Arc<Live>, FetchError> {
        let mut slot = self.live.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(l) = &*slot {
            return Ok(l.clone());
        }
        let rt = network_runtime("kpack-oci")?;
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(self.settings.timeout)
            .connect_timeout(self.settings.connect_timeout)
            .danger_accept_invalid_certs(!self.opts.tls_verify)
            .user_agent(concat!("kpack-fuse/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| FetchError::Config(format!("cannot set up the HTTP client: {e}")))?;
        let live = Arc::new(self.probe(rt, http)?);
        *slot = Some(live.clone());
        Ok(live)
    }

    /// `GET /v2/` over each allowed scheme until one answers: the scheme that answered, and
    /// the authentication challenge when it said 401.
    fn probe(
        &self,
        rt: tokio::runtime::Runtime,
        http: reqwest::Client,
    ) -> Result<Live, FetchError> {
        let schemes = Registry::schemes(self.loopback, self.opts.tls_verify);
        let mut last = String::new();
        for (i, scheme) in schemes.iter().enumerate() {
            let base = Url::parse(&format!("{scheme}://{}/", self.registry))
                .map_err(|e| FetchError::Config(format!("{}: {e}", self.registry)))?;
            let v2 = base.join("v2/").expect("a relative path");
            let what = format!("{} ({v2})", self.name());
            // HTTPS is tried once when plain HTTP may follow; the last scheme gets the retries.
            let retries = if i + 1 < schemes.len() {
                0
            } else {
                self.settings.retries
            };
            let answer = self.retrying(&what, false, retries, || {
                self.stats.requests.fetch_add(1, Ordering::Relaxed);
                rt.block_on(async {
                    let r = http.get(v2.clone()).send().await.map_err(transport)?;
                    match r.status().as_u16() {
                        200..=299 => Ok(None),
                        401 => {
                            let h = r
                                .headers()
                                .get(header::WWW_AUTHENTICATE)
                                .and_then(|v| v.to_str().ok())
                                .map(str::to_owned)
                                .ok_or_else(|| {
                                    Failure::new(Class::Denied, "HTTP 401 without WWW-Authenticate")
                                })?;
                            let challenge = auth::parse_challenge(&h).map_err(|w| {
                                Failure::new(Class::Fatal, format!("HTTP 401: {w}"))
                            })?;
                            if challenge == Challenge::Basic {
                                self.check_basic(&http, &v2, status_failure(r).await)
                                    .await?;
                            }
                            Ok(Some(challenge))
                        }
                        _ => Err(status_failure(r).await),
                    }
                })
            });
            match answer {
                Ok(challenge) => {
                    return Ok(Live {
                        rt,
                        http,
                        base,
                        challenge,
                    });
                }
                Err(FetchError::Failed(m) | FetchError::TimedOut(m)) if i + 1 < schemes.len() => {
                    // A probe, not a failure: a loopback registry without TLS is the usual
                    // case, and `remote_failures` must stay 0 on a healthy mount.
                    self.stats.failures.fetch_sub(1, Ordering::Relaxed);
                    log::debug!("{m}; trying plain HTTP");
                    last = m;
                }
                Err(e) => {
                    let unreached = matches!(e, FetchError::Failed(_) | FetchError::TimedOut(_));
                    let hint = if schemes.len() == 1 && unreached {
                        " (plain HTTP is used only for loopback registries, or with \
                         --tls-verify=false)"
                    } else {
                        ""
                    };
                    return Err(match e {
                        FetchError::Failed(m) => FetchError::Failed(format!("{m}{hint}")),
                        FetchError::TimedOut(m) => FetchError::TimedOut(format!("{m}{hint}")),
                        other => other,
                    });
                }
            }
        }
        Err(FetchError::Failed(last))
    }

    /// After `/v2/` asked for Basic authentication (`refused`, its answer without
    /// credentials): refuses at once when there are no credentials, else checks them with a
    /// second `GET /v2/`, so a wrong password is reported with the registry's error code.
    async fn check_basic(
        &self,
        http: &reqwest::Client,
        v2: &Url,
        refused: Failure,
    ) -> Result<(), Failure> {
        let Some(c) = &self.creds else {
            return Err(Failure::new(
                Class::Denied,
                format!(
                    "{}; no credentials for {} in REGISTRY_AUTH_FILE, \
                     $XDG_RUNTIME_DIR/containers/auth.json or ~/.docker/config.json",
                    refused.why, self.registry
                ),
            ));
        };
        self.stats.requests.fetch_add(1, Ordering::Relaxed);
        let r = http
            .get(v2.clone())
            .header(header::AUTHORIZATION, c.basic_header())
            .send()
            .await
            .map_err(transport)?;
        if r.status().is_success() {
            return Ok(());
        }
        let mut f = status_failure(r).await;
        f.why = format!("{} (credentials from {})", f.why, c.origin);
        Err(f)
    }

    /// Runs `attempt` with the retry policy of [`Settings`]; see [`Registry::retrying`].
    pub(super) fn with_retries<T>(
        &self,
        what: &str,
        shrinkable: bool,
        attempt: impl FnMut() -> Result<T, Failure>,
    ) -> Result<T, FetchError> {
        self.retrying(what, shrinkable, self.settings.retries, attempt)
    }

    /// Runs `attempt` (one request, or one short exchange) with [`Retries::run`]: retried
    /// `retries` times at most.
    fn retrying<T>(
        &self,
        what: &str,
        shrinkable: bool,
        retries: u32,
        attempt: impl FnMut() -> Result<T, Failure>,
    ) -> Result<T, FetchError> {
        Retries {
            permits: &self.permits,
            stats: &self.stats,
            retries,
            timeout: self.settings.timeout,
        }
        .run(what, shrinkable, attempt)
    }

    /// The `Authorization` value for the registry's origin, fetching a token when the
    /// challenge is Bearer and none is valid.
    async fn authorization(&self, live: &Live) -> Result<Option<String>, Failure> {
        match &live.challenge {
            None => Ok(None),
            Some(Challenge::Basic) => Ok(self.creds.as_ref().map(Credentials::basic_header)),
            Some(Challenge::Bearer { realm, service, .. }) => {
                let cached = self
                    .token
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .clone()
                    .filter(Token::valid);
                let token = match cached {
                    Some(t) => t,
                    None => {
                        let t = self.fetch_token(live, realm, service.as_deref()).await?;
                        *self.token.lock().unwrap_or_else(|p| p.into_inner()) = Some(t.clone());
                        t
                    }
                };
                Ok(Some(format!("Bearer {}", token.value)))
            }
        }
    }

    async fn fetch_token(
        &self,
        live: &Live,
        realm: &str,
        service: Option<&str>,
    ) -> Result<Token, Failure> {
        let mut url = Url::parse(realm).map_err(|e| {
            Failure::new(
                Class::Fatal,
                format!("token realm {realm:?} is not a URL: {e}"),
            )
        })?;
        {
            let mut q = url.query_pairs_mut();
            if let Some(s) = service {
                q.append_pair("service", s);
            }
            q.append_pair("scope", &auth::scope(&self.repository, self.opts.push));
        }
        let shown = format!("token service {}", url.origin().ascii_serialization());
        let mut rb = live.http.get(url);
        if let Some(c) = &self.creds {
            rb = rb.header(header::AUTHORIZATION, c.basic_header());
        }
        self.stats.requests.fetch_add(1, Ordering::Relaxed);
        let r = rb.send().await.map_err(transport)?;
        if !r.status().is_success() {
            let mut f = status_failure(r).await;
            f.why = format!("{shown}: {}", f.why);
            return Err(f);
        }
        let body = read_limited(r, auth::MAX_TOKEN_ANSWER as u64)
            .await
            .map_err(|e| {
                let mut f = Failure::from(e);
                f.why = format!("{shown}: {}", f.why);
                f
            })?;
        auth::parse_token_answer(&body, Instant::now())
            .map_err(|w| Failure::new(Class::Fatal, format!("{shown}: {w}")))
    }

    /// Sends `req` once, with the registry's `Authorization` only when it goes to the
    /// registry's origin; a 401 from there drops the token and resends once with a fresh one.
    pub(super) async fn send(&self, live: &Live, req: &Req) -> Result<reqwest::Response, Failure> {
        let ours = origin(&req.url) == origin(&live.base);
        let mut refreshed = false;
        loop {
            let mut rb = live
                .http
                .request(req.method.clone(), req.url.clone())
                .headers(req.headers.clone());
            if ours {
                if let Some(a) = self.authorization(live).await? {
                    rb = rb.header(header::AUTHORIZATION, a);
                }
            }
            if let Some(b) = &req.body {
                rb = rb.body(b.clone());
            }
            self.stats.requests.fetch_add(1, Ordering::Relaxed);
            let r = rb.send().await.map_err(transport)?;
            let bearer = matches!(live.challenge, Some(Challenge::Bearer { .. }));
            if r.status() == StatusCode::UNAUTHORIZED && ours && bearer && !refreshed {
                *self.token.lock().unwrap_or_else(|p| p.into_inner()) = None;
                refreshed = true;
                continue;
            }
            return Ok(r);
        }
    }

    /// `url` of the registry for `path` (below `/v2/NAME/`).
    pub(super) fn url(&self, live: &Live, path: &str) -> Url {
        live.base
            .join(&format!("v2/{}/{path}", self.repository))
            .expect("a relative path")
    }
}

/// The class and reason of a request that got no (complete) answer.
pub(super) fn transport(e: reqwest::Error) -> Failure {
    let mut deepest = None;
    let mut cur: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(&e);
    let mut cert = false;
    while let Some(x) = cur {
        let t = x.to_string();
        cert |= t.to_ascii_lowercase().contains("certificate");
        deepest = Some(t);
        cur = x.source();
    }
    let class = if cert {
        Class::Fatal
    } else if e.is_timeout() && !e.is_connect() {
        Class::Timeout
    } else if e.is_connect() || e.is_request() || e.is_body() || e.is_decode() || e.is_timeout() {
        // `Response::chunk` reports a connection reset or closed mid-body as a decode error
        // (no decompression is enabled, so nothing else is one): retried like any connection
        // error.
        Class::Retry
    } else {
        Class::Fatal
    };
    let kind = if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "cannot connect"
    } else {
        "request failed"
    };
    let why = match deepest {
        Some(d) => format!("{kind}: {d}"),
        None => kind.to_owned(),
    };
    Failure::new(class, why.replace('\n', " "))
}

/// Reads at most `limit` bytes of `r`'s body; more is an error.
pub(super) async fn read_limited(
    mut r: reqwest::Response,
    limit: u64,
) -> Result<Vec<u8>, BodyError> {
    if let Some(n) = r.content_length() {
        if n > limit {
            return Err(BodyError::TooLong(format!(
                "the answer is {n} bytes, more than the {limit} read"
            )));
        }
    }
    let mut out = Vec::new();
    while let Some(chunk) = r.chunk().await.map_err(transport)? {
        if out.len() as u64 + chunk.len() as u64 > limit {
            return Err(BodyError::TooLong(format!(
                "the answer is longer than the {limit} bytes read"
            )));
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

/// Why [`read_limited`] returned no body: the answer is longer than the limit (a reason any
/// caller may word for what it reads), or the transfer failed.
pub(super) enum BodyError {
    TooLong(String),
    Failed(Failure),
}

impl From<Failure> for BodyError {
    fn from(f: Failure) -> BodyError {
        BodyError::Failed(f)
    }
}

impl From<BodyError> for Failure {
    fn from(e: BodyError) -> Failure {
        match e {
            BodyError::TooLong(why) => Failure::new(Class::Fatal, why),
            BodyError::Failed(f) => f,
        }
    }
}

/// A `Retry-After` value: seconds, or an HTTP date; capped.
pub(super) fn retry_after(v: &str, now: chrono::DateTime<chrono::Utc>) -> Option<Duration> {
    let v = v.trim();
    let d = if let Ok(s) = v.parse::<u64>() {
        Duration::from_secs(s)
    } else {
        let at = chrono::DateTime::parse_from_rfc2822(v).ok()?;
        (at.with_timezone(&chrono::Utc) - now)
            .to_std()
            .unwrap_or(Duration::ZERO)
    };
    Some(d.min(MAX_RETRY_AFTER))
}

/// The failure of a non-success answer: its class by status, and a one-line reason with the
/// HTTP status and the registry's error codes and messages.
pub(super) async fn status_failure(r: reqwest::Response) -> Failure {
    let status = r.status();
    let after = r
        .headers()
        .get(header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| retry_after(v, chrono::Utc::now()));
    let body = read_limited(r, MAX_SMALL_BODY as u64)
        .await
        .unwrap_or_default();
    let class = match status.as_u16() {
        404 => Class::NotFound,
        401 | 403 => Class::Denied,
        408 | 429 | 500..=599 => Class::Retry,
        _ => Class::Fatal,
    };
    let mut why = format!("HTTP {status}");
    if let Some(codes) = error_codes(&body) {
        why.push_str(": ");
        why.push_str(&codes);
    }
    Failure {
        class,
        why,
        retry_after: after,
    }
}

/// `s` (something a server sent) fit for a one-line message: control characters as spaces, at
/// most `max` characters, then `…`.
pub(super) fn one_line(s: &str, max: usize) -> String {
    let mut out: String = s
        .chars()
        .take(max)
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if s.chars().nth(max).is_some() {
        out.push('…');
    }
    out
}

/// `CODE: message; CODE: message` of a distribution error body, on one line, bounded.
pub(super) fn error_codes(body: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Body {
        errors: Vec<Item>,
    }
    #[derive(serde::Deserialize)]
    struct Item {
        code: Option<String>,
        message: Option<String>,
    }
    let b: Body = serde_json::from_slice(body).ok()?;
    let clean = |s: &str| one_line(s, 200);
    let parts: Vec<String> = b
        .errors
        .iter()
        .take(4)
        .filter_map(|e| match (&e.code, &e.message) {
            (Some(c), Some(m)) if !m.is_empty() => Some(format!("{}: {}", clean(c), clean(m))),
            (Some(c), _) => Some(clean(c)),
            (None, Some(m)) => Some(clean(m)),
            (None, None) => None,
        })
        .collect();
    (!parts.is_empty()).then(|| parts.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_bodies_become_one_line() {
        assert_eq!(
            error_codes(br#"{"errors":[{"code":"MANIFEST_UNKNOWN","message":"manifest unknown","detail":{"Tag":"x"}}]}"#),
            Some("MANIFEST_UNKNOWN: manifest unknown".into())
        );
        assert_eq!(
            error_codes(
                br#"{"errors":[{"code":"UNAUTHORIZED","message":"a\nb"},{"code":"DENIED"}]}"#
            ),
            Some("UNAUTHORIZED: a b; DENIED".into())
        );
        assert_eq!(error_codes(b"<html>"), None);
        assert_eq!(error_codes(br#"{"errors":[]}"#), None);
    }

    #[test]
    fn retry_after_is_seconds_or_a_date_and_capped() {
        let now = chrono::DateTime::parse_from_rfc2822("Sun, 06 Nov 1994 08:49:37 GMT")
            .unwrap()
            .with_timezone(&chrono::Utc);
        assert_eq!(retry_after("3", now), Some(Duration::from_secs(3)));
        assert_eq!(retry_after("9999", now), Some(MAX_RETRY_AFTER));
        assert_eq!(
            retry_after("Sun, 06 Nov 1994 08:49:47 GMT", now),
            Some(Duration::from_secs(10))
        );
        assert_eq!(
            retry_after("Sun, 06 Nov 1994 08:49:00 GMT", now),
            Some(Duration::ZERO)
        );
        assert_eq!(retry_after("soon", now), None);
    }

    #[test]
    fn a_registry_is_shared_between_threads() {
        fn shareable<T: Send + Sync>() {}
        shareable::<Registry>();
    }

    #[test]
    fn plain_http_only_for_loopback_or_without_verification() {
        let schemes = |r: &str, verify| {
            let r = Reference::parse(&format!("oci://{r}/x")).unwrap();
            Registry::schemes(r.is_loopback(), verify)
        };
        assert_eq!(schemes("ghcr.io", true), &["https"]);
        assert_eq!(schemes("ghcr.io", false), &["https", "http"]);
        assert_eq!(schemes("127.0.0.1:5000", true), &["https", "http"]);
        assert_eq!(schemes("localhost", true), &["https", "http"]);
        assert_eq!(schemes("[::1]:80", true), &["https", "http"]);
        assert_eq!(schemes("10.0.0.1", true), &["https"]);
    }
}
