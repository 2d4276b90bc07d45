//! Faults at an archive's byte source, as a remote source meets them (a failed fetch, a reply
//! cut short, a slow one, flipped bytes): every read of a kernel is its exact bytes or a clear
//! error, never other bytes and never a panic, for archives in our layout and in the
//! reference's; and once the source is sound again, every kernel reads back exactly.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use rocm_kpack::{Archive, Compression, LocalFile};

use crate::support::craft;
use crate::support::faulty_source::{Fault, FaultKind, FaultySource};

const KINDS: [FaultKind; 4] = [
    FaultKind::Fail,
    FaultKind::Truncate,
    FaultKind::Flip,
    FaultKind::Delay(Duration::from_millis(1)),
];

fn kernels() -> Vec<(String, Vec<u8>)> {
    (0..6)
        .map(|i| {
            let data = (0..20_000 + i * 3000)
                .map(|j| ((j / 5 + i * 31) % 253) as u8)
                .collect();
            (format!("lib/l{i}.so#0"), data)
        })
        .collect()
}

fn write(dir: &std::path::Path, reference: bool) -> std::path::PathBuf {
    let path = dir.join(if reference { "ref.kpack" } else { "ours.kpack" });
    let bytes = craft::gfx942_archive(kernels(), Compression::Zstd { level: 1 }, reference);
    std::fs::write(&path, bytes).unwrap();
    path
}

/// The archive at `path` over a faulty source, with a count of the reads that reach it.
fn open(path: &std::path::Path) -> (Archive, FaultySource, Arc<AtomicUsize>) {
    let reads = Arc::new(AtomicUsize::new(0));
    let counted = reads.clone();
    let source =
        FaultySource::new(LocalFile::open(path).unwrap()).observed(Arc::new(move |_, _| {
            counted.fetch_add(1, Ordering::Relaxed);
        }));
    let archive = Archive::open_source(Box::new(source.clone())).unwrap();
    (archive, source, reads)
}

#[test]
fn a_faulted_frame_is_an_error_or_its_exact_bytes_and_heals() {
    let dir = tempfile::tempdir().unwrap();
    for reference in [false, true] {
        let path = write(dir.path(), reference);
        for kind in KINDS {
            let (archive, source, reads) = open(&path);
            for (i, (key, data)) in kernels().iter().enumerate() {
                let frame = archive.locate(key, "gfx942").unwrap().stored;
                // The size word before a reference-layout frame is read with it.
                let range = frame.offset.saturating_sub(4)..frame.offset + frame.size;
                source.add(Fault { range, kind });
                let what = format!("{kind:?}, reference layout {reference}, kernel {i}");
                match archive.get_kernel(key, "gfx942") {
                    Ok(got) => {
                        assert_eq!(&got, data, "{what}: other bytes");
                        assert!(matches!(kind, FaultKind::Delay(_)), "{what}: no error");
                    }
                    Err(e) => {
                        assert!(!matches!(kind, FaultKind::Delay(_)), "{what}: {e}");
                        assert!(!e.to_string().is_empty(), "{what}");
                    }
                }
            }
            source.clear();
            assert!(source.is_clear());
            // Nothing a fault left behind is served: each kernel is read from the source again.
            for (key, data) in kernels() {
                let before = reads.load(Ordering::Relaxed);
                assert_eq!(
                    archive.get_kernel(&key, "gfx942").unwrap(),
                    data,
                    "{kind:?}"
                );
                assert!(
                    reads.load(Ordering::Relaxed) > before,
                    "{kind:?}: {key} not read"
                );
            }
        }
    }
}

/// A fault in the header or the TOC fails the open with an error, or opens an archive whose
/// every kernel is then its exact bytes or an error (bits flipped in a digest may leave a TOC
/// that parses); a delay opens it whole.
#[test]
fn a_faulted_toc_fails_the_open_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    for reference in [false, true] {
        let path = write(dir.path(), reference);
        let len = std::fs::metadata(&path).unwrap().len();
        let toc = {
            let bytes = std::fs::read(&path).unwrap();
            u64::from_le_bytes(bytes[8..16].try_into().unwrap())
        };
        for kind in KINDS {
            for range in [0..16, toc..toc + 8, len - 8..len] {
                let source = FaultySource::new(LocalFile::open(&path).unwrap());
                source.add(Fault {
                    range: range.clone(),
                    kind,
                });
                let opened = Archive::open_source(Box::new(source));
                let what = format!("{kind:?} at {range:?}, reference layout {reference}");
                match (kind, opened) {
                    (FaultKind::Delay(_), Ok(a)) => {
                        let (key, data) = &kernels()[0];
                        assert_eq!(&a.get_kernel(key, "gfx942").unwrap(), data, "{what}");
                    }
                    (FaultKind::Delay(_), Err(e)) => panic!("{what}: {e}"),
                    (FaultKind::Flip, Ok(a)) => {
                        for (key, data) in kernels() {
                            if let Ok(got) = a.get_kernel(&key, "gfx942") {
                                assert_eq!(got, data, "{what}: other bytes");
                            }
                        }
                    }
                    (_, Ok(_)) => panic!("{what}: opened"),
                    (_, Err(e)) => assert!(!e.to_string().is_empty(), "{what}"),
                }
            }
        }
    }
}

/// A read that fails while the open walks a reference-layout archive's frame chain is the
/// source's failure (an I/O error, exit 3 from the commands), not a malformed archive.
#[test]
fn a_failed_read_in_the_frame_chain_is_an_io_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), true);
    let bytes = std::fs::read(&path).unwrap();
    // The blob starts at 64 with the frame count; the first frame's size word follows.
    let first = u64::from(u32::from_le_bytes(bytes[68..72].try_into().unwrap()));
    let second_word = 72 + first;
    let source = FaultySource::new(LocalFile::open(&path).unwrap());
    source.add(Fault {
        range: second_word..second_word + 4,
        kind: FaultKind::Fail,
    });
    let e = Archive::open_source(Box::new(source)).unwrap_err();
    assert_eq!(e.kind(), rocm_kpack::ErrorKind::IoError, "{e}");
    assert!(e.to_string().contains("injected fault"), "{e}");
}
