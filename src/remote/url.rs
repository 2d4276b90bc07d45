//! Which sources are remote, and what a remote source names: one S3 object, every `*.kpack`
//! directly under an S3 prefix, or one object on a plain HTTP(S) server.
//!
//! Parsing is pure (no I/O), so the accepted and refused spellings are unit-tested here.

use std::fmt;

/// A parsed remote source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RemoteUrl {
    /// `s3://BUCKET/KEY` (one object; the key does not end with `/`).
    S3Object { bucket: String, key: String },
    /// `s3://BUCKET/PREFIX/` or `s3://BUCKET`: every `*.kpack` directly under the prefix
    /// (`prefix` is empty or ends with `/`).
    S3Prefix { bucket: String, prefix: String },
    /// `http://HOST[:PORT]/PATH` or `https://...`: `base` is `scheme://authority`, `path` the
    /// rest without the leading `/` (still percent-encoded, as the server expects it).
    Http { base: String, path: String },
}

/// Whether a source argument is a URL this program fetches (as opposed to a local path).
pub fn is_remote(source: &str) -> bool {
    ["s3://", "http://", "https://", "oci://"]
        .iter()
        .any(|p| source.len() >= p.len() && source[..p.len()].eq_ignore_ascii_case(p))
}

impl RemoteUrl {
    /// Parses `s3://`, `http://` and `https://` sources; the message says what is wrong.
    pub fn parse(source: &str) -> Result<RemoteUrl, String> {
        let (scheme, rest) = source
            .split_once("://")
            .ok_or_else(|| format!("{source}: not a URL (s3://, http:// or https://)"))?;
        if rest.split('/').next().unwrap_or("").contains('@') {
            // Not echoed: it would put a password in a message.
            return Err(format!(
                "{scheme}:// source: no user or password in the URL (it is shown in logs and \
                 in user.kpack.archive; S3 credentials come from the environment)"
            ));
        }
        if rest.contains(['?', '#']) {
            return Err(format!(
                "{source}: query strings and fragments are not supported in a source URL"
            ));
        }
        if rest.chars().any(|c| c.is_control() || c == ' ') {
            return Err(format!(
                "{source}: spaces and control characters must be percent-encoded"
            ));
        }
        match scheme.to_ascii_lowercase().as_str() {
            "s3" => {
                let (bucket, key) = rest.split_once('/').unwrap_or((rest, ""));
                if !valid_bucket(bucket) {
                    return Err(format!(
                        "{source}: {bucket:?} is not an S3 bucket name (3-63 of a-z, 0-9, '.', '-')"
                    ));
                }
                if key.split('/').any(|c| c == "." || c == "..")
                    || key.contains("//")
                    || key.starts_with('/')
                {
                    return Err(format!(
                        "{source}: empty, '.' and '..' components are not allowed in the key"
                    ));
                }
                let bucket = bucket.to_owned();
                if key.is_empty() || key.ends_with('/') {
                    Ok(RemoteUrl::S3Prefix {
                        bucket,
                        prefix: key.to_owned(),
                    })
                } else {
                    Ok(RemoteUrl::S3Object {
                        bucket,
                        key: key.to_owned(),
                    })
                }
            }
            s @ ("http" | "https") => {
                let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
                if authority.is_empty() {
                    return Err(format!("{source}: needs a host"));
                }
                if path.is_empty() || path.ends_with('/') {
                    return Err(format!(
                        "{source}: an http(s) source names one archive (a directory listing \
                         cannot be read over plain HTTP; use s3:// for a prefix)"
                    ));
                }
                Ok(RemoteUrl::Http {
                    base: format!("{s}://{authority}"),
                    path: path.to_owned(),
                })
            }
            _ => Err(format!(
                "{source}: unsupported scheme {scheme:?} (s3://, http:// or https://)"
            )),
        }
    }
}

impl fmt::Display for RemoteUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RemoteUrl::S3Object { bucket, key } => write!(f, "s3://{bucket}/{key}"),
            RemoteUrl::S3Prefix { bucket, prefix } => write!(f, "s3://{bucket}/{prefix}"),
            RemoteUrl::Http { base, path } => write!(f, "{base}/{path}"),
        }
    }
}

/// S3's bucket naming rules, loosely: enough to refuse typos that would otherwise become
/// confusing request errors.
fn valid_bucket(b: &str) -> bool {
    (3..=63).contains(&b.len())
        && b.bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'.' || c == b'-')
        && b.as_bytes()[0].is_ascii_alphanumeric()
        && b.as_bytes()[b.len() - 1].is_ascii_alphanumeric()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remote_sources_are_told_from_paths() {
        assert!(is_remote("s3://b/k"));
        assert!(is_remote("HTTPS://h/x.kpack"));
        assert!(is_remote("http://127.0.0.1:8080/a.kpack"));
        assert!(!is_remote("/srv/s3://x"));
        assert!(!is_remote("s3:/b"));
        assert!(!is_remote("archive.kpack"));
    }

    #[test]
    fn s3_objects_and_prefixes() {
        assert_eq!(
            RemoteUrl::parse("s3://kernels/rocm/7.0/gfx942.kpack").unwrap(),
            RemoteUrl::S3Object {
                bucket: "kernels".into(),
                key: "rocm/7.0/gfx942.kpack".into()
            }
        );
        assert_eq!(
            RemoteUrl::parse("s3://kernels/rocm/").unwrap(),
            RemoteUrl::S3Prefix {
                bucket: "kernels".into(),
                prefix: "rocm/".into()
            }
        );
        for whole in ["s3://kernels", "s3://kernels/"] {
            assert_eq!(
                RemoteUrl::parse(whole).unwrap(),
                RemoteUrl::S3Prefix {
                    bucket: "kernels".into(),
                    prefix: String::new()
                }
            );
        }
        assert_eq!(
            RemoteUrl::parse("s3://kernels/a/b.kpack")
                .unwrap()
                .to_string(),
            "s3://kernels/a/b.kpack"
        );
    }

    #[test]
    fn http_objects() {
        assert_eq!(
            RemoteUrl::parse("http://127.0.0.1:8080/mirror/a%20b.kpack").unwrap(),
            RemoteUrl::Http {
                base: "http://127.0.0.1:8080".into(),
                path: "mirror/a%20b.kpack".into()
            }
        );
        assert_eq!(
            RemoteUrl::parse("https://h.example/x.kpack")
                .unwrap()
                .to_string(),
            "https://h.example/x.kpack"
        );
    }

    #[test]
    fn refused_spellings_say_why() {
        let cases = [
            ("ftp://h/x.kpack", "unsupported scheme"),
            ("s3://Bad_Bucket/x", "not an S3 bucket name"),
            ("s3://ab/x", "not an S3 bucket name"),
            ("s3://bucket/a/../b.kpack", "'..'"),
            ("s3://bucket/a//b.kpack", "empty"),
            ("http://h/dir/", "names one archive"),
            ("http://h", "names one archive"),
            ("http://user:pw@h/x.kpack", "no user or password"),
            ("https://h/x.kpack?sig=1", "query strings"),
            ("http://h/a b.kpack", "percent-encoded"),
        ];
        for (url, why) in cases {
            let e = RemoteUrl::parse(url).unwrap_err();
            assert!(e.contains(why), "{url}: {e}");
            assert!(!e.contains("pw@"), "no secret echoed for {url}: {e}");
        }
    }
}
