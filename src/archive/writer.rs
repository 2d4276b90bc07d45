//! Writes `.kpack` archives byte-identical to the reference writer for the same inputs: ordinals
//! in insertion order, the TOC's keys in the reference's order, minimal msgpack encodings, and
//! zstd frames made with content size and no checksum. Unless asked for the reference layout, each
//! TOC entry also records its frame position and the BLAKE3 digests of the kernel and of its zstd
//! frame (see docs/format.md). Compression and hashing of large inputs run on all cores; the
//! output does not depend on the thread count.

use std::io::{self, Write};
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::archive::codec::{self, FrameEncoder};
use crate::archive::format::{self, Header, Scheme};
use crate::atomic_file::{self, AtomicFile};
use crate::error::{Error, Result};

/// How the writer stores kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    None,
    Zstd { level: i32 },
}

impl Compression {
    pub fn scheme(self) -> Scheme {
        match self {
            Compression::None => Scheme::None,
            Compression::Zstd { .. } => Scheme::ZstdPerKernel,
        }
    }
}

impl Default for Compression {
    fn default() -> Self {
        Compression::Zstd {
            level: codec::DEFAULT_LEVEL,
        }
    }
}

struct PendingKernel {
    key: String,
    arch: String,
    data: Vec<u8>,
    metadata: Vec<(String, String)>,
}

/// Builds an archive in memory and writes it in one go.
pub struct ArchiveWriter {
    group_name: String,
    gfx_arch_family: String,
    gfx_arches: Vec<String>,
    compression: Compression,
    kernels: Vec<PendingKernel>,
    /// (key, arch) pairs added so far, so that a duplicate is refused in constant time.
    added: std::collections::HashSet<(String, String)>,
    threads: usize,
    /// Write exactly what the reference writer writes: no `frame`, `blake3` or `frame_blake3`.
    reference_layout: bool,
}

/// Inputs smaller than this are compressed on the calling thread: starting threads costs more.
const PARALLEL_THRESHOLD: usize = 1 << 20;

impl ArchiveWriter {
    pub fn new(
        group_name: impl Into<String>,
        gfx_arch_family: impl Into<String>,
        gfx_arches: Vec<String>,
        compression: Compression,
    ) -> Result<ArchiveWriter> {
        if let Compression::Zstd { level } = compression {
            FrameEncoder::new(level).map_err(Error::InvalidArgument)?;
        }
        Ok(ArchiveWriter {
            group_name: group_name.into(),
            gfx_arch_family: gfx_arch_family.into(),
            gfx_arches,
            compression,
            kernels: Vec::new(),
            added: std::collections::HashSet::new(),
            threads: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
            reference_layout: false,
        })
    }

    /// With `true`, writes exactly the reference writer's bytes: entries carry no `frame`,
    /// `blake3` or `frame_blake3` metadata (readers then validate the frame chain at open and
    /// check no digests).
    pub fn set_reference_layout(&mut self, on: bool) {
        self.reference_layout = on;
    }

    /// Caps the number of compression threads (at least one).
    pub fn set_threads(&mut self, threads: usize) {
        self.threads = threads.max(1);
    }

    pub fn len(&self) -> usize {
        self.kernels.len()
    }

    pub fn is_empty(&self) -> bool {
        self.kernels.is_empty()
    }

    /// Adds a kernel; it gets the next ordinal. Backslashes in the key become `/` (as the
    /// reference does). A (key, arch) pair may be added once.
    pub fn add_kernel(&mut self, key: &str, arch: &str, data: Vec<u8>) -> Result<()> {
        self.add_kernel_with_metadata(key, arch, data, Vec::new())
    }

    /// Like [`add_kernel`](Self::add_kernel), with string metadata stored in the entry's
    /// `metadata` map (the reader ignores it, as the reference does).
    pub fn add_kernel_with_metadata(
        &mut self,
        key: &str,
        arch: &str,
        data: Vec<u8>,
        metadata: Vec<(String, String)>,
    ) -> Result<()> {
        let key = key.replace('\\', "/");
        if !self.added.insert((key.clone(), arch.to_owned())) {
            return Err(Error::InvalidArgument(format!(
                "kernel {key} [{arch}] was already added"
            )));
        }
        self.kernels.push(PendingKernel {
            key,
            arch: arch.to_owned(),
            data,
            metadata,
        });
        Ok(())
    }

    /// Writes the archive to `path` through a temporary file in the same directory, renamed into
    /// place once complete (flushed to disk first), so a failed write never leaves a
    /// half-written archive behind.
    pub fn write(&self, path: &Path, progress: &(dyn Fn(u64) + Sync)) -> Result<u64> {
        let (tmp, file) = AtomicFile::create(path, atomic_file::Options::DURABLE)?;
        // Errors name the output the user asked for: the temporary file is our detail.
        let mut out = io::BufWriter::new(file);
        let n = self
            .write_to(&mut out, progress)
            .map_err(|e| relabel(e, path))?;
        let file = out
            .into_inner()
            .map_err(|e| Error::io(path, "cannot write", e.into_error()))?;
        tmp.commit(file)?;
        Ok(n)
    }

    /// Writes the archive to a stream; returns its size. `progress` receives the input bytes of
    /// each kernel once it has been encoded.
    pub fn write_to<W: Write>(&self, out: &mut W, progress: &(dyn Fn(u64) + Sync)) -> Result<u64> {
        let blob = self.build_blob(progress)?;
        let toc_offset = format::BLOB_ALIGNMENT + blob.bytes.len() as u64;
        let toc = self.encode_toc(&blob);
        let io_err = |e| Error::io("<output>", "cannot write", e);
        out.write_all(&Header::encode(toc_offset)).map_err(io_err)?;
        out.write_all(&[0u8; format::BLOB_ALIGNMENT as usize - format::HEADER_SIZE])
            .map_err(io_err)?;
        out.write_all(&blob.bytes).map_err(io_err)?;
        out.write_all(&toc).map_err(io_err)?;
        out.flush().map_err(io_err)?;
        Ok(toc_offset + toc.len() as u64)
    }

    fn build_blob(&self, progress: &(dyn Fn(u64) + Sync)) -> Result<Blob> {
        match self.compression {
            Compression::None => {
                let encoded = self.encode_all(None, progress)?;
                let total: usize = self.kernels.iter().map(|k| k.data.len()).sum();
                let mut bytes = Vec::with_capacity(total);
                let mut spans = Vec::with_capacity(self.kernels.len());
                for k in &self.kernels {
                    spans.push((
                        format::BLOB_ALIGNMENT + bytes.len() as u64,
                        k.data.len() as u64,
                    ));
                    bytes.extend_from_slice(&k.data);
                }
                let digests = encoded.into_iter().map(|e| (e.digest, None)).collect();
                Ok(Blob {
                    bytes,
                    spans,
                    digests,
                })
            }
            Compression::Zstd { level } => {
                let encoded = self.encode_all(Some(level), progress)?;
                let mut digests = Vec::with_capacity(encoded.len());
                let frames: Vec<Vec<u8>> = encoded
                    .into_iter()
                    .map(|e| {
                        digests.push((e.digest, e.frame_digest));
                        e.frame
                    })
                    .collect();
                let total: usize = frames.iter().map(|f| f.len() + 4).sum::<usize>() + 4;
                let mut bytes = Vec::with_capacity(total);
                let mut spans = Vec::with_capacity(frames.len());
                let count = u32::try_from(frames.len())
                    .ok()
                    .filter(|n| *n <= format::MAX_ZSTD_FRAMES)
                    .ok_or_else(|| {
                        Error::InvalidArgument(format!(
                            "{} kernels exceed the format's limit",
                            frames.len()
                        ))
                    })?;
                bytes.extend_from_slice(&count.to_le_bytes());
                for f in &frames {
                    let len = u32::try_from(f.len()).map_err(|_| {
                        Error::InvalidArgument("a compressed kernel exceeds 4 GiB".into())
                    })?;
                    spans.push((format::BLOB_ALIGNMENT + bytes.len() as u64, u64::from(len)));
                    bytes.extend_from_slice(&len.to_le_bytes());
                    bytes.extend_from_slice(f);
                }
                if bytes.len() as u64 > format::MAX_ZSTD_BLOB {
                    return Err(Error::InvalidArgument(
                        "the zstd blob would exceed 4 GiB".into(),
                    ));
                }
                Ok(Blob {
                    bytes,
                    spans,
                    digests,
                })
            }
        }
    }

    /// Compresses (when `level` is given) and hashes (unless writing the reference layout) every
    /// kernel, in parallel for large inputs; results are in ordinal order.
    fn encode_all(
        &self,
        level: Option<i32>,
        progress: &(dyn Fn(u64) + Sync),
    ) -> Result<Vec<Encoded>> {
        let total: usize = self.kernels.iter().map(|k| k.data.len()).sum();
        let threads = if total < PARALLEL_THRESHOLD {
            1
        } else {
            self.threads.min(self.kernels.len()).max(1)
        };
        let slots: Vec<Mutex<Option<FrameResult>>> =
            self.kernels.iter().map(|_| Mutex::new(None)).collect();
        let next = AtomicUsize::new(0);
        let digests = Digests::written(!self.reference_layout, level.is_some());
        let work = || -> std::result::Result<(), String> {
            let mut enc = level.map(FrameEncoder::new).transpose()?;
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(k) = self.kernels.get(i) else {
                    return Ok(());
                };
                let frame = match &mut enc {
                    Some(enc) => enc.encode(&k.data),
                    None => Ok(Vec::new()),
                };
                let digest = digests.of_kernel(&k.data);
                progress(k.data.len() as u64);
                let encoded = frame.map(|frame| Encoded {
                    frame_digest: digests.of_frame(&frame),
                    frame,
                    digest,
                });
                *crate::sync::lock(&slots[i]) = Some(encoded);
            }
        };
        if threads == 1 {
            work().map_err(Error::InvalidArgument)?;
        } else {
            std::thread::scope(|s| {
                let handles: Vec<_> = (0..threads).map(|_| s.spawn(work)).collect();
                handles.into_iter().try_for_each(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err("compression thread panicked".into()))
                })
            })
            .map_err(Error::InvalidArgument)?;
        }
        slots
            .into_iter()
            .zip(&self.kernels)
            .map(
                |(slot, k)| match slot.into_inner().unwrap_or_else(|p| p.into_inner()) {
                    Some(Ok(frame)) => Ok(frame),
                    Some(Err(e)) => Err(Error::InvalidArgument(format!(
                        "compressing {} [{}]: {e}",
                        k.key, k.arch
                    ))),
                    None => Err(Error::InvalidArgument(format!(
                        "{} [{}] was not compressed",
                        k.key, k.arch
                    ))),
                },
            )
            .collect()
    }

    /// The TOC, in the reference writer's key order.
    fn encode_toc(&self, blob: &Blob) -> Vec<u8> {
        let head = TocHead {
            group_name: &self.group_name,
            gfx_arch_family: &self.gfx_arch_family,
            gfx_arches: &self.gfx_arches,
            compression: self.compression,
            reference_layout: self.reference_layout,
        };
        let entries: Vec<TocEntry<'_>> = self
            .kernels
            .iter()
            .zip(&blob.digests)
            .map(|(k, (digest, frame_digest))| TocEntry {
                key: &k.key,
                arch: &k.arch,
                original_size: k.data.len() as u64,
                metadata: &k.metadata,
                digest: *digest,
                frame_digest: *frame_digest,
            })
            .collect();
        encode_toc(&head, &entries, &blob.spans, blob.bytes.len() as u64)
    }
}

/// Which digests an archive we write records for each kernel. Every writer (the in-memory
/// [`ArchiveWriter`], the streaming pack pipeline, [`encode_toc`]) asks this one rule: nothing
/// in the reference layout; otherwise `blake3` of every kernel, and for zstd archives also the
/// frame's position (`frame`) and `frame_blake3`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Digests {
    /// `blake3`: the decoded kernel's digest.
    pub kernel: bool,
    /// `frame` and `frame_blake3`: the zstd frame's position and digest.
    pub frame: bool,
}

impl Digests {
    /// What is written when `ours` (not `--reference-layout`) and kernels are stored as zstd
    /// frames (`zstd`).
    pub fn written(ours: bool, zstd: bool) -> Digests {
        Digests {
            kernel: ours,
            frame: ours && zstd,
        }
    }

    /// The `blake3` value for a kernel's decoded bytes, when one is written.
    pub(crate) fn of_kernel(self, data: &[u8]) -> Option<[u8; 32]> {
        self.kernel.then(|| *blake3::hash(data).as_bytes())
    }

    /// The `frame_blake3` value for a kernel's stored frame, when one is written.
    pub fn of_frame(self, frame: &[u8]) -> Option<[u8; 32]> {
        self.frame.then(|| *blake3::hash(frame).as_bytes())
    }
}

/// The archive-wide fields of a TOC.
pub(crate) struct TocHead<'a> {
    pub group_name: &'a str,
    pub gfx_arch_family: &'a str,
    pub gfx_arches: &'a [String],
    pub compression: Compression,
    /// No `frame` and no digests (see [`Digests`]), whatever the entries carry.
    pub reference_layout: bool,
}

/// One kernel as the TOC records it; its ordinal is its position.
pub struct TocEntry<'a> {
    pub key: &'a str,
    pub arch: &'a str,
    pub original_size: u64,
    pub metadata: &'a [(String, String)],
    /// BLAKE3 of the decoded kernel (`blake3`).
    pub digest: Option<[u8; 32]>,
    /// BLAKE3 of its zstd frame (`frame_blake3`); written only beside a `frame` (see [`Digests`]).
    pub frame_digest: Option<[u8; 32]>,
}

/// The TOC, in the reference writer's key order, for kernels in ordinal order. `spans` holds,
/// per ordinal, the kernel's absolute (offset, size) for `none`, or its frame's size word
/// position and the size it holds for zstd; `blob_len` is the zstd blob's length. Shared by
/// [`ArchiveWriter`] and the streaming writer of `split` and `pack --from-fatbin`.
pub(crate) fn encode_toc(
    head: &TocHead<'_>,
    entries: &[TocEntry<'_>],
    spans: &[(u64, u64)],
    blob_len: u64,
) -> Vec<u8> {
    use rmp::encode as e;
    let written = Digests::written(
        !head.reference_layout,
        matches!(head.compression, Compression::Zstd { .. }),
    );
    let mut t = Vec::new();
    let w = &mut t;
    let scheme_fields = match head.compression {
        Compression::None => 1,
        Compression::Zstd { .. } => 2,
    };
    e::write_map_len(w, 6 + scheme_fields).expect("vec write");
    e::write_str(w, "format_version").expect("vec write");
    e::write_uint(w, u64::from(format::VERSION)).expect("vec write");
    e::write_str(w, "group_name").expect("vec write");
    e::write_str(w, head.group_name).expect("vec write");
    e::write_str(w, "gfx_arch_family").expect("vec write");
    e::write_str(w, head.gfx_arch_family).expect("vec write");
    e::write_str(w, "gfx_arches").expect("vec write");
    e::write_array_len(w, head.gfx_arches.len() as u32).expect("vec write");
    for a in head.gfx_arches {
        e::write_str(w, a).expect("vec write");
    }
    // Keys in first-insertion order, arches in insertion order within each key.
    let mut keys: Vec<&str> = Vec::new();
    let mut by_key: std::collections::HashMap<&str, Vec<usize>> = std::collections::HashMap::new();
    for (i, k) in entries.iter().enumerate() {
        by_key.entry(k.key).or_insert_with(|| {
            keys.push(k.key);
            Vec::new()
        });
        by_key.get_mut(k.key).expect("inserted").push(i);
    }
    e::write_str(w, "toc").expect("vec write");
    e::write_map_len(w, keys.len() as u32).expect("vec write");
    for key in keys {
        e::write_str(w, key).expect("vec write");
        let idx = &by_key[key];
        e::write_map_len(w, idx.len() as u32).expect("vec write");
        for &i in idx {
            let k = &entries[i];
            e::write_str(w, k.arch).expect("vec write");
            let frame = written.frame.then(|| spans[i]);
            let digest = k.digest.filter(|_| written.kernel);
            let frame_digest = k.frame_digest.filter(|_| written.frame);
            let meta_len = k.metadata.len()
                + usize::from(frame.is_some())
                + usize::from(digest.is_some())
                + usize::from(frame_digest.is_some());
            e::write_map_len(w, if meta_len == 0 { 3 } else { 4 }).expect("vec write");
            e::write_str(w, "type").expect("vec write");
            e::write_str(w, "hsaco").expect("vec write");
            e::write_str(w, "ordinal").expect("vec write");
            e::write_uint(w, i as u64).expect("vec write");
            e::write_str(w, "original_size").expect("vec write");
            e::write_uint(w, k.original_size).expect("vec write");
            if meta_len != 0 {
                e::write_str(w, "metadata").expect("vec write");
                e::write_map_len(w, meta_len as u32).expect("vec write");
                for (mk, mv) in k.metadata {
                    e::write_str(w, mk).expect("vec write");
                    e::write_str(w, mv).expect("vec write");
                }
                if let Some((offset, size)) = frame {
                    e::write_str(w, format::META_FRAME).expect("vec write");
                    e::write_array_len(w, 2).expect("vec write");
                    e::write_uint(w, offset).expect("vec write");
                    e::write_uint(w, size).expect("vec write");
                }
                if let Some(d) = digest {
                    e::write_str(w, format::META_BLAKE3).expect("vec write");
                    e::write_bin(w, &d).expect("vec write");
                }
                if let Some(d) = frame_digest {
                    e::write_str(w, format::META_FRAME_BLAKE3).expect("vec write");
                    e::write_bin(w, &d).expect("vec write");
                }
            }
        }
    }
    e::write_str(w, "compression_scheme").expect("vec write");
    e::write_str(w, head.compression.scheme().name()).expect("vec write");
    match head.compression {
        Compression::None => {
            e::write_str(w, "blobs").expect("vec write");
            e::write_array_len(w, spans.len() as u32).expect("vec write");
            for (offset, size) in spans {
                e::write_map_len(w, 2).expect("vec write");
                e::write_str(w, "offset").expect("vec write");
                e::write_uint(w, *offset).expect("vec write");
                e::write_str(w, "size").expect("vec write");
                e::write_uint(w, *size).expect("vec write");
            }
        }
        Compression::Zstd { .. } => {
            e::write_str(w, "zstd_offset").expect("vec write");
            e::write_uint(w, format::BLOB_ALIGNMENT).expect("vec write");
            e::write_str(w, "zstd_size").expect("vec write");
            e::write_uint(w, blob_len).expect("vec write");
        }
    }
    t
}

/// One kernel's compressed frame (empty for `none`) and digest, or why compressing failed.
type FrameResult = std::result::Result<Encoded, String>;

struct Encoded {
    frame: Vec<u8>,
    digest: Option<[u8; 32]>,
    frame_digest: Option<[u8; 32]>,
}

/// A BLAKE3 digest, when one is recorded.
type Digest = Option<[u8; 32]>;

struct Blob {
    bytes: Vec<u8>,
    /// Absolute (offset, size) per ordinal. `none`: the kernel's bytes; zstd: the frame's size
    /// word and the size it holds (the `frame` metadata).
    spans: Vec<(u64, u64)>,
    /// Per ordinal, when hashing: the kernel's digest and (zstd) its frame's.
    digests: Vec<(Digest, Digest)>,
}

fn relabel(e: Error, path: &Path) -> Error {
    match e {
        Error::Io { what, source, .. } => Error::Io {
            path: path.to_path_buf(),
            what,
            source,
        },
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::Digests;

    #[test]
    fn one_rule_decides_which_digests_are_written() {
        let both = Digests::written(true, true);
        assert_eq!((both.kernel, both.frame), (true, true));
        let plain = Digests::written(true, false);
        assert_eq!((plain.kernel, plain.frame), (true, false));
        for zstd in [false, true] {
            let reference = Digests::written(false, zstd);
            assert_eq!((reference.kernel, reference.frame), (false, false));
            assert_eq!(reference.of_kernel(b"k"), None);
        }
        assert_eq!(plain.of_kernel(b"k"), Some(*blake3::hash(b"k").as_bytes()));
        assert_eq!(plain.of_frame(b"f"), None);
        assert_eq!(both.of_frame(b"f"), Some(*blake3::hash(b"f").as_bytes()));
    }
}
