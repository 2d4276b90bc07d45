//! The AWS shared files (`~/.aws/credentials` and `~/.aws/config`, or `AWS_SHARED_CREDENTIALS_FILE`
//! and `AWS_CONFIG_FILE`), read for the profile `AWS_PROFILE` (else `default`). The environment
//! variables win over them, and container and instance roles come after them (the client
//! library handles those). Nothing read here is ever logged.

use std::path::PathBuf;

/// Static keys from the credentials file.
#[derive(Clone, PartialEq, Eq)]
pub struct Keys {
    pub access_key_id: String,
    pub secret_access_key: String,
    pub session_token: Option<String>,
}

/// What the shared files give for the active profile.
#[derive(Default, Clone, PartialEq, Eq)]
pub struct Files {
    pub credentials: Option<Keys>,
    pub region: Option<String>,
    pub endpoint_url: Option<String>,
}

fn home_file(var: &str, rel: &str) -> Option<PathBuf> {
    std::env::var_os(var)
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(rel)))
}

/// Reads both files for the active profile; missing or unreadable files give nothing.
pub fn from_files() -> Files {
    let profile = std::env::var("AWS_PROFILE").unwrap_or_else(|_| "default".into());
    let read = |p: Option<PathBuf>| p.and_then(|p| std::fs::read_to_string(p).ok());
    let creds = read(home_file("AWS_SHARED_CREDENTIALS_FILE", ".aws/credentials"));
    let config = read(home_file("AWS_CONFIG_FILE", ".aws/config"));
    parse(&profile, creds.as_deref(), config.as_deref())
}

/// The keys of section `name` in an INI text.
fn section<'a>(text: &'a str, name: &str) -> Vec<(&'a str, &'a str)> {
    let mut inside = false;
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(h) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            inside = h.trim() == name;
            continue;
        }
        if inside {
            if let Some((k, v)) = line.split_once('=') {
                out.push((k.trim(), v.trim()));
            }
        }
    }
    out
}

/// The last non-empty value of `key` in a section (keys compare case-insensitively).
fn get(kv: &[(&str, &str)], key: &str) -> Option<String> {
    kv.iter()
        .rev()
        .find(|(k, _)| k.eq_ignore_ascii_case(key))
        .map(|(_, v)| v.to_string())
        .filter(|v| !v.is_empty())
}

/// The keys a section gives, if it has both the key id and the secret; either file may hold them.
fn keys(kv: &[(&str, &str)]) -> Option<Keys> {
    Some(Keys {
        access_key_id: get(kv, "aws_access_key_id")?,
        secret_access_key: get(kv, "aws_secret_access_key")?,
        session_token: get(kv, "aws_session_token"),
    })
}

fn parse(profile: &str, creds: Option<&str>, config: Option<&str>) -> Files {
    let mut files = Files::default();
    if let Some(text) = creds {
        files.credentials = keys(&section(text, profile));
    }
    if let Some(text) = config {
        // The config file names non-default profiles `[profile NAME]`.
        let header = if profile == "default" {
            "default".to_owned()
        } else {
            format!("profile {profile}")
        };
        let kv = section(text, &header);
        files.region = get(&kv, "region");
        files.endpoint_url = get(&kv, "endpoint_url");
        if files.credentials.is_none() {
            files.credentials = keys(&kv);
        }
    }
    files
}

#[cfg(test)]
mod tests {
    use super::*;

    const CREDS: &str = "\
# comment
[default]
aws_access_key_id = AKIDDEFAULT
aws_secret_access_key = s3cr3t

[ci]
aws_access_key_id=AKIDCI
aws_secret_access_key=other
aws_session_token = tok
";
    const CONFIG: &str = "\
[default]
region = eu-west-1
[profile ci]
region = us-west-2
endpoint_url = http://127.0.0.1:9000
";

    #[test]
    fn profiles_from_both_files() {
        let d = parse("default", Some(CREDS), Some(CONFIG));
        let k = d.credentials.unwrap();
        assert_eq!(
            (k.access_key_id.as_str(), k.secret_access_key.as_str()),
            ("AKIDDEFAULT", "s3cr3t")
        );
        assert_eq!(k.session_token, None);
        assert_eq!(d.region.as_deref(), Some("eu-west-1"));
        assert_eq!(d.endpoint_url, None);
        let ci = parse("ci", Some(CREDS), Some(CONFIG));
        assert_eq!(
            ci.credentials.unwrap().session_token.as_deref(),
            Some("tok")
        );
        assert_eq!(ci.region.as_deref(), Some("us-west-2"));
        assert_eq!(ci.endpoint_url.as_deref(), Some("http://127.0.0.1:9000"));
        let none = parse("missing", Some(CREDS), None);
        assert!(none.credentials.is_none() && none.region.is_none());
        assert!(parse("default", None, None) == Files::default());
    }

    #[test]
    fn keys_from_the_config_file_only_when_the_credentials_file_has_none() {
        let config = "\
[profile cfg]
aws_access_key_id = AKIDCFG
aws_secret_access_key = cfgsecret
[default]
aws_access_key_id = AKIDIGNORED
aws_secret_access_key = ignored
[profile half]
aws_access_key_id = AKIDHALF
";
        // Keys has no Debug (it holds secrets), so fields are compared one by one.
        let cfg = parse("cfg", Some(CREDS), Some(config)).credentials.unwrap();
        assert_eq!(
            (cfg.access_key_id.as_str(), cfg.secret_access_key.as_str()),
            ("AKIDCFG", "cfgsecret")
        );
        assert_eq!(cfg.session_token, None);
        // The credentials file wins over the config file for the same profile.
        let d = parse("default", Some(CREDS), Some(config));
        assert_eq!(d.credentials.unwrap().access_key_id, "AKIDDEFAULT");
        // A key id without its secret gives no keys.
        assert!(parse("half", None, Some(config)).credentials.is_none());
    }
}
