//! The `.kpack` byte layout: the 16-byte header and the msgpack TOC, read with the reference's
//! lenient rules (see docs/format.md). No I/O happens here: the TOC is pulled through a read
//! function the caller supplies (`read_toc`, see `window.rs`) into the compact form of
//! `kernels.rs`.

mod kernels;
mod window;

use std::collections::HashSet;

pub use kernels::{Kernels, TocBinary, TocEntry};
use kernels::{KernelsBuilder, NewEntry};
pub(crate) use window::ReadAt;
use window::Window;
pub use window::{CHUNK as TOC_WINDOW, TocReadError};

use crate::archive::msgpack::{self, Value};

pub const MAGIC: &[u8; 4] = b"KPAK";
pub const VERSION: u32 = 1;
pub const HEADER_SIZE: usize = 16;
/// Blobs start at this offset; the bytes between the header and it are zero.
pub const BLOB_ALIGNMENT: u64 = 64;
/// Largest zstd blob the reference accepts.
pub(crate) const MAX_ZSTD_BLOB: u64 = 4 << 30;
/// Largest frame count the reference accepts in a zstd blob.
pub const MAX_ZSTD_FRAMES: u32 = 1 << 20;

/// Keys of an entry's `metadata` map that our writer adds (the reference ignores the map).
pub const META_FRAME: &str = "frame";
pub const META_BLAKE3: &str = "blake3";
pub const META_FRAME_BLAKE3: &str = "frame_blake3";

pub const SCHEME_NONE: &str = "none";
pub const SCHEME_ZSTD: &str = "zstd-per-kernel";

/// The fixed header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub magic: [u8; 4],
    pub version: u32,
    pub toc_offset: u64,
}

impl Header {
    pub fn parse(bytes: &[u8; HEADER_SIZE]) -> Header {
        let mut magic = [0u8; 4];
        magic.copy_from_slice(&bytes[0..4]);
        Header {
            magic,
            version: crate::bytes::le_u32(bytes, 4).expect("16-byte header"),
            toc_offset: crate::bytes::le_u64(bytes, 8).expect("16-byte header"),
        }
    }

    pub fn encode(toc_offset: u64) -> [u8; HEADER_SIZE] {
        let mut out = [0u8; HEADER_SIZE];
        out[0..4].copy_from_slice(MAGIC);
        out[4..8].copy_from_slice(&VERSION.to_le_bytes());
        out[8..16].copy_from_slice(&toc_offset.to_le_bytes());
        out
    }
}

/// How kernels are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scheme {
    /// Plain bytes; the `blobs` list gives absolute offsets.
    None,
    /// One zstd frame per kernel in a blob at `zstd_offset`.
    ZstdPerKernel,
}

impl Scheme {
    pub fn name(self) -> &'static str {
        match self {
            Scheme::None => SCHEME_NONE,
            Scheme::ZstdPerKernel => SCHEME_ZSTD,
        }
    }
}

/// A zstd frame's position as our writer records it: `offset` is the absolute file offset of the
/// frame's 4-byte size word, `size` the value of that word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FramePos {
    pub offset: u64,
    pub size: u32,
}

/// A byte range in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    pub offset: u64,
    pub size: u64,
}

/// The TOC after the reference's lenient reading.
#[derive(Debug, Clone, PartialEq)]
pub struct Toc {
    pub format_version: Option<u64>,
    pub group_name: Option<String>,
    pub gfx_arch_family: Option<String>,
    /// The archive-level arch index, in file order; non-string items dropped.
    pub gfx_arches: Vec<String>,
    /// Binaries sorted by key (byte order), each key once, with their arch entries.
    pub kernels: Kernels,
    pub scheme: Scheme,
    /// `none`: the `blobs` list, indexed by ordinal (empty when absent).
    pub blobs: Vec<Span>,
    /// `zstd-per-kernel`: where the blob lies (0 when a field is absent).
    pub zstd_blob: Span,
    /// Bytes of the TOC's msgpack object (what follows it is ignored).
    pub byte_len: usize,
}

/// A TOC problem: what is wrong and at which byte of the TOC.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TocError {
    pub offset: usize,
    pub reason: String,
}

impl From<msgpack::DecodeError> for TocError {
    fn from(e: msgpack::DecodeError) -> Self {
        TocError {
            offset: e.offset,
            reason: e.reason,
        }
    }
}

fn type_error(field: &str, v: &Value<'_>, want: &str) -> TocError {
    let shown = match v {
        Value::Int(i) => format!("{i}"),
        Value::Uint(u) => format!("{u}"),
        other => other.type_name().to_owned(),
    };
    TocError {
        offset: 0,
        reason: format!("field '{field}' must be {want}, found {shown}"),
    }
}

fn req_u64(map: &Value<'_>, field: &str, ctx: &dyn Fn() -> String) -> Result<u64, TocError> {
    match map.get(field) {
        None => Err(TocError {
            offset: 0,
            reason: format!("{}: field '{field}' is missing", ctx()),
        }),
        Some(v) => v.as_u64().ok_or_else(|| {
            let mut e = type_error(field, v, "an unsigned 64-bit integer");
            e.reason = format!("{}: {}", ctx(), e.reason);
            e
        }),
    }
}

/// Parses the TOC (the first msgpack object of the `len` bytes `read` gives; trailing bytes ignored) with the reference's
/// rules: unknown or missing scheme means `none`; a non-array `gfx_arches` or non-map `toc` reads
/// as empty; non-string keys and non-map arch values are skipped; numeric fields of the wrong
/// type, negative or out of range are errors; a missing `ordinal` is an error, as is a missing
/// `original_size`
/// for `zstd-per-kernel` (the reference aborts there), while a `none` entry without
/// `original_size` reads with its blob's size (as the reference does). Where a map repeats a key
/// (the root, `toc`, an arch map, an entry), the first occurrence counts, as in the reference's
/// parser; later ones are still read (and their numbers checked) but ignored. A binary whose arch
/// map holds no entries is not a binary that has kernels and is left out.
///
/// The root map and the big `toc` map are walked with a pull reader rather than decoded into a
/// tree, one unit at a time through a bounded window (see `window.rs`): a TOC of a million
/// entries is never held whole, and its entries cost no allocation each.
/// Also returns the BLAKE3 of the TOC object's bytes (`Toc::byte_len` of them).
/// Up to `keep_digests` digest values are copied out as they pass (`Kernels::take_digests`).
pub(crate) fn read_toc(
    len: u64,
    read: ReadAt<'_>,
    keep_digests: usize,
) -> Result<(Toc, [u8; 32]), TocReadError> {
    read_toc_windowed(len, read, keep_digests, TOC_WINDOW)
}

/// `read_toc` through a window of `window` bytes instead of [`TOC_WINDOW`]. The result (TOC,
/// digest, error and its offset) does not depend on `window`; tests and the fuzzer use tiny
/// windows to run the grow-and-retry path on small TOCs.
#[doc(hidden)]
pub fn read_toc_windowed(
    len: u64,
    read: ReadAt<'_>,
    keep_digests: usize,
    window: usize,
) -> Result<(Toc, [u8; 32]), TocReadError> {
    let mut w = Window::new(len, read, window);
    let (fields, mut at) = w.unit(0, |r| match r.map_header()? {
        Some(fields) => Ok(fields),
        None => {
            let root = r.value(0)?;
            Err(TocError {
                offset: 0,
                reason: format!("TOC is a {}, not a map", root.type_name()),
            })
        }
    })?;
    let mut toc = Toc {
        format_version: None,
        group_name: None,
        gfx_arch_family: None,
        gfx_arches: Vec::new(),
        kernels: Kernels::default(),
        scheme: Scheme::None,
        blobs: Vec::new(),
        zstd_blob: Span { offset: 0, size: 0 },
        byte_len: 0,
    };
    // Scheme-specific fields are interpreted once the scheme is known (it may come later).
    let mut blobs: Option<Result<Vec<Span>, TocError>> = None;
    let mut zstd_offset: Option<Result<u64, TocError>> = None;
    let mut zstd_size: Option<Result<u64, TocError>> = None;
    let mut missing_size: Option<TocError> = None;
    let mut seen: HashSet<String> = HashSet::new();
    for _ in 0..fields {
        let field_at = at as usize;
        // The field's key; its value too unless it is the first `toc`, which is walked in units.
        let ((name, is_toc), end) = w.unit(at, |r| {
            let key = r.value(1)?;
            let name = key.as_str().unwrap_or("");
            let repeated = !name.is_empty() && seen.contains(name);
            if name == "toc" && !repeated {
                return Ok((name.to_owned(), true));
            }
            let value = r.value(1)?;
            if repeated {
                return Ok((String::new(), false));
            }
            let located = |e: TocError| TocError {
                offset: field_at,
                reason: e.reason,
            };
            match name {
                "format_version" => toc.format_version = value.as_u64(),
                "group_name" => toc.group_name = value.as_str().map(str::to_owned),
                "gfx_arch_family" => toc.gfx_arch_family = value.as_str().map(str::to_owned),
                "gfx_arches" => {
                    toc.gfx_arches = match &value {
                        Value::Array(items) => items
                            .iter()
                            .filter_map(Value::as_str)
                            .map(str::to_owned)
                            .collect(),
                        _ => Vec::new(),
                    }
                }
                "compression_scheme" => {
                    toc.scheme = match value.as_str() {
                        Some(SCHEME_ZSTD) => Scheme::ZstdPerKernel,
                        _ => Scheme::None,
                    }
                }
                "blobs" => blobs = Some(parse_blobs(&value).map_err(located)),
                "zstd_offset" => {
                    zstd_offset = Some(zstd_field("zstd_offset", &value).map_err(located))
                }
                "zstd_size" => zstd_size = Some(zstd_field("zstd_size", &value).map_err(located)),
                _ => {}
            }
            Ok((name.to_owned(), false))
        })?;
        at = end;
        if !name.is_empty() {
            seen.insert(name);
        }
        if is_toc {
            (toc.kernels, missing_size, at) = parse_binaries(&mut w, at, keep_digests)?;
        }
    }
    toc.byte_len = at as usize;
    match toc.scheme {
        Scheme::None => {
            toc.blobs = blobs.transpose()?.unwrap_or_default();
            if missing_size.is_some() {
                let blobs = &toc.blobs;
                toc.kernels.fill_missing_sizes(|ordinal| {
                    blobs.get(ordinal as usize).map_or(0, |s| s.size)
                });
            }
        }
        Scheme::ZstdPerKernel => {
            if let Some(e) = missing_size {
                return Err(e.into());
            }
            toc.zstd_blob = Span {
                offset: zstd_offset.transpose()?.unwrap_or(0),
                size: zstd_size.transpose()?.unwrap_or(0),
            }
        }
    }
    let digest = w.digest(at);
    Ok((toc, digest))
}

/// `read_toc` over bytes in memory.
pub fn parse_toc(bytes: &[u8]) -> Result<Toc, TocError> {
    let mut read = |at: u64, buf: &mut [u8]| -> std::io::Result<usize> {
        let at = (at as usize).min(bytes.len());
        let n = buf.len().min(bytes.len() - at);
        buf[..n].copy_from_slice(&bytes[at..at + n]);
        Ok(n)
    };
    match read_toc(bytes.len() as u64, &mut read, 0) {
        Ok((toc, _)) => Ok(toc),
        Err(TocReadError::Toc(e)) => Err(e),
        Err(e) => Err(TocError {
            offset: 0,
            reason: format!("{e:?}"),
        }),
    }
}

fn zstd_field(field: &str, v: &Value<'_>) -> Result<u64, TocError> {
    v.as_u64()
        .ok_or_else(|| type_error(field, v, "an unsigned 64-bit integer"))
}

fn parse_blobs(value: &Value<'_>) -> Result<Vec<Span>, TocError> {
    let Value::Array(items) = value else {
        return Ok(Vec::new());
    };
    let mut blobs = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        if !matches!(item, Value::Map(_)) {
            return Err(TocError {
                offset: 0,
                reason: format!("blobs[{i}] is a {}, not a map", item.type_name()),
            });
        }
        let ctx = || format!("blobs[{i}]");
        blobs.push(Span {
            offset: req_u64(item, "offset", &ctx)?,
            size: req_u64(item, "size", &ctx)?,
        });
    }
    Ok(blobs)
}

/// The fewest bytes a binary with one entry takes: a one-byte key, arch map header and arch
/// key, an entry map header, then `"ordinal"` (8 bytes) and a one-byte value.
const MIN_BINARY_BYTES: u64 = 13;

/// The `toc` map starting at TOC offset `at`, walked one binary at a time: binary key -> arch
/// -> entry. Also returns the error for the first entry without `original_size` (an error only
/// for `zstd-per-kernel`, decided by the caller once the scheme is known), and where the map ends.
fn parse_binaries(
    w: &mut Window<'_>,
    at: u64,
    keep_digests: usize,
) -> Result<(Kernels, Option<TocError>, u64), TocReadError> {
    let (count, mut at) = w.unit(at, |r| match r.map_header()? {
        Some(count) => Ok(Some(count)),
        None => {
            r.value(1)?; // Not a map: reads as an empty TOC.
            Ok(None)
        }
    })?;
    let Some(count) = count else {
        return Ok((Kernels::default(), None, at));
    };
    let mut missing_size = None;
    // The count was checked against the bytes present at two per binary, but room is made only
    // for binaries that could have an entry in the bytes left (a binary with kernels takes at
    // least MIN_BINARY_BYTES), so a TOC of empty binaries cannot make us reserve 38x its size.
    let fit = usize::try_from(w.remaining(at) / MIN_BINARY_BYTES).unwrap_or(usize::MAX);
    let mut kernels = KernelsBuilder::with_capacity(count.min(fit).min(1 << 20), keep_digests);
    for _ in 0..count {
        let mark = kernels.mark();
        let missing_before = missing_size.clone();
        ((), at) = w.unit(at, |r| {
            // A run on a window too small left a partial binary behind.
            kernels.rewind(mark);
            missing_size.clone_from(&missing_before);
            parse_binary(r, at as usize, &mut kernels, &mut missing_size)
        })?;
    }
    Ok((kernels.finish(), missing_size, at))
}

/// One binary of the `toc` map: its key, its arch map and every entry in it. `r` starts at TOC
/// offset `base`.
fn parse_binary(
    r: &mut msgpack::Reader<'_>,
    base: usize,
    kernels: &mut KernelsBuilder,
    missing_size: &mut Option<TocError>,
) -> Result<(), TocError> {
    let key_value = r.value(2)?;
    let key = key_value.as_str();
    let Some(arch_count) = r.map_header()? else {
        r.value(2)?;
        return Ok(());
    };
    if let Some(key) = key {
        kernels.open_binary(key)?;
    }
    for _ in 0..arch_count {
        let at = r.position();
        let arch_value = r.value(3)?;
        let Some(entry_fields) = r.map_header()? else {
            r.value(3)?;
            continue;
        };
        let mut ordinal = None;
        let mut original_size = None;
        let mut metadata = None;
        for _ in 0..entry_fields {
            let field = r.value(4)?;
            if field.as_str() == Some("metadata") && metadata.is_none() {
                metadata = Some(entry_metadata(r)?);
                continue;
            }
            let value = r.value(4)?;
            let slot = match field.as_str() {
                Some("ordinal") => &mut ordinal,
                Some("original_size") => &mut original_size,
                _ => continue,
            };
            slot.get_or_insert(value);
        }
        // Entries under a non-string key are skipped, but only after being read whole.
        let (Some(key), Some(arch)) = (key, arch_value.as_str()) else {
            continue;
        };
        let ctx = |what: String| TocError {
            offset: at,
            reason: format!("toc[{key:?}][{arch:?}]: {what}"),
        };
        let number = |field: &str, v: Option<Value<'_>>| -> Result<u64, TocError> {
            let v = v.ok_or_else(|| ctx(format!("field '{field}' is missing")))?;
            v.as_u64()
                .ok_or_else(|| ctx(type_error(field, &v, "an unsigned 64-bit integer").reason))
        };
        let ordinal = number("ordinal", ordinal)?;
        let ordinal = u32::try_from(ordinal)
            .map_err(|_| ctx(format!("ordinal {ordinal} does not fit in 32 bits")))?;
        let original_size = match original_size {
            Some(_) => Some(number("original_size", original_size)?),
            None => {
                if missing_size.is_none() {
                    // Kept past this unit, so rebased here: `Window::unit` rebases only the
                    // errors a unit returns.
                    let mut e = ctx("field 'original_size' is missing".into());
                    e.offset += base;
                    *missing_size = Some(e);
                }
                None
            }
        };
        let meta = metadata.unwrap_or_default();
        kernels
            .add_entry(
                arch,
                NewEntry {
                    ordinal,
                    original_size,
                    frame: meta.frame,
                    blake3: meta.blake3.map(|(at, d)| (base + at, d)),
                    frame_blake3: meta.frame_blake3.map(|(at, d)| (base + at, d)),
                },
            )
            .map_err(|e| ctx(e.reason))?;
    }
    Ok(())
}

/// Our keys of an entry's `metadata` map.
#[derive(Debug, Default)]
struct EntryMeta {
    frame: Option<FramePos>,
    /// Where a well-formed `blake3` value's 32 bytes lie in the TOC.
    blake3: Option<(usize, [u8; 32])>,
    /// Where a well-formed `frame_blake3` value's 32 bytes lie in the TOC.
    frame_blake3: Option<(usize, [u8; 32])>,
}

/// Our keys in an entry's `metadata` map, read in place (a map per entry would cost an
/// allocation each in a TOC of a million entries). A value of the wrong shape is ignored, as the
/// whole map is by the reference: the entry then reads as one without that key (the frame chain
/// is walked at open, no digest is checked). A repeated key counts at its first occurrence.
/// Digests are located, not copied: the archive decides whether to keep them in memory.
fn entry_metadata(r: &mut msgpack::Reader<'_>) -> Result<EntryMeta, TocError> {
    let Some(count) = r.map_header()? else {
        r.value(5)?; // Not a map: nothing of ours.
        return Ok(EntryMeta::default());
    };
    let mut meta = EntryMeta::default();
    let (mut frame_seen, mut blake3_seen, mut frame_blake3_seen) = (false, false, false);
    let digest_at = |r: &mut msgpack::Reader<'_>| -> Result<_, TocError> {
        Ok(match r.value(5)? {
            Value::Bin(b) => <[u8; 32]>::try_from(b).ok().map(|d| (r.position() - 32, d)),
            _ => None,
        })
    };
    for _ in 0..count {
        let key = r.value(5)?;
        match key.as_str() {
            Some(META_FRAME) if !frame_seen => {
                frame_seen = true;
                meta.frame = frame_pos(r)?;
            }
            Some(META_BLAKE3) if !blake3_seen => {
                blake3_seen = true;
                meta.blake3 = digest_at(r)?;
            }
            Some(META_FRAME_BLAKE3) if !frame_blake3_seen => {
                frame_blake3_seen = true;
                meta.frame_blake3 = digest_at(r)?;
            }
            _ => {
                r.value(5)?;
            }
        }
    }
    Ok(meta)
}

/// A `frame` value: `[offset, size]`, two unsigned integers, `size` fitting in 32 bits; anything
/// else is `None`. Read by headers, so a million entries cost no allocation here.
fn frame_pos(r: &mut msgpack::Reader<'_>) -> Result<Option<FramePos>, TocError> {
    let Some(len) = r.array_header()? else {
        r.value(6)?;
        return Ok(None);
    };
    let mut items = [None, None];
    let mut slots = items.iter_mut();
    for _ in 0..len {
        let v = r.value(6)?;
        if let Some(slot) = slots.next() {
            *slot = v.as_u64();
        }
    }
    Ok(match (len, items) {
        (2, [Some(offset), Some(size)]) => u32::try_from(size)
            .ok()
            .map(|size| FramePos { offset, size }),
        _ => None,
    })
}

/// Walks the frame table at the start of a zstd blob: `u32 count`, then `count` times
/// `u32 size` + `size` bytes. `read` fills a buffer from a blob-relative offset and returns how
/// many bytes it got. Returns blob-relative spans of the frames.
pub fn index_zstd_frames<R>(blob_size: u64, base: u64, mut read: R) -> Result<Vec<Span>, String>
where
    R: FnMut(u64, &mut [u8]) -> std::io::Result<usize>,
{
    if blob_size < 4 {
        return Err(format!(
            "blob of {blob_size} bytes is too small for a frame count"
        ));
    }
    // Size words are read a page at a time, pages aligned in the file (`base` is the blob's
    // absolute offset): small frames share a read, a large frame's body is never read, and
    // each read touches exactly the pages that hold the word, so walking the chain leaves at
    // most one page per frame in the page cache instead of pulling the blob in.
    const PAGE: u64 = 4096;
    let mut window = [0u8; 2 * PAGE as usize];
    let mut window_start = 0u64;
    let mut window_len = 0usize;
    let mut read_u32 = |at: u64| -> Result<u32, String> {
        if at + 4 > window_start + window_len as u64 || at < window_start {
            let abs = base.saturating_add(at);
            let start = (abs - abs % PAGE).saturating_sub(base).min(at);
            let end_abs = abs.saturating_add(4).div_ceil(PAGE).saturating_mul(PAGE);
            let end = end_abs.saturating_sub(base).min(blob_size).max(at + 4);
            let want = ((end - start) as usize).min(window.len());
            let got =
                crate::bytes::read_full_with(|b, pos| read(pos, b), &mut window[..want], start)
                    .map_err(|e| format!("read failed at blob byte {at}: {e}"))?;
            window_start = start;
            window_len = got;
            if (got as u64) < at - start + 4 {
                return Err(format!(
                    "blob ends inside the frame header at blob byte {at}"
                ));
            }
        }
        let i = (at - window_start) as usize;
        Ok(crate::bytes::le_u32(&window[..window_len], i).expect("checked inside the window"))
    };

    let count = read_u32(0)?;
    if count > MAX_ZSTD_FRAMES {
        return Err(format!(
            "frame count {count} exceeds the limit of {MAX_ZSTD_FRAMES}"
        ));
    }
    let mut frames = Vec::with_capacity((count as usize).min((blob_size / 4) as usize));
    let mut pos = 4u64;
    for i in 0..count {
        if pos + 4 > blob_size {
            return Err(format!(
                "frame {i} header at blob byte {pos} lies past the blob's end"
            ));
        }
        let size = u64::from(read_u32(pos)?);
        pos += 4;
        if size > blob_size - pos {
            return Err(format!(
                "frame {i} at blob byte {pos} claims {size} bytes, past the blob's end ({blob_size})"
            ));
        }
        frames.push(Span { offset: pos, size });
        pos += size;
    }
    Ok(frames)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn index(blob: &[u8]) -> Result<Vec<Span>, String> {
        index_zstd_frames(blob.len() as u64, 64, |at, buf| {
            let at = at as usize;
            let n = buf.len().min(blob.len().saturating_sub(at));
            buf[..n].copy_from_slice(&blob[at..at + n]);
            Ok(n)
        })
    }

    #[test]
    fn frame_index_walks_headers() {
        let blob = [2, 0, 0, 0, 1, 0, 0, 0, 0xaa, 2, 0, 0, 0, 0xbb, 0xcc, 0xff];
        assert_eq!(
            index(&blob).unwrap(),
            vec![
                Span { offset: 8, size: 1 },
                Span {
                    offset: 13,
                    size: 2
                }
            ]
        );
    }

    #[test]
    fn frame_index_rejects_bad_tables() {
        assert!(index(&[1, 0, 0]).is_err());
        assert!(index(&[2, 0, 0, 0, 1, 0, 0, 0, 0xaa]).is_err());
        assert!(index(&[1, 0, 0, 0, 9, 0, 0, 0, 0xaa]).is_err());
        assert!(index(&[1, 0, 0x10, 0, 0, 0, 0, 0]).is_err());
        assert_eq!(index(&[0, 0, 0, 0, 7, 7]).unwrap(), vec![]);
    }

    #[test]
    fn frame_index_crosses_windows() {
        let mut blob = vec![];
        let sizes = [70_000u32, 3, 100_000, 0, 5];
        blob.extend_from_slice(&(sizes.len() as u32).to_le_bytes());
        for s in sizes {
            blob.extend_from_slice(&s.to_le_bytes());
            blob.extend(std::iter::repeat_n(7u8, s as usize));
        }
        let spans = index(&blob).unwrap();
        assert_eq!(
            spans.iter().map(|s| s.size as u32).collect::<Vec<_>>(),
            sizes
        );
    }

    #[test]
    fn toc_numeric_fields_are_strict() {
        // {"toc": {"k": {"a": {"ordinal": -1, "original_size": 1}}}}
        let mut buf = Vec::new();
        rmp::encode::write_map_len(&mut buf, 1).unwrap();
        rmp::encode::write_str(&mut buf, "toc").unwrap();
        rmp::encode::write_map_len(&mut buf, 1).unwrap();
        rmp::encode::write_str(&mut buf, "k").unwrap();
        rmp::encode::write_map_len(&mut buf, 1).unwrap();
        rmp::encode::write_str(&mut buf, "a").unwrap();
        rmp::encode::write_map_len(&mut buf, 2).unwrap();
        rmp::encode::write_str(&mut buf, "ordinal").unwrap();
        rmp::encode::write_sint(&mut buf, -1).unwrap();
        rmp::encode::write_str(&mut buf, "original_size").unwrap();
        rmp::encode::write_uint(&mut buf, 1).unwrap();
        let e = parse_toc(&buf).unwrap_err();
        assert!(e.reason.contains("ordinal"), "{}", e.reason);
    }
}
