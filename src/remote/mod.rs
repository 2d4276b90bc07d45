//! Archives in object storage: `s3://BUCKET/KEY.kpack`, `s3://BUCKET/PREFIX/` (every `*.kpack`
//! directly under it) and `http(s)://HOST/PATH.kpack`, opened as [`Archive`]s that read through
//! [`object::RemoteObject`], so the mount, `list`, `verify` and `extract` treat them exactly as
//! local archives.
//!
//! This module belongs to the `kpack-fuse` program only: the library (`librocm_kpack`) never
//! references it, so the C library links no HTTP or TLS code.

pub mod client;
mod credentials;
pub mod object;
mod ranges;
pub mod retry;
pub mod settings;
pub mod url;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use object_store::path::Path as ObjectPath;
use rocm_kpack::Archive;
use rocm_kpack::error::ErrorKind;

pub use crate::oci::source::OciOptions;
use client::{Client, Endpoint, FetchError, Stats, StoreObject};
use object::RemoteObject;
use settings::Settings;
pub use url::{RemoteUrl, is_remote};

/// What kind of failure a [`RemoteError`] is; the command line maps each to its exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RemoteErrorKind {
    /// The URL itself is malformed, or names a prefix where one object is needed.
    BadUrl,
    /// A request failed: the object is missing, forbidden, or the server could not be reached.
    Unreachable,
    /// The object was fetched but is not a readable archive (the core's reason).
    Archive(ErrorKind),
    /// A prefix holds no archive that opens, or an artifact no layer for the GPUs asked for.
    NoArchives,
    /// An `oci://` reference names something that is not a kernel pack (a container image, an
    /// index, a manifest our layers do not fit).
    NotAPack,
}

/// Why a remote source cannot be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteError {
    pub kind: RemoteErrorKind,
    pub message: String,
}

impl RemoteError {
    pub(crate) fn new(kind: RemoteErrorKind, message: impl Into<String>) -> RemoteError {
        RemoteError {
            kind,
            message: message.into(),
        }
    }

    /// A request failure at open, with the server's reason.
    fn fetch(e: FetchError) -> RemoteError {
        RemoteError::new(RemoteErrorKind::Unreachable, e.to_string())
    }

    pub(crate) fn archive(url: &str, e: &rocm_kpack::Error) -> RemoteError {
        let text = e.to_string();
        let message = if text.contains(url) {
            text
        } else {
            format!("{url}: {text}")
        };
        RemoteError::new(RemoteErrorKind::Archive(e.kind()), message)
    }
}

impl std::fmt::Display for RemoteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// What an opened remote source shares among its objects: their request counters.
#[derive(Debug, Clone)]
pub struct Session {
    stats: Arc<Stats>,
}

impl Session {
    pub(crate) fn new(stats: Arc<Stats>) -> Session {
        Session { stats }
    }

    pub fn stats(&self) -> Arc<Stats> {
        self.stats.clone()
    }
}

/// An opened remote source.
#[derive(Debug)]
pub struct Opened {
    /// The source as the mount shows it (an `oci://` tag resolved to its digest).
    pub shown: String,
    /// Whether the URL named a prefix or an artifact of several archives (shown like a
    /// directory of archives).
    pub is_prefix: bool,
    pub archives: Vec<Arc<Archive>>,
    /// Members of a prefix that did not open (already logged as warnings).
    pub warnings: Vec<String>,
    pub session: Session,
}

/// Where fetched ranges spill: `dir` when given (a cache directory), else the temporary
/// directory.
fn spill_dir(dir: Option<&Path>) -> PathBuf {
    dir.map(Path::to_path_buf)
        .unwrap_or_else(std::env::temp_dir)
}

/// Opens every archive a remote source names. Members of a prefix that do not open are
/// warnings (errors with `strict`), as in a local directory; an `oci://` artifact's layers are
/// chosen by `oci` and each must open.
pub fn open(
    source: &str,
    settings: &Settings,
    oci: &OciOptions,
    strict: bool,
    spill: Option<&Path>,
) -> Result<Opened, RemoteError> {
    if crate::oci::is_oci(source) {
        return crate::oci::source::open(source, settings, oci, &spill_dir(spill));
    }
    let url = RemoteUrl::parse(source).map_err(|m| RemoteError::new(RemoteErrorKind::BadUrl, m))?;
    let stats = Arc::new(Stats::default());
    let spill = spill_dir(spill);
    let (endpoint, members, is_prefix) = match &url {
        RemoteUrl::Http { base, path } => {
            let p = ObjectPath::from_url_path(path)
                .map_err(|e| RemoteError::new(RemoteErrorKind::BadUrl, format!("{url}: {e}")))?;
            (
                Endpoint::Http { base: base.clone() },
                vec![(p, url.to_string())],
                false,
            )
        }
        RemoteUrl::S3Object { bucket, key } => {
            let p = ObjectPath::parse(key)
                .map_err(|e| RemoteError::new(RemoteErrorKind::BadUrl, format!("{url}: {e}")))?;
            (
                Endpoint::S3 {
                    bucket: bucket.clone(),
                },
                vec![(p, url.to_string())],
                false,
            )
        }
        RemoteUrl::S3Prefix { bucket, .. } => (
            Endpoint::S3 {
                bucket: bucket.clone(),
            },
            Vec::new(),
            true,
        ),
    };
    let client = Arc::new(Client::new(endpoint, settings.clone(), stats.clone()));
    let members = match &url {
        RemoteUrl::S3Prefix { bucket, prefix } => {
            let mut objects = client
                .list(&format!("listing {url}"), prefix)
                .map_err(RemoteError::fetch)?;
            objects.retain(|m| m.location.as_ref().ends_with(".kpack"));
            objects.sort_by(|a, b| a.location.as_ref().cmp(b.location.as_ref()));
            if objects.is_empty() {
                return Err(RemoteError::new(
                    RemoteErrorKind::NoArchives,
                    format!("{url}: no *.kpack object directly under this prefix"),
                ));
            }
            objects
                .into_iter()
                .map(|m| {
                    let shown = format!("s3://{bucket}/{}", m.location);
                    (m.location, shown)
                })
                .collect()
        }
        _ => members,
    };
    let mut archives = Vec::new();
    let mut warnings = Vec::new();
    let total = members.len();
    for (path, shown) in members {
        let opened = RemoteObject::open(
            Arc::new(StoreObject::new(client.clone(), path)),
            shown.clone(),
            &spill,
        )
        .map_err(RemoteError::fetch)
        .and_then(|o| {
            Archive::open_source(Box::new(o)).map_err(|e| RemoteError::archive(&shown, &e))
        });
        match opened {
            Ok(a) => archives.push(Arc::new(a)),
            Err(e) if is_prefix && !strict => {
                let w = format!("skipping {}", e.message);
                log::warn!("{w}");
                warnings.push(w);
            }
            Err(e) => return Err(e),
        }
    }
    if archives.is_empty() {
        return Err(RemoteError::new(
            RemoteErrorKind::NoArchives,
            format!("{url}: none of its {total} *.kpack objects opens"),
        ));
    }
    Ok(Opened {
        shown: url.to_string(),
        is_prefix,
        archives,
        warnings,
        session: Session { stats },
    })
}

/// A remote mount source, opened as the mount's [`Source`](rocm_kpack::fs::setup::source::Source)
/// (shown by its URL), and its session (counters).
pub fn mount_source(
    url: &str,
    settings: &Settings,
    oci: &OciOptions,
    strict: bool,
) -> Result<(rocm_kpack::fs::setup::source::Source, Session), RemoteError> {
    use rocm_kpack::fs::setup::source::{Source, SourceKind};
    let o = open(url, settings, oci, strict, None)?;
    let src = Source {
        kind: if o.is_prefix {
            SourceKind::Directory
        } else {
            SourceKind::Archive
        },
        path: PathBuf::from(o.shown),
        archives: o.archives,
        kernel_name: None,
        warnings: o.warnings,
    };
    Ok((src, o.session))
}
