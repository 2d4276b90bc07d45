//! Clang offload bundles, as found in the `.hip_fatbin` section of ROCm host binaries.
//!
//! A section holds one bundle per translation unit, one after another (usually with alignment
//! padding between them). Each bundle is either uncompressed (`__CLANG_OFFLOAD_BUNDLE__`: a table
//! of entries, each an offset/size into the bundle plus a target triple) or a `CCOB` compressed
//! bundle (a small header and a zstd frame that decodes to one uncompressed bundle). Byte layouts
//! are in `docs/import.md`.
//!
//! Everything here is a pure function over bytes: no I/O, no panics on any input. Every length is
//! checked against the bytes present before it is used, and decompression output is bounded by
//! the size the header declares (itself capped by `MAX_DECOMPRESSED`) and grows only as real
//! output is produced, so a hostile header cannot make us allocate what it merely claims.

use std::borrow::Cow;
use std::fmt;
use std::io::Read;

mod walk;
pub(crate) use walk::walk_fatbin;
pub use walk::{
    BundleHead, Event, FileRange, Located, Source, WalkError, decode_ccob_bundle, index_fatbin,
};

/// The first bytes of an uncompressed bundle.
pub const BUNDLE_MAGIC: &[u8; 24] = b"__CLANG_OFFLOAD_BUNDLE__";
/// The first bytes of a compressed bundle.
pub const CCOB_MAGIC: &[u8; 4] = b"CCOB";
/// The CCOB compression method we read: zstd. (Method 0 is zlib, which ROCm does not use for
/// device code.)
pub const CCOB_METHOD_ZSTD: u16 = 1;
/// Header lengths of CCOB versions 2 and 3.
pub const CCOB_V2_HEADER: usize = 24;
pub const CCOB_V3_HEADER: usize = 32;
/// The largest decompressed bundle we accept. Real per-TU bundles are tens of megabytes; this cap
/// only exists so that a corrupt size field cannot ask for more.
pub(crate) const MAX_DECOMPRESSED: u64 = 4 << 30;
/// Triples are short (`hipv4-amdgcn-amd-amdhsa--gfx942:sramecc+:xnack-`); a longer one is corrupt.
const MAX_TRIPLE_LEN: u64 = 1024;

/// Bytes of an uncompressed bundle header: magic plus entry count.
const BUNDLE_HEADER: usize = 24 + 8;
/// Smallest entry record: offset, size and triple length (an empty triple).
const MIN_ENTRY: usize = 24;

/// Why a `.hip_fatbin` section could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BundleError {
    /// Byte offset in the parsed input where the problem is.
    pub offset: u64,
    pub reason: String,
}

impl BundleError {
    fn new(offset: usize, reason: impl Into<String>) -> BundleError {
        BundleError {
            offset: offset as u64,
            reason: reason.into(),
        }
    }

    /// The same error, with `base` added to the offset (for errors inside a nested buffer).
    fn shifted(self, base: u64, context: &str) -> BundleError {
        BundleError {
            offset: self.offset + base,
            reason: format!("{context}: {}", self.reason),
        }
    }
}

impl fmt::Display for BundleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "bad offload bundle at byte {}: {}",
            self.offset, self.reason
        )
    }
}

impl std::error::Error for BundleError {}

/// How a bundle is stored in the section.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    Uncompressed,
    /// `CCOB` with this format version (2 or 3).
    Compressed {
        version: u16,
    },
}

/// One device code object of a bundle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry<'a> {
    /// The full bundler triple, e.g. `hipv4-amdgcn-amd-amdhsa--gfx90a:xnack-`.
    pub triple: String,
    /// The target ID: the triple's text after its last `--`, e.g. `gfx90a:xnack-`.
    pub arch: String,
    /// Offset of the code object from the start of its (decompressed) bundle.
    pub offset: u64,
    /// The code object. Borrowed from the section for uncompressed bundles.
    pub data: Cow<'a, [u8]>,
}

/// One bundle (one translation unit) of a `.hip_fatbin` section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bundle<'a> {
    /// Where the bundle starts in the section.
    pub offset: u64,
    /// How many section bytes it occupies.
    pub len: u64,
    pub layout: Layout,
    /// Device entries in table order; host entries are left out.
    pub entries: Vec<Entry<'a>>,
}

/// Whether a bundler triple names the host part (which carries no device code).
pub fn is_host_triple(triple: &str) -> bool {
    triple.starts_with("host-")
}

/// The target ID of a device triple: the text after the last `--`, if that is non-empty.
pub fn arch_of_triple(triple: &str) -> Option<&str> {
    let (_, arch) = triple.rsplit_once("--")?;
    (!arch.is_empty()).then_some(arch)
}

/// Reads every bundle of a `.hip_fatbin` section, in order.
///
/// Scanning starts at byte 0; after each bundle it resumes right after the bundle's last byte
/// and looks for the next magic of either kind (what lies between is padding). A section with no
/// magic at all (for example one zeroed by a kpack split) has no bundles. This is
/// `walk_fatbin` over bytes in memory, collecting what it visits.
pub fn parse_fatbin(section: &[u8]) -> Result<Vec<Bundle<'_>>, BundleError> {
    let mut bundles = Vec::new();
    let mut entries = Vec::new();
    walk_fatbin(section, |event| {
        match event {
            Event::Entry(e) => entries.push(e),
            Event::End(head) => bundles.push(Bundle {
                offset: head.offset,
                len: head.len,
                layout: head.layout,
                entries: std::mem::take(&mut entries),
            }),
        }
        Ok::<(), std::convert::Infallible>(())
    })
    .map_err(|e| match e {
        WalkError::Bundle(e) => e,
        WalkError::Read(e) => BundleError::new(0, e.to_string()),
        WalkError::Visit(never) => match never {},
    })?;
    Ok(bundles)
}

/// The first position at or after `from` where either magic starts.
pub(crate) fn find_next_magic(data: &[u8], from: usize) -> Option<usize> {
    let hay = data.get(from..)?;
    hay.iter()
        .enumerate()
        .filter(|(_, b)| **b == b'_' || **b == b'C')
        .map(|(i, _)| i)
        .find(|&i| hay[i..].starts_with(BUNDLE_MAGIC) || hay[i..].starts_with(CCOB_MAGIC))
        .map(|i| from + i)
}

fn read_u64(data: &[u8], at: usize) -> Result<u64, BundleError> {
    crate::bytes::le_u64(data, at).ok_or_else(|| {
        BundleError::new(
            at,
            format!(
                "truncated: needs 8 bytes at {at}, only {} present",
                data.len()
            ),
        )
    })
}

fn read_u32(data: &[u8], at: usize) -> Result<u32, BundleError> {
    crate::bytes::le_u32(data, at).ok_or_else(|| {
        BundleError::new(
            at,
            format!(
                "truncated: needs 4 bytes at {at}, only {} present",
                data.len()
            ),
        )
    })
}

fn read_u16(data: &[u8], at: usize) -> Result<u16, BundleError> {
    crate::bytes::le_u16(data, at).ok_or_else(|| {
        BundleError::new(
            at,
            format!(
                "truncated: needs 2 bytes at {at}, only {} present",
                data.len()
            ),
        )
    })
}

/// Parses the uncompressed bundle at the start of `data` (which may continue past the bundle).
/// Returns its device entries and its length: the end of the furthest entry or of the entry
/// table, whichever is later.
pub fn parse_uncompressed(data: &[u8]) -> Result<(Vec<Entry<'_>>, usize), BundleError> {
    let (table, len) = parse_table(data, data.len() as u64).map_err(|e| match e {
        TableError::Bundle(e) => e,
        TableError::NeedMore => BundleError::new(0, "truncated"),
    })?;
    let entries = table
        .into_iter()
        .map(|t| Entry {
            data: Cow::Borrowed(&data[t.offset as usize..(t.offset + t.size) as usize]),
            triple: t.triple,
            arch: t.arch,
            offset: t.offset,
        })
        .collect();
    Ok((entries, len as usize))
}

/// One device entry of an uncompressed bundle's table: where its code object lies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TableEntry {
    pub triple: String,
    pub arch: String,
    /// From the start of the bundle.
    pub offset: u64,
    pub size: u64,
}

/// Why an entry table could not be read from the bytes given.
#[derive(Debug)]
pub(crate) enum TableError {
    Bundle(BundleError),
    /// The table goes on past the bytes given, but not past the bytes available: read more.
    NeedMore,
}

/// Parses the entry table of the uncompressed bundle at the start of `data`, where the bundle
/// may extend over `avail >= data.len()` bytes (the rest of the section) of which only `data`
/// was read. Returns the device entries and the bundle's length (the end of the furthest
/// entry or of the table). Errors describe the `avail` bytes, so they do not depend on how
/// much was read.
pub(crate) fn parse_table(data: &[u8], avail: u64) -> Result<(Vec<TableEntry>, u64), TableError> {
    let bad = |at: usize, why: String| TableError::Bundle(BundleError::new(at, why));
    // A field past `data` but inside `avail` means the caller should read more.
    let field = |at: usize| -> Result<u64, TableError> {
        match crate::bytes::le_u64(data, at) {
            Some(v) => Ok(v),
            None if (at as u64).saturating_add(8) <= avail => Err(TableError::NeedMore),
            None => Err(bad(
                at,
                format!("truncated: needs 8 bytes at {at}, only {avail} present"),
            )),
        }
    };
    if !data.starts_with(BUNDLE_MAGIC) {
        return Err(bad(0, "missing __CLANG_OFFLOAD_BUNDLE__ magic".into()));
    }
    let count = field(24)?;
    // Each record takes at least MIN_ENTRY bytes, which bounds the count by the input before we
    // reserve anything for it.
    let room = avail.saturating_sub(BUNDLE_HEADER as u64) / MIN_ENTRY as u64;
    if count > room {
        return Err(bad(
            24,
            format!("entry count {count} cannot fit in the {avail} bytes present"),
        ));
    }
    let mut entries = Vec::with_capacity((count as usize).min(data.len() / MIN_ENTRY));
    let mut at = BUNDLE_HEADER;
    let mut end = 0u64;
    for n in 0..count {
        let offset = field(at)?;
        let size = field(at + 8)?;
        let triple_len = field(at + 16)?;
        if triple_len > MAX_TRIPLE_LEN {
            return Err(bad(
                at + 16,
                format!("entry {n}: triple length {triple_len} is implausible"),
            ));
        }
        let triple_at = at + 24;
        let triple_end = triple_at + triple_len as usize;
        let Some(triple) = data.get(triple_at..triple_end) else {
            return Err(if triple_end as u64 <= avail {
                TableError::NeedMore
            } else {
                bad(
                    triple_at,
                    format!("entry {n}: triple runs past the end of the input"),
                )
            });
        };
        let triple = std::str::from_utf8(triple)
            .map_err(|_| bad(triple_at, format!("entry {n}: triple is not UTF-8")))?;
        let code_end = offset
            .checked_add(size)
            .filter(|e| *e <= avail)
            .ok_or_else(|| {
                bad(
                    at,
                    format!(
                        "entry {n} ({triple}): bytes {offset}+{size} run past the {avail} bytes present"
                    ),
                )
            })?;
        at = triple_end;
        end = end.max(code_end);
        if is_host_triple(triple) {
            continue;
        }
        let arch = arch_of_triple(triple).ok_or_else(|| {
            bad(
                triple_at,
                format!("entry {n}: triple {triple:?} has no target ID after \"--\""),
            )
        })?;
        entries.push(TableEntry {
            triple: triple.to_owned(),
            arch: arch.to_owned(),
            offset,
            size,
        });
    }
    Ok((entries, end.max(at as u64)))
}

/// A decompressed CCOB bundle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decompressed {
    pub version: u16,
    /// Bytes the compressed bundle occupies (header plus payload), from its header.
    pub total_size: usize,
    /// The uncompressed bundle it wraps.
    pub bundle: Vec<u8>,
}

/// Decompresses the CCOB bundle at the start of `data` (which may continue past it).
pub fn decompress_ccob(data: &[u8]) -> Result<Decompressed, BundleError> {
    let h = ccob_header(data, data.len() as u64)?;
    let payload = &data[h.header_len..h.total as usize];
    Ok(Decompressed {
        version: h.version,
        total_size: h.total as usize,
        bundle: h.decode(payload)?,
    })
}

/// The fields of a CCOB header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CcobHeader {
    pub version: u16,
    pub header_len: usize,
    /// Bytes the compressed bundle occupies, header included.
    pub total: u64,
    /// Size of the uncompressed bundle.
    pub declared: u64,
}

impl CcobHeader {
    /// Decodes the payload (the `total - header_len` bytes after the header).
    pub fn decode(&self, payload: &[u8]) -> Result<Vec<u8>, BundleError> {
        decode_bounded(payload, self.declared).map_err(|r| BundleError::new(self.header_len, r))
    }
}

/// Reads and checks the CCOB header at the start of `data` (at least the first
/// [`CCOB_V3_HEADER`] bytes of the bundle, or all of them if fewer), where `avail` bytes of
/// section are present from the bundle's start.
pub(crate) fn ccob_header(data: &[u8], avail: u64) -> Result<CcobHeader, BundleError> {
    if !data.starts_with(CCOB_MAGIC) {
        return Err(BundleError::new(0, "missing CCOB magic"));
    }
    let version = read_u16(data, 4)?;
    let method = read_u16(data, 6)?;
    let (header, total, declared) = match version {
        2 => (
            CCOB_V2_HEADER,
            u64::from(read_u32(data, 8)?),
            u64::from(read_u32(data, 12)?),
        ),
        3 => (CCOB_V3_HEADER, read_u64(data, 8)?, read_u64(data, 16)?),
        v => {
            return Err(BundleError::new(
                4,
                format!("unsupported CCOB version {v} (2 and 3 are known)"),
            ));
        }
    };
    if header as u64 > avail {
        return Err(BundleError::new(
            0,
            format!("truncated: the v{version} header needs {header} bytes, {avail} present"),
        ));
    }
    if method != CCOB_METHOD_ZSTD {
        return Err(BundleError::new(
            6,
            format!("unsupported compression method {method} (only 1 = zstd is read)"),
        ));
    }
    if total < header as u64 || total > avail {
        return Err(BundleError::new(
            8,
            format!(
                "total size {total} is not between the {header}-byte header and the {avail} bytes present"
            ),
        ));
    }
    if declared > MAX_DECOMPRESSED {
        return Err(BundleError::new(
            if version == 2 { 12 } else { 16 },
            format!("uncompressed size {declared} exceeds the {MAX_DECOMPRESSED}-byte limit"),
        ));
    }
    Ok(CcobHeader {
        version,
        header_len: header,
        total,
        declared,
    })
}

/// Decodes one zstd frame that must produce exactly `expected` bytes. The output buffer grows
/// with the bytes actually produced (never to more than `expected + 1`), so a lying size field
/// costs nothing.
fn decode_bounded(payload: &[u8], expected: u64) -> Result<Vec<u8>, String> {
    let decoder = zstd::stream::read::Decoder::with_buffer(payload)
        .map_err(|e| format!("cannot start zstd decoder: {e}"))?
        .single_frame();
    let mut out = Vec::new();
    decoder
        .take(expected + 1)
        .read_to_end(&mut out)
        .map_err(|e| format!("zstd payload does not decode: {e}"))?;
    if out.len() as u64 != expected {
        let got = if out.len() as u64 > expected {
            format!("more than {expected}")
        } else {
            out.len().to_string()
        };
        return Err(format!(
            "payload decodes to {got} bytes, the header says {expected}"
        ));
    }
    Ok(out)
}

/// The test builders of bundles (one file shared with the integration tests).
#[cfg(test)]
#[path = "../../../tests/it/support/bundles.rs"]
pub(crate) mod fixtures;

#[cfg(test)]
mod tests;
