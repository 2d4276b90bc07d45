//! `oci://HOST[:PORT]/REPOSITORY[:TAG]` and `oci://HOST[:PORT]/REPOSITORY@sha256:HEX`: parsed
//! strictly (the distribution specification's grammar for repository names and tags), shown
//! back in the same canonical form.

use std::fmt;

use super::registry::one_line;

/// A `sha256:` content digest (64 lowercase hex digits).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest(String);

impl Digest {
    /// Parses `sha256:HEX`; other algorithms are refused.
    pub fn parse(s: &str) -> Result<Digest, String> {
        let hex = s
            .strip_prefix("sha256:")
            .ok_or_else(|| format!("{:?} is not a sha256: digest", one_line(s, 80)))?;
        if hex.len() != 64 || !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return Err(format!(
                "{:?} is not a sha256: digest (64 lowercase hex digits)",
                one_line(s, 80)
            ));
        }
        Ok(Digest(s.to_owned()))
    }

    /// The SHA-256 digest of `data`.
    pub fn of(data: &[u8]) -> Digest {
        let mut h = Hasher::new();
        h.update(data);
        h.finish()
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Lowercase hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// Which manifest a reference names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Tag(String),
    Digest(Digest),
}

impl Target {
    /// The `REFERENCE` of `/v2/NAME/manifests/REFERENCE`.
    pub fn as_path(&self) -> &str {
        match self {
            Target::Tag(t) => t,
            Target::Digest(d) => d.as_str(),
        }
    }
}

/// A parsed `oci://` reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reference {
    /// `host` or `host:port` (an IPv6 address in brackets), lowercase.
    pub registry: String,
    pub repository: String,
    /// `None` when the reference names neither a tag nor a digest.
    pub target: Option<Target>,
}

/// The tag `push` uses when the reference has none (as docker and podman do).
pub const DEFAULT_TAG: &str = "latest";

impl Reference {
    /// Parses `oci://HOST[:PORT]/REPO[:TAG]` or `oci://HOST[:PORT]/REPO@sha256:HEX`.
    pub fn parse(s: &str) -> Result<Reference, String> {
        let bad = |why: &str| format!("{s}: not an oci:// reference: {why}");
        let rest = s
            .strip_prefix("oci://")
            .ok_or_else(|| bad("it must start with oci://"))?;
        let (registry, path) = rest
            .split_once('/')
            .ok_or_else(|| bad("no repository (oci://HOST[:PORT]/REPOSITORY[:TAG])"))?;
        check_registry(registry).map_err(|w| bad(&w))?;
        let (name, target) = if let Some((name, digest)) = path.split_once('@') {
            let d = Digest::parse(digest).map_err(|w| bad(&w))?;
            (name, Some(Target::Digest(d)))
        } else {
            // A tag follows the last ':' after the last '/'.
            let last = path.rfind('/').map_or(0, |i| i + 1);
            match path[last..].rfind(':') {
                Some(i) => {
                    let tag = &path[last + i + 1..];
                    check_tag(tag).map_err(|w| bad(&w))?;
                    (&path[..last + i], Some(Target::Tag(tag.to_owned())))
                }
                None => (path, None),
            }
        };
        check_repository(name).map_err(|w| bad(&w))?;
        Ok(Reference {
            registry: registry.to_ascii_lowercase(),
            repository: name.to_owned(),
            target,
        })
    }

    /// The reference with `tag` when it names no tag or digest.
    pub fn or_tag(mut self, tag: &str) -> Reference {
        if self.target.is_none() {
            self.target = Some(Target::Tag(tag.to_owned()));
        }
        self
    }

    /// The host without the port (and without IPv6 brackets).
    pub fn host(&self) -> &str {
        host_of(&self.registry)
    }

    /// Whether the host is a loopback name or address (127.0.0.0/8, ::1, localhost): the only
    /// hosts reached over plain HTTP without `--tls-verify=false`.
    pub fn is_loopback(&self) -> bool {
        is_loopback_host(self.host())
    }

    /// `REGISTRY/REPOSITORY@DIGEST`, the form `push` prints.
    pub fn pinned(&self, digest: &Digest) -> String {
        format!("{}/{}@{digest}", self.registry, self.repository)
    }
}

impl fmt::Display for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "oci://{}/{}", self.registry, self.repository)?;
        match &self.target {
            Some(Target::Tag(t)) => write!(f, ":{t}"),
            Some(Target::Digest(d)) => write!(f, "@{d}"),
            None => Ok(()),
        }
    }
}

/// `host` of `host[:port]`, brackets of an IPv6 address removed.
pub fn host_of(registry: &str) -> &str {
    if let Some(inner) = registry.strip_prefix('[') {
        return inner.split(']').next().unwrap_or(inner);
    }
    registry.split(':').next().unwrap_or(registry)
}

/// Whether `host` (no port) is loopback.
pub fn is_loopback_host(host: &str) -> bool {
    let h = host.to_ascii_lowercase();
    if h == "localhost" || h.ends_with(".localhost") {
        return true;
    }
    h.parse::<std::net::IpAddr>()
        .is_ok_and(|ip| ip.is_loopback())
}

fn check_registry(r: &str) -> Result<(), String> {
    if r.is_empty() {
        return Err("no registry host".into());
    }
    let (host, port) = if let Some(inner) = r.strip_prefix('[') {
        let (addr, after) = inner
            .split_once(']')
            .ok_or_else(|| format!("registry {r:?}: unclosed '['"))?;
        if addr.parse::<std::net::Ipv6Addr>().is_err() {
            return Err(format!("registry {r:?}: not an IPv6 address in brackets"));
        }
        match after {
            "" => (addr, None),
            p => (
                addr,
                Some(
                    p.strip_prefix(':')
                        .ok_or_else(|| format!("registry {r:?}: junk after ']'"))?,
                ),
            ),
        }
    } else {
        match r.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (r, None),
        }
    };
    if !r.starts_with('[') {
        let label_ok = |l: &str| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        };
        if host.is_empty() || host.len() > 253 || !host.split('.').all(label_ok) {
            return Err(format!(
                "registry host {host:?} is not a host name or address"
            ));
        }
    }
    if let Some(p) = port {
        if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) || p.parse::<u16>().is_err() {
            return Err(format!("registry port {p:?} is not a number in 0..=65535"));
        }
    }
    Ok(())
}

/// Repository names: `/`-separated components of `[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*`.
fn check_repository(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("empty repository name".into());
    }
    if name.len() > 255 {
        return Err("repository name longer than 255 characters".into());
    }
    for comp in name.split('/') {
        if !component_ok(comp) {
            return Err(format!(
                "repository component {comp:?} is not lowercase letters and digits separated \
                 by '.', '_', '__' or dashes"
            ));
        }
    }
    Ok(())
}

fn component_ok(c: &str) -> bool {
    let b = c.as_bytes();
    let alnum = |x: u8| x.is_ascii_lowercase() || x.is_ascii_digit();
    if b.is_empty() || !alnum(b[0]) || !alnum(b[b.len() - 1]) {
        return false;
    }
    let mut i = 0;
    while i < b.len() {
        if alnum(b[i]) {
            i += 1;
            continue;
        }
        // A separator run: ".", "_", "__", or one or more '-'.
        let start = i;
        while i < b.len() && !alnum(b[i]) {
            i += 1;
        }
        let sep = &c[start..i];
        let ok = sep == "." || sep == "_" || sep == "__" || sep.bytes().all(|x| x == b'-');
        if !ok {
            return false;
        }
    }
    true
}

/// Tags: `[A-Za-z0-9_][A-Za-z0-9._-]{0,127}`.
fn check_tag(tag: &str) -> Result<(), String> {
    let b = tag.as_bytes();
    let first = b
        .first()
        .is_some_and(|&x| x.is_ascii_alphanumeric() || x == b'_');
    let rest = b[1.min(b.len())..]
        .iter()
        .all(|&x| x.is_ascii_alphanumeric() || matches!(x, b'.' | b'_' | b'-'));
    if !first || !rest || b.len() > 128 {
        return Err(format!(
            "tag {tag:?} is not 1 to 128 of letters, digits, '_', '.', '-' (not starting with \
             '.' or '-')"
        ));
    }
    Ok(())
}

/// The SHA-256 digest of bytes that arrive in pieces.
pub struct Hasher(ring::digest::Context);

impl Hasher {
    pub fn new() -> Hasher {
        Hasher(ring::digest::Context::new(&ring::digest::SHA256))
    }

    pub fn update(&mut self, piece: &[u8]) {
        self.0.update(piece);
    }

    pub fn finish(self) -> Digest {
        Digest(format!("sha256:{}", hex(self.0.finish().as_ref())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEX: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn references_parse_and_display_canonically() {
        let r = Reference::parse("oci://127.0.0.1:5000/kpack/rocsparse:6.4").unwrap();
        assert_eq!(r.registry, "127.0.0.1:5000");
        assert_eq!(r.repository, "kpack/rocsparse");
        assert_eq!(r.target, Some(Target::Tag("6.4".into())));
        assert_eq!(r.to_string(), "oci://127.0.0.1:5000/kpack/rocsparse:6.4");
        assert!(r.is_loopback());
        assert_eq!(r.host(), "127.0.0.1");

        let d = format!("oci://Ghcr.IO/a/b.c__d-e@sha256:{HEX}");
        let r = Reference::parse(&d).unwrap();
        assert_eq!(r.registry, "ghcr.io");
        assert_eq!(r.repository, "a/b.c__d-e");
        assert_eq!(
            r.target,
            Some(Target::Digest(
                Digest::parse(&format!("sha256:{HEX}")).unwrap()
            ))
        );
        assert_eq!(
            r.to_string(),
            format!("oci://ghcr.io/a/b.c__d-e@sha256:{HEX}")
        );
        assert!(!r.is_loopback());

        let r = Reference::parse("oci://localhost/x").unwrap();
        assert_eq!(r.target, None);
        assert!(r.is_loopback());
        let r = r.or_tag(DEFAULT_TAG);
        assert_eq!(r.to_string(), "oci://localhost/x:latest");
        let r = Reference::parse("oci://[::1]:5000/x:T_1.a-b").unwrap();
        assert_eq!(r.host(), "::1");
        assert!(r.is_loopback());
        assert!(Reference::parse("oci://127.9.9.9/x").unwrap().is_loopback());
        assert!(!Reference::parse("oci://10.0.0.1/x").unwrap().is_loopback());
        assert_eq!(
            Reference::parse("oci://h/x")
                .unwrap()
                .pinned(&Digest::parse(&format!("sha256:{HEX}")).unwrap()),
            format!("h/x@sha256:{HEX}")
        );
    }

    #[test]
    fn bad_references_say_why() {
        for (r, why) in [
            ("docker://h/x", "must start with oci://"),
            ("oci://h", "no repository"),
            ("oci://h/", "empty repository"),
            ("oci://h/Upper", "repository component \"Upper\""),
            ("oci://h/a//b", "repository component \"\""),
            ("oci://h/a-", "repository component \"a-\""),
            ("oci://h/a...b", "repository component"),
            ("oci://h/a___b", "repository component"),
            ("oci://h/x:", "tag \"\""),
            ("oci://h/x:.t", "tag \".t\""),
            ("oci://h/x:a/b", "repository component \"x:a\""),
            ("oci://h:99999/x", "port \"99999\""),
            ("oci://h:/x", "port \"\""),
            ("oci://h_x/x", "host \"h_x\""),
            ("oci:///x", "no registry host"),
            ("oci://[zz]/x", "IPv6"),
            ("oci://h/x@sha256:abc", "64 lowercase hex"),
            ("oci://h/x@md5:abc", "not a sha256"),
        ] {
            let e = Reference::parse(r).unwrap_err();
            assert!(e.contains(why), "{r}: {e}");
            assert!(e.starts_with(r), "{r}: {e}");
        }
        let long = format!("oci://h/x:{}", "a".repeat(129));
        assert!(Reference::parse(&long).unwrap_err().contains("1 to 128"));
        assert!(Reference::parse(&format!("oci://h/x:{}", "a".repeat(128))).is_ok());
        assert!(Digest::parse(&format!("sha256:{}", HEX.to_uppercase())).is_err());
    }

    #[test]
    fn digests_of_bytes() {
        assert_eq!(
            Digest::of(b"{}").as_str(),
            "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"
        );
    }
}
