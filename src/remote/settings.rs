//! Network settings of remote sources with their documented defaults. How a user gives them
//! (flags and `-o` items) is the command line's business (`cli/remote_args.rs`).

use std::time::Duration;

/// Default request timeout (whole request, headers and body).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// Default TCP/TLS connect timeout.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Default retries of one request after a timeout, a connection error, a 5xx or a 429.
pub const DEFAULT_RETRIES: u32 = 3;
/// Default requests in flight at once, per mount (or per command).
pub const DEFAULT_REQUESTS: u32 = 8;

/// The settings one remote source is opened with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// S3 endpoint for S3-compatible stores; `None` means `AWS_ENDPOINT_URL`, else AWS.
    pub endpoint_url: Option<String>,
    pub timeout: Duration,
    pub connect_timeout: Duration,
    pub retries: u32,
    pub requests: u32,
    /// `oci://` registries: verify TLS certificates, and use plain HTTP only for loopback
    /// hosts (`--tls-verify=false` turns both off).
    pub tls_verify: bool,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            endpoint_url: None,
            timeout: DEFAULT_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            retries: DEFAULT_RETRIES,
            requests: DEFAULT_REQUESTS,
            tls_verify: true,
        }
    }
}
