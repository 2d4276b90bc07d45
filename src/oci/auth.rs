//! Registry authentication: the `WWW-Authenticate` challenge of a 401 (Basic, or Bearer with a
//! token realm), the token service's answer, and the token cache. The requests themselves are
//! made by `registry.rs`.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::registry::one_line;

/// How long a token lives when the token service does not say.
pub const DEFAULT_TOKEN_LIFE: Duration = Duration::from_secs(60);
/// The largest token answer read.
pub const MAX_TOKEN_ANSWER: usize = 64 << 10;

/// A parsed `WWW-Authenticate` challenge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Challenge {
    Basic,
    Bearer {
        realm: String,
        service: Option<String>,
        scope: Option<String>,
    },
}

/// Parses one challenge: `Basic realm="…"` or `Bearer realm="…",service="…",scope="…"`
/// (parameter values quoted or bare, commas allowed inside quotes, backslash escapes).
pub fn parse_challenge(header: &str) -> Result<Challenge, String> {
    let h = header.trim();
    let (scheme, rest) = h.split_once(char::is_whitespace).unwrap_or((h, ""));
    match scheme.to_ascii_lowercase().as_str() {
        "basic" => {
            parse_params(rest)?;
            Ok(Challenge::Basic)
        }
        "bearer" => {
            let params = parse_params(rest)?;
            let realm = params
                .get("realm")
                .filter(|r| !r.is_empty())
                .cloned()
                .ok_or("a Bearer challenge without a realm")?;
            Ok(Challenge::Bearer {
                realm,
                service: params.get("service").cloned(),
                scope: params.get("scope").cloned(),
            })
        }
        other => Err(format!(
            "an unsupported authentication scheme {:?}",
            one_line(other, 40)
        )),
    }
}

/// `name=value` pairs separated by commas; names lowercased.
fn parse_params(s: &str) -> Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    let b = s.as_bytes();
    let mut i = 0;
    loop {
        while i < b.len() && (b[i] == b',' || b[i].is_ascii_whitespace()) {
            i += 1;
        }
        if i >= b.len() {
            return Ok(out);
        }
        let start = i;
        while i < b.len() && b[i] != b'=' && b[i] != b',' {
            i += 1;
        }
        let name = s[start..i].trim().to_ascii_lowercase();
        if i >= b.len() || b[i] != b'=' || name.is_empty() {
            return Err(format!(
                "a malformed challenge parameter near {:?}",
                one_line(&s[start..], 40)
            ));
        }
        i += 1;
        while i < b.len() && b[i].is_ascii_whitespace() {
            i += 1;
        }
        let value = if i < b.len() && b[i] == b'"' {
            i += 1;
            let mut v = Vec::new();
            loop {
                match b.get(i) {
                    None => return Err("an unclosed quote in a challenge".into()),
                    Some(b'"') => {
                        i += 1;
                        break;
                    }
                    Some(b'\\') if i + 1 < b.len() => {
                        v.push(b[i + 1]);
                        i += 2;
                    }
                    Some(&c) => {
                        v.push(c);
                        i += 1;
                    }
                }
            }
            String::from_utf8(v).map_err(|_| "a challenge value that is not UTF-8")?
        } else {
            let start = i;
            while i < b.len() && b[i] != b',' {
                i += 1;
            }
            s[start..i].trim().to_owned()
        };
        out.insert(name, value);
    }
}

/// A bearer token and when it stops being used.
#[derive(Clone)]
pub struct Token {
    pub value: String,
    pub expires: Instant,
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(…)")
    }
}

impl Token {
    pub fn valid(&self) -> bool {
        Instant::now() < self.expires
    }
}

/// Parses a token service's JSON answer: `token` or `access_token`, and `expires_in` seconds
/// (60 when absent). The token is used a few seconds less than it lives.
pub fn parse_token_answer(body: &[u8], now: Instant) -> Result<Token, String> {
    #[derive(serde::Deserialize)]
    struct Answer {
        token: Option<String>,
        access_token: Option<String>,
        expires_in: Option<u64>,
    }
    let a: Answer = serde_json::from_slice(body).map_err(|e| {
        format!(
            "the token service's answer is not JSON of a token: {}",
            one_line(&e.to_string(), 200)
        )
    })?;
    let value = a
        .token
        .filter(|t| !t.is_empty())
        .or(a.access_token.filter(|t| !t.is_empty()))
        .ok_or("the token service's answer holds no token")?;
    if value.bytes().any(|b| b.is_ascii_control() || b == b' ') {
        return Err("the token service's token is not a single header word".into());
    }
    let life = a
        .expires_in
        .map_or(DEFAULT_TOKEN_LIFE, |s| Duration::from_secs(s.min(86_400)));
    // A token close to its end is refetched rather than sent to be refused.
    let margin = (life / 10).min(Duration::from_secs(5));
    Ok(Token {
        value,
        expires: now + life - margin,
    })
}

/// The scope asked for: `repository:NAME:pull` or `repository:NAME:pull,push`.
pub fn scope(repository: &str, push: bool) -> String {
    format!(
        "repository:{repository}:{}",
        if push { "pull,push" } else { "pull" }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn challenges_parse() {
        assert_eq!(
            parse_challenge(r#"Basic realm="Registry Realm""#),
            Ok(Challenge::Basic)
        );
        assert_eq!(
            parse_challenge(
                r#"Bearer realm="https://auth.example/token",service="registry.example",scope="repository:a/b:pull,push""#
            ),
            Ok(Challenge::Bearer {
                realm: "https://auth.example/token".into(),
                service: Some("registry.example".into()),
                scope: Some("repository:a/b:pull,push".into()),
            })
        );
        assert_eq!(
            parse_challenge(r#"bearer  REALM = "http://h/t" , service=svc, error="invalid_token""#),
            Ok(Challenge::Bearer {
                realm: "http://h/t".into(),
                service: Some("svc".into()),
                scope: None,
            })
        );
        assert_eq!(
            parse_challenge(r#"Bearer realm="http://h/t\"x""#),
            Ok(Challenge::Bearer {
                realm: "http://h/t\"x".into(),
                service: None,
                scope: None,
            })
        );
        for bad in [
            "Bearer service=\"x\"",
            "Bearer realm=\"http://h",
            "Negotiate abc",
            "Bearer realm",
        ] {
            assert!(parse_challenge(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn token_answers_parse() {
        let now = Instant::now();
        let t = parse_token_answer(br#"{"token":"abc","expires_in":300}"#, now).unwrap();
        assert_eq!(t.value, "abc");
        assert_eq!(t.expires, now + Duration::from_secs(295));
        let t = parse_token_answer(br#"{"access_token":"xyz"}"#, now).unwrap();
        assert_eq!(t.value, "xyz");
        assert_eq!(t.expires, now + Duration::from_secs(55));
        let t =
            parse_token_answer(br#"{"token":"","access_token":"q","expires_in":2}"#, now).unwrap();
        assert_eq!(t.value, "q");
        assert_eq!(t.expires, now + Duration::from_millis(1800));
        assert!(parse_token_answer(b"{}", now).is_err());
        assert!(parse_token_answer(b"<html>", now).is_err());
        assert!(parse_token_answer(br#"{"token":"a\nb"}"#, now).is_err());
        assert_eq!(format!("{t:?}"), "Token(…)");
        assert_eq!(scope("a/b", false), "repository:a/b:pull");
        assert_eq!(scope("a/b", true), "repository:a/b:pull,push");
    }
}
