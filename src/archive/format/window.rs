//! The TOC read from its source through a bounded window, hashed as it goes.
//!
//! A TOC may be hundreds of MiB (a million entries with digests), and an open archive needs only
//! what it parses out of it, so the bytes are never held whole: the parser works on one unit at a
//! time (the root map's header, one root field, the `toc` map's header, one binary with all of
//! its entries), each parsed from a window that starts at the unit and is refilled from the
//! source. A unit whose parse fails before the window holds everything left of the TOC is parsed
//! again from a window twice as large: only a failure with every remaining byte present is an
//! error, so every length check, every error and its offset is exactly what a parse of the whole
//! TOC gives. The window grows past its usual size only for a unit larger than it (a binary with
//! thousands of arches, a `none` archive's `blobs` list) or for a TOC that fails to parse. Bytes
//! leave the window only once the parser is past them, and are hashed then: the TOC digest costs
//! no second pass.

use std::io;

use crate::archive::msgpack::Reader;

use super::TocError;

/// Bytes read at a time, and the least the window keeps ahead of the parser at a unit's start.
/// Tests and the fuzzer pass far smaller windows so that the retry path runs on small TOCs.
pub const CHUNK: usize = 256 << 10;

/// Why the TOC could not be read.
#[derive(Debug)]
pub enum TocReadError {
    /// The source failed.
    Io(io::Error),
    /// The TOC does not parse (offsets count from its first byte).
    Toc(TocError),
    /// The window could not grow to this many bytes.
    OutOfMemory(usize),
}

impl From<TocError> for TocReadError {
    fn from(e: TocError) -> Self {
        TocReadError::Toc(e)
    }
}

/// Fills a buffer from a TOC-relative offset; returns how many bytes it got (0 at the end).
pub(crate) type ReadAt<'r> = &'r mut dyn FnMut(u64, &mut [u8]) -> io::Result<usize>;

pub(super) struct Window<'r> {
    read: ReadAt<'r>,
    /// Bytes of TOC the source holds (from the TOC's start to the end of the file).
    len: u64,
    buf: Vec<u8>,
    /// TOC offset of `buf[0]`.
    base: u64,
    /// Every byte before `base`.
    hasher: blake3::Hasher,
    /// Bytes read at a time (see [`CHUNK`]).
    chunk: usize,
}

impl<'r> Window<'r> {
    /// A window reading `chunk` bytes at a time (at least 1).
    pub fn new(len: u64, read: ReadAt<'r>, chunk: usize) -> Self {
        Window {
            read,
            len,
            buf: Vec::new(),
            base: 0,
            hasher: blake3::Hasher::new(),
            chunk: chunk.max(1),
        }
    }

    fn end(&self) -> u64 {
        self.base + self.buf.len() as u64
    }

    /// Bytes of the TOC from `at` to its end, as far as the source has shown so far.
    pub(crate) fn remaining(&self, at: u64) -> u64 {
        self.len.saturating_sub(at)
    }

    /// Whether the window holds every byte of the TOC from its start.
    fn is_final(&self) -> bool {
        self.end() >= self.len
    }

    /// Moves the window's start to `at` (hashing the bytes left behind) and reads until it holds
    /// `want` bytes from there, or the rest of the TOC.
    fn fill(&mut self, at: u64, want: usize) -> Result<(), TocReadError> {
        let drop = (at - self.base) as usize;
        if drop > 0 {
            self.hasher.update(&self.buf[..drop]);
            self.buf.drain(..drop);
            self.base = at;
        }
        let target = (want as u64).min(self.len - at) as usize;
        let have = self.buf.len();
        if have >= target {
            return Ok(());
        }
        self.buf
            .try_reserve_exact(target - have)
            .map_err(|_| TocReadError::OutOfMemory(target))?;
        self.buf.resize(target, 0);
        let got = crate::bytes::read_full_with(
            |b, pos| (self.read)(pos, b),
            &mut self.buf[have..],
            at + have as u64,
        )
        .map_err(TocReadError::Io)?;
        self.buf.truncate(have + got);
        if have + got < target {
            // The source ended early: what it holds is the whole TOC.
            self.len = self.end();
        }
        Ok(())
    }

    /// Parses one unit starting at TOC offset `at` (never before the current unit); returns what
    /// `parse` made of it and where the unit ends. `parse` may run more than once (on a larger
    /// window), so it must undo any effect of an earlier, failed run before it starts.
    pub fn unit<T>(
        &mut self,
        at: u64,
        mut parse: impl FnMut(&mut Reader<'_>) -> Result<T, TocError>,
    ) -> Result<(T, u64), TocReadError> {
        if self.end() - at < (self.chunk / 2) as u64 && !self.is_final() {
            self.fill(at, self.chunk)?;
        }
        loop {
            let start = (at - self.base) as usize;
            let mut r = Reader::new(&self.buf[start..]);
            match parse(&mut r) {
                Ok(v) => return Ok((v, at + r.position() as u64)),
                Err(e) if self.is_final() => {
                    return Err(TocReadError::Toc(TocError {
                        offset: e.offset.saturating_add(at as usize),
                        reason: e.reason,
                    }));
                }
                Err(_) => {
                    let held = (self.end() - at) as usize;
                    self.fill(at, held.saturating_mul(2).max(self.chunk))?;
                }
            }
        }
    }

    /// The BLAKE3 of the TOC's first `end` bytes (the parser is past all of them).
    pub fn digest(mut self, end: u64) -> [u8; 32] {
        let keep = (end - self.base) as usize;
        self.hasher.update(&self.buf[..keep]);
        *self.hasher.finalize().as_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Scheme, read_toc};
    use super::*;

    /// `{"compression_scheme": "zstd-per-kernel", "toc": {...}, "zstd_offset": 64}` with `keys`
    /// binaries of `arches` entries each, every entry with both digests.
    fn toc_bytes(keys: usize, arches: usize) -> Vec<u8> {
        let mut b = Vec::new();
        rmp::encode::write_map_len(&mut b, 3).unwrap();
        rmp::encode::write_str(&mut b, "compression_scheme").unwrap();
        rmp::encode::write_str(&mut b, "zstd-per-kernel").unwrap();
        rmp::encode::write_str(&mut b, "toc").unwrap();
        rmp::encode::write_map_len(&mut b, keys as u32).unwrap();
        for k in 0..keys {
            rmp::encode::write_str(&mut b, &format!("lib/k{k:07}.so#0")).unwrap();
            rmp::encode::write_map_len(&mut b, arches as u32).unwrap();
            for a in 0..arches {
                rmp::encode::write_str(&mut b, &format!("gfx{a}")).unwrap();
                rmp::encode::write_map_len(&mut b, 3).unwrap();
                rmp::encode::write_str(&mut b, "ordinal").unwrap();
                rmp::encode::write_uint(&mut b, (k * arches + a) as u64).unwrap();
                rmp::encode::write_str(&mut b, "original_size").unwrap();
                rmp::encode::write_uint(&mut b, 7).unwrap();
                rmp::encode::write_str(&mut b, "metadata").unwrap();
                rmp::encode::write_map_len(&mut b, 2).unwrap();
                for (name, fill) in [("blake3", k as u8), ("frame_blake3", a as u8)] {
                    rmp::encode::write_str(&mut b, name).unwrap();
                    rmp::encode::write_bin(&mut b, &[fill; 32]).unwrap();
                }
            }
        }
        rmp::encode::write_str(&mut b, "zstd_offset").unwrap();
        rmp::encode::write_uint(&mut b, 64).unwrap();
        b
    }

    type Read = Result<(Toc, [u8; 32]), TocReadError>;

    /// Reads `bytes` as a source would; also returns the largest read and the bytes read.
    fn read(bytes: &[u8], keep: usize) -> (Read, usize, usize) {
        let (mut largest, mut total) = (0, 0);
        let mut read = |at: u64, buf: &mut [u8]| -> io::Result<usize> {
            largest = largest.max(buf.len());
            let at = (at as usize).min(bytes.len());
            let n = buf.len().min(bytes.len() - at);
            total += n;
            buf[..n].copy_from_slice(&bytes[at..at + n]);
            Ok(n)
        };
        let got = read_toc(bytes.len() as u64, &mut read, keep);
        (got, largest, total)
    }

    use super::super::Toc;

    #[test]
    fn a_large_toc_is_read_once_through_a_bounded_window() {
        let mut bytes = toc_bytes(40_000, 1);
        let object = bytes.len();
        bytes.extend_from_slice(&[0xc1; 1000]); // Trailing bytes are not part of the TOC.
        assert!(object > 16 * CHUNK, "{object}");
        let (got, largest, total) = read(&bytes, 1 << 20);
        let (mut toc, digest) = got.unwrap();
        assert!(largest <= CHUNK, "largest read {largest}");
        assert_eq!(total, bytes.len(), "each byte read once");
        assert_eq!(toc.byte_len, object);
        assert_eq!(digest, *blake3::hash(&bytes[..object]).as_bytes());
        assert_eq!(toc.scheme, Scheme::ZstdPerKernel);
        assert_eq!(toc.zstd_blob.offset, 64);
        assert_eq!(toc.kernels.len(), 40_000);
        let entry = |toc: &Toc| {
            let e = toc.kernels.binary(39_999).unwrap().arch(0).unwrap();
            (e.ordinal, e.original_size, e.blake3_at, e.frame_blake3_at)
        };
        let e = entry(&toc);
        assert_eq!((e.0, e.1), (39_999, 7));
        let kept = toc.kernels.take_digests().unwrap();
        assert_eq!(kept.len(), 80_000);
        let at = e.2.unwrap() as usize;
        assert_eq!(&bytes[at..at + 32], &[(39_999 % 256) as u8; 32]);
        assert!(kept.contains(&(at as u32, [(39_999 % 256) as u8; 32])));
        // Past the limit nothing is kept, and the positions still are.
        let (got, _, _) = read(&bytes, 79_999);
        let (mut toc, _) = got.unwrap();
        assert_eq!(toc.kernels.take_digests(), None);
        assert_eq!(entry(&toc), e);
    }

    #[test]
    fn a_unit_larger_than_the_window_grows_it() {
        // One key with 30,000 arches: a single unit of about 3 MB.
        let bytes = toc_bytes(1, 30_000);
        assert!(bytes.len() > 8 * CHUNK);
        let (got, largest, _) = read(&bytes, 0);
        let (toc, digest) = got.unwrap();
        assert!(largest > CHUNK, "the window grew");
        assert_eq!(digest, *blake3::hash(&bytes).as_bytes());
        let b = toc.kernels.binary(0).unwrap();
        assert_eq!(b.len(), 30_000);
        assert_eq!(b.arch(29_999).unwrap().arch, "gfx29999");
    }

    #[test]
    fn errors_far_into_a_large_toc_are_those_of_a_whole_parse() {
        let bytes = toc_bytes(20_000, 1);
        // Cut inside the last entry: truncated at the end, whatever the window held before.
        let cut = &bytes[..bytes.len() - 40];
        let (got, _, _) = read(cut, 0);
        let Err(TocReadError::Toc(e)) = got else {
            panic!("{:?}", got.map(|_| ()))
        };
        assert!(
            e.reason.contains("truncated") || e.reason.contains("past the end"),
            "{e:?}"
        );
        assert!(e.offset > cut.len() - 100 && e.offset <= cut.len(), "{e:?}");
        // A negative ordinal in the last entry is reported at that entry's arch key.
        let mut bad = bytes.clone();
        let needle = b"\xa7ordinal";
        let at = bad
            .windows(needle.len())
            .rposition(|w| w == needle)
            .unwrap();
        assert_eq!(bad[at + needle.len()], 0xcd, "ordinal 19999 as uint16");
        // int16 -1: the same length, and not an unsigned integer.
        bad[at + needle.len()..][..3].copy_from_slice(&[0xd1, 0xff, 0xff]);
        let (got, _, _) = read(&bad, 0);
        let Err(TocReadError::Toc(e)) = got else {
            panic!("{:?}", got.map(|_| ()))
        };
        assert!(e.reason.contains("ordinal"), "{e:?}");
        // The entry's arch key `gfx0` (5 bytes) starts right before its map header.
        let arch_at = bad[..at]
            .windows(5)
            .rposition(|w| w == b"\xa4gfx0")
            .unwrap();
        assert_eq!(e.offset, arch_at);
    }

    /// Reads `bytes` through a window of `window` bytes, shown as text to compare results (the
    /// error type is not `PartialEq`); keeps every digest, so the kept ones are compared too.
    fn read_with(bytes: &[u8], window: usize) -> String {
        let mut read = |at: u64, buf: &mut [u8]| -> io::Result<usize> {
            let at = (at as usize).min(bytes.len());
            let n = buf.len().min(bytes.len() - at);
            buf[..n].copy_from_slice(&bytes[at..at + n]);
            Ok(n)
        };
        let got = super::super::read_toc_windowed(bytes.len() as u64, &mut read, 1 << 20, window);
        format!("{got:?}")
    }

    /// Renames the last entry's `original_size` (same length, so nothing else moves); returns the
    /// offset of that entry's arch key, where the error is reported.
    fn drop_last_original_size(bytes: &mut [u8]) -> usize {
        let needle = b"\xadoriginal_size";
        let at = bytes
            .windows(needle.len())
            .rposition(|w| w == needle)
            .unwrap();
        bytes[at + needle.len() - 1] = b'X';
        bytes[..at]
            .windows(5)
            .rposition(|w| w == b"\xa4gfx0")
            .unwrap()
    }

    #[test]
    fn a_late_missing_original_size_is_reported_at_its_toc_offset() {
        let mut bytes = toc_bytes(20_000, 1);
        assert!(bytes.len() > 4 * CHUNK);
        let arch_at = drop_last_original_size(&mut bytes);
        let (got, _, _) = read(&bytes, 0);
        let Err(TocReadError::Toc(e)) = got else {
            panic!("{:?}", got.map(|_| ()))
        };
        assert_eq!(
            e.reason,
            "toc[\"lib/k0019999.so#0\"][\"gfx0\"]: field 'original_size' is missing"
        );
        assert_eq!(e.offset, arch_at);
        // The same as a parse holding the whole TOC in one window.
        assert_eq!(read_with(&bytes, CHUNK), read_with(&bytes, bytes.len()));
    }

    #[test]
    fn the_window_size_changes_nothing() {
        let windows = [16, 64, 4096, CHUNK];
        let same = |bytes: &[u8], what: &str| {
            let want = read_with(bytes, CHUNK);
            for w in windows {
                assert_eq!(read_with(bytes, w), want, "{what}, window {w}");
            }
            want
        };
        let valid = toc_bytes(12, 5);
        assert!(same(&valid, "valid").starts_with("Ok("));
        let mut missing = valid.clone();
        drop_last_original_size(&mut missing);
        assert!(same(&missing, "missing size").contains("'original_size' is missing"));
        let mut errors = 0;
        for cut in (0..valid.len()).step_by(13) {
            errors += same(&valid[..cut], &format!("cut at {cut}")).starts_with("Err(") as usize;
        }
        for at in (0..valid.len()).step_by(5) {
            for byte in [0x00, 0xc1, 0xcf, 0xdc, 0xff] {
                let mut bad = valid.clone();
                bad[at] = byte;
                let what = format!("byte {at} = {byte:#x}");
                errors += same(&bad, &what).starts_with("Err(") as usize;
            }
        }
        assert!(
            errors > 100,
            "the corruptions reach the error paths: {errors}"
        );
    }

    #[test]
    fn a_failing_source_is_an_io_error() {
        let bytes = toc_bytes(20_000, 1);
        let mut read = |at: u64, buf: &mut [u8]| -> io::Result<usize> {
            if at > 3 * CHUNK as u64 {
                return Err(io::Error::other("gone"));
            }
            let at = at as usize;
            let n = buf.len().min(bytes.len() - at);
            buf[..n].copy_from_slice(&bytes[at..at + n]);
            Ok(n)
        };
        let got = read_toc(bytes.len() as u64, &mut read, 0);
        assert!(
            matches!(got, Err(TocReadError::Io(ref e)) if e.to_string() == "gone"),
            "{got:?}"
        );
    }
}
