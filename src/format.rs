//! The `.kpack` byte layout, as pure functions over bytes: the 16-byte header and the msgpack TOC,
//! read with the reference's lenient rules (see docs/format.md). No I/O happens here.

use crate::msgpack::{self, Value};

pub const MAGIC: &[u8; 4] = b"KPAK";
pub const VERSION: u32 = 1;
pub const HEADER_SIZE: usize = 16;
/// Blobs start at this offset; the bytes between the header and it are zero.
pub const BLOB_ALIGNMENT: u64 = 64;
/// Largest zstd blob the reference accepts.
pub const MAX_ZSTD_BLOB: u64 = 4 << 30;
/// Largest frame count the reference accepts in a zstd blob.
pub const MAX_ZSTD_FRAMES: u32 = 1 << 20;

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
            version: u32::from_le_bytes(bytes[4..8].try_into().expect("4 bytes")),
            toc_offset: u64::from_le_bytes(bytes[8..16].try_into().expect("8 bytes")),
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

/// One `toc[key][arch]` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TocEntry {
    pub arch: String,
    pub ordinal: u32,
    pub original_size: u64,
}

/// One binary key with its arch entries, in file order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TocBinary {
    pub key: String,
    pub arches: Vec<TocEntry>,
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
    /// Binaries sorted by key (byte order); each key once.
    pub binaries: Vec<TocBinary>,
    pub scheme: Scheme,
    /// `none`: the `blobs` list, indexed by ordinal (empty when absent).
    pub blobs: Vec<Span>,
    /// `zstd-per-kernel`: where the blob lies (0 when a field is absent).
    pub zstd_blob: Span,
}

/// A TOC problem: what is wrong and at which byte of the TOC.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TocError {
    pub offset: usize,
    pub reason: String,
}

impl From<msgpack::DecodeError> for TocError {
    fn from(e: msgpack::DecodeError) -> Self {
        TocError { offset: e.offset, reason: e.reason }
    }
}

fn type_error(field: &str, v: &Value<'_>, want: &str) -> TocError {
    let shown = match v {
        Value::Int(i) => format!("{i}"),
        Value::Uint(u) => format!("{u}"),
        other => other.type_name().to_owned(),
    };
    TocError { offset: 0, reason: format!("field '{field}' must be {want}, found {shown}") }
}

fn req_u64(map: &Value<'_>, field: &str, ctx: &dyn Fn() -> String) -> Result<u64, TocError> {
    match map.get(field) {
        None => Err(TocError { offset: 0, reason: format!("{}: field '{field}' is missing", ctx()) }),
        Some(v) => v.as_u64().ok_or_else(|| {
            let mut e = type_error(field, v, "an unsigned 64-bit integer");
            e.reason = format!("{}: {}", ctx(), e.reason);
            e
        }),
    }
}

fn opt_u64_or_zero(map: &Value<'_>, field: &str) -> Result<u64, TocError> {
    match map.get(field) {
        None => Ok(0),
        Some(v) => v.as_u64().ok_or_else(|| type_error(field, v, "an unsigned 64-bit integer")),
    }
}

/// Parses TOC bytes (the first msgpack object; trailing bytes ignored) with the reference's
/// rules: unknown or missing scheme means `none`; a non-array `gfx_arches` or non-map `toc` reads
/// as empty; non-string keys and non-map arch values are skipped; numeric fields of the wrong
/// type, negative or out of range are errors; a missing `ordinal` or `original_size` is an error
/// (the reference leaves it uninitialised).
pub fn parse_toc(bytes: &[u8]) -> Result<Toc, TocError> {
    let (root, _) = msgpack::decode_slice(bytes)?;
    if !matches!(root, Value::Map(_)) {
        return Err(TocError { offset: 0, reason: format!("TOC is a {}, not a map", root.type_name()) });
    }

    let scheme = match root.get("compression_scheme").and_then(Value::as_str) {
        Some(SCHEME_ZSTD) => Scheme::ZstdPerKernel,
        _ => Scheme::None,
    };

    let gfx_arches = match root.get("gfx_arches") {
        Some(Value::Array(items)) => {
            items.iter().filter_map(Value::as_str).map(str::to_owned).collect()
        }
        _ => Vec::new(),
    };

    let mut binaries: Vec<TocBinary> = Vec::new();
    if let Some(Value::Map(keys)) = root.get("toc") {
        binaries.reserve(keys.len());
        for (k, v) in keys {
            let (Some(key), Value::Map(arch_pairs)) = (k.as_str(), v) else { continue };
            let mut arches = Vec::with_capacity(arch_pairs.len());
            for (ak, av) in arch_pairs {
                let (Some(arch), Value::Map(_)) = (ak.as_str(), av) else { continue };
                let ctx = || format!("toc[{key:?}][{arch:?}]");
                let ordinal = req_u64(av, "ordinal", &ctx)?;
                let ordinal = u32::try_from(ordinal).map_err(|_| TocError {
                    offset: 0,
                    reason: format!("{}: ordinal {ordinal} does not fit in 32 bits", ctx()),
                })?;
                let original_size = req_u64(av, "original_size", &ctx)?;
                match arches.iter_mut().find(|e: &&mut TocEntry| e.arch == arch) {
                    Some(existing) => *existing = TocEntry { arch: arch.to_owned(), ordinal, original_size },
                    None => arches.push(TocEntry { arch: arch.to_owned(), ordinal, original_size }),
                }
            }
            binaries.push(TocBinary { key: key.to_owned(), arches });
        }
    }
    // Sorted by key; a key written twice keeps its last occurrence, like a map.
    binaries.reverse();
    binaries.sort_by(|a, b| a.key.cmp(&b.key));
    binaries.dedup_by(|later, earlier| later.key == earlier.key);

    let mut blobs = Vec::new();
    let mut zstd_blob = Span { offset: 0, size: 0 };
    match scheme {
        Scheme::None => {
            if let Some(Value::Array(items)) = root.get("blobs") {
                blobs.reserve(items.len());
                for (i, item) in items.iter().enumerate() {
                    if !matches!(item, Value::Map(_)) {
                        return Err(TocError {
                            offset: 0,
                            reason: format!("blobs[{i}] is a {}, not a map", item.type_name()),
                        });
                    }
                    let ctx = || format!("blobs[{i}]");
                    let offset = req_u64(item, "offset", &ctx)?;
                    let size = req_u64(item, "size", &ctx)?;
                    blobs.push(Span { offset, size });
                }
            }
        }
        Scheme::ZstdPerKernel => {
            zstd_blob = Span {
                offset: opt_u64_or_zero(&root, "zstd_offset")?,
                size: opt_u64_or_zero(&root, "zstd_size")?,
            };
        }
    }

    Ok(Toc {
        format_version: root.get("format_version").and_then(Value::as_u64),
        group_name: root.get("group_name").and_then(Value::as_str).map(str::to_owned),
        gfx_arch_family: root.get("gfx_arch_family").and_then(Value::as_str).map(str::to_owned),
        gfx_arches,
        binaries,
        scheme,
        blobs,
        zstd_blob,
    })
}

/// Walks the frame table at the start of a zstd blob: `u32 count`, then `count` times
/// `u32 size` + `size` bytes. `read` fills a buffer from a blob-relative offset and returns how
/// many bytes it got. Returns blob-relative spans of the frames.
pub fn index_zstd_frames<R>(blob_size: u64, mut read: R) -> Result<Vec<Span>, String>
where
    R: FnMut(u64, &mut [u8]) -> std::io::Result<usize>,
{
    if blob_size < 4 {
        return Err(format!("blob of {blob_size} bytes is too small for a frame count"));
    }
    // Frame headers are read through a window so that small frames cost no extra syscalls and
    // large ones are skipped without reading their bodies.
    const WINDOW: usize = 64 * 1024;
    let mut window = vec![0u8; WINDOW.min(blob_size as usize)];
    let mut window_start = 0u64;
    let mut window_len = 0usize;
    let mut read_u32 = |at: u64| -> Result<u32, String> {
        if at + 4 > window_start + window_len as u64 || at < window_start {
            let want = (blob_size - at).min(window.len() as u64) as usize;
            let mut got = 0;
            while got < want {
                match read(at + got as u64, &mut window[got..want]) {
                    Ok(0) => break,
                    Ok(n) => got += n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(format!("read failed at blob byte {at}: {e}")),
                }
            }
            window_start = at;
            window_len = got;
            if got < 4 {
                return Err(format!("blob ends inside the frame header at blob byte {at}"));
            }
        }
        let i = (at - window_start) as usize;
        Ok(u32::from_le_bytes(window[i..i + 4].try_into().expect("4 bytes")))
    };

    let count = read_u32(0)?;
    if count > MAX_ZSTD_FRAMES {
        return Err(format!("frame count {count} exceeds the limit of {MAX_ZSTD_FRAMES}"));
    }
    let mut frames = Vec::with_capacity((count as usize).min((blob_size / 4) as usize));
    let mut pos = 4u64;
    for i in 0..count {
        if pos + 4 > blob_size {
            return Err(format!("frame {i} header at blob byte {pos} lies past the blob's end"));
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
        index_zstd_frames(blob.len() as u64, |at, buf| {
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
            vec![Span { offset: 8, size: 1 }, Span { offset: 13, size: 2 }]
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
        assert_eq!(spans.iter().map(|s| s.size as u32).collect::<Vec<_>>(), sizes);
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
