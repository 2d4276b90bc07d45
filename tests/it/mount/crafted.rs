//! The filesystem logic (no mount) over hand-made malformed archives: entries the archive cannot
//! deliver show with their TOC size and read as EIO; nothing else is affected.

use std::sync::Arc;

use rocm_kpack::Archive;
use rocm_kpack::fs::{Errno, FsOptions, KpackFs, Lookup, ReadDone};

use crate::support::craft::{V, archive_bytes, m, s, sample_kernel, zstd_parts};

fn entry(ordinal: u64, size: u64) -> V {
    m(vec![
        ("type", s("hsaco")),
        ("ordinal", V::U(ordinal)),
        ("original_size", V::U(size)),
    ])
}

fn fs_over(bytes: &[u8]) -> (tempfile::TempDir, KpackFs) {
    fs_over_with(bytes, 1 << 20)
}

fn fs_over_with(bytes: &[u8], cache_size: u64) -> (tempfile::TempDir, KpackFs) {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("crafted.kpack");
    std::fs::write(&p, bytes).unwrap();
    let opts = FsOptions {
        cache_size,
        backing: rocm_kpack::fs::store::Placement::Memory,
        files_max: 1024,
        gpus: vec![],
        uid: 0,
        gid: 0,
    };
    let (fs, _) = KpackFs::new(vec![Arc::new(Archive::open(&p).unwrap())], &opts).unwrap();
    (d, fs)
}

fn file(fs: &KpackFs, arch: &str) -> (u64, u64) {
    let Lookup::Found(dir) = fs.lookup(1, b"k#0").unwrap() else {
        panic!("k#0")
    };
    let Lookup::Found(f) = fs
        .lookup(dir.ino, format!("{arch}.hsaco").as_bytes())
        .unwrap()
    else {
        panic!("{arch}")
    };
    (f.ino, f.size)
}

/// Opens `ino` and waits for its file, running its decode on this thread; returns the handle.
fn open(fs: &KpackFs, ino: u64) -> Result<u64, Errno> {
    let (tx, rx) = std::sync::mpsc::channel();
    let done = Box::new(move |r| drop(tx.send(r)));
    if let Some(job) = fs.open_start(ino, libc::O_RDONLY, false, done) {
        fs.run_fill(job);
    }
    let opened = rx.recv().map_err(|_| Errno::EIO)??;
    Ok(fs.add_handle(opened).fh)
}

/// Reads up to `size` bytes at `offset` through handle `fh`.
fn read_at(fs: &KpackFs, fh: u64, offset: u64, size: u32) -> Result<Vec<u8>, Errno> {
    let (tx, rx) = std::sync::mpsc::channel();
    let done: ReadDone = Box::new(move |r| drop(tx.send(r.map(<[u8]>::to_vec))));
    fs.read_start(fh, offset, size, done);
    rx.recv().map_err(|_| Errno::EIO)?
}

fn read(fs: &KpackFs, ino: u64) -> Result<Vec<u8>, Errno> {
    let fh = open(fs, ino)?;
    let r = read_at(fs, fh, 0, u32::MAX);
    fs.release(fh);
    r
}

#[test]
fn shared_ordinal_with_another_size_is_eio_not_the_other_bytes() {
    let data = sample_kernel();
    let (blob, mut toc) = zstd_parts(&data);
    let n = data.len() as u64;
    toc.at("toc").at("k#0").set("gfx906", entry(0, n + 10));
    toc.at("toc").at("k#0").set("gfx908", entry(7, 99));
    let (_d, fs) = fs_over(&archive_bytes(&blob, &toc.encode()));
    let (good, good_size) = file(&fs, "gfx900");
    let (odd, odd_size) = file(&fs, "gfx906");
    let (missing, missing_size) = file(&fs, "gfx908");
    assert_eq!((good_size, odd_size, missing_size), (n, n + 10, 99));
    // Cached through gfx900 first: gfx906 must still not get those bytes.
    assert_eq!(read(&fs, good).unwrap(), data);
    assert_eq!(read(&fs, odd).unwrap_err(), Errno::EIO);
    // An ordinal with no frame.
    assert_eq!(read(&fs, missing).unwrap_err(), Errno::EIO);
    assert_eq!(read(&fs, good).unwrap(), data);
}

/// A `none` archive of `data` as `k#0` for gfx900, plus a gfx906 entry whose blob lies at
/// `offset` with `size` bytes (wherever that is).
fn with_second_blob(data: &[u8], offset: u64, size: u64) -> (Vec<u8>, V) {
    let (blob, mut toc) = crate::support::craft::noop_parts(data);
    toc.at("toc").at("k#0").set("gfx906", entry(1, size));
    toc.set(
        "blobs",
        V::A(vec![
            m(vec![
                ("offset", V::U(64)),
                ("size", V::U(data.len() as u64)),
            ]),
            m(vec![("offset", V::U(offset)), ("size", V::U(size))]),
        ]),
    );
    (blob, toc)
}

#[test]
fn blob_past_the_end_of_the_file_is_eio() {
    let data = sample_kernel();
    let (blob, toc) = with_second_blob(&data, 1 << 30, 50);
    let (_d, fs) = fs_over(&archive_bytes(&blob, &toc.encode()));
    let (good, _) = file(&fs, "gfx900");
    let (bad, bad_size) = file(&fs, "gfx906");
    assert_eq!(bad_size, 50);
    assert_eq!(read(&fs, bad).unwrap_err(), Errno::EIO);
    assert_eq!(read(&fs, good).unwrap(), data);
}

#[test]
fn a_binary_with_an_empty_arch_map_has_no_directory() {
    let data = sample_kernel();
    let (blob, mut toc) = crate::support::craft::noop_parts(&data);
    toc.at("toc").set("lib/empty.so#0", m(vec![]));
    let (_d, fs) = fs_over(&archive_bytes(&blob, &toc.encode()));
    assert!(matches!(fs.lookup(1, b"lib").unwrap(), Lookup::Missing));
    let (good, _) = file(&fs, "gfx900");
    assert_eq!(read(&fs, good).unwrap(), data);
}

/// A TOC size far beyond what the frame holds: the open fails with EIO once the frame is
/// checked, before any space is reserved for it (1 TiB of memfd would otherwise be asked for).
#[test]
fn hostile_original_size_is_eio_without_reserving_it() {
    let data = sample_kernel();
    let (blob, mut toc) = zstd_parts(&data);
    toc.at("toc").at("k#0").set("gfx906", entry(0, 1 << 40));
    let (_d, fs) = fs_over(&archive_bytes(&blob, &toc.encode()));
    let (huge, size) = file(&fs, "gfx906");
    assert_eq!(size, 1 << 40);
    assert_eq!(read(&fs, huge).unwrap_err(), Errno::EIO);
    assert_eq!(fs.store().live_bytes(), 0);
    let (good, _) = file(&fs, "gfx900");
    assert_eq!(read(&fs, good).unwrap(), data);
}

/// Reads a file whole through READs of at most 1 MiB, as the kernel would send them.
fn read_in_requests(fs: &KpackFs, ino: u64) -> Result<Vec<u8>, Errno> {
    let fh = open(fs, ino)?;
    let mut out = Vec::new();
    let r = loop {
        match read_at(fs, fh, out.len() as u64, 1 << 20) {
            Ok(s) if s.is_empty() => break Ok(out),
            Ok(s) => out.extend_from_slice(&s),
            Err(e) => break Err(e),
        }
    };
    fs.release(fh);
    r
}

/// Kernels checked whole before they are served (scheme `none`; zstd with only the decoded
/// bytes' digest) are written to their backing file in several steps: every byte arrives, a
/// digest that does not match serves nothing and keeps nothing, and a `none` blob that cannot
/// be in the file reserves nothing.
#[test]
fn kernels_checked_whole_are_written_in_steps_and_served_only_when_they_match() {
    let data = crate::support::craft::incompressible(11, (2 << 20) + 12_345);
    let digest = blake3::hash(&data).as_bytes().to_vec();
    let with_digest = |digest: Vec<u8>| {
        m(vec![
            ("type", s("hsaco")),
            ("ordinal", V::U(0)),
            ("original_size", V::U(data.len() as u64)),
            ("metadata", m(vec![("blake3", V::B(digest))])),
        ])
    };
    for scheme in ["none", "zstd"] {
        for (recorded, serves) in [(digest.clone(), true), (vec![9; 32], false)] {
            let (blob, mut toc) = if scheme == "none" {
                crate::support::craft::noop_parts(&data)
            } else {
                zstd_parts(&data)
            };
            toc.at("toc").at("k#0").set("gfx900", with_digest(recorded));
            let (_d, fs) = fs_over_with(&archive_bytes(&blob, &toc.encode()), 64 << 20);
            let (ino, size) = file(&fs, "gfx900");
            assert_eq!(size, data.len() as u64);
            if serves {
                assert!(read_in_requests(&fs, ino).unwrap() == data, "{scheme}");
                assert_eq!(fs.store().live_bytes(), data.len() as u64, "{scheme}");
            } else {
                assert_eq!(read_in_requests(&fs, ino).unwrap_err(), Errno::EIO);
                assert_eq!(fs.store().live_bytes(), 0, "{scheme}: nothing kept");
                // Not kept, so not served on a second try either.
                assert_eq!(read_in_requests(&fs, ino).unwrap_err(), Errno::EIO);
            }
        }
    }
    let (blob, toc) = with_second_blob(&data, 64, 1 << 40);
    let (_d, fs) = fs_over(&archive_bytes(&blob, &toc.encode()));
    let (huge, size) = file(&fs, "gfx906");
    assert_eq!(size, 1 << 40);
    assert_eq!(read(&fs, huge).unwrap_err(), Errno::EIO);
    assert_eq!(
        fs.store().live_bytes(),
        0,
        "1 TiB of memfd was never asked for"
    );
    let (good, _) = file(&fs, "gfx900");
    assert!(read_in_requests(&fs, good).unwrap() == data);
}

/// An empty entry naming the ordinal of a kernel that is in the store: its open is EIO, not
/// the other entry's file; before that kernel is read too (its frame is not empty).
#[test]
fn an_empty_entry_sharing_a_kept_kernels_ordinal_is_eio() {
    let data = crate::support::craft::incompressible(3, 200_000);
    let (blob, mut toc) = zstd_parts(&data);
    toc.at("toc").at("k#0").set("gfx906", entry(0, 0));
    let (_d, fs) = fs_over(&archive_bytes(&blob, &toc.encode()));
    let (good, _) = file(&fs, "gfx900");
    let (empty, size) = file(&fs, "gfx906");
    assert_eq!(size, 0);
    assert_eq!(open(&fs, empty).unwrap_err(), Errno::EIO);
    assert!(read_in_requests(&fs, good).unwrap() == data);
    assert!(fs.store().live_bytes() > 0, "gfx900 is kept");
    assert_eq!(open(&fs, empty).unwrap_err(), Errno::EIO);
}
