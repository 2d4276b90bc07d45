//! `KpackFs` without a mount: lookups, fallback links, attributes, listings, xattrs, reads
//! through the cache, and the errors the kernel would see.

use std::path::Path;
use std::sync::Arc;

use super::policy::Granted;
use super::tree::{Entry, ROOT};
use super::*;
use crate::archive::writer::{ArchiveWriter, Compression};
use crate::fs::read::fill::ReadDone;

/// The requests of the read path, each waiting for its answer: the mount itself only starts
/// them (`read/mod.rs`) and answers through callbacks. A decode a request starts runs on the
/// calling thread.
pub(super) trait Blocking {
    /// Opens a file for reading and waits for its file; returns the new handle.
    fn open(&self, ino: Ino, flags: i32) -> Result<u64, Errno>;
    /// Reads by inode (page-cache mode) and waits for the bytes.
    fn read_ino(&self, ino: Ino, offset: u64, size: u32) -> Result<ReadSlice, Errno>;
    /// Reads through handle `fh` and waits for the bytes; short only at end of file.
    fn read(&self, fh: u64, offset: u64, size: u32) -> Result<ReadSlice, Errno>;
}

impl Blocking for KpackFs {
    fn open(&self, ino: Ino, flags: i32) -> Result<u64, Errno> {
        let (tx, rx) = std::sync::mpsc::channel();
        let done = Box::new(move |r| drop(tx.send(r)));
        if let Some(job) = self.open_start(ino, flags, false, done) {
            self.run_fill(job);
        }
        let opened = rx.recv().map_err(|_| Errno::EIO)??;
        Ok(self.add_handle(opened).fh)
    }

    fn read_ino(&self, ino: Ino, offset: u64, size: u32) -> Result<ReadSlice, Errno> {
        let (tx, rx) = std::sync::mpsc::channel();
        let done: ReadDone = Box::new(move |r| drop(tx.send(r.map(<[u8]>::to_vec))));
        if let Some(job) = self.read_ino_start(ino, offset, size, done) {
            self.run_fill(job);
        }
        rx.recv().map_err(|_| Errno::EIO)?.map(ReadSlice)
    }

    fn read(&self, fh: u64, offset: u64, size: u32) -> Result<ReadSlice, Errno> {
        let (tx, rx) = std::sync::mpsc::channel();
        let done: ReadDone = Box::new(move |r| drop(tx.send(r.map(<[u8]>::to_vec))));
        self.read_start(fh, offset, size, done);
        rx.recv().map_err(|_| Errno::EIO)?.map(ReadSlice)
    }
}

/// Bytes read from a kernel file by a [`Blocking`] request.
#[derive(Debug, Clone)]
pub(super) struct ReadSlice(pub(super) Vec<u8>);

impl ReadSlice {
    pub(super) fn as_slice(&self) -> &[u8] {
        &self.0
    }
}

/// Puts `fs` in page-cache mode, as `init` does when the kernel grants it.
fn page_cache_mode(fs: &mut KpackFs) {
    fs.plan_open_mode(OpenMode::PageCache, false);
    fs.mode().settle(Granted {
        no_open: true,
        passthrough: false,
    });
}

type Kernels = Vec<(&'static str, &'static str, Vec<u8>)>;

fn write_archive(
    dir: &Path,
    name: &str,
    compression: Compression,
    kernels: &Kernels,
) -> std::path::PathBuf {
    let mut arches: Vec<String> = kernels.iter().map(|k| k.1.to_owned()).collect();
    arches.dedup();
    let mut w = ArchiveWriter::new("g", "fam", arches, compression).unwrap();
    for (key, arch, data) in kernels {
        w.add_kernel(key, arch, data.clone()).unwrap();
    }
    let path = dir.join(name);
    w.write(&path, &|_| {}).unwrap();
    path
}

fn sample() -> Kernels {
    vec![
        ("lib/liba.so#0", "gfx900", b"A-900".repeat(100)),
        (
            "lib/liba.so#0",
            "gfx942:sramecc+:xnack-",
            b"A-942sx".repeat(50),
        ),
        ("lib/liba.so#0", "gfx11-generic", b"A-11g".repeat(70)),
        ("lib/libb.so#1", "gfx1100", b"B-1100".repeat(30)),
        ("bin/app#0", "gfx90a:xnack+", vec![0xee; 3000]),
    ]
}

fn options(cache: u64, gpus: &[&str]) -> FsOptions {
    FsOptions {
        cache_size: cache,
        backing: Placement::Memory,
        files_max: 1024,
        gpus: gpus.iter().map(|s| s.to_string()).collect(),
        uid: 1234,
        gid: 5678,
    }
}

fn mount_fs(
    kernels: &Kernels,
    compression: Compression,
    opts: &FsOptions,
) -> (tempfile::TempDir, KpackFs) {
    let dir = tempfile::tempdir().unwrap();
    let path = write_archive(dir.path(), "a.kpack", compression, kernels);
    let archive = Arc::new(Archive::open(&path).unwrap());
    let (fs, dups) = KpackFs::new(vec![archive], opts).unwrap();
    assert!(dups.is_empty());
    (dir, fs)
}

/// The sample kernels at zstd-3 with a 1 MiB cache in memory.
fn sample_mount() -> (tempfile::TempDir, KpackFs) {
    mount_fs(
        &sample(),
        Compression::Zstd { level: 3 },
        &options(1 << 20, &[]),
    )
}

fn walk(fs: &KpackFs, path: &str) -> Result<Lookup, Errno> {
    let mut ino = ROOT;
    let mut last = Lookup::Found(fs.getattr(ROOT).unwrap());
    for comp in path.split('/').filter(|c| !c.is_empty()) {
        last = fs.lookup(ino, comp.as_bytes())?;
        match last {
            Lookup::Found(a) => ino = a.ino,
            Lookup::Missing => return Ok(Lookup::Missing),
        }
    }
    Ok(last)
}

fn attr(fs: &KpackFs, path: &str) -> Attr {
    match walk(fs, path).unwrap() {
        Lookup::Found(a) => a,
        Lookup::Missing => panic!("{path} not found"),
    }
}

fn read_all(fs: &KpackFs, ino: u64, chunk: u32) -> Vec<u8> {
    let fh = fs.open(ino, libc::O_RDONLY).unwrap();
    let mut out = Vec::new();
    loop {
        let s = fs.read(fh, out.len() as u64, chunk).unwrap();
        if s.as_slice().is_empty() {
            break;
        }
        out.extend_from_slice(s.as_slice());
    }
    fs.release(fh);
    out
}

struct VecSink {
    entries: Vec<(u64, u64, Kind, String)>,
    room: usize,
}

impl DirSink for VecSink {
    fn add(&mut self, ino: u64, next: u64, kind: Kind, name: &str) -> bool {
        if self.entries.len() == self.room {
            return true;
        }
        self.entries.push((ino, next, kind, name.to_owned()));
        false
    }
}

fn list(fs: &KpackFs, ino: u64) -> Vec<String> {
    let mut sink = VecSink {
        entries: Vec::new(),
        room: usize::MAX,
    };
    fs.readdir(ino, 0, &mut sink).unwrap();
    sink.entries.into_iter().map(|e| e.3).collect()
}

#[test]
fn tree_matches_keys_and_arches() {
    for compression in [Compression::None, Compression::Zstd { level: 3 }] {
        let (_d, fs) = mount_fs(&sample(), compression, &options(1 << 20, &[]));
        assert_eq!(list(&fs, ROOT), [".", "..", "bin", "lib"]);
        let lib = attr(&fs, "lib");
        assert_eq!(list(&fs, lib.ino), [".", "..", "liba.so#0", "libb.so#1"]);
        let a = attr(&fs, "lib/liba.so#0");
        assert_eq!(
            list(&fs, a.ino),
            [
                ".",
                "..",
                "gfx11-generic.hsaco",
                "gfx900.hsaco",
                "gfx942:sramecc+:xnack-.hsaco"
            ]
        );
        for (key, arch, data) in sample() {
            let f = attr(&fs, &format!("{key}/{arch}.hsaco"));
            assert_eq!(
                (f.kind, f.size, f.perm, f.nlink),
                (Kind::File, data.len() as u64, 0o444, 1)
            );
            assert_eq!((f.uid, f.gid), (1234, 5678));
            assert_eq!(read_all(&fs, f.ino, 7), data, "{key} {arch}");
        }
        let root = fs.getattr(ROOT).unwrap();
        assert_eq!((root.kind, root.perm, root.nlink), (Kind::Dir, 0o555, 4));
        assert_eq!(lib.nlink, 4);
    }
}

#[test]
fn access_follows_the_modes_shown() {
    let (_d, fs) = mount_fs(&sample(), Compression::None, &options(1 << 20, &[]));
    let dir = attr(&fs, "lib/liba.so#0").ino;
    let file = attr(&fs, "lib/liba.so#0/gfx900.hsaco").ino;
    for ino in [ROOT, dir, file] {
        assert_eq!(fs.access(ino, false, false), Ok(()));
        assert_eq!(fs.access(ino, true, false), Err(Errno::EROFS));
    }
    assert_eq!(fs.access(dir, false, true), Ok(()));
    assert_eq!(fs.access(file, false, true), Err(Errno::EACCES));
    assert_eq!(fs.access(1 << 40, false, false), Err(Errno::ENOENT));
}

#[test]
fn inode_numbers_are_stable_across_builds() {
    let (_d1, fs1) = mount_fs(&sample(), Compression::None, &options(0, &[]));
    let (_d2, fs2) = mount_fs(&sample(), Compression::None, &options(0, &[]));
    for (key, arch, _) in sample() {
        let p = format!("{key}/{arch}.hsaco");
        assert_eq!(attr(&fs1, &p).ino, attr(&fs2, &p).ino);
        // And for the life of one mount: a second lookup gives the same number.
        assert_eq!(attr(&fs1, &p).ino, attr(&fs1, &p).ino);
    }
}

#[test]
fn fallback_links_follow_the_loader_rules() {
    let (_d, fs) = sample_mount();
    let dir = attr(&fs, "lib/liba.so#0").ino;
    let link = |name: &str| match fs.lookup(dir, name.as_bytes()).unwrap() {
        Lookup::Found(a) => {
            assert_eq!(a.kind, Kind::Symlink);
            Some(String::from_utf8(fs.readlink(a.ino).unwrap()).unwrap())
        }
        Lookup::Missing => None,
    };
    // Feature subsets: more specific requests fall back to what is present.
    assert_eq!(link("gfx900:xnack+.hsaco").as_deref(), Some("gfx900.hsaco"));
    assert_eq!(
        link("gfx900:sramecc-:xnack-.hsaco").as_deref(),
        Some("gfx900.hsaco")
    );
    // Signs are never flipped, and a present arch with features needs those features.
    assert_eq!(link("gfx942:sramecc+:xnack+.hsaco"), None);
    assert_eq!(link("gfx942.hsaco"), None);
    // Generic target of the processor.
    assert_eq!(
        link("gfx1101.hsaco").as_deref(),
        Some("gfx11-generic.hsaco")
    );
    assert_eq!(
        link("amdgcn-amd-amdhsa--gfx1151:xnack-.hsaco").as_deref(),
        Some("gfx11-generic.hsaco")
    );
    // Nothing resolvable; not a kernel name; no processor-to-processor fallback.
    assert_eq!(link("gfx1030.hsaco"), None);
    assert_eq!(link("gfx906.hsaco"), None);
    assert_eq!(link("gfx900"), None);
    assert_eq!(link(".hsaco"), None);
    // Directories without kernels answer nothing.
    assert_eq!(fs.lookup(ROOT, b"gfx900.hsaco").unwrap(), Lookup::Missing);
    // Fallback names never show up in listings.
    assert!(
        !list(&fs, dir)
            .iter()
            .any(|n| n.contains("1101") || n.contains("xnack+"))
    );
    // Every name resolving to one file shares one link inode, and the link reads as the file.
    let a = match fs.lookup(dir, b"gfx900:xnack+.hsaco").unwrap() {
        Lookup::Found(a) => a,
        _ => unreachable!(),
    };
    let b = match fs.lookup(dir, b"gfx900:xnack-.hsaco").unwrap() {
        Lookup::Found(a) => a,
        _ => unreachable!(),
    };
    assert_eq!(a.ino, b.ino);
    assert_eq!(a.size, "gfx900.hsaco".len() as u64);
    assert_eq!(
        fs.tree.entry(a.ino),
        Some(Entry::Link(attr(&fs, "lib/liba.so#0/gfx900.hsaco").ino))
    );
}

#[test]
fn native_link_uses_the_first_gpu_that_resolves() {
    let (_d, fs) = mount_fs(
        &sample(),
        Compression::None,
        &options(1 << 20, &["gfx1030", "gfx1101", "gfx900"]),
    );
    let a = attr(&fs, "lib/liba.so#0").ino;
    assert_eq!(list(&fs, a).last().map(String::as_str), Some(NATIVE));
    let native = attr(&fs, "lib/liba.so#0/native.hsaco");
    assert_eq!(native.kind, Kind::Symlink);
    assert_eq!(fs.readlink(native.ino).unwrap(), b"gfx11-generic.hsaco");
    // libb has gfx1100 only: gfx1101 does not run it, gfx900 neither.
    let b = attr(&fs, "lib/libb.so#1").ino;
    assert!(!list(&fs, b).contains(&NATIVE.to_owned()));
    assert_eq!(fs.lookup(b, NATIVE.as_bytes()).unwrap(), Lookup::Missing);
    // Readdir gives native.hsaco its link inode and kind.
    let mut sink = VecSink {
        entries: Vec::new(),
        room: usize::MAX,
    };
    fs.readdir(a, 0, &mut sink).unwrap();
    let last = sink.entries.last().unwrap();
    assert_eq!((last.0, last.2), (native.ino, Kind::Symlink));
}

#[test]
fn readdir_offsets_resume_after_the_last_entry() {
    let (_d, fs) = mount_fs(&sample(), Compression::None, &options(0, &["gfx900"]));
    let dir = attr(&fs, "lib/liba.so#0").ino;
    let full = list(&fs, dir);
    let mut got = Vec::new();
    let mut offset = 0;
    loop {
        let mut sink = VecSink {
            entries: Vec::new(),
            room: 2,
        };
        fs.readdir(dir, offset, &mut sink).unwrap();
        if sink.entries.is_empty() {
            break;
        }
        offset = sink.entries.last().unwrap().1;
        got.extend(sink.entries.into_iter().map(|e| e.3));
    }
    assert_eq!(got, full);
    assert_eq!(full.len(), 6);
}

#[test]
fn errors_of_the_mounts_own_files() {
    let errno = |code| Errno::from(&std::io::Error::from_raw_os_error(code));
    assert_eq!(errno(libc::ENOSPC), Errno(libc::ENOSPC));
    assert_eq!(errno(libc::ENOMEM), Errno::ENOMEM);
    for other in [libc::EACCES, libc::EIO, libc::EMFILE, libc::EROFS] {
        assert_eq!(errno(other), Errno::EIO);
    }
    assert_eq!(Errno::from(&std::io::Error::other("no errno")), Errno::EIO);
}

#[test]
fn errnos() {
    let (_d, fs) = mount_fs(&sample(), Compression::None, &options(1 << 20, &[]));
    let file = attr(&fs, "bin/app#0/gfx90a:xnack+.hsaco").ino;
    let dir = attr(&fs, "bin/app#0").ino;
    assert_eq!(fs.lookup(ROOT, b"nope").unwrap(), Lookup::Missing);
    assert_eq!(fs.lookup(file, b"x").unwrap_err(), Errno::ENOTDIR);
    assert_eq!(fs.getattr(999_999).unwrap_err(), Errno::ENOENT);
    assert_eq!(fs.open(file, libc::O_WRONLY).unwrap_err(), Errno::EROFS);
    assert_eq!(fs.open(file, libc::O_RDWR).unwrap_err(), Errno::EROFS);
    assert_eq!(
        fs.open(file, libc::O_RDONLY | libc::O_TRUNC).unwrap_err(),
        Errno::EROFS
    );
    assert_eq!(fs.open(dir, libc::O_RDONLY).unwrap_err(), Errno::EISDIR);
    assert_eq!(fs.readlink(file).unwrap_err(), Errno::EINVAL);
    assert_eq!(
        fs.readdir(
            file,
            0,
            &mut VecSink {
                entries: vec![],
                room: 9
            }
        )
        .unwrap_err(),
        Errno::ENOTDIR
    );
    assert_eq!(
        fs.getxattr(file, b"user.kpack.nope").unwrap_err(),
        Errno::ENODATA
    );
    assert_eq!(
        fs.getxattr(dir, b"user.kpack.stats").unwrap_err(),
        Errno::ENODATA
    );
}

#[test]
fn reads_at_edges() {
    let (_d, fs) = sample_mount();
    let f = attr(&fs, "bin/app#0/gfx90a:xnack+.hsaco");
    let fh = fs.open(f.ino, libc::O_RDONLY).unwrap();
    assert_eq!(fs.read(fh, 0, 1).unwrap().as_slice(), [0xee]);
    assert_eq!(fs.read(fh, 2999, 100).unwrap().as_slice(), [0xee]);
    assert!(fs.read(fh, 3000, 100).unwrap().as_slice().is_empty());
    assert!(fs.read(fh, u64::MAX, 100).unwrap().as_slice().is_empty());
    assert_eq!(fs.read(fh, 10, 0).unwrap().as_slice().len(), 0);
    assert_eq!(fs.read(fh, 2990, u32::MAX).unwrap().as_slice().len(), 10);
    fs.release(fh);
    assert_eq!(fs.open_handles(), 0);
}

#[test]
fn xattrs_describe_the_entry() {
    let (_d, fs) = sample_mount();
    let f = attr(&fs, "lib/libb.so#1/gfx1100.hsaco").ino;
    let get = |n: &str| String::from_utf8(fs.getxattr(f, n.as_bytes()).unwrap()).unwrap();
    assert!(get("user.kpack.archive").ends_with("/a.kpack"));
    assert_eq!(get("user.kpack.arch"), "gfx1100");
    assert_eq!(get("user.kpack.key"), "lib/libb.so#1");
    assert_eq!(get("user.kpack.scheme"), "zstd-per-kernel");
    assert_eq!(get("user.kpack.ordinal"), "3");
    let stored: u64 = get("user.kpack.stored_size").parse().unwrap();
    assert!(
        stored > 0 && stored < 180,
        "a repetitive 180-byte kernel compresses: {stored}"
    );
    assert_eq!(
        fs.listxattr(f).unwrap(),
        b"user.kpack.archive\0user.kpack.arch\0user.kpack.key\0user.kpack.scheme\0user.kpack.ordinal\0user.kpack.stored_size\0user.kpack.blake3\0"
    );
    let data = &sample()
        .into_iter()
        .find(|k| k.0 == "lib/libb.so#1" && k.1 == "gfx1100")
        .unwrap()
        .2;
    assert_eq!(
        get("user.kpack.blake3"),
        blake3::hash(data).to_hex().as_str(),
        "the archive's digest of the decoded bytes, in hex"
    );
    assert_eq!(fs.listxattr(ROOT).unwrap(), b"user.kpack.stats\0");
    read_all(&fs, f, 4096);
    read_all(&fs, f, 4096);
    assert_eq!(
        String::from_utf8(fs.getxattr(ROOT, b"user.kpack.stats").unwrap()).unwrap(),
        "hits 1\nmisses 1\ndecodes 1\nbytes_cached 180\nevictions 0\ncapacity 1048576\nspace_evictions 0\nspace_refusals 0\nlookups 3\nlookups_missing 0\n\
         daemon_opens 2\nopen_handles 0\ndaemon_reads 4\nreads_while_decoding 0\nopens_while_decoding 0\ndecodes_ahead 0\nbacking_in_memory 1\nbacking_bytes 180\ncache_dir_hits 0\ncache_dir_misses 0\n\
         cache_dir_rejected 0\ncache_dir_evictions 0\npassthrough 0\npage_cache_mode 0\n"
    );
}

#[test]
fn kernel_larger_than_the_cache_is_decoded_once_per_handle() {
    let kernels: Kernels = vec![(
        "k#0",
        "gfx900",
        (0..100_000u32).map(|i| (i * 7 % 251) as u8).collect(),
    )];
    let (_d, fs) = mount_fs(
        &kernels,
        Compression::Zstd { level: 3 },
        &options(1000, &[]),
    );
    let f = attr(&fs, "k#0/gfx900.hsaco").ino;
    assert_eq!(read_all(&fs, f, 4096), kernels[0].2);
    let s = fs.cache_stats();
    assert_eq!((s.decodes, s.bytes_cached), (1, 0));
    assert_eq!(read_all(&fs, f, 333), kernels[0].2);
    assert_eq!(
        fs.cache_stats().decodes,
        2,
        "a new handle decodes again; its reads do not"
    );
    assert_eq!(fs.open_handles(), 0);
}

/// Overwrites the stored bytes of one kernel of the archive at `path` with 0xff.
fn corrupt_kernel(path: &Path, key: &str, arch: &str) {
    let stored = Archive::open(path)
        .unwrap()
        .locate(key, arch)
        .unwrap()
        .stored;
    let mut bytes = std::fs::read(path).unwrap();
    bytes[stored.offset as usize..(stored.offset + stored.size) as usize].fill(0xff);
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn corrupt_frame_is_eio_and_neighbours_read() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_archive(
        dir.path(),
        "c.kpack",
        Compression::Zstd { level: 3 },
        &sample(),
    );
    corrupt_kernel(&path, "lib/libb.so#1", "gfx1100");
    let (fs, _) = KpackFs::new(
        vec![Arc::new(Archive::open(&path).unwrap())],
        &options(1 << 20, &[]),
    )
    .unwrap();
    let bad = attr(&fs, "lib/libb.so#1/gfx1100.hsaco");
    assert_eq!(bad.size, 180, "the size comes from the TOC");
    // The kernel is decoded at open, so the open fails, and nothing is kept for it.
    assert_eq!(fs.open(bad.ino, libc::O_RDONLY).unwrap_err(), Errno::EIO);
    assert_eq!(fs.open(bad.ino, libc::O_RDONLY).unwrap_err(), Errno::EIO);
    assert_eq!(fs.cache_stats().decodes, 2, "a failed decode is not cached");
    assert_eq!((fs.open_handles(), fs.store().live_bytes()), (0, 0));
    assert_eq!(
        read_all(&fs, attr(&fs, "lib/liba.so#0/gfx900.hsaco").ino, 64),
        b"A-900".repeat(100)
    );
}

#[test]
fn archive_rewritten_in_place_gives_eio() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_archive(dir.path(), "w.kpack", Compression::None, &sample());
    let (fs, _) = KpackFs::new(
        vec![Arc::new(Archive::open(&path).unwrap())],
        &options(1 << 20, &[]),
    )
    .unwrap();
    let f = attr(&fs, "lib/libb.so#1/gfx1100.hsaco").ino;
    // Same length, different bytes, newer mtime: rewritten in place (not replaced).
    let mut bytes = std::fs::read(&path).unwrap();
    let stored = Archive::open(&path)
        .unwrap()
        .locate("lib/libb.so#1", "gfx1100")
        .unwrap()
        .stored;
    bytes[stored.offset as usize] ^= 0xff;
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&file, &bytes, 0).unwrap();
    file.set_modified(std::time::SystemTime::now() + Duration::from_secs(5))
        .unwrap();
    assert_eq!(fs.open(f, libc::O_RDONLY).unwrap_err(), Errno::EIO);
    // Truncated: EIO too.
    file.set_len(stored.offset).unwrap();
    let g = attr(&fs, "lib/liba.so#0/gfx900.hsaco").ino;
    assert_eq!(fs.open(g, libc::O_RDONLY).unwrap_err(), Errno::EIO);
}

#[test]
fn unsafe_names_refuse_the_mount_naming_the_key() {
    for (key, arch) in [
        ("lib/../x#0", "gfx900"),
        ("lib//x#0", "gfx900"),
        ("/abs#0", "gfx900"),
        ("lib/x#0/", "gfx900"),
        (".", "gfx900"),
        ("lib/a\0b", "gfx900"),
        ("ok#0", "gfx9/00"),
        ("ok#0", ".."),
        ("ok#0", "gfx\0"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let k: Kernels = vec![(
            Box::leak(key.to_owned().into_boxed_str()),
            Box::leak(arch.to_owned().into_boxed_str()),
            vec![1],
        )];
        let path = write_archive(dir.path(), "bad.kpack", Compression::None, &k);
        let err = KpackFs::new(
            vec![Arc::new(Archive::open(&path).unwrap())],
            &options(0, &[]),
        )
        .err()
        .unwrap();
        assert_eq!(err.key, key);
        assert!(err.to_string().contains(&format!("{key:?}")), "{err}");
    }
    let long = "x".repeat(256);
    let dir = tempfile::tempdir().unwrap();
    let k: Kernels = vec![(
        Box::leak(format!("lib/{long}").into_boxed_str()),
        "gfx900",
        vec![1],
    )];
    let path = write_archive(dir.path(), "long.kpack", Compression::None, &k);
    let err = KpackFs::new(
        vec![Arc::new(Archive::open(&path).unwrap())],
        &options(0, &[]),
    )
    .err()
    .unwrap();
    assert!(err.reason.contains("256 bytes"), "{err}");
}

#[test]
fn file_and_directory_name_clash_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let k: Kernels = vec![
        ("a", "gfx900", vec![1]),
        ("a/gfx900.hsaco", "gfx906", vec![2]),
    ];
    let path = write_archive(dir.path(), "clash.kpack", Compression::None, &k);
    let err = KpackFs::new(
        vec![Arc::new(Archive::open(&path).unwrap())],
        &options(0, &[]),
    )
    .err()
    .unwrap();
    assert_eq!(err.key, "a/gfx900.hsaco");
}

#[test]
fn merged_archives_keep_the_first_entry() {
    let dir = tempfile::tempdir().unwrap();
    let p1 = write_archive(
        dir.path(),
        "1.kpack",
        Compression::None,
        &vec![("k#0", "gfx900", b"first".to_vec())],
    );
    let p2 = write_archive(
        dir.path(),
        "2.kpack",
        Compression::Zstd { level: 3 },
        &vec![
            ("k#0", "gfx900", b"second".to_vec()),
            ("k#0", "gfx906", b"other".to_vec()),
        ],
    );
    let archives = vec![
        Arc::new(Archive::open(&p1).unwrap()),
        Arc::new(Archive::open(&p2).unwrap()),
    ];
    let (fs, dups) = KpackFs::new(archives, &options(1 << 20, &[])).unwrap();
    assert_eq!(
        dups,
        vec![Duplicate {
            key: "k#0".into(),
            arch: "gfx900".into(),
            kept: 0,
            dropped: 1
        }]
    );
    assert_eq!(
        read_all(&fs, attr(&fs, "k#0/gfx900.hsaco").ino, 100),
        b"first"
    );
    assert_eq!(
        read_all(&fs, attr(&fs, "k#0/gfx906.hsaco").ino, 100),
        b"other"
    );
}

#[test]
fn statfs_counts_blocks_and_inodes() {
    let (_d, fs) = mount_fs(&sample(), Compression::None, &options(0, &[]));
    let s = fs.statfs();
    // 500 + 350 + 350 + 180 + 3000 bytes: 1 + 1 + 1 + 1 + 1 blocks of 4096.
    assert_eq!(
        s,
        StatFs {
            blocks: 5,
            files: 11,
            bsize: 4096,
            namelen: 255,
            frsize: 4096
        }
    );
}

#[test]
fn median_kernel_size_takes_the_lower_middle() {
    let small = sample();
    let (_d, fs) = mount_fs(&small, Compression::None, &options(1 << 20, &[]));
    // Sizes 180, 300, 350, 500, 3000: median 350.
    assert_eq!(fs.median_kernel_size(), Some(350));
    let at = |len: usize| -> Kernels {
        vec![
            ("k#0", "gfx900", vec![1; 10]),
            ("k#1", "gfx900", vec![2; len]),
            ("k#2", "gfx900", vec![3; len + 1]),
            ("k#3", "gfx900", vec![4; 1 << 20]),
        ]
    };
    // Four kernels: the lower middle one decides.
    let limit = PAGE_CACHE_MEDIAN_MAX as usize;
    let (_d, fs) = mount_fs(&at(limit), Compression::None, &options(1 << 20, &[]));
    assert_eq!(fs.median_kernel_size(), Some(PAGE_CACHE_MEDIAN_MAX));
    let (_d, fs) = mount_fs(&at(limit + 1), Compression::None, &options(1 << 20, &[]));
    assert_eq!(fs.median_kernel_size(), Some(PAGE_CACHE_MEDIAN_MAX + 1));
    let (_d, fs) = mount_fs(&Vec::new(), Compression::None, &options(1 << 20, &[]));
    assert_eq!(fs.median_kernel_size(), None);
}

#[test]
fn page_cache_mode_refuses_opens_and_reads_by_inode() {
    let (_d, mut fs) = sample_mount();
    page_cache_mode(&mut fs);
    let f = attr(&fs, "bin/app#0/gfx90a:xnack+.hsaco").ino;
    let dir = attr(&fs, "bin/app#0").ino;
    assert_eq!(fs.refuse_open(f, libc::O_RDONLY), Errno::ENOSYS);
    assert_eq!(fs.refuse_open(f, libc::O_WRONLY), Errno::EROFS);
    assert_eq!(fs.refuse_open(dir, libc::O_RDONLY), Errno::EISDIR);
    assert_eq!(fs.refuse_open(999_999, libc::O_RDONLY), Errno::ENOENT);
    assert_eq!(fs.open_handles(), 0);
    assert_eq!(fs.read_ino(f, 0, 2).unwrap().as_slice(), [0xee, 0xee]);
    // Small kernels are decoded into the reply and kept in the store, in memory (no
    // backing file): the reads after the first decode nothing.
    assert_eq!(fs.read_ino(f, 2990, 100).unwrap().as_slice(), [0xee; 10]);
    assert!(fs.read_ino(f, 2990, 0).unwrap().as_slice().is_empty());
    assert!(fs.read_ino(f, 3000, 100).unwrap().as_slice().is_empty());
    assert!(fs.read_ino(f, u64::MAX, 100).unwrap().as_slice().is_empty());
    assert_eq!(fs.read_ino(dir, 0, 1).unwrap_err(), Errno::EISDIR);
    assert_eq!(fs.read_ino(999_999, 0, 1).unwrap_err(), Errno::ENOENT);
    for (key, arch, data) in sample() {
        let ino = attr(&fs, &format!("{key}/{arch}.hsaco")).ino;
        assert_eq!(fs.read_ino(ino, 0, 1 << 20).unwrap().as_slice(), data);
    }
    let stats = fs.stats_text();
    assert!(
        stats.contains("\nlookups_missing 0\ndaemon_opens 4\nopen_handles 0\n"),
        "{stats}"
    );
    // One decode per kernel; every read after a kernel's first is a hit (reads at or past
    // the end look nothing up).
    let total: usize = sample().iter().map(|k| k.2.len()).sum();
    assert!(
        stats.contains(&format!(
            "hits 3\nmisses 5\ndecodes 5\nbytes_cached {total}\n"
        )),
        "{stats}"
    );
}

#[test]
fn page_cache_reads_keep_kernels_larger_than_one_read() {
    let big: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    let kernels: Kernels = vec![("k#0", "gfx900", big.clone())];
    let (_d, mut fs) = mount_fs(
        &kernels,
        Compression::Zstd { level: 3 },
        &options(1 << 20, &[]),
    );
    page_cache_mode(&mut fs);
    let ino = attr(&fs, "k#0/gfx900.hsaco").ino;
    let mut got = Vec::new();
    while (got.len() as u64) < big.len() as u64 {
        let s = fs.read_ino(ino, got.len() as u64, 128 << 10).unwrap();
        got.extend_from_slice(s.as_slice());
    }
    assert!(got == big);
    assert!(fs.store().contains(crate::fs::store::KernelId {
        archive: 0,
        ordinal: 0
    }));
    let stats = fs.stats_text();
    assert!(
        stats.contains("\ndecodes 1\nbytes_cached 300000\n"),
        "{stats}"
    );
}

#[test]
fn concurrent_reads_of_a_small_kernel_share_one_decode() {
    let (_d, mut fs) = sample_mount();
    page_cache_mode(&mut fs);
    let f = attr(&fs, "bin/app#0/gfx90a:xnack+.hsaco").ino;
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = |offset: u64| -> ReadDone {
        let tx = tx.clone();
        Box::new(move |r| tx.send((offset, r.map(<[u8]>::to_vec))).unwrap())
    };
    // The first READ returns the decode; the second, before it runs, waits for it.
    let job = fs.read_ino_start(f, 0, 4, reader(0)).expect("a decode");
    assert!(fs.read_ino_start(f, 2998, 10, reader(2998)).is_none());
    assert!(rx.try_recv().is_err(), "nothing answered before the decode");
    fs.run_fill(job);
    let mut got: Vec<_> = rx.try_iter().collect();
    got.sort_by_key(|g| g.0);
    assert_eq!(got, [(0, Ok(vec![0xee; 4])), (2998, Ok(vec![0xee; 2]))]);
    assert_eq!(fs.cache_stats().decodes, 1);
    // Now kept: answered at once.
    assert!(fs.read_ino_start(f, 0, 1, reader(0)).is_none());
    assert_eq!(rx.try_recv().unwrap(), (0, Ok(vec![0xee])));
}

#[test]
fn many_concurrent_reads_of_a_small_kernel_decode_it_once_into_memory() {
    const N: usize = 8;
    let (_d, mut fs) = sample_mount();
    page_cache_mode(&mut fs);
    let f = attr(&fs, "bin/app#0/gfx90a:xnack+.hsaco").ino;
    let start = std::sync::Barrier::new(N);
    // Each reader runs the decode itself when it is the one that starts it.
    let got: Vec<Vec<u8>> = std::thread::scope(|s| {
        let readers: Vec<_> = (0..N)
            .map(|i| {
                let (fs, start) = (&fs, &start);
                s.spawn(move || {
                    start.wait();
                    fs.read_ino(f, i as u64, 1 << 20)
                        .unwrap()
                        .as_slice()
                        .to_vec()
                })
            })
            .collect();
        readers.into_iter().map(|r| r.join().unwrap()).collect()
    });
    for (i, bytes) in got.iter().enumerate() {
        assert_eq!(*bytes, vec![0xee; 3000 - i]);
    }
    let s = fs.cache_stats();
    assert_eq!(
        (s.decodes, s.hits + s.misses, s.bytes_cached),
        (1, N as u64, 3000)
    );
    assert_eq!(
        fs.store().live_bytes(),
        0,
        "kept in memory, no backing file"
    );
}

#[test]
fn small_kernels_in_memory_count_in_the_stores_one_bound() {
    let (_d, mut fs) = mount_fs(
        &sample(),
        Compression::Zstd { level: 3 },
        &options(3200, &[]),
    );
    page_cache_mode(&mut fs);
    let app = attr(&fs, "bin/app#0/gfx90a:xnack+.hsaco").ino;
    let b = attr(&fs, "lib/libb.so#1/gfx1100.hsaco").ino;
    assert_eq!(fs.read_ino(app, 0, 4).unwrap().as_slice(), [0xee; 4]);
    assert_eq!(fs.read_ino(b, 0, 6).unwrap().as_slice(), b"B-1100");
    let s = fs.cache_stats();
    assert_eq!((s.decodes, s.bytes_cached, s.evictions), (2, 3180, 0));
    // A third kernel does not fit beside both: the least recently used one goes.
    let a = attr(&fs, "lib/liba.so#0/gfx900.hsaco").ino;
    assert_eq!(fs.read_ino(a, 0, 5).unwrap().as_slice(), b"A-900");
    let s = fs.cache_stats();
    assert_eq!((s.decodes, s.bytes_cached, s.evictions), (3, 680, 1));
    assert_eq!(fs.read_ino(b, 6, 6).unwrap().as_slice(), b"B-1100");
    assert_eq!(fs.cache_stats().decodes, 3, "the most recent ones stayed");
}

#[test]
fn files_decoded_ahead_are_pinned_within_the_bound_until_opened() {
    const KEYS: [&str; 8] = ["k#0", "k#1", "k#2", "k#3", "k#4", "k#5", "k#6", "k#7"];
    let kernels: Kernels = (0..8)
        .map(|i| (KEYS[i], "gfx900", vec![i as u8; 1000]))
        .collect();
    let scratch = tempfile::tempdir().unwrap();
    let opts = FsOptions {
        backing: Placement::Scratch(scratch.path().to_owned()),
        ..options(4000, &[])
    };
    let (_d, fs) = mount_fs(&kernels, Compression::Zstd { level: 3 }, &opts);
    let ino = |i: usize| attr(&fs, &format!("{}/gfx900.hsaco", KEYS[i])).ino;
    let id = |i: u32| crate::fs::store::KernelId {
        archive: 0,
        ordinal: i,
    };
    assert_eq!(read_all(&fs, ino(0), 4096), vec![0; 1000]);
    assert!(
        fs.jobs_ahead_of(ino(0), 4).is_empty(),
        "one open is no scan"
    );
    assert_eq!(read_all(&fs, ino(1), 4096), vec![1; 1000]);
    // The second open continues a scan: files 2 and 3 are decoded ahead and pinned; their
    // pins take half the bound, so nothing more is decoded ahead.
    let jobs = fs.jobs_ahead_of(ino(1), 4);
    assert_eq!(jobs.len(), 2);
    for job in jobs {
        fs.run_fill(job);
    }
    assert_eq!(fs.store().pinned_bytes(), 2000);
    assert!(
        fs.continue_ahead().is_none(),
        "pins would exceed their share"
    );
    let s = fs.cache_stats();
    assert_eq!((s.decodes, s.bytes_cached), (4, 4000));
    // The store is full: a new kernel evicts the least recently used one not pinned.
    assert_eq!(read_all(&fs, ino(7), 4096), vec![7; 1000]);
    assert!(!fs.store().contains(id(0)) && fs.store().contains(id(1)));
    assert!(fs.store().contains(id(2)) && fs.store().contains(id(3)));
    // An open takes a pin: no decode, and the entry is an ordinary one from then on.
    assert_eq!(read_all(&fs, ino(2), 4096), vec![2; 1000]);
    assert_eq!(fs.cache_stats().decodes, 5);
    assert_eq!(fs.store().pinned_bytes(), 1000);
}

#[test]
fn a_kernel_that_fails_to_decode_ahead_is_not_decoded_ahead_again() {
    const KEYS: [&str; 4] = ["k#0", "k#1", "k#2", "k#3"];
    let kernels: Kernels = (0..4)
        .map(|i| (KEYS[i], "gfx900", vec![i as u8; 1000]))
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let path = write_archive(
        dir.path(),
        "c.kpack",
        Compression::Zstd { level: 3 },
        &kernels,
    );
    corrupt_kernel(&path, "k#2", "gfx900");
    let scratch = tempfile::tempdir().unwrap();
    let opts = FsOptions {
        backing: Placement::Scratch(scratch.path().to_owned()),
        ..options(1 << 20, &[])
    };
    let (fs, _) = KpackFs::new(vec![Arc::new(Archive::open(&path).unwrap())], &opts).unwrap();
    let ino = |i: usize| attr(&fs, &format!("{}/gfx900.hsaco", KEYS[i])).ino;
    assert_eq!(read_all(&fs, ino(0), 4096), vec![0; 1000]);
    assert!(fs.jobs_ahead_of(ino(0), 4).is_empty());
    assert_eq!(read_all(&fs, ino(1), 4096), vec![1; 1000]);
    for job in fs.jobs_ahead_of(ino(1), 4) {
        fs.run_fill(job);
    }
    assert_eq!(fs.cache_stats().decodes, 4, "k#2 failed, k#3 is pinned");
    // A decode thread goes on decoding ahead while nothing else waits: the kernel that failed
    // is not taken up again, or the thread would decode it for ever.
    assert!(fs.continue_ahead().is_none());
    assert_eq!(fs.cache_stats().decodes, 4);
    // An open still tries it, and fails as the decode ahead did.
    assert_eq!(fs.open(ino(2), libc::O_RDONLY).unwrap_err(), Errno::EIO);
    assert_eq!(fs.cache_stats().decodes, 5);
}

#[test]
fn opens_while_every_decode_thread_is_busy_still_move_their_scan() {
    const KEYS: [&str; 4] = ["k#0", "k#1", "k#2", "k#3"];
    let kernels: Kernels = (0..4)
        .map(|i| (KEYS[i], "gfx900", vec![i as u8; 1000]))
        .collect();
    let scratch = tempfile::tempdir().unwrap();
    let opts = FsOptions {
        backing: Placement::Scratch(scratch.path().to_owned()),
        ..options(1 << 20, &[])
    };
    let (_d, fs) = mount_fs(&kernels, Compression::Zstd { level: 3 }, &opts);
    let ino = |i: usize| attr(&fs, &format!("{}/gfx900.hsaco", KEYS[i])).ino;
    assert!(
        fs.jobs_ahead_of(ino(0), 4).is_empty(),
        "one open is no scan"
    );
    // The second open comes while every decode thread is busy: nothing starts now, but the
    // open continues the scan, so the thread that finishes next goes on ahead of it.
    assert!(fs.jobs_ahead_of(ino(1), 0).is_empty());
    let job = fs.continue_ahead().expect("the scan goes on past file 1");
    fs.run_fill(job);
    assert_eq!(fs.cache_stats().decodes, 1);
    assert_eq!(read_all(&fs, ino(2), 4096), vec![2; 1000]);
    assert_eq!(fs.cache_stats().decodes, 1, "file 2 was decoded ahead");
}
