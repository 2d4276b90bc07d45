//! Registry credentials where podman, skopeo and docker keep them: `REGISTRY_AUTH_FILE`, else
//! `${XDG_RUNTIME_DIR}/containers/auth.json`, then `$HOME/.docker/config.json`. In each file,
//! in this order: a `credHelpers` entry for the registry (a `docker-credential-NAME get`
//! program), the longest matching `auths` key (`host[:port]`, `https://host[:port]`, or a
//! longer `host[:port]/namespace` prefix of the repository), then `credsStore`. Secrets never
//! reach a log line or an error message.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use base64::Engine;

/// A user name and password (or identity token) for one registry.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub username: String,
    pub password: String,
    /// Where they came from (a file or a helper), for messages.
    pub origin: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Credentials({} from {})", self.username, self.origin)
    }
}

impl Credentials {
    /// The `Authorization` value of HTTP basic authentication.
    pub fn basic_header(&self) -> String {
        let raw = format!("{}:{}", self.username, self.password);
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(raw)
        )
    }
}

/// The files read, in order, from the environment given by `var`.
pub fn auth_files(var: &dyn Fn(&str) -> Option<String>) -> Vec<PathBuf> {
    if let Some(f) = var("REGISTRY_AUTH_FILE").filter(|v| !v.is_empty()) {
        return vec![PathBuf::from(f)];
    }
    let mut v = Vec::new();
    if let Some(x) = var("XDG_RUNTIME_DIR").filter(|v| !v.is_empty()) {
        v.push(Path::new(&x).join("containers/auth.json"));
    }
    if let Some(h) = var("HOME").filter(|v| !v.is_empty()) {
        v.push(Path::new(&h).join(".docker/config.json"));
    }
    v
}

/// The credentials for `registry` (`host[:port]`) and `repository` from the process's
/// environment, or `None` (anonymous). An unreadable or malformed file is an error naming it.
pub fn lookup(registry: &str, repository: &str) -> Result<Option<Credentials>, String> {
    lookup_in(
        &auth_files(&|k| std::env::var(k).ok()),
        registry,
        repository,
    )
}

/// [`lookup`] over the files `files`.
pub fn lookup_in(
    files: &[PathBuf],
    registry: &str,
    repository: &str,
) -> Result<Option<Credentials>, String> {
    for f in files {
        let text = match std::fs::read(f) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(format!("{}: cannot read: {e}", f.display())),
        };
        if text.len() > 4 << 20 {
            return Err(format!("{}: larger than 4 MiB", f.display()));
        }
        if let Some(c) = from_file(&text, f, registry, repository)? {
            return Ok(Some(c));
        }
    }
    Ok(None)
}

#[derive(serde::Deserialize, Default)]
struct AuthFile {
    #[serde(default)]
    auths: std::collections::BTreeMap<String, AuthEntry>,
    #[serde(default, rename = "credHelpers")]
    cred_helpers: std::collections::BTreeMap<String, String>,
    #[serde(default, rename = "credsStore")]
    creds_store: Option<String>,
}

#[derive(serde::Deserialize, Default)]
struct AuthEntry {
    auth: Option<String>,
    username: Option<String>,
    password: Option<String>,
    identitytoken: Option<String>,
}

/// `key` without a scheme and trailing slashes (`https://host/` → `host`), lowercase host.
fn normalize_key(key: &str) -> String {
    let k = key
        .strip_prefix("https://")
        .or_else(|| key.strip_prefix("http://"))
        .unwrap_or(key)
        .trim_end_matches('/');
    match k.split_once('/') {
        Some((h, rest)) => format!("{}/{rest}", h.to_ascii_lowercase()),
        None => k.to_ascii_lowercase(),
    }
}

/// How long a match `key` is for `registry/repository`, or `None` when it does not match.
fn match_len(key: &str, registry: &str, repository: &str) -> Option<usize> {
    let key = normalize_key(key);
    if key == registry {
        return Some(key.len());
    }
    let full = format!("{registry}/{repository}");
    (full.starts_with(&key)
        && key.starts_with(&format!("{registry}/"))
        && (full.len() == key.len() || full.as_bytes()[key.len()] == b'/'))
        .then_some(key.len())
}

fn from_file(
    text: &[u8],
    path: &Path,
    registry: &str,
    repository: &str,
) -> Result<Option<Credentials>, String> {
    let file: AuthFile = serde_json::from_slice(text)
        .map_err(|e| format!("{}: not an auth file: {e}", path.display()))?;
    if let Some(helper) = file
        .cred_helpers
        .iter()
        .find(|(k, _)| normalize_key(k) == registry)
        .map(|(_, h)| h)
    {
        return run_helper(helper, registry).map(Some);
    }
    let best = file
        .auths
        .iter()
        .filter_map(|(k, e)| Some((match_len(k, registry, repository)?, k, e)))
        .max_by_key(|(n, _, _)| *n);
    if let Some((_, key, e)) = best {
        let origin = format!("{} ({key})", path.display());
        if let Some(auth) = e.auth.as_deref().filter(|a| !a.is_empty()) {
            let raw = base64::engine::general_purpose::STANDARD
                .decode(auth.trim())
                .map_err(|_| format!("{origin}: \"auth\" is not base64"))?;
            let raw = String::from_utf8(raw)
                .map_err(|_| format!("{origin}: \"auth\" is not UTF-8 user:password"))?;
            let (u, p) = raw
                .split_once(':')
                .ok_or_else(|| format!("{origin}: \"auth\" is not base64 of user:password"))?;
            return Ok(Some(Credentials {
                username: u.to_owned(),
                password: p.to_owned(),
                origin,
            }));
        }
        if let (Some(u), Some(p)) = (&e.username, &e.password) {
            return Ok(Some(Credentials {
                username: u.clone(),
                password: p.clone(),
                origin,
            }));
        }
        if let Some(t) = e.identitytoken.as_deref().filter(|t| !t.is_empty()) {
            // docker's convention for identity tokens: an empty-looking user.
            return Ok(Some(Credentials {
                username: "<token>".into(),
                password: t.to_owned(),
                origin,
            }));
        }
    }
    match &file.creds_store {
        Some(store) if !store.is_empty() => match run_helper(store, registry) {
            Ok(c) => Ok(Some(c)),
            // A store that has nothing for this registry means anonymous access.
            Err(e) if e.contains("credentials not found") => Ok(None),
            Err(e) => Err(e),
        },
        _ => Ok(None),
    }
}

/// Runs `docker-credential-NAME get` with the registry on standard input; its answer is JSON
/// with `Username` and `Secret`.
fn run_helper(name: &str, registry: &str) -> Result<Credentials, String> {
    if name.is_empty()
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
    {
        return Err(format!(
            "credential helper name {name:?} is not a plain program name"
        ));
    }
    let prog = format!("docker-credential-{name}");
    let mut child = Command::new(&prog)
        .arg("get")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot run the credential helper {prog}: {e}"))?;
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(registry.as_bytes());
    }
    let mut out = Vec::new();
    if let Some(stdout) = child.stdout.take() {
        let _ = stdout.take(64 << 10).read_to_end(&mut out);
    }
    let status = child
        .wait()
        .map_err(|e| format!("credential helper {prog}: {e}"))?;
    if !status.success() {
        // Helpers print "credentials not found in native keychain" for an unknown server; the
        // answer is shown only when it is one short line (it never holds a secret then).
        let text = String::from_utf8_lossy(&out);
        let line = text.trim();
        let why = if line.len() < 120 && !line.contains('\n') && !line.contains('{') {
            line.to_owned()
        } else {
            format!("exit status {status}")
        };
        return Err(format!("credential helper {prog} for {registry}: {why}"));
    }
    #[derive(serde::Deserialize)]
    struct Answer {
        #[serde(rename = "Username")]
        username: String,
        #[serde(rename = "Secret")]
        secret: String,
    }
    let a: Answer = serde_json::from_slice(&out).map_err(|_| {
        format!("credential helper {prog} for {registry}: its answer is not JSON with Username and Secret")
    })?;
    Ok(Credentials {
        username: a.username,
        password: a.secret,
        origin: format!("credential helper {prog}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b64(s: &str) -> String {
        base64::engine::general_purpose::STANDARD.encode(s)
    }

    #[test]
    fn files_are_found_in_podman_order() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        assert_eq!(
            auth_files(&env(&[
                ("REGISTRY_AUTH_FILE", "/a.json"),
                ("HOME", "/h"),
                ("XDG_RUNTIME_DIR", "/run/u")
            ])),
            vec![PathBuf::from("/a.json")]
        );
        assert_eq!(
            auth_files(&env(&[("HOME", "/h"), ("XDG_RUNTIME_DIR", "/run/u")])),
            vec![
                PathBuf::from("/run/u/containers/auth.json"),
                PathBuf::from("/h/.docker/config.json")
            ]
        );
        assert_eq!(auth_files(&env(&[])), Vec::<PathBuf>::new());
    }

    #[test]
    fn entries_match_by_host_and_longest_prefix() {
        let dir = tempfile::tempdir().unwrap();
        let first = dir.path().join("auth.json");
        let second = dir.path().join("config.json");
        std::fs::write(
            &first,
            format!(
                r#"{{"auths":{{
                    "reg.example:5000":{{"auth":"{}"}},
                    "reg.example:5000/team":{{"auth":"{}"}},
                    "reg.example:5000/team/deep":{{"username":"deep","password":"pw3"}},
                    "https://other.example/":{{"auth":"{}"}}
                }}}}"#,
                b64("host:pw1"),
                b64("team:pw2:with:colons"),
                b64("other:pw4")
            ),
        )
        .unwrap();
        std::fs::write(
            &second,
            format!(
                r#"{{"auths":{{"late.example":{{"auth":"{}"}}}}}}"#,
                b64("late:pw5")
            ),
        )
        .unwrap();
        let files = vec![dir.path().join("missing.json"), first.clone(), second];
        let who = |reg: &str, repo: &str| {
            lookup_in(&files, reg, repo)
                .unwrap()
                .map(|c| (c.username, c.password))
        };
        let pair = |u: &str, p: &str| Some((u.to_owned(), p.to_owned()));
        assert_eq!(who("reg.example:5000", "x"), pair("host", "pw1"));
        assert_eq!(
            who("reg.example:5000", "team/x"),
            pair("team", "pw2:with:colons")
        );
        assert_eq!(
            who("reg.example:5000", "team"),
            pair("team", "pw2:with:colons")
        );
        assert_eq!(who("reg.example:5000", "teamx/y"), pair("host", "pw1"));
        assert_eq!(who("reg.example:5000", "team/deep/z"), pair("deep", "pw3"));
        assert_eq!(who("other.example", "a"), pair("other", "pw4"));
        assert_eq!(who("late.example", "a"), pair("late", "pw5"));
        assert_eq!(who("reg.example", "a"), None);
        let c = lookup_in(&files, "reg.example:5000", "x").unwrap().unwrap();
        assert_eq!(c.basic_header(), format!("Basic {}", b64("host:pw1")));
        assert!(!format!("{c:?}").contains("pw1"));

        std::fs::write(&first, r#"{"auths":{"h":{"auth":"%%%"}}}"#).unwrap();
        let e = lookup_in(&files, "h", "x").unwrap_err();
        assert!(e.contains("not base64") && !e.contains("%%%"), "{e}");
        std::fs::write(&first, "not json").unwrap();
        assert!(
            lookup_in(&files, "h", "x")
                .unwrap_err()
                .contains("not an auth file")
        );
    }

    #[test]
    fn a_missing_helper_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("auth.json");
        std::fs::write(&f, r#"{"credHelpers":{"h:1":"kpack-test-none"}}"#).unwrap();
        let e = lookup_in(std::slice::from_ref(&f), "h:1", "x").unwrap_err();
        assert!(
            e.contains("cannot run the credential helper docker-credential-kpack-test-none"),
            "{e}"
        );
        std::fs::write(&f, r#"{"credHelpers":{"h:1":"../evil"}}"#).unwrap();
        assert!(
            lookup_in(&[f], "h:1", "x")
                .unwrap_err()
                .contains("plain program name")
        );
    }
}
