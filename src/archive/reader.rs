//! An open `.kpack` archive: validated at open, then read concurrently with positioned reads.
//!
//! One `Archive` is `Send + Sync`. Its bytes come from a [`ByteSource`] (a local file, or a remote
//! object supplied by the program), opened once; kernels are read with positioned reads, so no
//! cursor is shared and no lock is held across I/O or decompression. zstd contexts are per thread.
//! Every allocation is bounded by the file: the TOC by the bytes present, the frame table by the
//! frames present, a decoded kernel by its `original_size`, and a stored blob by the file length.

use std::borrow::Cow;
use std::cell::RefCell;
use std::io;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use crate::archive::byte_source::{ByteSource, LocalFile, read_full_at};
use crate::archive::codec::{self, KernelBuf};
use crate::archive::format::{self, Header, Scheme, Span, Toc, TocBinary, TocEntry, TocReadError};
use crate::archive::kernel_index::KernelIndex;
use crate::error::{Error, Result};

/// Up to this many digests (`blake3` and `frame_blake3` values) are kept in memory at open;
/// past it (about 4.5 MiB), each is read from the TOC in the file when a kernel is located. A
/// million-entry archive would otherwise keep 64 MiB of digests for the life of a mount, while
/// a small one would pay a read per kernel.
const KEEP_DIGESTS: usize = 1 << 17;

/// A BLAKE3 digest an entry may record.
type Digest = Option<[u8; 32]>;

/// An open archive.
#[derive(Debug)]
pub struct Archive {
    /// The source's display name, as errors carry it.
    path: PathBuf,
    source: Box<dyn ByteSource>,
    file_len: u64,
    modified: Option<SystemTime>,
    toc: Toc,
    /// Where the TOC starts in the file (digest positions count from here).
    toc_offset: u64,
    /// The entries' digests, sorted by their TOC position, when few enough to keep; `None`:
    /// read from the file when needed.
    digests: Option<Vec<(u32, [u8; 32])>>,
    /// BLAKE3 of the TOC's msgpack object.
    toc_digest: [u8; 32],
    /// Absolute byte ranges of stored kernels, indexed by ordinal (blobs, zstd frames found by
    /// walking the chain at open, or those of a kernel index). Empty when frames are located
    /// from the TOC.
    spans: Vec<Span>,
    /// zstd archives whose every entry records its frame position: the blob and its frame
    /// count, read at open; each frame is checked against them when it is read.
    lazy_frames: Option<(Span, u32)>,
    /// Opened with a kernel index: the BLAKE3 of each stored kernel by ordinal (as `spans`),
    /// which every read checks before decoding.
    stored_digests: Option<Vec<[u8; 32]>>,
}

/// Where [`Archive::read_in_steps`] hands each piece: its offset in the kernel and its bytes.
type PieceSink<'a> = dyn FnMut(u64, &[u8]) -> std::result::Result<(), String> + 'a;

/// Where one kernel is and how big it comes out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelRef<'a> {
    pub key: &'a str,
    pub arch: &'a str,
    pub ordinal: u32,
    /// Bytes stored in the file (blob or frame).
    pub stored: Span,
    /// Bytes `get_kernel` returns: the blob size for `none`, `original_size` for zstd.
    pub size: u64,
    /// The frame was located from the TOC: its size word (the 4 bytes before `stored`) is
    /// checked when it is read.
    pub size_word_unchecked: bool,
    /// The entry's `blake3` digest of the decoded bytes, when the archive records one.
    pub digest: Option<[u8; 32]>,
    /// The entry's `frame_blake3` digest of its zstd frame (zstd archives only). When present,
    /// reads check the frame's bytes against it before decoding, and do not hash the output.
    pub frame_digest: Option<[u8; 32]>,
}

impl KernelRef<'_> {
    /// Bytes read before a zstd frame: its 4-byte size word when the frame was located from the
    /// TOC (the word is then checked), else none.
    fn frame_word(&self) -> usize {
        if self.size_word_unchecked { 4 } else { 0 }
    }
}

impl Archive {
    /// Opens and validates an archive. Errors follow the reference's open matrix (see
    /// `Error::kind`).
    pub fn open(path: impl AsRef<Path>) -> Result<Archive> {
        Archive::open_source(Box::new(LocalFile::open(path)?))
    }

    /// Opens and validates an archive read from any byte source (a local file, a remote object).
    pub fn open_source(source: Box<dyn ByteSource>) -> Result<Archive> {
        Archive::open_keeping(source, KEEP_DIGESTS)
    }

    /// Opens an archive described by its kernel index (see `kernel_index.rs`): the header and
    /// the TOC are read and checked as [`open_source`](Self::open_source) checks them, and the
    /// TOC's place and digest must be the index's; the stored kernels' places come from the
    /// index (checked against the TOC), so nothing of the blob is read at open. Every read of
    /// a kernel then checks its stored bytes against the index's digest before decoding them.
    /// An archive that is not the one indexed is an invalid-format error.
    pub fn open_with_index(source: Box<dyn ByteSource>, index: &KernelIndex) -> Result<Archive> {
        Archive::open_parts(source, KEEP_DIGESTS, Some(index))
    }

    /// Opens, keeping at most `keep_digests` digests in memory.
    fn open_keeping(source: Box<dyn ByteSource>, keep_digests: usize) -> Result<Archive> {
        Archive::open_parts(source, keep_digests, None)
    }

    /// Opens, keeping at most `keep_digests` digests in memory, with the stored kernels' places
    /// from `index` when given, else from the TOC or the frame chain.
    fn open_parts(
        source: Box<dyn ByteSource>,
        keep_digests: usize,
        index: Option<&KernelIndex>,
    ) -> Result<Archive> {
        let modified = source.modified();
        let path = PathBuf::from(source.display_name());
        let file_len = source.len();
        if file_len == 0 {
            return Err(Error::EmptyFile { path });
        }
        let mut header = [0u8; format::HEADER_SIZE];
        let got = read_full_at(&*source, &mut header, 0)
            .map_err(|e| Error::io(&path, "cannot read header", e))?;
        if got < header.len() {
            return Err(Error::TruncatedHeader {
                path,
                len: got as u64,
            });
        }
        let header = Header::parse(&header);
        if &header.magic != format::MAGIC {
            return Err(Error::BadMagic {
                path,
                found: header.magic,
            });
        }
        if header.version != format::VERSION {
            return Err(Error::UnsupportedVersion {
                path,
                version: header.version,
            });
        }
        if header.toc_offset >= file_len {
            return Err(Error::TocOffsetOutOfRange {
                path,
                toc_offset: header.toc_offset,
                file_len,
            });
        }
        let toc_offset = header.toc_offset;
        let mismatch = |reason: String| Error::KernelIndexMismatch {
            path: path.clone(),
            reason,
        };
        let toc_place = Span {
            offset: toc_offset,
            size: file_len - toc_offset,
        };
        if let Some(want) = index.map(|i| i.toc).filter(|&want| want != toc_place) {
            return Err(mismatch(format!(
                "TOC does not match its kernel index (the archive's TOC lies at byte {} with {} \
                 bytes to the end of the file, the index says byte {} with {} bytes)",
                toc_place.offset, toc_place.size, want.offset, want.size
            )));
        }
        // Streamed through a bounded window, hashed on the way (see format/window.rs).
        let mut read = |at: u64, buf: &mut [u8]| source.read_at(buf, toc_offset + at);
        let (mut toc, toc_digest) =
            format::read_toc(file_len - toc_offset, &mut read, keep_digests).map_err(
                |e| match e {
                    TocReadError::Io(e) => Error::io(&path, "cannot read TOC", e),
                    TocReadError::Toc(e) => Error::TocParse {
                        path: path.clone(),
                        offset: toc_offset + e.offset as u64,
                        reason: e.reason,
                    },
                    TocReadError::OutOfMemory(bytes) => Error::OutOfMemory { bytes },
                },
            )?;
        if let Some(want) = index.map(|i| i.toc_digest).filter(|&d| d != toc_digest) {
            return Err(mismatch(format!(
                "TOC does not match its kernel index (its BLAKE3 is {}, the index records {})",
                crate::error::hex(&toc_digest),
                crate::error::hex(&want)
            )));
        }
        let digests = toc.kernels.take_digests();

        let mut stored_digests = None;
        let (spans, lazy_frames) = match (toc.scheme, index) {
            (scheme, Some(index)) => {
                if scheme == Scheme::ZstdPerKernel {
                    check_zstd_blob(&path, file_len, toc.zstd_blob)?;
                }
                let spans = index
                    .stored_spans(scheme, &toc.blobs, toc.zstd_blob)
                    .map_err(mismatch)?;
                stored_digests = Some(index.stored.iter().map(|s| s.digest).collect());
                (spans, None)
            }
            (Scheme::None, None) => (toc.blobs.clone(), None),
            (Scheme::ZstdPerKernel, None) => {
                let blob = toc.zstd_blob;
                let count = zstd_frame_count(&path, &*source, file_len, blob)?;
                let mut entries = toc.kernels.binaries().flat_map(|b| b.arches()).peekable();
                let positioned = entries.peek().is_some() && entries.all(|e| e.frame.is_some());
                if positioned {
                    (Vec::new(), Some((blob, count)))
                } else {
                    (index_zstd(&path, &*source, blob)?, None)
                }
            }
        };
        Ok(Archive {
            path,
            source,
            file_len,
            modified,
            toc,
            toc_offset,
            digests,
            toc_digest,
            spans,
            lazy_frames,
            stored_digests,
        })
    }

    /// The source's display name (a path for local files, a URL for remote ones).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The byte source this archive reads from.
    pub fn source(&self) -> &dyn ByteSource {
        &*self.source
    }

    pub fn file_len(&self) -> u64 {
        self.file_len
    }

    /// The archive file's modification time, when the file system reports one.
    pub fn modified(&self) -> Option<SystemTime> {
        self.modified
    }

    /// Where the TOC starts (the header's `toc_offset`).
    pub fn toc_offset(&self) -> u64 {
        self.toc_offset
    }

    /// BLAKE3 of the exact bytes of the TOC's msgpack object (from `toc_offset` to its end,
    /// without trailing bytes). The TOC holds every kernel's digest in archives we write, so
    /// this pins the whole archive; pins and cache keys use it.
    pub fn toc_digest(&self) -> [u8; 32] {
        self.toc_digest
    }

    /// The `blake3` digest recorded for a kernel, when the archive has one for it. In a large
    /// archive this reads 32 bytes of the TOC from the file (see [`KEEP_DIGESTS`]).
    pub fn kernel_digest(&self, key: &str, arch: &str) -> Result<Option<[u8; 32]>> {
        match self.entry_index(key, arch) {
            Some((b, e)) => self.entry_digest(&self.entry_at(b, e).expect("found")),
            None => Ok(None),
        }
    }

    /// The `blake3` digest of an entry of this archive's TOC, when it has one.
    pub fn entry_digest(&self, entry: &TocEntry<'_>) -> Result<Option<[u8; 32]>> {
        entry.blake3_at.map(|at| self.digest_at(at)).transpose()
    }

    /// The 32 digest bytes at TOC position `at`: kept, or read from the file.
    fn digest_at(&self, at: u32) -> Result<[u8; 32]> {
        if let Some(kept) = &self.digests {
            if let Ok(i) = kept.binary_search_by_key(&at, |&(pos, _)| pos) {
                return Ok(kept[i].1);
            }
        }
        let mut digest = [0u8; 32];
        self.read_toc_bytes(at, &mut digest)?;
        Ok(digest)
    }

    /// The digests at TOC positions `kernel` (`blake3`) and `frame` (`frame_blake3`). When both
    /// come from the file and lie close together (our writer puts them 47 bytes apart), one read
    /// fetches both.
    fn digests_at(&self, kernel: Option<u32>, frame: Option<u32>) -> Result<(Digest, Digest)> {
        /// Farthest apart two digests may start and still be read together.
        const NEAR: u32 = 96;
        if let (None, Some(k), Some(f)) = (&self.digests, kernel, frame) {
            let (lo, hi) = (k.min(f), k.max(f));
            if hi - lo <= NEAR {
                let mut both = [0u8; NEAR as usize + 32];
                let both = &mut both[..(hi - lo) as usize + 32];
                self.read_toc_bytes(lo, both)?;
                let take = |at: u32| -> [u8; 32] {
                    both[(at - lo) as usize..][..32]
                        .try_into()
                        .expect("32 bytes")
                };
                return Ok((Some(take(k)), Some(take(f))));
            }
        }
        let read = |at: Option<u32>| at.map(|at| self.digest_at(at)).transpose();
        Ok((read(kernel)?, read(frame)?))
    }

    /// Fills `buf` from TOC position `at` (digests of archives too large to keep them).
    fn read_toc_bytes(&self, at: u32, buf: &mut [u8]) -> Result<()> {
        let offset = self.toc_offset + u64::from(at);
        let got = read_full_at(&*self.source, buf, offset)
            .map_err(|e| Error::io(&self.path, "cannot read a kernel digest from the TOC", e))?;
        if got < buf.len() {
            // The file was shorter at open time only if it changed since.
            return Err(self.check_unchanged().err().unwrap_or_else(|| {
                Error::io(
                    &self.path,
                    format!("cannot read the kernel digest at byte {offset}"),
                    io::Error::from(io::ErrorKind::UnexpectedEof),
                )
            }));
        }
        Ok(())
    }

    pub fn scheme(&self) -> Scheme {
        self.toc.scheme
    }

    pub fn group_name(&self) -> Option<&str> {
        self.toc.group_name.as_deref()
    }

    pub fn gfx_arch_family(&self) -> Option<&str> {
        self.toc.gfx_arch_family.as_deref()
    }

    /// The archive-level arch index (`gfx_arches`), in file order. The loader matches on this.
    pub fn architectures(&self) -> &[String] {
        &self.toc.gfx_arches
    }

    /// Binaries with their arch entries, sorted by key.
    pub fn binaries(&self) -> impl ExactSizeIterator<Item = TocBinary<'_>> + '_ {
        self.toc.kernels.binaries()
    }

    /// The binary at index `i` of [`binaries`](Self::binaries).
    pub fn binary(&self, i: usize) -> Option<TocBinary<'_>> {
        self.toc.kernels.binary(i)
    }

    /// The key of the binary at index `i` of [`binaries`](Self::binaries).
    pub(crate) fn binary_key(&self, i: usize) -> Option<&str> {
        (i < self.toc.kernels.len()).then(|| self.toc.kernels.key(i))
    }

    /// Number of binaries.
    pub fn binary_count(&self) -> usize {
        self.toc.kernels.len()
    }

    /// The entry `binaries()[binary].arches()[entry]`.
    pub(crate) fn entry_at(&self, binary: usize, entry: usize) -> Option<TocEntry<'_>> {
        self.toc.kernels.binary(binary)?.arch(entry)
    }

    /// Whether `gfx_arches` lists `arch` (exact match).
    pub fn has_architecture(&self, arch: &str) -> bool {
        self.toc.gfx_arches.iter().any(|a| a == arch)
    }

    /// The (binary, entry) indices of a kernel in `binaries()`, when the TOC has an entry for it.
    pub fn entry_index(&self, key: &str, arch: &str) -> Option<(usize, usize)> {
        let b = self.toc.kernels.find(key)?;
        let e = self.toc.kernels.binary(b)?.position(arch)?;
        Some((b, e))
    }

    fn not_found(&self, key: &str, arch: &str, reason: impl Into<String>) -> Error {
        Error::KernelNotFound {
            path: self.path.clone(),
            key: key.to_owned(),
            arch: arch.to_owned(),
            reason: reason.into(),
        }
    }

    /// Finds a kernel and checks that it can be read: the same checks, in the same order, as the
    /// reference's get (missing entry or blob: not found; blob past the end: I/O error).
    pub fn locate(&self, key: &str, arch: &str) -> Result<KernelRef<'_>> {
        let (b, e) = self
            .entry_index(key, arch)
            .ok_or_else(|| self.not_found(key, arch, "no such entry in the TOC"))?;
        self.locate_at(b, e)
    }

    /// [`Archive::locate`] for the entry `binaries()[binary].arches[entry]`, without the search
    /// by name (the mount builds its tree from these indices and reads through them).
    pub fn locate_at(&self, binary: usize, entry: usize) -> Result<KernelRef<'_>> {
        self.locate_digests(binary, entry, true)
    }

    /// [`Archive::locate_at`] for a read ([`read_with`](Self::read_with)) and nothing else:
    /// `digest` is left `None` when a frame digest vouches for the decoded bytes, so that an
    /// archive whose digests are read from the file pays one 32-byte read, not two.
    pub fn locate_for_read_at(&self, binary: usize, entry: usize) -> Result<KernelRef<'_>> {
        self.locate_digests(binary, entry, false)
    }

    /// Locates an entry with its frame digest (zstd) and, when `kernel_digest` is set or no frame
    /// digest vouches for the bytes, its kernel digest.
    fn locate_digests(
        &self,
        binary: usize,
        entry: usize,
        kernel_digest: bool,
    ) -> Result<KernelRef<'_>> {
        let mut kref = self.locate_stored(binary, entry)?;
        let entry = self.entry_at(binary, entry).expect("located");
        let zstd = self.toc.scheme == Scheme::ZstdPerKernel;
        let indexed = self
            .stored_digests
            .as_ref()
            .map(|d| d[kref.ordinal as usize]);
        let frame_at = entry.frame_blake3_at.filter(|_| zstd);
        let vouched = frame_at.is_some() || (zstd && indexed.is_some());
        let kernel_at = entry.blake3_at.filter(|_| kernel_digest || !vouched);
        (kref.digest, kref.frame_digest) = self.digests_at(kernel_at, frame_at)?;
        if let Some(indexed) = indexed {
            self.take_indexed(&mut kref, indexed)?;
        }
        Ok(kref)
    }

    /// Puts a kernel index's digest of the stored bytes where reads check it: as the frame
    /// digest (zstd), or as the decoded bytes' digest (`none`, whose stored bytes are the
    /// kernel). A digest the TOC records for the same bytes must be the same.
    fn take_indexed(&self, kref: &mut KernelRef<'_>, indexed: [u8; 32]) -> Result<()> {
        let (slot, name) = match self.toc.scheme {
            Scheme::ZstdPerKernel => (&mut kref.frame_digest, format::META_FRAME_BLAKE3),
            Scheme::None => (&mut kref.digest, format::META_BLAKE3),
        };
        match *slot {
            Some(recorded) if recorded != indexed => Err(Error::KernelIndexMismatch {
                path: self.path.clone(),
                reason: format!(
                    "kernel {} [{}] does not match its kernel index (the TOC's {name} is {}, \
                     the index records {})",
                    kref.key,
                    kref.arch,
                    crate::error::hex(&recorded),
                    crate::error::hex(&indexed)
                ),
            }),
            _ => {
                *slot = Some(indexed);
                Ok(())
            }
        }
    }

    /// What a read of the entry at these indices would return and store: its size and its
    /// stored bytes, checked as [`Archive::locate_at`] checks them, without reading anything
    /// (the mount lists a million entries with this).
    pub(crate) fn sizes_at(&self, binary: usize, entry: usize) -> Result<(u64, Span)> {
        self.locate_stored(binary, entry)
            .map(|kref| (kref.size, kref.stored))
    }

    /// Hints that the entry at these indices will be read soon: a local archive starts reading
    /// its stored bytes (with a zstd frame's size word) into the page cache, so the read that
    /// follows finds them there instead of waiting on the disk. Nothing for an entry that does
    /// not locate, or a source that takes no hints.
    pub(crate) fn will_need_at(&self, binary: usize, entry: usize) {
        if let Ok(kref) = self.locate_stored(binary, entry) {
            let word = kref.frame_word() as u64;
            let start = kref.stored.offset.saturating_sub(word);
            let len = (kref.stored.offset - start).saturating_add(kref.stored.size);
            self.source.will_need(start, len);
        }
    }

    /// [`Archive::locate_at`] without the digest.
    fn locate_stored(&self, binary: usize, entry: usize) -> Result<KernelRef<'_>> {
        let Some((bin, entry)) = self
            .toc
            .kernels
            .binary(binary)
            .and_then(|b| Some((b, b.arch(entry)?)))
        else {
            return Err(self.not_found(
                &format!("#{binary}"),
                &format!("#{entry}"),
                "no TOC entry at these indices",
            ));
        };
        let (key, arch) = (bin.key, entry.arch);
        let stored = match self.lazy_frames {
            Some((blob, count)) => self.positioned_frame(key, arch, &entry, blob, count)?,
            None => *self.spans.get(entry.ordinal as usize).ok_or_else(|| {
                self.not_found(
                    key,
                    arch,
                    format!(
                        "ordinal {} has no stored blob ({} present)",
                        entry.ordinal,
                        self.spans.len()
                    ),
                )
            })?,
        };
        let size = match self.toc.scheme {
            Scheme::None => {
                self.check_blob_in_file(key, arch, stored, stored.size)?;
                stored.size
            }
            Scheme::ZstdPerKernel => entry.original_size,
        };
        Ok(KernelRef {
            key,
            arch,
            ordinal: entry.ordinal,
            stored,
            size,
            // Frames of a kernel index come without their size words: checked when read, as
            // for frames located from the TOC.
            size_word_unchecked: self.lazy_frames.is_some()
                || (self.stored_digests.is_some() && self.toc.scheme == Scheme::ZstdPerKernel),
            digest: None,
            frame_digest: None,
        })
    }

    /// How many stored kernels the archive holds, by ordinal: the `blobs` list (`none`) or the
    /// zstd blob's frame count.
    pub fn stored_count(&self) -> usize {
        match self.lazy_frames {
            Some((_, count)) => count as usize,
            None => self.spans.len(),
        }
    }

    /// The stored kernels' places by ordinal, [`stored_count`](Self::stored_count) of them: kept
    /// since open, or (frames located from the TOC) found now by walking the frame chain.
    pub fn stored_spans(&self) -> Result<Cow<'_, [Span]>> {
        match self.lazy_frames {
            Some((blob, _)) => index_zstd(&self.path, &*self.source, blob).map(Cow::Owned),
            None => Ok(Cow::Borrowed(&self.spans)),
        }
    }

    /// Whether frames are located from the TOC's `frame` metadata (open read no frame table).
    pub fn frames_positioned(&self) -> bool {
        self.lazy_frames.is_some()
    }

    /// The frame of an entry from its `frame` metadata, checked against the blob as the walk at
    /// open would check it: an ordinal past the frame count is not found, a frame outside the
    /// blob is invalid format. Its size word is checked when the frame is read.
    fn positioned_frame(
        &self,
        key: &str,
        arch: &str,
        entry: &TocEntry<'_>,
        blob: Span,
        count: u32,
    ) -> Result<Span> {
        if entry.ordinal >= count {
            return Err(self.not_found(
                key,
                arch,
                format!(
                    "ordinal {} has no stored blob ({count} present)",
                    entry.ordinal
                ),
            ));
        }
        let pos = entry.frame.expect("every entry has a frame in this mode");
        let first = blob.offset + 4;
        let end = blob.offset + blob.size;
        let size = u64::from(pos.size);
        if pos.offset < first || pos.offset > end || end - pos.offset < 4 + size {
            return Err(Error::ZstdIndex {
                path: self.path.clone(),
                offset: blob.offset,
                reason: format!(
                    "frame of {key} [{arch}] at byte {} of {size} bytes lies outside the blob \
                     [{first}, {end})",
                    pos.offset
                ),
            });
        }
        Ok(Span {
            offset: pos.offset + 4,
            size,
        })
    }

    /// Every (key, arch) entry, in key order then file order of arches.
    pub fn entries(&self) -> impl Iterator<Item = (&str, TocEntry<'_>)> {
        self.indexed_entries().map(|(_, key, e)| (key, e))
    }

    /// [`entries`](Self::entries) with the (binary, entry) indices that
    /// [`locate_at`](Self::locate_at) takes: walking every entry through them costs no search
    /// by name (which is linear in a binary's arches, so quadratic over one key with many).
    pub fn indexed_entries(&self) -> impl Iterator<Item = ((usize, usize), &str, TocEntry<'_>)> {
        self.toc
            .kernels
            .binaries()
            .enumerate()
            .flat_map(|(b, bin)| {
                bin.arches()
                    .enumerate()
                    .map(move |(e, entry)| ((b, e), bin.key, entry))
            })
    }

    /// Reads a kernel into a buffer from `alloc`, which receives the exact size and returns `None`
    /// when it cannot allocate. `none` copies straight from the file; zstd reads the frame into a
    /// per-thread buffer, checks that the frame can really produce `original_size` bytes (so a
    /// hostile size never turns into a huge allocation), then decodes into the buffer. A buffer is
    /// returned only once every one of its bytes was written, so `alloc` may hand out memory
    /// that was never initialised.
    ///
    /// Digests: when the entry records its frame's digest (`frame_blake3`), the frame's bytes are
    /// checked against it before decoding, and the decoded bytes are not hashed (zstd decoding is
    /// a function of the frame, so they are the writer's). Otherwise, when it records the
    /// kernel's digest (`blake3`), the decoded bytes are checked against it; on a mismatch the
    /// buffer is zeroed. Either mismatch is an error, so altered code is never handed out.
    ///
    /// When reading, decoding or a digest check fails, the source is asked first whether it
    /// changed since open: bytes of an archive rewritten in place are expected not to decode or
    /// match, and "archive changed while open" is then the true cause to report. Only an archive
    /// that did not change gets the decode or digest error itself.
    pub fn read_with<T, A>(&self, kref: &KernelRef<'_>, alloc: A) -> Result<T>
    where
        T: KernelBuf,
        A: FnOnce(usize) -> Option<T>,
    {
        self.explain(self.read_checked(kref, alloc, false))
    }

    /// Reads a kernel and checks every digest its entry records: the frame's, then the decoded
    /// bytes' (so an archive whose two digests disagree is reported). What `verify` runs.
    pub fn verify_kernel(&self, kref: &KernelRef<'_>) -> Result<()> {
        self.explain(self.read_checked(kref, Unfilled::new, true))
            .map(drop)
    }

    /// Reads a zstd kernel's compressed frame into `frame` (replacing its contents) and checks
    /// it before anything is decoded: its size word when located from the TOC, its
    /// `frame_blake3` digest when recorded, and that its header declares `kref.size` bytes. On
    /// success returns where the frame starts in `frame`: `frame[start..]` is exactly the
    /// frame's bytes, which a caller may decode at its own pace (`start` is 4 when the size
    /// word was read with it: one read, and no move of the frame to drop the word; a buffer
    /// reused from an earlier frame is not zeroed again). When the entry has no frame digest
    /// (`kref.frame_digest` is `None`), nothing vouches for the bytes yet: the caller must
    /// check what it decodes against `kref.digest`. On error `frame` is left empty. A `none`
    /// archive has no frames: an invalid-argument error.
    pub fn read_verified_frame(&self, kref: &KernelRef<'_>, frame: &mut Vec<u8>) -> Result<usize> {
        if self.toc.scheme != Scheme::ZstdPerKernel {
            frame.clear();
            return Err(Error::InvalidArgument(format!(
                "kernel {} [{}] of {}: a '{}' archive stores no zstd frames",
                kref.key,
                kref.arch,
                self.path.display(),
                self.toc.scheme.name()
            )));
        }
        // The size word and the frame are read together: one request to a remote source (a
        // second read of 4 bytes would be a second ranged GET); the frame is then handed out
        // where it lies, after the word, rather than moved down over it.
        let word = kref.frame_word();
        let checked = usize::try_from(kref.stored.size)
            .ok()
            .and_then(|n| n.checked_add(word))
            .ok_or(Error::OutOfMemory { bytes: usize::MAX })
            .and_then(|len| {
                if len > frame.len() {
                    frame
                        .try_reserve_exact(len - frame.len())
                        .map_err(|_| Error::OutOfMemory { bytes: len })?;
                }
                frame.resize(len, 0);
                self.read_frame(kref, frame)?;
                codec::check_decoded_size(&frame[word..], kref.size)
                    .map_err(|reason| self.decode_error(kref, reason))
            });
        if let Err(e) = self.explain(checked) {
            frame.clear();
            return Err(e);
        }
        Ok(word)
    }

    /// Reads a kernel in pieces of at most `step` bytes, handed in order to `sink(offset,
    /// piece)`, for a caller that writes them where nobody reads them before this returns
    /// `Ok`: every digest the entry records is checked as by [`read_with`](Self::read_with),
    /// but the decoded bytes' digest only once all of them are out, so `sink` may have seen
    /// bytes that then fail it. `sink` is first called only once the stored kernel is known to
    /// produce `kref.size` bytes (the frame's size word, digest and declared size; a `none`
    /// kernel's bounds), so a caller may reserve that much room then and a hostile size claims
    /// nothing. `frame` and `piece` are the caller's buffers, reused from call to call (nothing
    /// is zeroed or faulted in per kernel); a `sink` error stops the read and comes back as a
    /// decompression failure naming the kernel.
    pub(crate) fn read_in_steps(
        &self,
        kref: &KernelRef<'_>,
        step: usize,
        frame: &mut Vec<u8>,
        piece: &mut Vec<u8>,
        mut sink: impl FnMut(u64, &[u8]) -> std::result::Result<(), String>,
    ) -> Result<()> {
        if step == 0 {
            return Err(Error::InvalidArgument("a read step of 0 bytes".into()));
        }
        // As in read_checked: a frame digest vouches for what the frame decodes to.
        let mut to_check = kref
            .digest
            .filter(|_| kref.frame_digest.is_none())
            .map(|recorded| (recorded, blake3::Hasher::new()));
        let mut pass = |at: u64, bytes: &[u8]| {
            if let Some((_, h)) = &mut to_check {
                h.update(bytes);
            }
            sink(at, bytes)
        };
        let read = match self.toc.scheme {
            Scheme::ZstdPerKernel => self.read_verified_frame(kref, frame).and_then(|start| {
                let spare = RefCell::new(std::mem::take(piece));
                let decoded = codec::decode_frame_steps(
                    &frame[start..],
                    kref.size,
                    step,
                    0,
                    || Ok(spare.take()),
                    |at, window, fresh, end| {
                        let passed = pass(at + fresh as u64, &window[fresh..end]);
                        *spare.borrow_mut() = window;
                        passed
                    },
                );
                *piece = spare.into_inner();
                decoded.map_err(|reason| self.decode_error(kref, reason))
            }),
            Scheme::None => self.copy_stored_in_steps(kref, step, piece, &mut pass),
        };
        let checked = read.and_then(|()| match to_check {
            Some((recorded, h)) => self.check_decoded(kref, recorded, *h.finalize().as_bytes()),
            None => Ok(()),
        });
        self.explain(checked)
    }

    /// A `none` kernel's stored bytes, `step` at a time through `piece`, to `pass`.
    fn copy_stored_in_steps(
        &self,
        kref: &KernelRef<'_>,
        step: usize,
        piece: &mut Vec<u8>,
        pass: &mut PieceSink<'_>,
    ) -> Result<()> {
        // Located kernels were checked when located; one built by hand is checked here, so that
        // nothing is handed out of a kernel that cannot be there.
        self.check_blob_in_file(kref.key, kref.arch, kref.stored, kref.size)?;
        let mut done = 0u64;
        while done < kref.size {
            let want = usize::try_from(kref.size - done).map_or(step, |n| n.min(step));
            if piece.len() < want {
                piece.resize(want, 0);
            }
            let buf = &mut piece[..want];
            let got = read_full_at(&*self.source, buf, kref.stored.offset + done).map_err(|e| {
                Error::io(
                    &self.path,
                    format!("cannot read kernel {} [{}]", kref.key, kref.arch),
                    e,
                )
            })?;
            if got < want {
                let file_len = kref.stored.offset + done + got as u64;
                return Err(self.blob_out_of_bounds(kref.key, kref.arch, kref.stored, file_len));
            }
            pass(done, buf).map_err(|reason| self.decode_error(kref, reason))?;
            done += want as u64;
        }
        Ok(())
    }

    /// A `none` kernel of `len` bytes at `stored` must lie inside the file.
    fn check_blob_in_file(&self, key: &str, arch: &str, stored: Span, len: u64) -> Result<()> {
        if stored
            .offset
            .checked_add(len)
            .is_none_or(|end| end > self.file_len)
        {
            return Err(self.blob_out_of_bounds(key, arch, stored, self.file_len));
        }
        Ok(())
    }

    /// The error of a `none` kernel's blob that the file ends before (at `file_len`).
    fn blob_out_of_bounds(&self, key: &str, arch: &str, stored: Span, file_len: u64) -> Error {
        Error::BlobOutOfBounds {
            path: self.path.clone(),
            key: key.to_owned(),
            arch: arch.to_owned(),
            offset: stored.offset,
            size: stored.size,
            file_len,
        }
    }

    /// Compares the BLAKE3 of a kernel's decoded bytes with the digest its entry records.
    fn check_decoded(
        &self,
        kref: &KernelRef<'_>,
        recorded: [u8; 32],
        actual: [u8; 32],
    ) -> Result<()> {
        if actual == recorded {
            Ok(())
        } else {
            Err(self.digest_error(kref, false, recorded, actual))
        }
    }

    /// Reports a failed read of an archive that changed since open as "changed" (see
    /// [`read_with`](Self::read_with)).
    fn explain<T>(&self, result: Result<T>) -> Result<T> {
        result.map_err(|e| match e {
            // Not about the bytes read: nothing a change of the archive would explain.
            Error::OutOfMemory { .. } | Error::InvalidArgument(_) => e,
            e => self.check_unchanged().err().unwrap_or(e),
        })
    }

    /// [`read_unchecked`](Self::read_unchecked) (which checks a frame digest), then the decoded
    /// bytes' digest when no frame digest vouched for them, or always with `all_digests`.
    fn read_checked<T, A>(&self, kref: &KernelRef<'_>, alloc: A, all_digests: bool) -> Result<T>
    where
        T: KernelBuf,
        A: FnOnce(usize) -> Option<T>,
    {
        let mut out = self.read_unchecked(kref, alloc)?;
        let vouched = kref.frame_digest.is_some() && !all_digests;
        if let (Some(recorded), false) = (kref.digest, vouched) {
            // SAFETY: read_unchecked returns a buffer only once every byte has been written.
            let bytes = unsafe { out.filled_mut() };
            let checked = self.check_decoded(kref, recorded, *blake3::hash(bytes).as_bytes());
            if checked.is_err() {
                bytes.fill(0);
            }
            checked?;
        }
        Ok(out)
    }

    /// Tells the source that the stored bytes of `kref` (with a frame's size word) failed
    /// their check, so that a copy it keeps is not served again.
    fn distrust(&self, kref: &KernelRef<'_>) {
        let from = kref.stored.offset.saturating_sub(4);
        self.source
            .forget(from, kref.stored.size + (kref.stored.offset - from));
    }

    fn digest_error(
        &self,
        kref: &KernelRef<'_>,
        of_frame: bool,
        recorded: [u8; 32],
        actual: [u8; 32],
    ) -> Error {
        self.distrust(kref);
        Error::DigestMismatch {
            path: self.path.clone(),
            key: kref.key.to_owned(),
            arch: kref.arch.to_owned(),
            of_frame,
            recorded: Box::new(recorded),
            actual: Box::new(actual),
        }
    }

    /// Reads a zstd kernel's frame into `buf`, which is [`KernelRef::frame_word`] bytes (its
    /// size word, when located from the TOC) plus the frame's size, in one read, and checks it
    /// (see [`check_frame`](Self::check_frame)).
    fn read_frame(&self, kref: &KernelRef<'_>, buf: &mut [u8]) -> Result<()> {
        let start = self.frame_start(kref)?;
        self.read_frame_bytes(kref, buf, start)?;
        let (head, frame) = buf.split_at(kref.frame_word());
        self.check_frame(kref, head, frame)
    }

    /// Where a frame's read starts: at its size word when that is checked, else at the frame.
    /// A `KernelRef` built by hand may claim a word before byte 4: refused, not wrapped around.
    fn frame_start(&self, kref: &KernelRef<'_>) -> Result<u64> {
        kref.stored
            .offset
            .checked_sub(kref.frame_word() as u64)
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "kernel {} [{}] of {}: a frame at byte {} has no room for its size word",
                    kref.key,
                    kref.arch,
                    self.path.display(),
                    kref.stored.offset
                ))
            })
    }

    /// Fills `buf` from `start`; a short read means the frame is truncated.
    fn read_frame_bytes(&self, kref: &KernelRef<'_>, buf: &mut [u8], start: u64) -> Result<()> {
        let got = read_full_at(&*self.source, buf, start).map_err(|e| {
            Error::io(
                &self.path,
                format!("cannot read frame of {} [{}]", kref.key, kref.arch),
                e,
            )
        })?;
        if got < buf.len() {
            return Err(self.decode_error(
                kref,
                format!(
                    "frame is truncated: {got} of {} bytes at byte {start} (file changed since \
                     open?)",
                    buf.len()
                ),
            ));
        }
        Ok(())
    }

    /// Checks a frame read from the file: its size word `head` (empty when not located from the
    /// TOC) against the TOC, then its bytes against `frame_blake3` when recorded. The one place
    /// where frame digests are checked.
    fn check_frame(&self, kref: &KernelRef<'_>, head: &[u8], frame: &[u8]) -> Result<()> {
        if !head.is_empty() {
            let start = kref.stored.offset - head.len() as u64;
            let found = crate::bytes::le_u32(head, 0).expect("4 bytes");
            if u64::from(found) != kref.stored.size {
                self.distrust(kref);
                return Err(Error::ZstdIndex {
                    path: self.path.clone(),
                    offset: start,
                    reason: format!(
                        "frame of {} [{}] at byte {start}: the size word holds {found}, the TOC \
                         says {}",
                        kref.key, kref.arch, kref.stored.size
                    ),
                });
            }
        }
        if let Some(recorded) = kref.frame_digest {
            let actual = *blake3::hash(frame).as_bytes();
            if actual != recorded {
                return Err(self.digest_error(kref, true, recorded, actual));
            }
        }
        Ok(())
    }

    /// [`read_with`](Self::read_with) without the check of the decoded bytes' digest.
    fn read_unchecked<T, A>(&self, kref: &KernelRef<'_>, alloc: A) -> Result<T>
    where
        T: KernelBuf,
        A: FnOnce(usize) -> Option<T>,
    {
        let size =
            usize::try_from(kref.size).map_err(|_| Error::OutOfMemory { bytes: usize::MAX })?;
        match self.toc.scheme {
            Scheme::None => {
                let mut buf = alloc(size).ok_or(Error::OutOfMemory { bytes: size })?;
                let dst = buf.init_mut();
                let got = read_full_at(&*self.source, dst, kref.stored.offset).map_err(|e| {
                    Error::io(
                        &self.path,
                        format!("cannot read kernel {} [{}]", kref.key, kref.arch),
                        e,
                    )
                })?;
                if got < dst.len() {
                    return Err(self.blob_out_of_bounds(
                        kref.key,
                        kref.arch,
                        kref.stored,
                        kref.stored.offset + got as u64,
                    ));
                }
                Ok(buf)
            }
            Scheme::ZstdPerKernel => {
                let word = kref.frame_word();
                with_frame_buffer(kref.stored.size as usize + word, |buf| {
                    self.read_frame(kref, buf)?;
                    let frame = &buf[word..];
                    codec::check_decoded_size(frame, kref.size)
                        .map_err(|reason| self.decode_error(kref, reason))?;
                    let mut out = alloc(size).ok_or(Error::OutOfMemory { bytes: size })?;
                    codec::decode_frame_into(frame, &mut out)
                        .map_err(|reason| self.decode_error(kref, reason))?;
                    Ok(out)
                })
            }
        }
    }

    /// Checks that the file still has the length and modification time it had at open. A
    /// reader that keeps an archive open for a long time (the mount) calls this after decoding,
    /// so that bytes read from a file truncated or rewritten in place are reported as an I/O
    /// error instead of being served.
    pub fn check_unchanged(&self) -> Result<()> {
        self.source.check_unchanged()
    }

    /// Reads a kernel into `dst`, which must be exactly `kref.size` bytes.
    pub fn read_into(&self, kref: &KernelRef<'_>, dst: &mut [u8]) -> Result<()> {
        if dst.len() as u64 != kref.size {
            return Err(Error::InvalidArgument(format!(
                "buffer of {} bytes for kernel {} [{}] of {} bytes",
                dst.len(),
                kref.key,
                kref.arch,
                kref.size
            )));
        }
        self.read_with(kref, |_| Some(dst)).map(|_| ())
    }

    fn decode_error(&self, kref: &KernelRef<'_>, reason: String) -> Error {
        self.distrust(kref);
        Error::Decompress {
            path: self.path.clone(),
            key: kref.key.to_owned(),
            arch: kref.arch.to_owned(),
            offset: kref.stored.offset,
            reason,
        }
    }

    /// Finds a kernel and returns it in a buffer from `alloc` (see [`read_with`](Self::read_with)).
    pub fn get_kernel_with<T, A>(&self, key: &str, arch: &str, alloc: A) -> Result<T>
    where
        T: KernelBuf,
        A: FnOnce(usize) -> Option<T>,
    {
        let (b, e) = self
            .entry_index(key, arch)
            .ok_or_else(|| self.not_found(key, arch, "no such entry in the TOC"))?;
        let kref = self.locate_for_read_at(b, e)?;
        self.read_with(&kref, alloc)
    }

    /// Returns a kernel as a fresh vector.
    pub fn get_kernel(&self, key: &str, arch: &str) -> Result<Vec<u8>> {
        self.get_kernel_with(key, arch, Unfilled::new)
            .map(Unfilled::into_filled)
    }
}

/// Checks the zstd blob's bounds and reads its frame count word: the open-time checks that do not
/// need the frame chain.
fn zstd_frame_count(
    path: &Path,
    source: &dyn ByteSource,
    file_len: u64,
    blob: Span,
) -> Result<u32> {
    check_zstd_blob(path, file_len, blob)?;
    let bad = |reason: String| Error::ZstdIndex {
        path: path.to_path_buf(),
        offset: blob.offset,
        reason,
    };
    let mut word = [0u8; 4];
    // A read that fails is the source's failure (a network timeout, say), not a bad archive.
    let got = read_full_at(source, &mut word, blob.offset)
        .map_err(|e| Error::io(path, "cannot read the zstd blob's frame count", e))?;
    if got < 4 {
        return Err(bad("blob ends inside the frame count".into()));
    }
    let count = u32::from_le_bytes(word);
    if count > format::MAX_ZSTD_FRAMES {
        return Err(bad(format!(
            "frame count {count} exceeds the limit of {}",
            format::MAX_ZSTD_FRAMES
        )));
    }
    Ok(count)
}

/// The zstd blob's bounds, checked without reading it: at most 4 GiB, inside the file, room for
/// its frame count word.
fn check_zstd_blob(path: &Path, file_len: u64, blob: Span) -> Result<()> {
    let bad = |reason: String| Error::ZstdIndex {
        path: path.to_path_buf(),
        offset: blob.offset,
        reason,
    };
    if blob.size > format::MAX_ZSTD_BLOB {
        return Err(bad(format!(
            "zstd_size {} exceeds the 4 GiB limit",
            blob.size
        )));
    }
    if blob
        .offset
        .checked_add(blob.size)
        .is_none_or(|end| end > file_len)
    {
        return Err(Error::io(
            path,
            format!("zstd blob at byte {} of {} bytes", blob.offset, blob.size),
            io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("runs past the end of the {file_len}-byte file"),
            ),
        ));
    }
    if blob.size < 4 {
        return Err(bad(format!(
            "blob of {} bytes is too small for a frame count",
            blob.size
        )));
    }
    Ok(())
}

/// Walks the frame chain of a blob already checked by [`zstd_frame_count`], reading only the
/// size words.
fn index_zstd(path: &Path, source: &dyn ByteSource, blob: Span) -> Result<Vec<Span>> {
    // The first read that failed: then the walk failed for the source, not for the archive.
    let mut failed_read = None;
    let frames = format::index_zstd_frames(blob.size, blob.offset, |at, buf| {
        source.read_at(buf, blob.offset + at).inspect_err(|e| {
            if e.kind() != io::ErrorKind::Interrupted {
                failed_read.get_or_insert_with(|| io::Error::new(e.kind(), e.to_string()));
            }
        })
    })
    .map_err(|reason| match failed_read.take() {
        Some(e) => Error::io(path, "cannot read the zstd blob's frame sizes", e),
        None => Error::ZstdIndex {
            path: path.to_path_buf(),
            offset: blob.offset,
            reason,
        },
    })?;
    Ok(frames
        .into_iter()
        .map(|s| Span {
            offset: blob.offset + s.offset,
            size: s.size,
        })
        .collect())
}

/// A vector's allocation that a read fills: zstd decodes straight into it, so nothing clears it
/// first (a cleared allocation is a pass of `memset` over every kernel when the allocator reuses
/// memory). A `none` read clears it before copying into it (`init_mut`).
struct Unfilled {
    /// Capacity `len`, length 0 until filled.
    buf: Vec<u8>,
    len: usize,
}

impl Unfilled {
    fn new(len: usize) -> Option<Unfilled> {
        let mut buf = Vec::new();
        buf.try_reserve_exact(len).ok()?;
        Some(Unfilled { buf, len })
    }

    /// The vector, once a read returned this buffer (which it does only when every byte was
    /// written).
    fn into_filled(mut self) -> Vec<u8> {
        // SAFETY: read_with returns a buffer only once all `len` bytes have been written.
        unsafe { self.buf.set_len(self.len) };
        self.buf
    }
}

// SAFETY: `len` bytes of the vector's capacity, owned by `self`; `init_mut` initialises them
// before handing out a slice; `filled_mut` relies on the caller's promise that they were written.
unsafe impl KernelBuf for Unfilled {
    fn size(&self) -> usize {
        self.len
    }
    fn as_mut_ptr(&mut self) -> *mut u8 {
        self.buf.as_mut_ptr()
    }
    fn init_mut(&mut self) -> &mut [u8] {
        self.buf.clear();
        self.buf.resize(self.len, 0);
        &mut self.buf
    }
    unsafe fn filled_mut(&mut self) -> &mut [u8] {
        // SAFETY: all `len` bytes were written (the caller's promise), within the capacity.
        unsafe { self.buf.set_len(self.len) };
        &mut self.buf
    }
}

/// Frames larger than this are read into a one-off buffer instead of the kept per-thread one, so
/// a thread that once read a huge frame does not hold that memory forever.
const KEEP_FRAME_BUFFER: usize = 16 << 20;

fn with_frame_buffer<R>(len: usize, f: impl FnOnce(&mut [u8]) -> Result<R>) -> Result<R> {
    thread_local! {
        static FRAME: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    }
    if len > KEEP_FRAME_BUFFER {
        let mut buf = Vec::new();
        buf.try_reserve_exact(len)
            .map_err(|_| Error::OutOfMemory { bytes: len })?;
        buf.resize(len, 0);
        return f(&mut buf);
    }
    FRAME.with(|cell| match cell.try_borrow_mut() {
        Ok(mut buf) => {
            if buf.len() < len {
                buf.resize(len, 0);
            }
            f(&mut buf[..len])
        }
        // Re-entered on this thread (not expected): fall back to a private buffer.
        Err(_) => f(&mut vec![0u8; len]),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn archive_is_send_and_sync() {
        assert_send_sync::<Archive>();
    }

    /// An in-memory source, standing in for a remote object.
    #[derive(Debug)]
    struct Memory(Vec<u8>);

    impl ByteSource for Memory {
        fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
            let start = (offset as usize).min(self.0.len());
            let n = buf.len().min(self.0.len() - start);
            buf[..n].copy_from_slice(&self.0[start..start + n]);
            Ok(n)
        }
        fn len(&self) -> u64 {
            self.0.len() as u64
        }
        fn display_name(&self) -> String {
            "mem://sample".into()
        }
        fn identity(&self) -> String {
            "mem".into()
        }
        fn check_unchanged(&self) -> Result<()> {
            Ok(())
        }
    }

    /// An archive of zstd kernels with digests, written to `dir`.
    fn digested_archive(dir: &Path) -> (PathBuf, Vec<(String, Vec<u8>)>) {
        let mut w = crate::archive::writer::ArchiveWriter::new(
            "g",
            "f",
            vec!["gfx90a".into()],
            crate::archive::writer::Compression::Zstd { level: 1 },
        )
        .unwrap();
        let kernels: Vec<(String, Vec<u8>)> = (0..40u8)
            .map(|i| (format!("lib/k{i:02}.so#0"), vec![i; 100 + usize::from(i)]))
            .collect();
        for (key, data) in &kernels {
            w.add_kernel(key, "gfx90a", data.clone()).unwrap();
        }
        let path = dir.join("d.kpack");
        w.write(&path, &|_| {}).unwrap();
        (path, kernels)
    }

    fn open_local(path: &Path, keep: usize) -> Archive {
        Archive::open_keeping(Box::new(LocalFile::open(path).unwrap()), keep).unwrap()
    }

    /// `read_in_steps` of `kref`: the pieces joined, and where each began.
    fn steps(a: &Archive, kref: &KernelRef<'_>) -> Result<(Vec<u8>, Vec<u64>)> {
        let (mut got, mut at) = (Vec::new(), Vec::new());
        a.read_in_steps(
            kref,
            1 << 20,
            &mut Vec::new(),
            &mut Vec::new(),
            |offset, piece| {
                at.push(offset);
                got.extend_from_slice(piece);
                Ok(())
            },
        )
        .map(|()| (got, at))
    }

    #[test]
    fn read_in_steps_hands_out_every_byte_in_order_and_checks_every_digest() {
        let dir = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..2_500_000u32)
            .map(|i| (i % 251) as u8 ^ (i >> 13) as u8)
            .collect();
        for (name, compression) in [
            ("n.kpack", crate::archive::writer::Compression::None),
            (
                "z.kpack",
                crate::archive::writer::Compression::Zstd { level: 1 },
            ),
        ] {
            let mut w = crate::archive::writer::ArchiveWriter::new(
                "g",
                "f",
                vec!["gfx90a".into()],
                compression,
            )
            .unwrap();
            w.add_kernel("lib/big.so#0", "gfx90a", data.clone())
                .unwrap();
            w.add_kernel("lib/empty.so#0", "gfx90a", Vec::new())
                .unwrap();
            let path = dir.path().join(name);
            w.write(&path, &|_| {}).unwrap();
            let a = Archive::open(&path).unwrap();
            let kref = a.locate("lib/big.so#0", "gfx90a").unwrap();
            assert!(kref.digest.is_some());
            let (got, at) = steps(&a, &kref).unwrap();
            assert!(got == data, "{name}");
            assert_eq!(at, [0, 1 << 20, 2 << 20], "{name}");
            let empty = a.locate("lib/empty.so#0", "gfx90a").unwrap();
            assert_eq!(steps(&a, &empty).unwrap(), (Vec::new(), Vec::new()));
            // Only the decoded bytes' digest (as archives had before frame digests): checked
            // once every piece is out.
            let mut decoded_only = kref;
            decoded_only.frame_digest = None;
            assert!(steps(&a, &decoded_only).unwrap().0 == data, "{name}");
            decoded_only.digest = Some([7; 32]);
            let err = steps(&a, &decoded_only).unwrap_err();
            assert!(
                matches!(
                    err,
                    Error::DigestMismatch {
                        of_frame: false,
                        ..
                    }
                ),
                "{name}: {err}"
            );
            let mut empty_wrong = empty;
            empty_wrong.digest = Some([7; 32]);
            empty_wrong.frame_digest = None;
            assert!(matches!(
                steps(&a, &empty_wrong),
                Err(Error::DigestMismatch { .. })
            ));
            // A sink's error stops the read and names the kernel.
            let mut calls = 0;
            let err = a
                .read_in_steps(&kref, 1 << 20, &mut Vec::new(), &mut Vec::new(), |_, _| {
                    calls += 1;
                    Err("disk full".into())
                })
                .unwrap_err();
            assert_eq!(calls, 1);
            assert!(err.to_string().contains("disk full"), "{err}");
            assert!(err.to_string().contains("lib/big.so#0"), "{err}");
            let zero = a.read_in_steps(&kref, 0, &mut Vec::new(), &mut Vec::new(), |_, _| Ok(()));
            assert!(matches!(zero, Err(Error::InvalidArgument(_))));
        }
    }

    #[test]
    fn read_in_steps_hands_out_nothing_of_a_kernel_that_cannot_be_there() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("n.kpack");
        let mut w = crate::archive::writer::ArchiveWriter::new(
            "g",
            "f",
            vec!["gfx90a".into()],
            crate::archive::writer::Compression::None,
        )
        .unwrap();
        w.add_kernel("k#0", "gfx90a", vec![5; 3 << 20]).unwrap();
        w.write(&path, &|_| {}).unwrap();
        let a = Archive::open(&path).unwrap();
        // A `none` entry claiming more bytes than the file holds: refused before the first
        // piece, so a caller that makes room at the first piece never reserves it.
        let mut huge = a.locate("k#0", "gfx90a").unwrap();
        huge.size = 1 << 40;
        huge.stored.size = 1 << 40;
        let mut calls = 0;
        let err = a
            .read_in_steps(&huge, 1 << 20, &mut Vec::new(), &mut Vec::new(), |_, _| {
                calls += 1;
                Ok(())
            })
            .unwrap_err();
        assert_eq!(calls, 0);
        assert!(matches!(err, Error::BlobOutOfBounds { .. }), "{err}");
    }

    #[test]
    fn digests_read_from_the_file_match_the_kept_ones() {
        let dir = tempfile::tempdir().unwrap();
        let (path, kernels) = digested_archive(dir.path());
        let (kept, read) = (open_local(&path, KEEP_DIGESTS), open_local(&path, 0));
        assert!(kept.digests.as_ref().is_some_and(|d| !d.is_empty()));
        assert!(read.digests.is_none(), "over the limit nothing is kept");
        for (key, data) in &kernels {
            let want = Some(*blake3::hash(data).as_bytes());
            assert_eq!(kept.kernel_digest(key, "gfx90a").unwrap(), want);
            assert_eq!(read.kernel_digest(key, "gfx90a").unwrap(), want);
            assert_eq!(read.locate(key, "gfx90a").unwrap().digest, want);
            let frame = kept.locate(key, "gfx90a").unwrap().frame_digest;
            assert!(frame.is_some());
            assert_eq!(read.locate(key, "gfx90a").unwrap().frame_digest, frame);
            assert_eq!(&read.get_kernel(key, "gfx90a").unwrap(), data);
        }
        assert_eq!(read.kernel_digest("lib/none.so#0", "gfx90a").unwrap(), None);
    }

    /// A file source that counts its reads and records the ranges it is told will be needed.
    #[derive(Debug, Default)]
    struct Watch {
        reads: std::sync::atomic::AtomicUsize,
        hints: std::sync::Mutex<Vec<(u64, u64)>>,
    }

    #[derive(Debug)]
    struct Watched(LocalFile, std::sync::Arc<Watch>);

    impl ByteSource for Watched {
        fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
            self.1
                .reads
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            self.0.read_at(buf, offset)
        }
        fn len(&self) -> u64 {
            self.0.len()
        }
        fn display_name(&self) -> String {
            self.0.display_name()
        }
        fn identity(&self) -> String {
            self.0.identity()
        }
        fn check_unchanged(&self) -> Result<()> {
            self.0.check_unchanged()
        }
        fn will_need(&self, offset: u64, len: u64) {
            self.1.hints.lock().unwrap().push((offset, len));
        }
    }

    #[test]
    fn will_need_hints_exactly_the_bytes_a_read_takes() {
        let dir = tempfile::tempdir().unwrap();
        let (path, _) = digested_archive(dir.path());
        let watch = std::sync::Arc::new(Watch::default());
        let source = Watched(LocalFile::open(&path).unwrap(), watch.clone());
        let a = Archive::open_source(Box::new(source)).unwrap();
        let hints = &watch.hints;
        for (b, e) in [(0, 0), (7, 0), (39, 0)] {
            a.will_need_at(b, e);
            let kref = a.locate_at(b, e).unwrap();
            // The size word before the frame (checked when read), then the frame.
            let want = (kref.stored.offset - 4, kref.stored.size + 4);
            assert_eq!(hints.lock().unwrap().pop(), Some(want));
        }
        // An entry that is not there hints nothing.
        a.will_need_at(40, 0);
        a.will_need_at(0, 1);
        assert!(hints.lock().unwrap().is_empty());
    }

    #[test]
    fn digests_from_the_file_cost_one_read_and_only_the_needed_ones() {
        let dir = tempfile::tempdir().unwrap();
        let (path, kernels) = digested_archive(dir.path());
        let watch = std::sync::Arc::new(Watch::default());
        let source = Watched(LocalFile::open(&path).unwrap(), watch.clone());
        let a = Archive::open_keeping(Box::new(source), 0).unwrap();
        let reads = &watch.reads;
        let count = |f: &dyn Fn()| {
            let before = reads.load(std::sync::atomic::Ordering::SeqCst);
            f();
            reads.load(std::sync::atomic::Ordering::SeqCst) - before
        };
        for (i, (key, data)) in kernels.iter().enumerate() {
            let frame = *blake3::hash(&{
                let k = a.locate_at(i, 0).unwrap();
                let mut f = Vec::new();
                let start = a.read_verified_frame(&k, &mut f).unwrap();
                f.split_off(start)
            })
            .as_bytes();
            // Both digests: one read.
            assert_eq!(
                count(&|| {
                    let k = a.locate_at(i, 0).unwrap();
                    assert_eq!(k.digest, Some(*blake3::hash(data).as_bytes()));
                    assert_eq!(k.frame_digest, Some(frame));
                }),
                1,
                "{key}"
            );
            // For a read, the frame digest vouches: only it is read.
            assert_eq!(
                count(&|| {
                    let k = a.locate_for_read_at(i, 0).unwrap();
                    assert_eq!((k.digest, k.frame_digest), (None, Some(frame)));
                }),
                1,
                "{key}"
            );
            // A whole get: that digest, then the frame with its size word.
            assert_eq!(
                count(&|| assert_eq!(&a.get_kernel(key, "gfx90a").unwrap(), data)),
                2,
                "{key}"
            );
        }
    }

    /// Bytes that a test changes under an open archive, which does not notice (as a remote
    /// object without ETags would not).
    #[derive(Debug, Clone)]
    struct Shared(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl ByteSource for Shared {
        fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
            Memory(self.0.lock().unwrap().clone()).read_at(buf, offset)
        }
        fn len(&self) -> u64 {
            self.0.lock().unwrap().len() as u64
        }
        fn display_name(&self) -> String {
            "mem://shared".into()
        }
        fn identity(&self) -> String {
            "shared".into()
        }
        fn check_unchanged(&self) -> Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_digest_read_from_the_file_is_checked_and_cannot_be_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let (path, kernels) = digested_archive(dir.path());
        let shared = Shared(std::sync::Arc::new(std::sync::Mutex::new(
            std::fs::read(&path).unwrap(),
        )));
        let a = Archive::open_keeping(Box::new(shared.clone()), 0).unwrap();
        let key = &kernels[3].0;
        let entry = a.entry_at(3, 0).unwrap();
        let at = |pos: Option<u32>| a.toc_offset as usize + pos.unwrap() as usize;
        let (blake3_at, frame_at) = (at(entry.blake3_at), at(entry.frame_blake3_at));
        // The frame digest altered after open: the (intact) kernel is refused before decoding.
        shared.0.lock().unwrap()[frame_at] ^= 1;
        let e = a.get_kernel(key, "gfx90a").unwrap_err();
        assert!(
            matches!(e, Error::DigestMismatch { of_frame: true, .. }),
            "{e:?}"
        );
        assert_eq!(e.kind(), crate::ErrorKind::DecompressionFailed);
        shared.0.lock().unwrap()[frame_at] ^= 1;
        // The decoded bytes' digest altered: reads trust the frame digest, verify checks both.
        shared.0.lock().unwrap()[blake3_at] ^= 1;
        assert_eq!(&a.get_kernel(key, "gfx90a").unwrap(), &kernels[3].1);
        let e = a
            .verify_kernel(&a.locate(key, "gfx90a").unwrap())
            .unwrap_err();
        assert!(
            matches!(
                e,
                Error::DigestMismatch {
                    of_frame: false,
                    ..
                }
            ),
            "{e:?}"
        );
        assert_eq!(
            &a.get_kernel(&kernels[4].0, "gfx90a").unwrap(),
            &kernels[4].1
        );
        // The TOC cut off inside a digest: it cannot be read, and nothing is returned.
        shared.0.lock().unwrap().truncate(blake3_at + 10);
        let e = a.kernel_digest(key, "gfx90a").unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::IoError, "{e}");
        let e = a.get_kernel(key, "gfx90a").unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::IoError, "{e}");
    }

    #[test]
    fn verified_frames_are_the_file_bytes_and_their_size_word_is_checked() {
        let dir = tempfile::tempdir().unwrap();
        let (path, kernels) = digested_archive(dir.path());
        let bytes = std::fs::read(&path).unwrap();
        let a = open_local(&path, KEEP_DIGESTS);
        assert!(a.frames_positioned());
        // One buffer reused from frame to frame, larger or smaller than the next one.
        let mut frame = vec![0xee; 7];
        for (key, _) in kernels.iter().rev() {
            let kref = a.locate(key, "gfx90a").unwrap();
            let start = a.read_verified_frame(&kref, &mut frame).unwrap();
            assert_eq!(start, 4, "read with its size word");
            let at = kref.stored.offset as usize;
            assert_eq!(
                frame[start..],
                bytes[at..at + kref.stored.size as usize],
                "{key}"
            );
        }
        // A size word that disagrees with the TOC: refused, the buffer left empty.
        let mut bad = bytes.clone();
        let kref = a.locate(&kernels[5].0, "gfx90a").unwrap();
        let word = kref.stored.offset as usize - 4;
        bad[word] ^= 0x40;
        let bad_path = dir.path().join("bad.kpack");
        std::fs::write(&bad_path, &bad).unwrap();
        let b = open_local(&bad_path, KEEP_DIGESTS);
        let kref = b.locate(&kernels[5].0, "gfx90a").unwrap();
        let e = b.read_verified_frame(&kref, &mut frame).unwrap_err();
        assert!(
            matches!(e, Error::ZstdIndex { offset, .. } if offset == word as u64),
            "{e:?}"
        );
        assert!(frame.is_empty());
    }

    #[test]
    fn a_hand_built_frame_before_byte_4_is_an_invalid_argument() {
        let dir = tempfile::tempdir().unwrap();
        let (path, kernels) = digested_archive(dir.path());
        let a = open_local(&path, KEEP_DIGESTS);
        let mut kref = a.locate(&kernels[0].0, "gfx90a").unwrap();
        assert!(kref.size_word_unchecked);
        kref.stored.offset = 2;
        let Err(e) = a.read_with(&kref, Unfilled::new) else {
            panic!("read a frame before byte 4")
        };
        assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
        assert!(e.to_string().contains("no room for its size word"), "{e}");
        let mut frame = Vec::new();
        let e = a.read_verified_frame(&kref, &mut frame).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
        assert!(a.verify_kernel(&kref).is_err());
    }

    #[test]
    fn opens_any_byte_source() {
        for compression in [
            crate::archive::writer::Compression::None,
            crate::archive::writer::Compression::Zstd { level: 3 },
        ] {
            let mut w = crate::archive::writer::ArchiveWriter::new(
                "g",
                "f",
                vec!["gfx90a".into()],
                compression,
            )
            .unwrap();
            w.add_kernel("lib/a.so#0", "gfx90a", b"kernel bytes".to_vec())
                .unwrap();
            let mut bytes = Vec::new();
            w.write_to(&mut bytes, &|_| {}).unwrap();
            let a = Archive::open_source(Box::new(Memory(bytes))).unwrap();
            assert_eq!(a.path(), Path::new("mem://sample"));
            assert_eq!(a.modified(), None);
            assert_eq!(
                a.get_kernel("lib/a.so#0", "gfx90a").unwrap(),
                b"kernel bytes"
            );
            let e = a.get_kernel("lib/b.so#0", "gfx90a").unwrap_err();
            assert!(e.to_string().contains("mem://sample"), "{e}");
        }
        let e = Archive::open_source(Box::new(Memory(Vec::new()))).unwrap_err();
        assert!(matches!(e, Error::EmptyFile { .. }), "{e}");
    }
}
