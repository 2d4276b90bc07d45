//! Builders of Clang offload bundles in the real format (docs/import.md), so tests can make the
//! `.hip_fatbin` of fat binaries: uncompressed bundles and CCOB bundles of versions 2 and 3.
//! Test code only, written from the byte layouts rather than from the reader's constants, so a
//! wrong constant there does not hide here. Depends on nothing but std and zstd, so one copy
//! serves every crate that needs it: the integration tests (`support::bundles`), the library's
//! and the program's unit tests and `benches/split.rs` and `examples/make_bundle.rs` (included
//! there with `#[path]`).

/// The first bytes of an uncompressed bundle.
const BUNDLE_MAGIC: &[u8; 24] = b"__CLANG_OFFLOAD_BUNDLE__";
/// Bytes of an uncompressed bundle header: magic plus entry count.
const BUNDLE_HEADER: usize = 24 + 8;
/// The first bytes of a compressed bundle.
const CCOB_MAGIC: &[u8; 4] = b"CCOB";
/// The CCOB compression method for zstd.
const CCOB_METHOD_ZSTD: u16 = 1;
/// Header lengths of CCOB versions 2 and 3.
const CCOB_V2_HEADER: usize = 24;
const CCOB_V3_HEADER: usize = 32;

/// Builds an uncompressed bundle from `(triple, code object)` entries, in the given order. Code
/// objects start at multiples of `align` (clang uses 4096); an entry with no bytes (the host
/// entry) gets the next aligned offset and size 0, as clang writes it.
pub fn build_uncompressed(entries: &[(&str, &[u8])], align: usize) -> Vec<u8> {
    let align = align.max(1);
    let up = |n: usize| n.div_ceil(align) * align;
    let table: usize = BUNDLE_HEADER + entries.iter().map(|(t, _)| 24 + t.len()).sum::<usize>();
    let mut offsets = Vec::with_capacity(entries.len());
    let mut next = up(table);
    for (_, data) in entries {
        offsets.push(next);
        next = up(next + data.len());
    }
    let total = offsets
        .last()
        .zip(entries.last())
        .map(|(o, (_, d))| o + d.len())
        .unwrap_or(table);
    let mut out = Vec::with_capacity(total);
    out.extend_from_slice(BUNDLE_MAGIC);
    out.extend_from_slice(&(entries.len() as u64).to_le_bytes());
    for ((triple, data), off) in entries.iter().zip(&offsets) {
        out.extend_from_slice(&(*off as u64).to_le_bytes());
        out.extend_from_slice(&(data.len() as u64).to_le_bytes());
        out.extend_from_slice(&(triple.len() as u64).to_le_bytes());
        out.extend_from_slice(triple.as_bytes());
    }
    for ((_, data), off) in entries.iter().zip(&offsets) {
        out.resize(*off, 0);
        out.extend_from_slice(data);
    }
    out
}

/// Wraps an uncompressed bundle in a CCOB bundle of `version` 2 or 3 (zstd at `level`). The hash
/// field, which clang fills for its own caching and readers do not check, is written as zero.
pub fn build_ccob(version: u16, bundle: &[u8], level: i32) -> Result<Vec<u8>, String> {
    let payload = zstd::bulk::compress(bundle, level).map_err(|e| format!("zstd: {e}"))?;
    let mut out = Vec::with_capacity(CCOB_V3_HEADER + payload.len());
    out.extend_from_slice(CCOB_MAGIC);
    out.extend_from_slice(&version.to_le_bytes());
    out.extend_from_slice(&CCOB_METHOD_ZSTD.to_le_bytes());
    match version {
        2 => {
            let total = u32::try_from(CCOB_V2_HEADER + payload.len())
                .map_err(|_| "bundle too large for CCOB v2")?;
            let size = u32::try_from(bundle.len()).map_err(|_| "bundle too large for CCOB v2")?;
            out.extend_from_slice(&total.to_le_bytes());
            out.extend_from_slice(&size.to_le_bytes());
        }
        3 => {
            out.extend_from_slice(&((CCOB_V3_HEADER + payload.len()) as u64).to_le_bytes());
            out.extend_from_slice(&(bundle.len() as u64).to_le_bytes());
        }
        v => return Err(format!("CCOB version {v} cannot be written (2 or 3)")),
    }
    out.extend_from_slice(&0u64.to_le_bytes());
    out.extend_from_slice(&payload);
    Ok(out)
}
