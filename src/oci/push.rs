//! `push`: kernel archives into a registry as one kernel-pack artifact. Each archive is opened
//! locally (which validates it and gives its arches and TOC place) and hashed; archives whose
//! frames are not all positioned and digested in their TOC get a kernel index layer. Blobs the
//! registry already has are not sent again; the manifest goes last, under the tag. The same
//! archives (same names, same bytes, same order) always give the same manifest digest.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rocm_kpack::archive::format::{HEADER_SIZE, Header};
use rocm_kpack::{Archive, ErrorKind, KernelIndex};

use super::manifest::{
    self, Descriptor, EMPTY_BLOB, FramesFrom, ImageManifest, MANIFEST_MEDIA_TYPE, TocPlace,
};
use super::reference::{DEFAULT_TAG, Digest, Hasher, Reference, Target};
use super::registry::{Options, Registry};
use super::upload::{BlobData, Chunking};
use crate::remote::client::{FetchError, Stats};
use crate::remote::settings::Settings;

/// The environment variable that sets the chunk size of uploads (and the largest blob sent in
/// one PUT) in bytes: a testing aid, documented in docs/oci.md.
pub const CHUNK_ENV: &str = "KPACK_FUSE_OCI_CHUNK";

/// What kind of failure a [`PushError`] is; the command line maps each to its exit code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PushErrorKind {
    /// A bad reference or command line: exit 2.
    Usage,
    /// A source that cannot be read: exit 3.
    Unreadable,
    /// A directory with no archive: exit 5.
    NoArchives,
    /// An archive that does not open: the core's kind.
    Archive(ErrorKind),
    /// The registry refused or could not be reached: exit 3.
    Registry,
}

/// Why a push failed: one line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PushError {
    pub kind: PushErrorKind,
    pub message: String,
}

impl PushError {
    fn new(kind: PushErrorKind, message: impl Into<String>) -> PushError {
        PushError {
            kind,
            message: message.into(),
        }
    }
}

impl From<FetchError> for PushError {
    fn from(e: FetchError) -> PushError {
        PushError::new(PushErrorKind::Registry, e.to_string())
    }
}

impl std::fmt::Display for PushError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// The push target: a reference with a tag (`latest` when none is given). A digest is refused.
pub fn target(dest: &str) -> Result<(Reference, String), PushError> {
    let r = Reference::parse(dest).map_err(|m| PushError::new(PushErrorKind::Usage, m))?;
    let r = r.or_tag(DEFAULT_TAG);
    match &r.target {
        Some(Target::Tag(t)) => {
            let t = t.clone();
            Ok((r, t))
        }
        _ => Err(PushError::new(
            PushErrorKind::Usage,
            format!("{dest}: push needs a tag (oci://REGISTRY/REPOSITORY:TAG), not a digest"),
        )),
    }
}

/// The archive files of `sources`: files as given, directories as their `*.kpack` files
/// directly inside, sorted by name. Two files of the same name are refused (layer titles
/// must be unique).
pub fn archive_files(sources: &[PathBuf]) -> Result<Vec<PathBuf>, PushError> {
    let mut out = Vec::new();
    for s in sources {
        let meta = std::fs::metadata(s).map_err(|e| {
            PushError::new(
                PushErrorKind::Unreadable,
                rocm_kpack::error::io_message(s, &e),
            )
        })?;
        if meta.is_dir() {
            let mut found: Vec<PathBuf> = std::fs::read_dir(s)
                .map_err(|e| {
                    PushError::new(
                        PushErrorKind::Unreadable,
                        rocm_kpack::error::io_message(s, &e),
                    )
                })?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "kpack") && p.is_file())
                .collect();
            if found.is_empty() {
                return Err(PushError::new(
                    PushErrorKind::NoArchives,
                    format!("{}: no *.kpack file directly inside", s.display()),
                ));
            }
            found.sort();
            out.extend(found);
        } else {
            out.push(s.clone());
        }
    }
    let mut seen = std::collections::HashMap::new();
    for p in &out {
        let name = title(p)?;
        if let Some(first) = seen.insert(name.clone(), p.clone()) {
            return Err(PushError::new(
                PushErrorKind::Usage,
                format!(
                    "{} and {} have the same file name {name:?}: layer titles must be unique",
                    first.display(),
                    p.display()
                ),
            ));
        }
    }
    Ok(out)
}

fn title(p: &Path) -> Result<String, PushError> {
    p.file_name()
        .and_then(|n| n.to_str())
        .map(str::to_owned)
        .ok_or_else(|| {
            PushError::new(
                PushErrorKind::Usage,
                format!("{}: the file name is not UTF-8", p.display()),
            )
        })
}

/// A blob to be present in the registry.
#[derive(Debug, Clone)]
pub struct Blob {
    pub digest: Digest,
    pub size: u64,
    pub data: BlobSource,
}

/// Where a blob's bytes are.
#[derive(Debug, Clone)]
pub enum BlobSource {
    Memory(Arc<Vec<u8>>),
    File(PathBuf),
}

/// The artifact made from local archives: its manifest and every blob it names.
#[derive(Debug, Clone)]
pub struct Prepared {
    pub manifest: ImageManifest,
    pub blobs: Vec<Blob>,
}

/// SHA-256, length and header of a file, read once.
fn hash_file(path: &Path) -> Result<(Digest, u64, Header), PushError> {
    let unreadable = |e: std::io::Error| {
        PushError::new(
            PushErrorKind::Unreadable,
            rocm_kpack::error::io_message(path, &e),
        )
    };
    let mut f = std::fs::File::open(path).map_err(unreadable)?;
    let mut ctx = Hasher::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut head = [0u8; HEADER_SIZE];
    let mut len = 0u64;
    loop {
        let n = f.read(&mut buf).map_err(unreadable)?;
        if n == 0 {
            break;
        }
        for (i, b) in buf[..n].iter().enumerate() {
            let at = len as usize + i;
            if at >= HEADER_SIZE {
                break;
            }
            head[at] = *b;
        }
        ctx.update(&buf[..n]);
        len += n as u64;
    }
    Ok((ctx.finish(), len, Header::parse(&head)))
}

/// Opens, checks and hashes each archive, and builds the manifest.
pub fn prepare(files: &[PathBuf]) -> Result<Prepared, PushError> {
    let mut layers: Vec<Descriptor> = Vec::new();
    let mut blobs = vec![Blob {
        digest: Digest::parse(manifest::EMPTY_DIGEST).expect("a digest"),
        size: EMPTY_BLOB.len() as u64,
        data: BlobSource::Memory(Arc::new(EMPTY_BLOB.to_vec())),
    }];
    for path in files {
        let name = title(path)?;
        let archive = Archive::open(path).map_err(|e| {
            let text = e.to_string();
            let shown = path.display().to_string();
            let message = if text.contains(&shown) {
                text
            } else {
                format!("{shown}: {text}")
            };
            PushError::new(PushErrorKind::Archive(e.kind()), message)
        })?;
        let (digest, size, header) = hash_file(path)?;
        if size != archive.file_len() || header.toc_offset >= size {
            return Err(PushError::new(
                PushErrorKind::Unreadable,
                format!("{}: the file changed while it was read", path.display()),
            ));
        }
        let toc = TocPlace {
            offset: header.toc_offset,
            length: size - header.toc_offset,
            blake3: archive.toc_digest(),
        };
        let in_toc = archive.frames_positioned()
            && archive.entries().all(|(_, e)| e.frame_blake3_at.is_some());
        let mut index = None;
        let frames = if in_toc {
            FramesFrom::Toc
        } else {
            let bytes = KernelIndex::build(&archive)
                .map_err(|e| PushError::new(PushErrorKind::Archive(e.kind()), e.to_string()))?
                .encode();
            let d = Digest::of(&bytes);
            let n = bytes.len() as u64;
            index = Some(Blob {
                digest: d.clone(),
                size: n,
                data: BlobSource::Memory(Arc::new(bytes)),
            });
            FramesFrom::Index { digest: d, size: n }
        };
        layers.push(manifest::archive_layer(
            &name,
            &digest,
            size,
            archive.architectures(),
            &toc,
            &frames,
        ));
        blobs.push(Blob {
            digest,
            size,
            data: BlobSource::File(path.clone()),
        });
        if let Some(b) = index {
            layers.push(manifest::index_layer(&name, &b.digest, b.size));
            blobs.push(b);
        }
    }
    Ok(Prepared {
        manifest: ImageManifest::pack(layers),
        blobs,
    })
}

/// What a push did.
#[derive(Debug, Clone)]
pub struct Pushed {
    pub digest: Digest,
    pub manifest: ImageManifest,
    /// Blobs sent, in order.
    pub uploaded: Vec<Digest>,
    /// Blobs the registry already had.
    pub present: Vec<Digest>,
}

/// The chunking of uploads: the defaults, or [`CHUNK_ENV`].
pub fn chunking() -> Result<Chunking, PushError> {
    match std::env::var(CHUNK_ENV) {
        Err(_) => Ok(Chunking::default()),
        Ok(v) => match v.parse::<u64>() {
            Ok(n) if n > 0 => Ok(Chunking {
                monolithic_max: n,
                chunk: n,
            }),
            _ => Err(PushError::new(
                PushErrorKind::Usage,
                format!("{CHUNK_ENV}={v:?} is not a positive number of bytes"),
            )),
        },
    }
}

/// Pushes `prepared` to `reference` under `tag`. `progress(done, total)` follows the bytes
/// uploaded, over the blobs the registry lacks.
pub fn push(
    reference: &Reference,
    tag: &str,
    prepared: &Prepared,
    tls_verify: bool,
    settings: &Settings,
    progress: &dyn Fn(u64, u64),
) -> Result<Pushed, PushError> {
    let chunking = chunking()?;
    let registry = Registry::new(
        reference,
        Options {
            tls_verify,
            push: true,
        },
        settings.clone(),
        Arc::new(Stats::default()),
    )?;
    let mut uploaded = Vec::new();
    let mut present = Vec::new();
    let mut missing = Vec::new();
    for b in &prepared.blobs {
        if uploaded.contains(&b.digest) || present.contains(&b.digest) {
            continue;
        }
        match registry.blob_size(&b.digest)? {
            Some(_) => present.push(b.digest.clone()),
            None => {
                missing.push(b);
                uploaded.push(b.digest.clone());
            }
        }
    }
    let total: u64 = missing.iter().map(|b| b.size).sum();
    let mut before = 0u64;
    for b in missing {
        let data = match &b.data {
            BlobSource::Memory(v) => BlobData::Bytes(v),
            BlobSource::File(p) => BlobData::File(p),
        };
        registry.upload_blob(&b.digest, b.size, data, chunking, &|n| {
            progress(before + n, total)
        })?;
        before += b.size;
    }
    let bytes = prepared.manifest.to_bytes();
    let digest = registry.put_manifest(tag, MANIFEST_MEDIA_TYPE, &bytes)?;
    log::debug!("{}", registry.stats().to_text().replace('\n', "; "));
    Ok(Pushed {
        digest,
        manifest: prepared.manifest.clone(),
        uploaded,
        present,
    })
}
