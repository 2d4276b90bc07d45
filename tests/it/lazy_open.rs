//! Opening reads what it needs: archives we write are opened from the header, the frame count
//! and the TOC, and each frame is checked when it is read; reference-layout archives have their
//! frame chain walked at open by reading only the pages that hold the size words.

use std::ops::Range;
use std::sync::{Arc, Mutex};

use rocm_kpack::{Archive, Compression, ErrorKind, LocalFile};

use crate::support::craft::*;
use crate::support::faulty_source::FaultySource;

const KERNELS: usize = 40;

fn kernels() -> Vec<(String, Vec<u8>)> {
    (0..KERNELS)
        .map(|i| {
            (
                format!("lib/l{i:02}.so#0"),
                incompressible(i as u64, 9000 + i * 1000),
            )
        })
        .collect()
}

fn write(reference: bool) -> Vec<u8> {
    gfx942_archive(kernels(), Compression::Zstd { level: 1 }, reference)
}

/// The archive of `bytes`, read through a source that records every range asked of it.
fn open_recording(bytes: &[u8]) -> (Archive, Arc<Mutex<Vec<Range<u64>>>>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.kpack");
    std::fs::write(&path, bytes).unwrap();
    let reads = Arc::new(Mutex::new(Vec::new()));
    let seen = reads.clone();
    let src = FaultySource::new(LocalFile::open(&path).unwrap()).observed(Arc::new(
        move |offset, len| seen.lock().unwrap().push(offset..offset + len as u64),
    ));
    (Archive::open_source(Box::new(src)).unwrap(), reads, dir)
}

fn toc_offset(bytes: &[u8]) -> u64 {
    u64::from_le_bytes(bytes[8..16].try_into().unwrap())
}

/// Absolute offsets of the frames' size words, walking the chain of a writer-made archive.
fn size_words(bytes: &[u8]) -> Vec<u64> {
    let count = u32::from_le_bytes(bytes[64..68].try_into().unwrap());
    let mut at = 68u64;
    (0..count)
        .map(|_| {
            let here = at;
            let size = u32::from_le_bytes(bytes[at as usize..at as usize + 4].try_into().unwrap());
            at += 4 + u64::from(size);
            here
        })
        .collect()
}

#[test]
fn positioned_open_reads_header_count_and_toc_only() {
    let bytes = write(false);
    let (a, reads, _dir) = open_recording(&bytes);
    assert!(a.frames_positioned());
    let toc = toc_offset(&bytes);
    let len = bytes.len() as u64;
    let seen = reads.lock().unwrap().clone();
    assert_eq!(seen, vec![0..16, toc..len, 64..68]);

    // Reading a kernel reads its size word and frame, and nothing else.
    reads.lock().unwrap().clear();
    let (key, data) = &kernels()[7];
    assert_eq!(&a.get_kernel(key, "gfx942").unwrap(), data);
    let word = size_words(&bytes)[7];
    let size = u64::from(u32::from_le_bytes(
        bytes[word as usize..word as usize + 4].try_into().unwrap(),
    ));
    assert_eq!(*reads.lock().unwrap(), vec![word..word + 4 + size]);
}

#[test]
fn reference_open_reads_only_the_pages_holding_size_words() {
    let bytes = write(true);
    let (a, reads, _dir) = open_recording(&bytes);
    assert!(!a.frames_positioned());
    let toc = toc_offset(&bytes);
    let words = size_words(&bytes);
    let mut blob_bytes = 0;
    for r in reads.lock().unwrap().iter() {
        // The header, the TOC and the frame count word.
        if r.start >= toc || r.end <= 16 || *r == (64..68) {
            continue;
        }
        // Each read inside the blob covers whole pages (clipped to the blob) around one word.
        assert!(r.end - r.start <= 8192, "{r:?}");
        assert!(r.start == 64 || r.start % 4096 == 0, "{r:?}");
        assert!(r.end == toc || r.end % 4096 == 0, "{r:?}");
        blob_bytes += r.end - r.start;
    }
    // Every word was read, and the blob (about 800 KB here) was not.
    for w in &words {
        assert!(
            reads
                .lock()
                .unwrap()
                .iter()
                .any(|r| r.start <= *w && w + 4 <= r.end),
            "size word at {w} not read"
        );
    }
    assert!(
        blob_bytes <= 2 * 4096 * (KERNELS as u64 + 1),
        "{blob_bytes} blob bytes read"
    );
    for (k, d) in kernels() {
        assert_eq!(a.get_kernel(&k, "gfx942").unwrap(), d);
    }
}

/// Writes `bytes` with frame `index`'s size word changed, opens it.
fn with_bad_word(bytes: &[u8], index: usize) -> (rocm_kpack::Result<Archive>, tempfile::TempDir) {
    let mut bad = bytes.to_vec();
    let w = size_words(bytes)[index] as usize;
    let size = u32::from_le_bytes(bad[w..w + 4].try_into().unwrap());
    bad[w..w + 4].copy_from_slice(&(size - 1).to_le_bytes());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.kpack");
    std::fs::write(&path, bad).unwrap();
    (Archive::open(&path), dir)
}

#[test]
fn positioned_frames_are_checked_when_read() {
    let (a, _dir) = with_bad_word(&write(false), 3);
    let a = a.unwrap();
    let ks = kernels();
    assert_eq!(a.get_kernel(&ks[2].0, "gfx942").unwrap(), ks[2].1);
    let e = a.get_kernel(&ks[3].0, "gfx942").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidFormat, "{e}");
    assert!(e.to_string().contains("lib/l03.so#0"), "{e}");
    assert!(e.to_string().contains("size word"), "{e}");

    // The same damage in a reference-layout archive fails the open, as the reference does.
    let (a, _dir) = with_bad_word(&write(true), 3);
    assert_eq!(a.unwrap_err().kind(), ErrorKind::InvalidFormat);
}

/// A one-kernel zstd archive whose entry records `frame` as given.
fn crafted(frame: V, ordinal: u64) -> Vec<u8> {
    let data = sample_kernel();
    let (blob, mut toc) = zstd_parts(&data);
    let entry = toc.at("toc").at("k#0").at("gfx900");
    entry.set("ordinal", V::U(ordinal));
    entry.set("metadata", m(vec![("frame", frame)]));
    archive_bytes(&blob, &toc.encode())
}

fn read_crafted(bytes: Vec<u8>) -> rocm_kpack::Result<Vec<u8>> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.kpack");
    std::fs::write(&path, bytes).unwrap();
    let a = Archive::open(&path)?;
    assert!(a.frames_positioned());
    a.get_kernel("k#0", "gfx900")
}

#[test]
fn positioned_frame_bounds_follow_the_open_time_rules() {
    let data = sample_kernel();
    let frame_len = zstd::bulk::compress(&data, 3).unwrap().len() as u64;
    // The right position reads.
    assert_eq!(
        read_crafted(crafted(V::A(vec![V::U(68), V::U(frame_len)]), 0)).unwrap(),
        data
    );
    // Outside the blob (before the first frame, past its end, overflowing): invalid format.
    for (offset, size) in [
        (64, frame_len),
        (68, frame_len + 1),
        (u64::MAX - 2, frame_len),
        (68 + 4 + frame_len, 0),
    ] {
        let e = read_crafted(crafted(V::A(vec![V::U(offset), V::U(size)]), 0)).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidFormat, "{offset} {size}: {e}");
    }
    // A size word that disagrees: invalid format when read.
    let e = read_crafted(crafted(V::A(vec![V::U(68), V::U(frame_len - 1)]), 0)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidFormat, "{e}");
    // An ordinal past the frame count: not found, as with the walked chain.
    let e = read_crafted(crafted(V::A(vec![V::U(68), V::U(frame_len)]), 1)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::KernelNotFound, "{e}");
}

#[test]
fn a_frame_of_the_wrong_shape_means_the_chain_is_walked() {
    let data = sample_kernel();
    let frame_len = zstd::bulk::compress(&data, 3).unwrap().len() as u64;
    for frame in [
        V::A(vec![V::U(68)]),
        V::A(vec![V::U(68), V::I(-1)]),
        V::A(vec![V::U(68), V::U(1 << 32)]),
        s("68"),
        V::A(vec![V::U(68), V::U(frame_len), V::U(0)]),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.kpack");
        std::fs::write(&path, crafted(frame.clone(), 0)).unwrap();
        let a = Archive::open(&path).unwrap();
        assert!(!a.frames_positioned(), "{frame:?}");
        assert_eq!(a.get_kernel("k#0", "gfx900").unwrap(), data);
    }
}
