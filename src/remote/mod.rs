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
pub mod settings;
pub mod url;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use object_store::path::Path as ObjectPath;
use rocm_kpack::Archive;
use rocm_kpack::error::ErrorKind;

use crate::cli::Exit;
use client::{Client, Endpoint, FetchError, Stats};
use object::RemoteObject;
use settings::RemoteArgs;
pub use url::{RemoteUrl, is_remote};

/// Why a remote source cannot be used, with the exit code the commands give it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteError {
    pub exit: Exit,
    pub message: String,
}

impl RemoteError {
    fn new(exit: Exit, message: impl Into<String>) -> RemoteError {
        RemoteError {
            exit,
            message: message.into(),
        }
    }

    /// A request failure at open: the source is missing or unreadable (exit 3), with the
    /// server's reason.
    fn fetch(e: FetchError) -> RemoteError {
        RemoteError::new(Exit::Unreadable, e.to_string())
    }

    fn archive(url: &str, e: &rocm_kpack::Error) -> RemoteError {
        let exit = match e.kind() {
            ErrorKind::FileNotFound | ErrorKind::IoError => Exit::Unreadable,
            _ => Exit::BadFormat,
        };
        let text = e.to_string();
        let message = if text.contains(url) {
            text
        } else {
            format!("{url}: {text}")
        };
        RemoteError::new(exit, message)
    }
}

/// The clients of one opened remote source, kept for their counters and so that their network
/// threads can be stopped before the mount forks.
#[derive(Debug, Clone)]
pub struct Session {
    clients: Vec<Arc<Client>>,
    stats: Arc<Stats>,
}

impl Session {
    /// Stops the network threads (they restart on the next request).
    pub fn suspend(&self) {
        for c in &self.clients {
            c.suspend();
        }
    }

    pub fn stats(&self) -> Arc<Stats> {
        self.stats.clone()
    }
}

/// An opened remote source.
#[derive(Debug)]
pub struct Opened {
    pub url: RemoteUrl,
    /// Whether the URL named a prefix (shown like a directory of archives).
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
/// warnings (errors with `strict`), as in a local directory.
pub fn open(
    source: &str,
    args: &RemoteArgs,
    strict: bool,
    spill: Option<&Path>,
) -> Result<Opened, RemoteError> {
    let url = RemoteUrl::parse(source).map_err(|m| RemoteError::new(Exit::Usage, m))?;
    let stats = Arc::new(Stats::default());
    let resolved = args.resolve();
    let spill = spill_dir(spill);
    let (endpoint, members, is_prefix) = match &url {
        RemoteUrl::Http { base, path } => {
            let p = ObjectPath::from_url_path(path)
                .map_err(|e| RemoteError::new(Exit::Usage, format!("{url}: {e}")))?;
            (
                Endpoint::Http { base: base.clone() },
                vec![(p, url.to_string())],
                false,
            )
        }
        RemoteUrl::S3Object { bucket, key } => {
            let p = ObjectPath::parse(key)
                .map_err(|e| RemoteError::new(Exit::Usage, format!("{url}: {e}")))?;
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
    let client = Arc::new(Client::new(endpoint, resolved, stats.clone()));
    let members = match &url {
        RemoteUrl::S3Prefix { bucket, prefix } => {
            let mut objects = client
                .list(&format!("listing {url}"), prefix)
                .map_err(RemoteError::fetch)?;
            objects.retain(|m| m.location.as_ref().ends_with(".kpack"));
            objects.sort_by(|a, b| a.location.as_ref().cmp(b.location.as_ref()));
            if objects.is_empty() {
                return Err(RemoteError::new(
                    Exit::NotFound,
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
        let opened = RemoteObject::open(client.clone(), path, shown.clone(), &spill)
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
            Exit::NotFound,
            format!("{url}: none of its {total} *.kpack objects opens"),
        ));
    }
    Ok(Opened {
        url,
        is_prefix,
        archives,
        warnings,
        session: Session {
            clients: vec![client],
            stats,
        },
    })
}

/// The archives a command argument names: a local path (one archive), or a URL (one object,
/// or with `allow_prefix` every archive under an S3 prefix).
pub fn open_for_command(
    arg: &Path,
    args: &RemoteArgs,
    allow_prefix: bool,
) -> crate::cli::CliResult<Vec<Arc<Archive>>> {
    use crate::cli::CliError;
    let Some(url) = arg.to_str().filter(|s| is_remote(s)) else {
        return Ok(vec![Arc::new(Archive::open(arg)?)]);
    };
    let parsed = RemoteUrl::parse(url).map_err(|m| CliError::new(Exit::Usage, m))?;
    if !allow_prefix && matches!(parsed, RemoteUrl::S3Prefix { .. }) {
        return Err(CliError::new(
            Exit::Usage,
            format!("{url}: names a prefix; this command reads one archive (s3://BUCKET/KEY)"),
        ));
    }
    // Commands fail on any member that does not open, as they do for a local file.
    let opened = open(url, args, true, None).map_err(|e| CliError::new(e.exit, e.message))?;
    Ok(opened.archives)
}

/// The one archive a command argument names (a local path or a URL of one object).
pub fn open_one(arg: &Path, args: &RemoteArgs) -> crate::cli::CliResult<Arc<Archive>> {
    let mut v = open_for_command(arg, args, false)?;
    Ok(v.remove(0))
}

/// A remote mount source, opened as the mount's [`Source`](rocm_kpack::fs::source::Source)
/// (shown by its URL), and its session (counters; threads to stop before the fork).
pub fn mount_source(
    url: &str,
    args: &RemoteArgs,
    strict: bool,
) -> crate::cli::CliResult<(rocm_kpack::fs::source::Source, Session)> {
    use rocm_kpack::fs::source::{Source, SourceKind};
    let o =
        open(url, args, strict, None).map_err(|e| crate::cli::CliError::new(e.exit, e.message))?;
    let src = Source {
        kind: if o.is_prefix {
            SourceKind::Directory
        } else {
            SourceKind::Archive
        },
        path: PathBuf::from(o.url.to_string()),
        archives: o.archives,
        kernel_name: None,
        warnings: o.warnings,
    };
    Ok((src, o.session))
}
