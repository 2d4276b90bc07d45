//! The one retry rule of remote requests (object stores and registries alike): an attempt runs
//! under a permit of the client's bound on requests in flight, and a failed one is retried after
//! a timeout, a connection error, a 5xx or a 429, with exponential backoff (0.2 s doubling, at
//! most 5 s) or the server's `Retry-After` when that is longer. Every other failure ends at once
//! as the [`FetchError`] of its class.

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::client::{FetchError, Permits, Stats};

/// How a failed attempt is handled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// A connection error, a 5xx, a 429, a short answer: tried again.
    Retry,
    /// No (complete) answer within the timeout: retried like [`Class::Retry`], unless the
    /// caller can ask for less instead.
    Timeout,
    NotFound,
    Denied,
    /// The object is no longer the version asked for.
    Changed,
    Fatal,
}

/// A failed attempt: its class, the reason (one line, no secrets), and a server's
/// `Retry-After`.
#[derive(Debug)]
pub struct Failure {
    pub class: Class,
    pub why: String,
    pub retry_after: Option<Duration>,
}

impl Failure {
    pub fn new(class: Class, why: impl Into<String>) -> Failure {
        Failure {
            class,
            why: why.into(),
            retry_after: None,
        }
    }
}

/// How a client retries: its bound on requests in flight, its counters, and its settings.
pub struct Retries<'a> {
    pub permits: &'a Permits,
    pub stats: &'a Stats,
    pub retries: u32,
    /// The request timeout, named in the message of a request that timed out.
    pub timeout: Duration,
}

impl Retries<'_> {
    /// Runs `attempt` until it succeeds or fails in a way that is not retried; `what` names
    /// the request in log lines and messages. With `shrinkable`, a timeout is returned at once
    /// ([`FetchError::TimedOut`]): the caller asks for fewer bytes rather than for the same
    /// ones again.
    pub fn run<T>(
        &self,
        what: &str,
        shrinkable: bool,
        mut attempt: impl FnMut() -> Result<T, Failure>,
    ) -> Result<T, FetchError> {
        let mut delay = Duration::from_millis(200);
        let mut tries = 0u32;
        loop {
            let result = {
                let _permit = self.permits.acquire();
                attempt()
            };
            let f = match result {
                Ok(v) => return Ok(v),
                Err(f) => f,
            };
            let why = match f.class {
                Class::Timeout => format!(
                    "timed out: no complete answer within {} s",
                    self.timeout.as_secs_f64()
                ),
                _ => f.why,
            };
            match f.class {
                Class::Timeout if shrinkable => {
                    self.stats.retries.fetch_add(1, Ordering::Relaxed);
                    return Err(FetchError::TimedOut(format!("{what}: {why}")));
                }
                Class::Retry | Class::Timeout if tries < self.retries => {
                    tries += 1;
                    self.stats.retries.fetch_add(1, Ordering::Relaxed);
                    let wait = f.retry_after.map_or(delay, |r| r.max(delay));
                    log::warn!(
                        "{what}: {why}; retry {tries} of {} in {} ms",
                        self.retries,
                        wait.as_millis()
                    );
                    std::thread::sleep(wait);
                    delay = (delay * 2).min(Duration::from_secs(5));
                }
                class => {
                    self.stats.failures.fetch_add(1, Ordering::Relaxed);
                    let after = if tries > 0 {
                        format!(" (after {tries} retries)")
                    } else {
                        String::new()
                    };
                    let msg = format!("{what}: {why}{after}");
                    return Err(match class {
                        Class::NotFound => FetchError::NotFound(msg),
                        Class::Denied => FetchError::Denied(msg),
                        Class::Changed => FetchError::Changed(msg),
                        Class::Timeout => FetchError::TimedOut(msg),
                        Class::Retry | Class::Fatal => FetchError::Failed(msg),
                    });
                }
            }
        }
    }
}
