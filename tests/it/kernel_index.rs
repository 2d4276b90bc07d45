//! An archive opened with its kernel index: the same kernels as the normal open, from the header
//! and the TOC alone, every stored kernel checked against the index before it is decoded, and an
//! archive that is not the indexed one refused at open.

use std::io;
use std::ops::Range;
use std::sync::{Arc, Mutex};

use rocm_kpack::archive::kernel_index::StoredKernel;
use rocm_kpack::{Archive, ByteSource, Compression, Error, ErrorKind, KernelIndex, LocalFile};

use crate::support::craft::incompressible;
use crate::support::faulty_source::{Fault, FaultKind, FaultySource};
use crate::support::*;

/// Archive bytes in memory that record which ranges a reader told them to forget.
#[derive(Debug, Clone)]
struct Mem {
    bytes: Arc<Vec<u8>>,
    forgot: Arc<Mutex<Vec<Range<u64>>>>,
}

impl Mem {
    fn new(bytes: Vec<u8>) -> Mem {
        Mem {
            bytes: Arc::new(bytes),
            forgot: Arc::default(),
        }
    }
}

impl ByteSource for Mem {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let start = (offset as usize).min(self.bytes.len());
        let n = buf.len().min(self.bytes.len() - start);
        buf[..n].copy_from_slice(&self.bytes[start..start + n]);
        Ok(n)
    }
    fn len(&self) -> u64 {
        self.bytes.len() as u64
    }
    fn display_name(&self) -> String {
        "mem://a.kpack".into()
    }
    fn identity(&self) -> String {
        "mem".into()
    }
    fn check_unchanged(&self) -> rocm_kpack::Result<()> {
        Ok(())
    }
    fn forget(&self, offset: u64, len: u64) {
        self.forgot.lock().unwrap().push(offset..offset + len);
    }
}

fn kernels() -> Vec<(String, Vec<u8>)> {
    (0..12)
        .map(|i| {
            let mut data = incompressible(i as u64, 3000 + i * 700);
            // Half compressible, so frames are of very different sizes.
            data.extend(std::iter::repeat_n(i as u8, 5000));
            (format!("lib/l{i:02}.so#0"), data)
        })
        .collect()
}

fn write(compression: Compression, reference: bool) -> Vec<u8> {
    craft::gfx942_archive(kernels(), compression, reference)
}

const SCHEMES: [Compression; 2] = [Compression::None, Compression::Zstd { level: 3 }];

/// The index of `bytes`, built from the normal open and passed through its encoding.
fn index_of(bytes: &[u8]) -> KernelIndex {
    let a = Archive::open_source(Box::new(Mem::new(bytes.to_vec()))).unwrap();
    let index = KernelIndex::build(&a).unwrap();
    assert_eq!(index.stored.len(), a.stored_count());
    assert_eq!(index.toc_digest, a.toc_digest());
    assert_eq!(
        (index.toc.offset, index.toc.size),
        (a.toc_offset(), bytes.len() as u64 - a.toc_offset())
    );
    let encoded = index.encode();
    assert_eq!(encoded, KernelIndex::build(&a).unwrap().encode());
    assert_eq!(KernelIndex::decode(&encoded).unwrap(), index);
    index
}

fn open_indexed(bytes: &[u8], index: &KernelIndex) -> rocm_kpack::Result<Archive> {
    Archive::open_with_index(Box::new(Mem::new(bytes.to_vec())), index)
}

/// Every entry of `bytes` read through the normal open and through the index: the same bytes,
/// and they verify.
fn assert_same_kernels(bytes: &[u8]) -> usize {
    let plain = Archive::open_source(Box::new(Mem::new(bytes.to_vec()))).unwrap();
    let index = index_of(bytes);
    let indexed = open_indexed(bytes, &index).unwrap();
    assert_eq!(indexed.stored_count(), plain.stored_count());
    assert_eq!(
        *indexed.stored_spans().unwrap(),
        *plain.stored_spans().unwrap()
    );
    let mut n = 0;
    for (key, entry) in plain.entries() {
        let want = plain.get_kernel(key, entry.arch).unwrap();
        assert_eq!(indexed.get_kernel(key, entry.arch).unwrap(), want, "{key}");
        let kref = indexed.locate(key, entry.arch).unwrap();
        indexed.verify_kernel(&kref).unwrap();
        n += 1;
    }
    n
}

#[test]
fn indexed_open_gives_the_same_kernels_as_the_walk() {
    for compression in SCHEMES {
        for reference in [true, false] {
            assert_eq!(assert_same_kernels(&write(compression, reference)), 12);
        }
    }
}

#[test]
fn indexed_open_gives_the_golden_kernels() {
    for (name, want) in [
        ("test_noop.kpack", golden_noop_kernels()),
        ("test_zstd.kpack", golden_zstd_kernels()),
    ] {
        let bytes = std::fs::read(fixture(name)).unwrap();
        assert_eq!(assert_same_kernels(&bytes), 3, "{name}");
        let a = open_indexed(&bytes, &index_of(&bytes)).unwrap();
        for (key, arch, data) in want {
            assert_eq!(
                a.get_kernel(key, arch).unwrap(),
                data,
                "{name}: {key} [{arch}]"
            );
        }
    }
}

/// The index's digests are of the stored bytes: a `none` blob, or a frame without its size word.
#[test]
fn the_index_hashes_each_stored_span() {
    for compression in SCHEMES {
        let bytes = write(compression, true);
        let index = index_of(&bytes);
        let a = Archive::open_source(Box::new(Mem::new(bytes.clone()))).unwrap();
        for (s, span) in index.stored.iter().zip(a.stored_spans().unwrap().iter()) {
            let (at, size) = (span.offset as usize, span.size as usize);
            assert_eq!(s.span, *span);
            assert_eq!(s.digest, *blake3::hash(&bytes[at..at + size]).as_bytes());
        }
    }
}

#[test]
fn indexed_open_reads_only_the_header_and_the_toc() {
    let dir = tempfile::tempdir().unwrap();
    for compression in SCHEMES {
        let bytes = write(compression, true);
        let path = dir.path().join("a.kpack");
        std::fs::write(&path, &bytes).unwrap();
        let index = index_of(&bytes);
        let reads = Arc::new(Mutex::new(Vec::new()));
        let seen = reads.clone();
        let src = FaultySource::new(LocalFile::open(&path).unwrap()).observed(Arc::new(
            move |offset, len| seen.lock().unwrap().push(offset..offset + len as u64),
        ));
        let a = Archive::open_with_index(Box::new(src), &index).unwrap();
        let toc = a.toc_offset();
        assert_eq!(*reads.lock().unwrap(), vec![0..16, toc..bytes.len() as u64]);
        // A read then takes its stored bytes (a frame with its size word), and nothing else.
        reads.lock().unwrap().clear();
        let (key, data) = &kernels()[5];
        assert_eq!(&a.get_kernel(key, "gfx942").unwrap(), data);
        let span = index.stored[5].span;
        let word = if compression == Compression::None {
            0
        } else {
            4
        };
        assert_eq!(
            *reads.lock().unwrap(),
            vec![span.offset - word..span.offset + span.size]
        );
    }
}

#[test]
fn a_flipped_stored_byte_fails_the_index_digest_before_anything_is_returned() {
    for compression in SCHEMES {
        let bytes = write(compression, true);
        let index = index_of(&bytes);
        let span = index.stored[3].span;
        let mem = Mem::new(bytes);
        let src = FaultySource::new(mem.clone());
        let flipped = span.offset + span.size / 2;
        src.add(Fault {
            range: flipped..flipped + 1,
            kind: FaultKind::Flip,
        });
        let a = Archive::open_with_index(Box::new(src), &index).unwrap();
        let (key, _) = &kernels()[3];
        let e = a.get_kernel(key, "gfx942").unwrap_err();
        let zstd = compression != Compression::None;
        let Error::DigestMismatch {
            of_frame, recorded, ..
        } = &e
        else {
            panic!("{e:?}")
        };
        assert_eq!(*of_frame, zstd);
        assert_eq!(**recorded, index.stored[3].digest);
        assert_eq!(e.kind(), ErrorKind::DecompressionFailed);
        // The source is told to drop the bytes it served (with the 4 bytes before them, a
        // zstd frame's size word), so that a later read fetches them again.
        assert_eq!(
            *mem.forgot.lock().unwrap(),
            vec![span.offset - 4..span.offset + span.size]
        );
        let kref = a.locate(key, "gfx942").unwrap();
        assert!(matches!(
            a.verify_kernel(&kref),
            Err(Error::DigestMismatch { .. })
        ));
        if zstd {
            // The mount's streaming path checks the frame before decoding it.
            let mut frame = Vec::new();
            let e = a.read_verified_frame(&kref, &mut frame).unwrap_err();
            assert!(
                matches!(e, Error::DigestMismatch { of_frame: true, .. }),
                "{e}"
            );
            assert!(frame.is_empty());
        }
        // The other kernels read as written.
        let (key, data) = &kernels()[4];
        assert_eq!(&a.get_kernel(key, "gfx942").unwrap(), data);
    }
}

#[test]
fn a_wrong_digest_in_the_index_refuses_the_intact_kernel() {
    for compression in SCHEMES {
        for reference in [true, false] {
            let bytes = write(compression, reference);
            let mut index = index_of(&bytes);
            index.stored[2].digest[0] ^= 1;
            let a = open_indexed(&bytes, &index).unwrap();
            let (key, _) = &kernels()[2];
            let e = a.get_kernel(key, "gfx942").unwrap_err();
            if reference {
                assert!(matches!(e, Error::DigestMismatch { .. }), "{e:?}");
            } else {
                // Our layout records the same digest in the TOC: the two must agree.
                let digest_name = if compression == Compression::None {
                    "blake3"
                } else {
                    "frame_blake3"
                };
                let recorded = index.stored[2].digest;
                let mut toc_says = recorded;
                toc_says[0] ^= 1;
                assert_eq!(
                    e.to_string(),
                    format!(
                        "mem://a.kpack: kernel {key} [gfx942] does not match its kernel index \
                         (the TOC's {digest_name} is {}, the index records {})",
                        rocm_kpack::error::hex(&toc_says),
                        rocm_kpack::error::hex(&recorded)
                    )
                );
                assert_eq!(e.kind(), ErrorKind::InvalidFormat);
            }
        }
    }
}

/// The open's error for `bytes` with `index`.
fn refused(bytes: &[u8], index: &KernelIndex) -> Error {
    let e = open_indexed(bytes, index).unwrap_err();
    assert!(matches!(e, Error::KernelIndexMismatch { .. }), "{e:?}");
    assert_eq!(e.kind(), ErrorKind::InvalidFormat);
    e
}

#[test]
fn an_archive_that_is_not_the_indexed_one_is_refused_at_open() {
    let bytes = write(Compression::Zstd { level: 3 }, true);
    let index = index_of(&bytes);
    let toc = index.toc.offset as usize;

    // Another archive's index.
    let other = index_of(&std::fs::read(fixture("test_zstd.kpack")).unwrap());
    assert_eq!(
        refused(&bytes, &other).to_string(),
        format!(
            "mem://a.kpack: TOC does not match its kernel index (the archive's TOC lies at byte \
             {toc} with {} bytes to the end of the file, the index says byte {} with {} bytes)",
            index.toc.size, other.toc.offset, other.toc.size
        )
    );

    // A byte appended: the TOC runs to another end.
    let mut longer = bytes.clone();
    longer.push(0);
    assert!(refused(&longer, &index).to_string().contains(&format!(
        "with {} bytes to the end of the file, the index says byte {toc} with {} bytes",
        index.toc.size + 1,
        index.toc.size
    )));

    // A TOC byte changed (a letter of the group name, still a valid TOC): its digest differs.
    let mut renamed = bytes.clone();
    let at = toc + find(&bytes[toc..], b"group_name") + 11;
    assert_eq!(renamed[at], b'g');
    renamed[at] = b'h';
    let changed = Archive::open_source(Box::new(Mem::new(renamed.clone())))
        .unwrap()
        .toc_digest();
    assert_eq!(
        refused(&renamed, &index).to_string(),
        format!(
            "mem://a.kpack: TOC does not match its kernel index (its BLAKE3 is {}, the index \
             records {})",
            rocm_kpack::error::hex(&changed),
            rocm_kpack::error::hex(&index.toc_digest)
        )
    );
}

fn find(hay: &[u8], needle: &[u8]) -> usize {
    hay.windows(needle.len()).position(|w| w == needle).unwrap()
}

#[test]
fn stored_places_that_disagree_with_the_toc_are_refused_at_open() {
    let zstd = write(Compression::Zstd { level: 3 }, true);
    let mut index = index_of(&zstd);
    index.stored[1].span.offset += 1;
    assert!(
        refused(&zstd, &index)
            .to_string()
            .contains("stored kernels do not match the kernel index (frame 1 at byte"),
    );
    let mut index = index_of(&zstd);
    let last = *index.stored.last().unwrap();
    index.stored.push(StoredKernel {
        span: rocm_kpack::archive::format::Span {
            offset: last.span.offset + last.span.size + 4,
            size: 0,
        },
        digest: [0; 32],
    });
    // No room for a thirteenth frame: the blob ends where the twelfth does.
    assert!(
        refused(&zstd, &index)
            .to_string()
            .contains("frame 12 at byte")
    );

    let none = write(Compression::None, true);
    let mut index = index_of(&none);
    index.stored.pop();
    assert!(
        refused(&none, &index)
            .to_string()
            .ends_with("(the TOC lists 12 blobs, the index 11)")
    );
}

#[test]
fn a_zstd_blob_refused_by_the_normal_open_is_refused_the_same_way() {
    // The golden zstd archive with its TOC's `zstd_size` (a uint8) cut to 2 bytes, too few for
    // the frame count word, and an index that vouches for that TOC.
    let bytes = std::fs::read(fixture("test_zstd.kpack")).unwrap();
    let mut index = index_of(&bytes);
    let toc = index.toc.offset as usize;
    let at = toc + find(&bytes[toc..], b"zstd_size") + 9;
    let mut cut = bytes.clone();
    assert_eq!(cut[at], 0xcc, "a uint8 size");
    cut[at + 1] = 2;
    index.toc_digest = *blake3::hash(&cut[toc..]).as_bytes();
    let plain = Archive::open_source(Box::new(Mem::new(cut.clone()))).unwrap_err();
    let e = open_indexed(&cut, &index).unwrap_err();
    assert!(matches!(e, Error::ZstdIndex { .. }), "{e:?}");
    assert_eq!(
        e.to_string(),
        "mem://a.kpack: bad zstd blob at byte 64: blob of 2 bytes is too small for a frame count"
    );
    assert_eq!(e.to_string(), plain.to_string());
}
