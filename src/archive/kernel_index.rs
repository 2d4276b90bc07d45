//! The kernel index: a small blob, made once per archive (when it is pushed to a registry), that
//! records where the TOC and every stored kernel lie and their BLAKE3 digests. A reader that has
//! it opens a reference-layout archive from the header and the TOC alone, instead of walking the
//! frame chain over the whole blob, and checks every stored kernel before decoding it
//! ([`Archive::open_with_index`]). This module owns the index's byte layout (docs/format.md,
//! "Kernel index"), building an index from an open archive, and checking an archive's stored
//! kernels against one.

use std::fmt;
use std::io;

use crate::archive::Archive;
use crate::archive::byte_source::read_full_at;
use crate::archive::format::{self, Scheme, Span};
use crate::error::{Error, Result};

pub const MAGIC: &[u8; 4] = b"KPIX";
pub const VERSION: u32 = 1;
/// Bytes before the first stored kernel's record.
pub const HEADER_SIZE: usize = 64;
/// Bytes of one stored kernel's record: offset, size, digest.
pub const RECORD_SIZE: usize = 48;

/// Bytes read at a time when hashing the stored kernels: small frames share a read, and a large
/// one streams through without being held whole.
const READ_CHUNK: usize = 4 << 20;

/// Where an archive's TOC and stored kernels lie, with their digests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelIndex {
    /// From the header's `toc_offset` to the end of the file.
    pub toc: Span,
    /// BLAKE3 of the TOC's msgpack object, as [`Archive::toc_digest`] returns it.
    pub toc_digest: [u8; 32],
    /// Every stored kernel, by ordinal ([`Archive::stored_count`] of them).
    pub stored: Vec<StoredKernel>,
}

/// One stored kernel: a zstd frame without its size word, or a `none` blob.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoredKernel {
    /// Absolute place of the stored bytes in the archive.
    pub span: Span,
    /// BLAKE3 of the stored bytes.
    pub digest: [u8; 32],
}

/// Why index bytes could not be decoded, and at which byte.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelIndexError {
    pub offset: usize,
    pub reason: String,
}

impl fmt::Display for KernelIndexError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "bad kernel index at byte {}: {}",
            self.offset, self.reason
        )
    }
}

impl std::error::Error for KernelIndexError {}

fn bad<T>(offset: usize, reason: impl Into<String>) -> std::result::Result<T, KernelIndexError> {
    Err(KernelIndexError {
        offset,
        reason: reason.into(),
    })
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    crate::bytes::le_u32(bytes, at).expect("length checked")
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    crate::bytes::le_u64(bytes, at).expect("length checked")
}

fn digest_at(bytes: &[u8], at: usize) -> [u8; 32] {
    bytes[at..at + 32].try_into().expect("length checked")
}

/// A span read from the index at byte `at`, refused when its end does not fit in 64 bits.
fn span_at(bytes: &[u8], at: usize, what: &str) -> std::result::Result<Span, KernelIndexError> {
    let span = Span {
        offset: u64_at(bytes, at),
        size: u64_at(bytes, at + 8),
    };
    if span.offset.checked_add(span.size).is_none() {
        return bad(
            at,
            format!(
                "{what} at byte {} of {} bytes ends past 2^64",
                span.offset, span.size
            ),
        );
    }
    Ok(span)
}

impl KernelIndex {
    /// Indexes an archive opened the normal way: the TOC's place and digest, and every stored
    /// kernel read once from the archive's source and hashed. Kernels are read in file order,
    /// 4 MiB at a time, so a 200 MB archive is one pass of large reads. An archive
    /// whose frames are located from its TOC has its frame chain walked first.
    pub fn build(archive: &Archive) -> Result<KernelIndex> {
        let spans = archive.stored_spans()?;
        let digests = hash_spans(archive, &spans, READ_CHUNK)?;
        // Bytes of an archive rewritten while it was read are not indexed.
        archive.check_unchanged()?;
        let toc_offset = archive.toc_offset();
        Ok(KernelIndex {
            toc: Span {
                offset: toc_offset,
                size: archive.file_len() - toc_offset,
            },
            toc_digest: archive.toc_digest(),
            stored: spans
                .iter()
                .zip(digests)
                .map(|(&span, digest)| StoredKernel { span, digest })
                .collect(),
        })
    }

    /// The index's bytes (docs/format.md, "Kernel index"): the same index always gives the same
    /// bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER_SIZE + RECORD_SIZE * self.stored.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&self.toc.offset.to_le_bytes());
        out.extend_from_slice(&self.toc.size.to_le_bytes());
        out.extend_from_slice(&self.toc_digest);
        out.extend_from_slice(&(self.stored.len() as u64).to_le_bytes());
        for s in &self.stored {
            out.extend_from_slice(&s.span.offset.to_le_bytes());
            out.extend_from_slice(&s.span.size.to_le_bytes());
            out.extend_from_slice(&s.digest);
        }
        out
    }

    /// Reads index bytes from an untrusted source. The magic and version are checked first
    /// (on as many of their bytes as are present), then that the length is exactly the header
    /// and the records it declares, before anything is allocated (so at most one record per 48
    /// bytes of input), then that no place ends past 2^64.
    pub fn decode(bytes: &[u8]) -> std::result::Result<KernelIndex, KernelIndexError> {
        let magic = &bytes[..bytes.len().min(4)];
        if !MAGIC.starts_with(magic) || magic.is_empty() {
            return bad(
                0,
                format!("not a kernel index: it starts with {magic:02x?}, not \"KPIX\""),
            );
        }
        if bytes.len() >= 8 && u32_at(bytes, 4) != VERSION {
            return bad(
                4,
                format!(
                    "unsupported kernel index version {} (this build reads version {VERSION})",
                    u32_at(bytes, 4)
                ),
            );
        }
        if bytes.len() < HEADER_SIZE {
            return bad(
                bytes.len(),
                format!(
                    "truncated: {} bytes, the header alone is {HEADER_SIZE}",
                    bytes.len()
                ),
            );
        }
        let declared = u64_at(bytes, 56);
        let held = ((bytes.len() - HEADER_SIZE) / RECORD_SIZE) as u64;
        if declared > held {
            return bad(
                56,
                format!(
                    "truncated: it declares {declared} stored kernels, its {} bytes hold {held}",
                    bytes.len()
                ),
            );
        }
        let end = HEADER_SIZE + declared as usize * RECORD_SIZE;
        if end != bytes.len() {
            return bad(
                end,
                format!(
                    "the index is {} bytes, not the {end} of its header and {declared} records",
                    bytes.len()
                ),
            );
        }
        let toc = span_at(bytes, 8, "the TOC")?;
        let mut stored = Vec::with_capacity(declared as usize);
        for i in 0..declared as usize {
            let at = HEADER_SIZE + i * RECORD_SIZE;
            stored.push(StoredKernel {
                span: span_at(bytes, at, &format!("stored kernel {i}"))?,
                digest: digest_at(bytes, at + 16),
            });
        }
        Ok(KernelIndex {
            toc,
            toc_digest: digest_at(bytes, 24),
            stored,
        })
    }

    /// The stored kernels' places, checked against what the archive's TOC says, as the walk
    /// of the frame chain at open would check them: for `none`, exactly the TOC's `blobs`; for
    /// `zstd-per-kernel`, a chain of at most 2^20 frames inside the blob `zstd_blob` (already
    /// checked against the file), each right after its 4-byte size word, the first right after
    /// the frame count word. The reason is the error's message when they differ.
    pub(crate) fn stored_spans(
        &self,
        scheme: Scheme,
        blobs: &[Span],
        zstd_blob: Span,
    ) -> std::result::Result<Vec<Span>, String> {
        let spans: Vec<Span> = self.stored.iter().map(|s| s.span).collect();
        match scheme {
            Scheme::None => {
                if spans.len() != blobs.len() {
                    return Err(format!(
                        "stored kernels do not match the kernel index (the TOC lists {} blobs, \
                         the index {})",
                        blobs.len(),
                        spans.len()
                    ));
                }
                if let Some(i) = (0..spans.len()).find(|&i| spans[i] != blobs[i]) {
                    return Err(format!(
                        "stored kernels do not match the kernel index (blob {i} lies at byte {} \
                         with {} bytes in the TOC, at byte {} with {} bytes in the index)",
                        blobs[i].offset, blobs[i].size, spans[i].offset, spans[i].size
                    ));
                }
            }
            Scheme::ZstdPerKernel => {
                if spans.len() > format::MAX_ZSTD_FRAMES as usize {
                    return Err(format!(
                        "the kernel index lists {} frames, more than the limit of {}",
                        spans.len(),
                        format::MAX_ZSTD_FRAMES
                    ));
                }
                let blob_end = zstd_blob.offset + zstd_blob.size;
                // The count word, then each frame's size word.
                let mut word = zstd_blob.offset + 4;
                for (i, span) in spans.iter().enumerate() {
                    let chained = span.offset == word + 4
                        && span.size <= u64::from(u32::MAX)
                        && span
                            .offset
                            .checked_add(span.size)
                            .is_some_and(|e| e <= blob_end);
                    if !chained {
                        return Err(format!(
                            "stored kernels do not match the kernel index (frame {i} at byte {} \
                             of {} bytes is not the next frame of the chain, which starts at \
                             byte {} in the blob [{}, {blob_end}))",
                            span.offset,
                            span.size,
                            word + 4,
                            zstd_blob.offset
                        ));
                    }
                    word = span.offset + span.size;
                }
            }
        }
        Ok(spans)
    }
}

/// BLAKE3 of each span's bytes, by position in `spans`, reading the spans in file order
/// through one buffer of `chunk` bytes (at least 1).
fn hash_spans(archive: &Archive, spans: &[Span], chunk: usize) -> Result<Vec<[u8; 32]>> {
    let file_len = archive.file_len();
    let mut order: Vec<usize> = (0..spans.len()).collect();
    order.sort_by_key(|&i| spans[i].offset);
    let mut buf = vec![0u8; (file_len as usize).min(chunk.max(1))];
    // The file's bytes [buf_at, buf_at + held) are in `buf`.
    let (mut buf_at, mut held) = (0u64, 0usize);
    let mut digests = vec![[0u8; 32]; spans.len()];
    for i in order {
        let span = spans[i];
        let end = span
            .offset
            .checked_add(span.size)
            .filter(|&end| end <= file_len)
            .ok_or_else(|| past_the_end(archive, i, span, file_len))?;
        let mut hasher = blake3::Hasher::new();
        let mut pos = span.offset;
        while pos < end {
            if pos < buf_at || pos >= buf_at + held as u64 {
                let want = (file_len - pos).min(buf.len() as u64) as usize;
                held = read_full_at(archive.source(), &mut buf[..want], pos).map_err(|e| {
                    Error::io(archive.path(), format!("cannot read stored kernel {i}"), e)
                })?;
                buf_at = pos;
                if held == 0 {
                    return Err(past_the_end(archive, i, span, pos));
                }
            }
            let from = (pos - buf_at) as usize;
            let take = (held - from).min((end - pos).try_into().unwrap_or(usize::MAX));
            hasher.update(&buf[from..from + take]);
            pos += take as u64;
        }
        digests[i] = *hasher.finalize().as_bytes();
    }
    Ok(digests)
}

/// Stored kernel `i` at `span` cannot be read: the file ends at `file_len`.
fn past_the_end(archive: &Archive, i: usize, span: Span, file_len: u64) -> Error {
    Error::io(
        archive.path(),
        format!(
            "cannot index stored kernel {i} at byte {} of {} bytes",
            span.offset, span.size
        ),
        io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("the file ends at byte {file_len}"),
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> KernelIndex {
        KernelIndex {
            toc: Span {
                offset: 0x0102,
                size: 0x30,
            },
            toc_digest: [0xaa; 32],
            stored: vec![
                StoredKernel {
                    span: Span {
                        offset: 72,
                        size: 5,
                    },
                    digest: [1; 32],
                },
                StoredKernel {
                    span: Span {
                        offset: 81,
                        size: 0x10000,
                    },
                    digest: [2; 32],
                },
            ],
        }
    }

    /// `sample()`'s bytes, spelled out field by field.
    fn sample_bytes() -> Vec<u8> {
        let mut b = b"KPIX".to_vec();
        b.extend([1, 0, 0, 0]);
        b.extend([0x02, 0x01, 0, 0, 0, 0, 0, 0]);
        b.extend([0x30, 0, 0, 0, 0, 0, 0, 0]);
        b.extend([0xaa; 32]);
        b.extend([2, 0, 0, 0, 0, 0, 0, 0]);
        b.extend([72, 0, 0, 0, 0, 0, 0, 0]);
        b.extend([5, 0, 0, 0, 0, 0, 0, 0]);
        b.extend([1; 32]);
        b.extend([81, 0, 0, 0, 0, 0, 0, 0]);
        b.extend([0, 0, 1, 0, 0, 0, 0, 0]);
        b.extend([2; 32]);
        b
    }

    fn error(bytes: &[u8]) -> (usize, String) {
        let e = KernelIndex::decode(bytes).unwrap_err();
        (e.offset, e.reason)
    }

    #[test]
    fn encodes_to_the_documented_bytes_and_back() {
        let index = sample();
        assert_eq!(index.encode(), sample_bytes());
        assert_eq!(index.encode().len(), HEADER_SIZE + 2 * RECORD_SIZE);
        assert_eq!(KernelIndex::decode(&sample_bytes()).unwrap(), index);
        let empty = KernelIndex {
            stored: Vec::new(),
            ..sample()
        };
        // The header alone, counting no records.
        let mut header = sample_bytes()[..HEADER_SIZE].to_vec();
        header[56] = 0;
        assert_eq!(empty.encode(), header);
        assert_eq!(KernelIndex::decode(&empty.encode()).unwrap(), empty);
    }

    #[test]
    fn refuses_other_magic_and_versions() {
        assert_eq!(
            error(b""),
            (
                0,
                "not a kernel index: it starts with [], not \"KPIX\"".into()
            )
        );
        assert_eq!(
            error(b"KPAK\x01\0\0\0"),
            (
                0,
                "not a kernel index: it starts with [4b, 50, 41, 4b], not \"KPIX\"".into()
            )
        );
        let mut v2 = sample_bytes();
        v2[4] = 2;
        assert_eq!(
            error(&v2),
            (
                4,
                "unsupported kernel index version 2 (this build reads version 1)".into()
            )
        );
        // Wrong version is told apart from truncation as soon as the version is there.
        assert_eq!(error(&v2[..8]).1, error(&v2).1);
    }

    #[test]
    fn refuses_every_truncation_and_trailing_bytes() {
        let bytes = sample_bytes();
        for n in 0..bytes.len() {
            let (offset, reason) = error(&bytes[..n]);
            let want = match n {
                0 => "not a kernel index: it starts with [], not \"KPIX\"".to_owned(),
                1..HEADER_SIZE => format!("truncated: {n} bytes, the header alone is 64"),
                _ => format!(
                    "truncated: it declares 2 stored kernels, its {n} bytes hold {}",
                    (n - HEADER_SIZE) / RECORD_SIZE
                ),
            };
            assert_eq!(reason, want, "{n} bytes");
            assert!(offset <= n, "{n} bytes");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert_eq!(
            error(&longer),
            (
                160,
                "the index is 161 bytes, not the 160 of its header and 2 records".into()
            )
        );
    }

    #[test]
    fn refuses_counts_beyond_the_bytes_without_allocating_them() {
        let mut bytes = sample_bytes();
        bytes[56..64].copy_from_slice(&u64::MAX.to_le_bytes());
        assert_eq!(
            error(&bytes),
            (
                56,
                format!(
                    "truncated: it declares {} stored kernels, its 160 bytes hold 2",
                    u64::MAX
                )
            )
        );
        bytes[56..64].copy_from_slice(&1u64.to_le_bytes());
        assert_eq!(
            error(&bytes).1,
            "the index is 160 bytes, not the 112 of its header and 1 records"
        );
    }

    #[test]
    fn refuses_places_that_end_past_2_pow_64() {
        let mut bytes = sample_bytes();
        bytes[8..16].copy_from_slice(&(u64::MAX - 0x2f).to_le_bytes());
        assert_eq!(
            error(&bytes),
            (
                8,
                format!(
                    "the TOC at byte {} of 48 bytes ends past 2^64",
                    u64::MAX - 0x2f
                )
            )
        );
        let mut bytes = sample_bytes();
        bytes[112 + 8..112 + 16].copy_from_slice(&u64::MAX.to_le_bytes());
        assert_eq!(
            error(&bytes),
            (
                112,
                format!(
                    "stored kernel 1 at byte 81 of {} bytes ends past 2^64",
                    u64::MAX
                )
            )
        );
        // The largest place that fits is accepted.
        bytes[112 + 8..112 + 16].copy_from_slice(&(u64::MAX - 81).to_le_bytes());
        assert!(KernelIndex::decode(&bytes).is_ok());
    }

    #[test]
    fn hashing_does_not_depend_on_the_read_size() {
        use crate::archive::writer::{ArchiveWriter, Compression};
        let dir = tempfile::tempdir().unwrap();
        for compression in [Compression::None, Compression::Zstd { level: 1 }] {
            let mut w = ArchiveWriter::new("g", "f", vec!["gfx90a".into()], compression).unwrap();
            w.set_reference_layout(true);
            for i in 0..6u32 {
                let data: Vec<u8> = (0..i * 3000).map(|j| (j * 7 + j / 13 + i) as u8).collect();
                w.add_kernel(&format!("k{i}#0"), "gfx90a", data).unwrap();
            }
            let path = dir.path().join("a.kpack");
            w.write(&path, &|_| {}).unwrap();
            let bytes = std::fs::read(&path).unwrap();
            let a = Archive::open(&path).unwrap();
            let spans = a.stored_spans().unwrap();
            let want: Vec<[u8; 32]> = spans
                .iter()
                .map(|s| {
                    let at = s.offset as usize;
                    *blake3::hash(&bytes[at..at + s.size as usize]).as_bytes()
                })
                .collect();
            // Reads smaller than a kernel, spanning several, and larger than the file.
            for chunk in [0, 1, 7, 4096, 1 << 30] {
                assert_eq!(hash_spans(&a, &spans, chunk).unwrap(), want, "{chunk}");
            }
            // Spans given out of file order hash the same.
            let reversed: Vec<Span> = spans.iter().rev().copied().collect();
            let mut got = hash_spans(&a, &reversed, 5000).unwrap();
            got.reverse();
            assert_eq!(got, want);
            // A span past the file's end is not indexed.
            let past = [Span {
                offset: bytes.len() as u64 - 2,
                size: 3,
            }];
            let e = hash_spans(&a, &past, 7).unwrap_err();
            assert_eq!(e.kind(), crate::ErrorKind::IoError, "{e}");
            assert!(
                e.to_string().contains("cannot index stored kernel 0"),
                "{e}"
            );
        }
    }

    proptest::proptest! {
        /// Any bytes: no panic; whatever decodes is canonical (encodes back to the same bytes).
        #[test]
        fn decoding_mutated_bytes_never_panics(
            edits in proptest::collection::vec((0usize..200, proptest::prelude::any::<u8>()), 0..6),
            cut in 0usize..220,
        ) {
            let mut bytes = sample_bytes();
            for (at, b) in edits {
                if at < bytes.len() {
                    bytes[at] = b;
                }
            }
            bytes.truncate(cut);
            if let Ok(index) = KernelIndex::decode(&bytes) {
                proptest::prop_assert_eq!(index.encode(), bytes);
            }
        }
    }

    fn spans(s: &[(u64, u64)]) -> KernelIndex {
        KernelIndex {
            stored: s
                .iter()
                .map(|&(offset, size)| StoredKernel {
                    span: Span { offset, size },
                    digest: [0; 32],
                })
                .collect(),
            ..sample()
        }
    }

    #[test]
    fn none_spans_must_be_the_tocs_blobs() {
        let blobs = [
            Span {
                offset: 64,
                size: 3,
            },
            Span {
                offset: 67,
                size: 0,
            },
        ];
        let blob = Span { offset: 0, size: 0 };
        let index = spans(&[(64, 3), (67, 0)]);
        assert_eq!(
            index.stored_spans(Scheme::None, &blobs, blob).unwrap(),
            blobs
        );
        assert_eq!(
            spans(&[(64, 3)])
                .stored_spans(Scheme::None, &blobs, blob)
                .unwrap_err(),
            "stored kernels do not match the kernel index (the TOC lists 2 blobs, the index 1)"
        );
        assert_eq!(
            spans(&[(64, 3), (67, 1)])
                .stored_spans(Scheme::None, &blobs, blob)
                .unwrap_err(),
            "stored kernels do not match the kernel index (blob 1 lies at byte 67 with 0 bytes \
             in the TOC, at byte 67 with 1 bytes in the index)"
        );
    }

    #[test]
    fn zstd_spans_must_chain_through_the_blob() {
        // Count word at 64, size words at 68 and 75: frames [72, 75) and [79, 89).
        let blob = Span {
            offset: 64,
            size: 25,
        };
        let good = spans(&[(72, 3), (79, 10)]);
        let want = vec![
            Span {
                offset: 72,
                size: 3,
            },
            Span {
                offset: 79,
                size: 10,
            },
        ];
        assert_eq!(
            good.stored_spans(Scheme::ZstdPerKernel, &[], blob).unwrap(),
            want
        );
        assert!(
            spans(&[])
                .stored_spans(Scheme::ZstdPerKernel, &[], blob)
                .unwrap()
                .is_empty()
        );
        let refused = |s: &[(u64, u64)]| {
            spans(s)
                .stored_spans(Scheme::ZstdPerKernel, &[], blob)
                .unwrap_err()
        };
        assert_eq!(
            refused(&[(72, 3), (80, 9)]),
            "stored kernels do not match the kernel index (frame 1 at byte 80 of 9 bytes is not \
             the next frame of the chain, which starts at byte 79 in the blob [64, 89))"
        );
        assert!(refused(&[(68, 3)]).contains("frame 0 at byte 68 of 3 bytes"));
        assert!(refused(&[(72, 3), (79, 11)]).contains("frame 1 at byte 79 of 11 bytes"));
        assert!(refused(&[(72, 1 << 32)]).contains("frame 0 at byte 72"));
        assert!(refused(&[(72, u64::MAX)]).contains("frame 0 at byte 72"));
        let many = vec![(0, 0); format::MAX_ZSTD_FRAMES as usize + 1];
        assert_eq!(
            refused(&many),
            "the kernel index lists 1048577 frames, more than the limit of 1048576"
        );
    }
}
