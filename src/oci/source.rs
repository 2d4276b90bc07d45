//! `oci://REGISTRY/REPOSITORY[:TAG|@DIGEST]` sources: the tag resolved once to a manifest
//! digest, the manifest checked against it, the layers chosen for `--gpu`, and each chosen
//! archive layer opened as an [`Archive`] over a lazily read blob, so that every byte served is
//! checked from the manifest down:
//!
//! - a layer of our own layout (`frames=toc`): its TOC is checked against the digest its
//!   annotations give; the TOC holds each frame's BLAKE3;
//! - a layer with a kernel index (`frames=index`): the index blob is checked against its
//!   digest and opens the archive without walking its frames; it holds the TOC's digest and
//!   each frame's BLAKE3;
//! - a layer without our annotations: fetched whole and checked against its layer digest
//!   before any of it is used.
//!
//! Every frame is checked against its BLAKE3 before it is decoded (by the core).

use std::path::Path;
use std::sync::Arc;
use std::time::SystemTime;

use rocm_kpack::archive::kernel_index::KernelIndex;
use rocm_kpack::error::ErrorKind;
use rocm_kpack::fs::setup::gpus::KFD_NODES;
use rocm_kpack::{Archive, ByteSource};

use crate::remote::client::{FetchError, Stats};
use crate::remote::object::RemoteObject;
use crate::remote::settings::Settings;
use crate::remote::{Opened, RemoteError, RemoteErrorKind, Session};

use super::blob::BlobRanges;
use super::manifest::{FramesFrom, Pack, PackLayer};
use super::reference::{DEFAULT_TAG, Digest, Hasher, Reference, Target, hex};
use super::registry::{Options, Registry};
use super::select;

/// The largest kernel index accepted: an index costs 40 bytes or so per kernel, so this is
/// hundreds of thousands of kernels, and a hostile descriptor cannot make the mount allocate
/// more.
const INDEX_MAX: u64 = 64 << 20;

/// How an `oci://` source is read, beyond the remote settings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OciOptions {
    /// `--gpu` values as given (`auto` included); empty: every layer.
    pub gpus: Vec<String>,
}

/// Opens the archive layers of an artifact that serve the wanted GPUs.
pub fn open(
    source: &str,
    settings: &Settings,
    options: &OciOptions,
    spill: &Path,
) -> Result<Opened, RemoteError> {
    let reference = Reference::parse(source)
        .map_err(|m| RemoteError::new(RemoteErrorKind::BadUrl, m))?
        .or_tag(DEFAULT_TAG);
    let gpus = select::wanted_gpus(&options.gpus, Path::new(KFD_NODES))
        .map_err(|m| RemoteError::new(RemoteErrorKind::BadUrl, m))?;
    let stats = Arc::new(Stats::default());
    let unreachable = |e: FetchError| RemoteError::new(RemoteErrorKind::Unreachable, e.to_string());
    let registry = Arc::new(
        Registry::new(
            &reference,
            Options {
                tls_verify: settings.tls_verify,
                push: false,
            },
            settings.clone(),
            stats.clone(),
        )
        .map_err(unreachable)?,
    );
    let target = reference.target.clone().expect("or_tag names a target");
    let fetched = registry.get_manifest(&target).map_err(unreachable)?;
    let pinned = format!("oci://{}", reference.pinned(&fetched.digest));
    if matches!(target, Target::Tag(_)) {
        log::info!("{reference} is {}", fetched.digest);
    }
    let manifest = Pack::parse(&reference.to_string(), &fetched.media_type, &fetched.bytes)
        .map_err(|m| RemoteError::new(RemoteErrorKind::NotAPack, m))?;
    let resolved = SystemTime::now();
    let opener = LayerOpener {
        registry: &registry,
        pinned: pinned.clone(),
        spill,
        resolved,
    };
    let mut archives = Vec::new();
    let mut passed_over = Vec::new();
    for layer in &manifest.layers {
        let annotated = !layer.arches.is_empty();
        if let Some(gpus) = &gpus {
            if annotated && !select::serves(gpus, &layer.arches) {
                passed_over.push(layer);
                continue;
            }
        }
        let archive = opener.open(layer)?;
        if let (Some(gpus), false) = (&gpus, annotated) {
            // A layer that does not say its arches is known only once fetched and checked.
            if !select::serves(gpus, archive.architectures()) {
                passed_over.push(layer);
                continue;
            }
        }
        archives.push(Arc::new(archive));
    }
    let layer_count = manifest.layers.len();
    if archives.is_empty() {
        let gpus = gpus.unwrap_or_default().join(", ");
        let layers: Vec<String> = passed_over
            .iter()
            .map(|l| format!("{} ({})", l.title, l.arches.join(",")))
            .collect();
        return Err(RemoteError::new(
            RemoteErrorKind::NoArchives,
            format!(
                "{pinned}: none of its {layer_count} archive layers has code for {gpus}: {}",
                layers.join("; ")
            ),
        ));
    }
    for l in &passed_over {
        log::info!(
            "{pinned}: not fetching {} (no code for the GPUs asked for)",
            l.title
        );
    }
    Ok(Opened {
        shown: pinned,
        is_prefix: layer_count > 1,
        archives,
        warnings: Vec::new(),
        session: Session::new(stats),
    })
}

struct LayerOpener<'a> {
    registry: &'a Arc<Registry>,
    /// The reference with the manifest's digest, which names every layer in messages.
    pinned: String,
    spill: &'a Path,
    resolved: SystemTime,
}

impl LayerOpener<'_> {
    fn open(&self, layer: &PackLayer) -> Result<Archive, RemoteError> {
        let shown = format!("{}/{}", self.pinned, layer.title);
        let ranges = Arc::new(BlobRanges::new(
            self.registry.clone(),
            &layer.digest,
            layer.size,
            self.resolved,
        ));
        let object = RemoteObject::open(ranges, shown.clone(), self.spill)
            .map_err(|e| RemoteError::new(RemoteErrorKind::Unreachable, e.to_string()))?;
        let archive_error = |e: rocm_kpack::Error| RemoteError::archive(&shown, &e);
        match (&layer.frames, &layer.toc) {
            (FramesFrom::Toc, Some(toc)) => {
                let archive = Archive::open_source(Box::new(object)).map_err(archive_error)?;
                let offset = archive.toc_offset();
                if offset != toc.offset
                    || archive.file_len() - offset != toc.length
                    || archive.toc_digest() != toc.blake3
                {
                    return Err(RemoteError::new(
                        RemoteErrorKind::Archive(ErrorKind::InvalidFormat),
                        format!(
                            "{shown}: the archive's TOC is not the one its layer annotations \
                             name (bytes {}+{}, BLAKE3 {}): the registry's copy is damaged",
                            toc.offset,
                            toc.length,
                            hex(&toc.blake3)
                        ),
                    ));
                }
                Ok(archive)
            }
            (FramesFrom::Index { digest, size }, _) => {
                if *size > INDEX_MAX {
                    return Err(RemoteError::new(
                        RemoteErrorKind::NotAPack,
                        format!(
                            "{shown}: its kernel index is {size} bytes, more than the {INDEX_MAX} \
                             accepted"
                        ),
                    ));
                }
                let bytes = self
                    .registry
                    .get_blob_unchecked(digest, *size)
                    .map_err(|e| RemoteError::new(RemoteErrorKind::Unreachable, e.to_string()))?;
                // A damaged index is a damaged archive, as a damaged layer is.
                let got = Digest::of(&bytes);
                if got != *digest {
                    return Err(RemoteError::new(
                        RemoteErrorKind::Archive(ErrorKind::InvalidFormat),
                        format!(
                            "{shown}: kernel index {digest}: the blob's bytes have digest {got}: \
                             the registry's copy is damaged"
                        ),
                    ));
                }
                let index = KernelIndex::decode(&bytes).map_err(|e| {
                    RemoteError::new(
                        RemoteErrorKind::Archive(ErrorKind::InvalidFormat),
                        format!("{shown}: kernel index {digest}: {e}"),
                    )
                })?;
                if let Some(toc) = &layer.toc {
                    if (index.toc.offset, index.toc.size, index.toc_digest)
                        != (toc.offset, toc.length, toc.blake3)
                    {
                        return Err(RemoteError::new(
                            RemoteErrorKind::Archive(ErrorKind::InvalidFormat),
                            format!(
                                "{shown}: kernel index {digest} names another TOC than the \
                                 layer's annotations"
                            ),
                        ));
                    }
                }
                Archive::open_with_index(Box::new(object), &index).map_err(archive_error)
            }
            _ => {
                let mut hash = Hasher::new();
                object
                    .fetch_whole(&mut |piece| hash.update(piece))
                    .map_err(|e| {
                        RemoteError::new(RemoteErrorKind::Unreachable, format!("{shown}: {e}"))
                    })?;
                let got = hash.finish();
                if got != layer.digest {
                    return Err(RemoteError::new(
                        RemoteErrorKind::Archive(ErrorKind::InvalidFormat),
                        format!(
                            "{shown}: the blob's bytes have digest {got}, not {}: the \
                             registry's copy is damaged",
                            layer.digest
                        ),
                    ));
                }
                object.keep_whole();
                Archive::open_source(Box::new(object) as Box<dyn ByteSource>).map_err(archive_error)
            }
        }
    }
}
