//! How commands take remote sources: the network flags shared by `mount`, `list`, `cat`,
//! `verify` and `extract`, the same settings as `-o` mount items, and an archive argument that
//! may be a local path or a URL.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rocm_kpack::Archive;

use crate::cli::exit::{CliError, CliResult, Exit};
use crate::remote::settings::Settings;
use crate::remote::{self, OciOptions, RemoteUrl, is_remote};

/// Remote settings as given (flags, then `-o` items); `None` means the default.
#[derive(Debug, Clone, Default, PartialEq, Eq, clap::Args)]
pub struct RemoteArgs {
    /// S3 endpoint for S3-compatible stores (path-style addressing) [default: AWS_ENDPOINT_URL,
    /// else AWS]. A plain http:// endpoint also needs AWS_ALLOW_HTTP=true.
    #[arg(long, value_name = "URL")]
    pub endpoint_url: Option<String>,
    /// Seconds one remote request may take before it is retried [default: 30]; one that
    /// times out is asked for again in smaller pieces, down to 64 KiB.
    #[arg(long, value_name = "SECS", value_parser = parse_secs)]
    pub remote_timeout: Option<u64>,
    /// Seconds to establish a connection before the attempt is retried [default: 5].
    #[arg(long, value_name = "SECS", value_parser = parse_secs)]
    pub remote_connect_timeout: Option<u64>,
    /// Retries of a remote request after a timeout, connection error, 5xx or 429, with
    /// exponential backoff (0.2 s doubling, at most 5 s) [default: 3].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(0..=20))]
    pub remote_retries: Option<u32>,
    /// Remote requests in flight at once [default: 8].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=256))]
    pub remote_requests: Option<u32>,
    /// oci:// registries: with false, accept any TLS certificate and fall back to plain HTTP
    /// when HTTPS fails (plain HTTP is otherwise used only for loopback registries)
    /// [default: true].
    #[arg(long, value_name = "BOOL", action = clap::ArgAction::Set, num_args = 0..=1,
          require_equals = true, default_missing_value = "true")]
    pub tls_verify: Option<bool>,
}

impl RemoteArgs {
    /// The settings these arguments give, defaults filled in.
    pub fn settings(&self) -> Settings {
        let d = Settings::default();
        Settings {
            endpoint_url: self.endpoint_url.clone(),
            timeout: self.remote_timeout.map_or(d.timeout, Duration::from_secs),
            connect_timeout: self
                .remote_connect_timeout
                .map_or(d.connect_timeout, Duration::from_secs),
            retries: self.remote_retries.unwrap_or(d.retries),
            requests: self.remote_requests.unwrap_or(d.requests),
            tls_verify: self.tls_verify.unwrap_or(d.tls_verify),
        }
    }

    /// Applies one `-o` item if it is a remote setting: `None` when the name is not one of
    /// ours, else whether its value was accepted.
    pub fn apply_option(&mut self, name: &str, value: Option<&str>) -> Option<Result<(), String>> {
        let needs = |what: &str| {
            value
                .filter(|v| !v.is_empty())
                .ok_or_else(|| format!("mount option {name:?} needs a value ({name}={what})"))
        };
        let number = |what: &str, lo: u64, hi: u64| -> Result<u64, String> {
            let v = needs(what)?;
            v.parse::<u64>()
                .ok()
                .filter(|n| (lo..=hi).contains(n))
                .ok_or_else(|| format!("mount option {name}: {v:?} is not a number in {lo}..={hi}"))
        };
        Some(match name {
            "endpoint_url" => needs("URL").map(|v| self.endpoint_url = Some(v.to_owned())),
            "remote_timeout" => number("SECS", 1, 3600).map(|n| self.remote_timeout = Some(n)),
            "remote_connect_timeout" => {
                number("SECS", 1, 3600).map(|n| self.remote_connect_timeout = Some(n))
            }
            "remote_retries" => number("N", 0, 20).map(|n| self.remote_retries = Some(n as u32)),
            "remote_requests" => number("N", 1, 256).map(|n| self.remote_requests = Some(n as u32)),
            "tls_verify" => match value.unwrap_or("true") {
                v @ ("true" | "false") => {
                    self.tls_verify = Some(v == "true");
                    Ok(())
                }
                v => Err(format!(
                    "mount option tls_verify: {v:?} is not true or false"
                )),
            },
            _ => return None,
        })
    }

    /// For `mount` of a local source, where these settings do nothing: one warning for each
    /// one given, flag or `-o` item alike.
    pub fn unused_with_local_source(&self) -> Vec<String> {
        [
            (
                "--endpoint-url",
                "endpoint_url",
                self.endpoint_url.is_some(),
            ),
            (
                "--remote-timeout",
                "remote_timeout",
                self.remote_timeout.is_some(),
            ),
            (
                "--remote-connect-timeout",
                "remote_connect_timeout",
                self.remote_connect_timeout.is_some(),
            ),
            (
                "--remote-retries",
                "remote_retries",
                self.remote_retries.is_some(),
            ),
            (
                "--remote-requests",
                "remote_requests",
                self.remote_requests.is_some(),
            ),
            ("--tls-verify", "tls_verify", self.tls_verify.is_some()),
        ]
        .into_iter()
        .filter(|(_, _, given)| *given)
        .map(|(flag, option, _)| {
            format!(
                "{flag} (-o {option}) does nothing with a local source (it is for s3://, \
                 http(s):// and oci:// sources); it will be refused there in a later release"
            )
        })
        .collect()
    }
}

pub(crate) fn parse_secs(s: &str) -> Result<u64, String> {
    s.parse::<u64>()
        .ok()
        .filter(|n| (1..=3600).contains(n))
        .ok_or_else(|| format!("{s:?} is not a number of seconds in 1..=3600"))
}

/// The archives a command argument names: a local path (one archive), or a URL (one object,
/// or with `allow_prefix` every archive under an S3 prefix), or an `oci://` artifact (the
/// archive layers with code for `gpus`, every one when empty). `gpus` is refused for any other
/// source.
pub fn open_archives(
    arg: &Path,
    args: &RemoteArgs,
    gpus: &[String],
    allow_prefix: bool,
) -> CliResult<Vec<Arc<Archive>>> {
    let url = arg.to_str().filter(|s| is_remote(s));
    if !gpus.is_empty() && !url.is_some_and(crate::oci::is_oci) {
        return Err(CliError::new(
            Exit::Usage,
            format!(
                "{}: --gpu chooses the layers of an oci:// artifact (and, for list and extract, \
                 the code objects of a HIPK binary); it does not apply here",
                arg.display()
            ),
        ));
    }
    let Some(url) = url else {
        return Ok(vec![Arc::new(Archive::open(arg)?)]);
    };
    let oci = OciOptions {
        gpus: gpus.to_vec(),
    };
    if !crate::oci::is_oci(url) {
        let parsed = RemoteUrl::parse(url).map_err(|m| CliError::new(Exit::Usage, m))?;
        if !allow_prefix && matches!(parsed, RemoteUrl::S3Prefix { .. }) {
            return Err(CliError::new(
                Exit::Usage,
                format!("{url}: names a prefix; this command reads one archive (s3://BUCKET/KEY)"),
            ));
        }
    }
    // Commands fail on any member that does not open, as they do for a local file.
    Ok(remote::open(url, &args.settings(), &oci, true, None)?.archives)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_options() {
        let mut a = RemoteArgs::default();
        assert_eq!(a.settings(), Settings::default());
        let r = a.settings();
        assert_eq!(r.timeout, Duration::from_secs(30));
        assert_eq!(r.connect_timeout, Duration::from_secs(5));
        assert_eq!((r.retries, r.requests), (3, 8));
        assert_eq!(
            a.apply_option("endpoint_url", Some("http://127.0.0.1:9000")),
            Some(Ok(()))
        );
        assert_eq!(a.apply_option("remote_timeout", Some("2")), Some(Ok(())));
        assert_eq!(
            a.apply_option("remote_connect_timeout", Some("1")),
            Some(Ok(()))
        );
        assert_eq!(a.apply_option("remote_retries", Some("0")), Some(Ok(())));
        assert_eq!(a.apply_option("remote_requests", Some("2")), Some(Ok(())));
        let r = a.settings();
        assert_eq!(r.endpoint_url.as_deref(), Some("http://127.0.0.1:9000"));
        assert_eq!(r.timeout, Duration::from_secs(2));
        assert_eq!(r.connect_timeout, Duration::from_secs(1));
        assert_eq!((r.retries, r.requests), (0, 2));
        assert_eq!(a.apply_option("cache_size", Some("1G")), None);
        assert_eq!(
            a.unused_with_local_source(),
            [
                "endpoint_url",
                "remote_timeout",
                "remote_connect_timeout",
                "remote_retries",
                "remote_requests"
            ]
            .map(|o| format!(
                "--{} (-o {o}) does nothing with a local source (it is for s3://, http(s):// \
                 and oci:// sources); it will be refused there in a later release",
                o.replace('_', "-")
            ))
        );
        assert_eq!(
            RemoteArgs::default().unused_with_local_source(),
            Vec::<String>::new()
        );
        for (n, v, why) in [
            ("remote_timeout", Some("0"), "1..=3600"),
            ("remote_requests", Some("x"), "not a number"),
            ("remote_retries", Some("21"), "0..=20"),
            ("endpoint_url", None, "needs a value"),
            ("endpoint_url", Some(""), "needs a value"),
        ] {
            let e = a.apply_option(n, v).unwrap().unwrap_err();
            assert!(e.contains(why), "{n}={v:?}: {e}");
        }
    }
}
