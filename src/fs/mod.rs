//! The read-only filesystem over kpack archives, without FUSE in the loop.
//!
//! [`KpackFs`] answers lookups, attributes, directory listings, extended attributes and reads
//! with this module's own types ([`Attr`], [`Errno`], [`DirSink`], [`ReadSlice`]), so every
//! behaviour can be unit-tested by calling it directly. `fuse.rs` is the only file that knows
//! `fuser`; it translates these answers into kernel replies.
//!
//! The read path: `open` makes sure the kernel's decoded bytes exist as a backing file
//! (`backing.rs`, filled by one decode job of `fill.rs` and shared by every handle and thread) and
//! the handle holds that file. With FUSE passthrough the kernel then reads the file itself and
//! reads never reach the daemon; otherwise `KpackFs::read` is one `pread` of the handle's file
//! (no lookup by name, no cache lookup). In page-cache open mode ([`OpenMode`]) no file is
//! opened through the daemon: `KpackFs::read_ino_start` finds the kernel by inode in the store
//! (a backing file, or for a kernel of one READ its decoded bytes in memory); what has to be
//! decoded first it returns as work for the decode pool.
//!
//! Decoded kernels the mount keeps on its own account live in one place, the store
//! (`store.rs`: one LRU, one byte bound, pins for files decoded ahead of a scan); every decode
//! is a job in `KpackFs::fills`, the one single flight (`fill.rs`). Files held by open handles
//! are the handles' own.

pub mod backing;
pub mod cache_dir;
pub mod fill;
pub mod fuse;
pub mod gpus;
pub mod kernel;
pub mod mountinfo;
pub mod policy;
pub mod pool;
mod scan;
pub mod source;
pub mod store;
mod stream;
pub mod tree;

use crate::sync::lock;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use crate::archive::codec::SharedKernel;
use crate::archive::{Archive, KernelRef};
use backing::{BackingFile, Placement};
use fill::{Fill, OpenDone, OpenedFile, ReadDone};
use kernel::{KernelId, KernelSpec};
use scan::Scan;
use store::{Body, CacheStats, Store};
use tree::{Entry, FileNode, Ino, ROOT, Tree, TreeBuilder, TreeError};

pub use policy::{OpenMode, PAGE_CACHE_MEDIAN_MAX, WARM_OPENS_TO_PAGE_CACHE};
pub use tree::{Duplicate, NATIVE};

/// How long the kernel may trust entries, attributes and negative lookups. The archives are
/// immutable while mounted, so this is long: re-reads and repeated probes of missing arches
/// then never reach the daemon.
pub const TTL: Duration = Duration::from_secs(365 * 24 * 3600);

/// `st_blksize`: a hint to readers such as `cp` to ask for large chunks.
pub const BLKSIZE: u32 = 128 * 1024;

/// A POSIX error number, as the kernel expects it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Errno(pub i32);

impl Errno {
    pub const ENOENT: Errno = Errno(libc::ENOENT);
    pub const EIO: Errno = Errno(libc::EIO);
    pub const ENOMEM: Errno = Errno(libc::ENOMEM);
    pub const EBADF: Errno = Errno(libc::EBADF);
    pub const ENOTDIR: Errno = Errno(libc::ENOTDIR);
    pub const EISDIR: Errno = Errno(libc::EISDIR);
    pub const EINVAL: Errno = Errno(libc::EINVAL);
    pub const EROFS: Errno = Errno(libc::EROFS);
    pub const EACCES: Errno = Errno(libc::EACCES);
    pub const ERANGE: Errno = Errno(libc::ERANGE);
    pub const ENODATA: Errno = Errno(libc::ENODATA);
    pub const ENOSYS: Errno = Errno(libc::ENOSYS);
}

/// The one mapping of core errors to what a reader of the mount sees: an allocation that
/// failed is ENOMEM; everything else (a corrupt or changed archive, an I/O error, a kernel
/// that fails its digest) is EIO for that file.
impl From<&crate::Error> for Errno {
    fn from(e: &crate::Error) -> Errno {
        match e.kind() {
            crate::ErrorKind::OutOfMemory => Errno::ENOMEM,
            _ => Errno::EIO,
        }
    }
}

/// The kind of an inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Dir,
    File,
    Symlink,
}

/// Attributes of one inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attr {
    pub ino: Ino,
    pub kind: Kind,
    pub size: u64,
    /// 512-byte blocks.
    pub blocks: u64,
    pub perm: u16,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    /// Modification, change and access time: the archive file's modification time.
    pub mtime: SystemTime,
    pub blksize: u32,
}

/// The answer to a lookup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup {
    Found(Attr),
    /// No such name; the kernel may cache this (a negative entry).
    Missing,
}

/// Receives directory entries; returns `true` when it is full (the entry was not taken).
pub trait DirSink {
    fn add(&mut self, ino: Ino, next_offset: u64, kind: Kind, name: &str) -> bool;
}

/// `statfs` numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatFs {
    pub blocks: u64,
    pub files: u64,
    pub bsize: u32,
    pub namelen: u32,
    pub frsize: u32,
}

/// Bytes read from a kernel file.
#[derive(Debug, Clone)]
pub struct ReadSlice(Vec<u8>);

impl ReadSlice {
    pub fn as_slice(&self) -> &[u8] {
        &self.0
    }
}

/// In page-cache mode, kernels up to this size are decoded straight into the READ reply, with
/// no backing file (the largest READ the kernel sends by default is 128 KiB).
const DIRECT_READ_MAX: u64 = 128 << 10;

/// The piece size of [`KpackFs::each_kept_kernel`].
pub const PREFILL_PIECE: u64 = 1 << 20;

/// What the mount was asked for, besides its archives.
#[derive(Debug, Clone)]
pub struct FsOptions {
    /// Byte bound of the backing files kept for kernels no handle has open.
    pub cache_size: u64,
    /// Where backing files live.
    pub backing: Placement,
    /// Most backing files kept open for kernels no handle has open (each is a descriptor):
    /// [`backing::descriptor_budget`] of the limit the program raised at start-up
    /// ([`backing::raise_open_file_limit`]).
    pub files_max: usize,
    /// Device ISAs, in order, for `native.hsaco`.
    pub gpus: Vec<String>,
    /// Owner of every inode.
    pub uid: u32,
    pub gid: u32,
}

/// A handle made by [`KpackFs::add_handle`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NewHandle {
    pub fh: u64,
    /// Every byte of its file is decoded and checked.
    pub complete: bool,
    /// Its file was kept from an earlier open, not made or joined by a decode job now.
    pub warm: bool,
}

/// Work to run off the request threads (on the decode pool) with [`KpackFs::run_fill`]: a
/// kernel's one decode job.
pub struct FillJob {
    ino: Ino,
    id: KernelId,
    fill: Arc<Fill>,
    make: Make,
}

/// What a decode job makes.
#[derive(Debug, Clone, Copy)]
enum Make {
    /// A backing file, for opens.
    File,
    /// A backing file for READs by inode (page-cache mode), which no handle holds.
    FileForRead,
    /// The decoded bytes in memory: a small kernel decoded for READs by inode (see
    /// [`KpackFs::decodes_into_reply`]).
    Bytes,
    /// A backing file decoded ahead of a scan (see [`KpackFs::decode_ahead`]), pinned in the
    /// store until its first open; `reserved` bytes of pins were reserved for it.
    Ahead { reserved: u64 },
}

/// Where a kernel's backing file comes from, before any decode (see
/// [`KpackFs::cached_or_located`]). Made once per decode and taken apart at once, so the size of
/// its larger variant costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
enum Source<'a> {
    /// A valid file found in the cache directory.
    Dir(Arc<BackingFile>),
    /// The located kernel and the spec of the file to make for it.
    Located(KernelRef<'a>, KernelSpec),
}

/// What a request found (see [`KpackFs::find_or_start`]).
enum Found {
    /// The kernel, held in the store.
    Held(Body),
    /// Its decode job, and the job to run when the request started it.
    Job(Arc<Fill>, Option<FillJob>),
}

/// How a kernel's bytes are produced.
enum Plan {
    /// Checked whole, then served: its digest covers only the decoded bytes (or it is stored
    /// as is, scheme `none`).
    Whole,
    /// Decoded in steps from this frame, `.0[.1..]` (verified against its digest when it has
    /// one), served as it goes.
    Stream(Vec<u8>, usize),
}

/// The filesystem.
pub struct KpackFs {
    tree: Tree,
    archives: Vec<Arc<Archive>>,
    /// Per archive: what its cache-directory keys start with (see [`KpackFs::cache_key`]).
    archive_tokens: Vec<Vec<u8>>,
    store: Store,
    /// OPEN requests answered (in page-cache mode only the ones before the kernel stopped
    /// sending them).
    opens: AtomicU64,
    /// Handles made while their kernel was still decoding (they read through the daemon).
    opens_while_decoding: AtomicU64,
    handles: Mutex<HashMap<u64, OpenedFile>>,
    /// Decode jobs running now, one per kernel (see `fill.rs`): the one single flight of every
    /// decode (opens, reads by inode, small kernels, decodes ahead).
    fills: Mutex<HashMap<KernelId, Arc<Fill>>>,
    next_fh: AtomicU64,
    /// LOOKUP requests answered, and how many of them found nothing. Reported in
    /// `user.kpack.stats` so that the effect of the kernel's entry caching can be observed.
    lookups: AtomicU64,
    lookups_missing: AtomicU64,
    /// READ requests the daemon served (none while passthrough is on).
    reads: AtomicU64,
    /// Of those, reads of a kernel still being decoded (answered at once or once their bytes
    /// were written).
    reads_while_decoding: Arc<AtomicU64>,
    /// Kernels decoded from an archive (a backing file found valid in the cache directory is
    /// not a decode).
    decodes: AtomicU64,
    /// Opens walking the files in order, and the decodes started ahead of them.
    scan: Scan,
    uid: u32,
    gid: u32,
    /// Time shown on directories: the newest archive's modification time.
    dir_time: SystemTime,
    /// More `name value` lines for `user.kpack.stats` from the program (remote sources' request
    /// counters): the library knows nothing of where the archives' bytes come from.
    extra_stats: Vec<StatsLines>,
    /// Every decode, in order, with whether its kernel was held when it started, for the
    /// model test.
    #[cfg(test)]
    decode_log: Mutex<Vec<(KernelId, bool)>>,
    /// Faults the model test switches on to show it catches them.
    #[cfg(test)]
    fault: Mutex<Fault>,
}

/// A fault in the read path, for the model test (see `model_tests.rs`).
#[cfg(test)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Fault {
    #[default]
    None,
    /// A request does not look in the store, so a kept kernel is decoded again.
    IgnoreStore,
}

/// A producer of `name value` lines for `user.kpack.stats`.
pub type StatsLines = Box<dyn Fn() -> String + Send + Sync>;

impl KpackFs {
    /// Builds the tree over `archives` (merged in order; the first to provide a (key, arch)
    /// wins). Returns the filesystem and the dropped duplicates.
    pub fn new(
        archives: Vec<Arc<Archive>>,
        opts: &FsOptions,
    ) -> Result<(KpackFs, Vec<Duplicate>), TreeError> {
        KpackFs::with_keys(archives, opts, &|_| true)
    }

    /// Like [`KpackFs::new`], showing only the keys for which `keep` is true.
    pub fn with_keys(
        archives: Vec<Arc<Archive>>,
        opts: &FsOptions,
        keep: &dyn Fn(&str) -> bool,
    ) -> Result<(KpackFs, Vec<Duplicate>), TreeError> {
        let mut builder = TreeBuilder::new();
        let mut duplicates = Vec::new();
        for (i, a) in archives.iter().enumerate() {
            duplicates.extend(builder.add_archive_keys(i as u32, a, keep)?);
        }
        let tree = builder.finish(&opts.gpus);
        let dir_time = archives
            .iter()
            .filter_map(|a| a.modified())
            .max()
            .unwrap_or(SystemTime::UNIX_EPOCH);
        let store =
            Store::new(&opts.backing, opts.cache_size, opts.files_max).unwrap_or_else(|e| {
                log::error!("cannot keep backing files as asked ({e}); keeping them in memory");
                Store::new(&Placement::Memory, opts.cache_size, opts.files_max)
                    .expect("a memory store needs no I/O")
            });
        let archive_tokens = archives.iter().map(|a| archive_token(a)).collect();
        let fs = KpackFs {
            tree,
            archives,
            archive_tokens,
            store,
            opens: AtomicU64::new(0),
            opens_while_decoding: AtomicU64::new(0),
            handles: Mutex::new(HashMap::new()),
            fills: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            lookups: AtomicU64::new(0),
            lookups_missing: AtomicU64::new(0),
            reads: AtomicU64::new(0),
            reads_while_decoding: Arc::new(AtomicU64::new(0)),
            decodes: AtomicU64::new(0),
            scan: Scan::default(),
            uid: opts.uid,
            gid: opts.gid,
            dir_time,
            extra_stats: Vec::new(),
            #[cfg(test)]
            decode_log: Mutex::new(Vec::new()),
            #[cfg(test)]
            fault: Mutex::new(Fault::None),
        };
        Ok((fs, duplicates))
    }

    /// Appends `lines()` to every `user.kpack.stats` answer.
    pub fn add_stats(&mut self, lines: StatsLines) {
        self.extra_stats.push(lines);
    }

    pub fn tree(&self) -> &Tree {
        &self.tree
    }

    /// The store's counters, with `decodes` counting kernels decoded from archives.
    pub fn cache_stats(&self) -> CacheStats {
        CacheStats {
            decodes: self.decodes.load(Ordering::Relaxed),
            ..self.store.stats()
        }
    }

    /// The decoded kernels this mount keeps, and where their files live.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The median decoded size of the tree's kernel files (the lower one of the middle two);
    /// `None` for an empty tree.
    pub fn median_kernel_size(&self) -> Option<u64> {
        let mut sizes: Vec<u64> = self.tree.files().iter().map(|f| f.size).collect();
        if sizes.is_empty() {
            return None;
        }
        let mid = (sizes.len() - 1) / 2;
        Some(*sizes.select_nth_unstable(mid).1)
    }

    /// The answer to an OPEN in page-cache mode: the errors `open` would give (so a bad open
    /// fails the same way in both modes), else ENOSYS, which tells the kernel to open every
    /// file of the mount by itself from now on, with no handle and no RELEASE.
    pub fn refuse_open(&self, ino: Ino, flags: i32) -> Errno {
        self.opens.fetch_add(1, Ordering::Relaxed);
        match self.openable(ino, flags) {
            Ok(_) => Errno::ENOSYS,
            Err(e) => e,
        }
    }

    /// A kernel that fits in one READ is decoded straight into the reply, with no backing file
    /// (create, reserve, unlink would cost more than the decode); its bytes are kept in the
    /// store, in memory. A cache directory still gets its file.
    fn decodes_into_reply(&self, f: &FileNode) -> bool {
        f.size <= DIRECT_READ_MAX && !self.store.is_cache_dir()
    }

    /// Reads by inode and waits for the bytes (see [`read_ino_start`](Self::read_ino_start)),
    /// running the kernel's decode on this thread when no other thread runs it.
    pub fn read_ino(&self, ino: Ino, offset: u64, size: u32) -> Result<ReadSlice, Errno> {
        let (tx, rx) = std::sync::mpsc::channel();
        let done: ReadDone = Box::new(move |r| drop(tx.send(r.map(<[u8]>::to_vec))));
        if let Some(job) = self.read_ino_start(ino, offset, size, done) {
            self.run_fill(job);
        }
        rx.recv().map_err(|_| Errno::EIO)?.map(ReadSlice)
    }

    /// Reads by inode, for files the kernel opened without the daemon (page-cache mode): from
    /// the store (a backing file, or a small kernel's bytes in memory), else through the
    /// kernel's decode job, started when none runs: a kernel that fits in one READ is decoded
    /// into memory, a larger one into its backing file. A READ that joins a job is answered as
    /// soon as its bytes are decoded, as for a handle opened while decoding. What must be
    /// decoded is the returned job, for the caller to run off the request threads: nothing here
    /// decodes. The kernel keeps the bytes in its page cache, so a file is read here about once.
    pub fn read_ino_start(
        &self,
        ino: Ino,
        offset: u64,
        size: u32,
        done: ReadDone,
    ) -> Option<FillJob> {
        self.reads.fetch_add(1, Ordering::Relaxed);
        let file = match self.tree.entry(ino) {
            Some(Entry::File(f)) => f,
            other => {
                done(Err(match other {
                    Some(Entry::Dir(_)) => Errno::EISDIR,
                    Some(_) => Errno::EINVAL,
                    None => Errno::ENOENT,
                }));
                return None;
            }
        };
        if offset >= file.size {
            done(Ok(&[]));
            return None;
        }
        // A small kernel decoded into a backing file before the mount turned to page-cache
        // mode is read from that file: nothing is decoded twice while it is held.
        let make = if self.decodes_into_reply(file) {
            Make::Bytes
        } else {
            Make::FileForRead
        };
        let found = {
            let fills = lock(&self.fills);
            self.find_or_start(fills, ino, file, make)
        };
        match found {
            Found::Held(body) => {
                let end = offset.saturating_add(u64::from(size));
                match self.body_len_matches(file, &body) {
                    Ok(()) => body.with_range(offset, end, done),
                    Err(e) => done(Err(e)),
                }
                None
            }
            Found::Job(fill, job) => {
                if fill.kernel_len().is_some_and(|len| len != file.size) {
                    let why = "its kernel's job is for another size";
                    done(Err(self.failed(file, &why, Errno::EIO)));
                    return job;
                }
                if !fill.is_done() {
                    self.reads_while_decoding.fetch_add(1, Ordering::Relaxed);
                }
                fill.read(file.size, offset, size, done);
                job
            }
        }
    }

    /// With the map of jobs locked (so that a job cannot finish in between): the kernel's body
    /// held in the store, else its job, joined or (returned with it) started to make `make`.
    /// Counts the request: a hit when it finds the kernel complete, else a miss.
    fn find_or_start(
        &self,
        mut fills: std::sync::MutexGuard<'_, HashMap<KernelId, Arc<Fill>>>,
        ino: Ino,
        file: &FileNode,
        make: Make,
    ) -> Found {
        let id = kernel_id(file);
        #[cfg(test)]
        let held = self
            .store
            .take(id)
            .filter(|_| !self.faulty(Fault::IgnoreStore));
        #[cfg(not(test))]
        let held = self.store.take(id);
        // An open needs a file: bytes in memory are written to one by a job (not decoded).
        let wanted = match (&held, make) {
            (Some(Body::Bytes(_)), Make::File) => None,
            _ => held,
        };
        if let Some(body) = wanted {
            self.store.count(true);
            // Marking a cache directory's file as used may write its inode: not under the lock.
            drop(fills);
            if let Body::File(b) = &body {
                self.store.touch(b);
            }
            return Found::Held(body);
        }
        if let Some(f) = fills.get(&id) {
            self.store.count(f.is_done());
            return Found::Job(f.clone(), None);
        }
        self.store.count(false);
        let fill = Arc::new(Fill::for_kernel(file.size));
        fills.insert(id, fill.clone());
        let job = FillJob {
            ino,
            id,
            fill: fill.clone(),
            make,
        };
        Found::Job(fill, Some(job))
    }

    /// Decodes a small kernel into memory (on a decode-pool thread).
    fn decode_small(&self, file: &FileNode) -> Result<Arc<[u8]>, Errno> {
        self.count_decode(kernel_id(file));
        let kref = self.locate_for_read(file)?;
        let buf = self.decode_with(file, &kref, |n| Some(SharedKernel::new(n)))?;
        // SAFETY: a decode returns its buffer only once every byte is written.
        Ok(unsafe { buf.into_filled() })
    }

    /// EIO (logged) unless `body` holds `file`'s size (see [`check_len`](Self::check_len)).
    fn body_len_matches(&self, file: &FileNode, body: &Body) -> Result<(), Errno> {
        match body {
            Body::File(b) => self.check_len(file, b),
            Body::Bytes(b) if b.len() as u64 == file.size => Ok(()),
            Body::Bytes(b) => {
                let why = format!(
                    "its kernel decodes to {} bytes, the TOC says {}",
                    b.len(),
                    file.size
                );
                Err(self.failed(file, &why, Errno::EIO))
            }
        }
    }

    /// Counts a decode of kernel `id` from its archive.
    fn count_decode(&self, id: KernelId) {
        self.decodes.fetch_add(1, Ordering::Relaxed);
        #[cfg(test)]
        {
            let held = self.holds(id);
            lock(&self.decode_log).push((id, held));
        }
        #[cfg(not(test))]
        let _ = id;
    }

    #[cfg(test)]
    fn faulty(&self, fault: Fault) -> bool {
        *lock(&self.fault) == fault
    }

    /// Whether kernel `id`'s decoded bytes are held: by the store, or by anyone through a
    /// file the store made.
    #[cfg(test)]
    fn holds(&self, id: KernelId) -> bool {
        self.store.contains(id)
    }

    /// Hands `put` the bytes of every kept kernel (those an open would find decoded), in
    /// pieces of at most [`PREFILL_PIECE`] bytes: `put(ino, offset, bytes)`. Inodes are taken
    /// in order from `from` on, then from the first: a reader walking the tree from there
    /// finds the files ahead of it done first. Stops at the first error of `put` or of a read.
    /// Returns the kernels and bytes handed.
    pub fn each_kept_kernel(
        &self,
        from: Ino,
        mut put: impl FnMut(Ino, u64, &[u8]) -> std::io::Result<()>,
    ) -> std::io::Result<(u64, u64)> {
        let (mut kernels, mut bytes) = (0, 0);
        let last = self.tree.len();
        let from = from.clamp(1, last.max(1));
        for ino in (from..=last).chain(1..from) {
            let Some(Entry::File(file)) = self.tree.entry(ino) else {
                continue;
            };
            let Some(body) = self.store.peek(kernel_id(file)) else {
                continue;
            };
            let mut offset = 0;
            while offset < body.len() {
                let end = offset.saturating_add(PREFILL_PIECE);
                let n = body.with_range(offset, end, |r| -> std::io::Result<u64> {
                    let piece = r.map_err(|e| std::io::Error::from_raw_os_error(e.0))?;
                    put(ino, offset, piece)?;
                    Ok(piece.len() as u64)
                })?;
                if n == 0 {
                    break;
                }
                offset += n;
            }
            kernels += 1;
            bytes += offset;
        }
        Ok((kernels, bytes))
    }

    /// Number of open file handles.
    pub fn open_handles(&self) -> usize {
        lock(&self.handles).len()
    }

    fn archive_of(&self, f: &FileNode) -> &Archive {
        &self.archives[f.archive as usize]
    }

    fn file_time(&self, f: &FileNode) -> SystemTime {
        self.archive_of(f)
            .modified()
            .unwrap_or(SystemTime::UNIX_EPOCH)
    }

    /// The (key, arch) names of a file.
    fn names_of(&self, f: &FileNode) -> (&str, &str) {
        let archive = self.archive_of(f);
        let binary = archive
            .binary(f.binary as usize)
            .expect("the tree holds indices of its archives' entries");
        let entry = binary
            .arch(f.entry as usize)
            .expect("the tree holds indices of its archives' entries");
        (binary.key, entry.arch)
    }

    fn attr_of(&self, ino: Ino, entry: Entry<'_>) -> Attr {
        let (kind, size, perm, nlink, mtime) = match entry {
            Entry::Dir(d) => (Kind::Dir, 0, 0o555, 2 + d.subdirs(), self.dir_time),
            Entry::File(f) => (Kind::File, f.size, 0o444, 1, self.file_time(f)),
            Entry::Link(target) => {
                let name_len = self.tree.name(target).map_or(0, |n| n.len() as u64);
                (Kind::Symlink, name_len, 0o777, 1, self.dir_time)
            }
        };
        Attr {
            ino,
            kind,
            size,
            blocks: size.div_ceil(512),
            perm,
            nlink,
            uid: self.uid,
            gid: self.gid,
            mtime,
            blksize: BLKSIZE,
        }
    }

    pub fn getattr(&self, ino: Ino) -> Result<Attr, Errno> {
        let entry = self.tree.entry(ino).ok_or(Errno::ENOENT)?;
        Ok(self.attr_of(ino, entry))
    }

    /// `access(2)` on `ino`, from the modes the tree shows: the mount is mounted without
    /// `default_permissions` (every mode is readable by all, so the kernel's check of each path
    /// component costs time and decides nothing), which sends `access` here. Writing is EROFS;
    /// executing needs an execute bit, as the kernel would require.
    pub fn access(&self, ino: Ino, write: bool, exec: bool) -> Result<(), Errno> {
        let attr = self.getattr(ino)?;
        if write {
            Err(Errno::EROFS)
        } else if exec && attr.perm & 0o111 == 0 {
            Err(Errno::EACCES)
        } else {
            Ok(())
        }
    }

    /// Looks `name` up in directory `parent`: an entry, `native.hsaco`, or a fallback link.
    pub fn lookup(&self, parent: Ino, name: &[u8]) -> Result<Lookup, Errno> {
        self.lookups.fetch_add(1, Ordering::Relaxed);
        let found = self.resolve(parent, name);
        if let Ok(Lookup::Missing) = found {
            self.lookups_missing.fetch_add(1, Ordering::Relaxed);
        }
        found
    }

    fn resolve(&self, parent: Ino, name: &[u8]) -> Result<Lookup, Errno> {
        let dir = match self.tree.entry(parent).ok_or(Errno::ENOENT)? {
            Entry::Dir(d) => d,
            _ => return Err(Errno::ENOTDIR),
        };
        let Ok(name) = std::str::from_utf8(name) else {
            return Ok(Lookup::Missing);
        };
        let ino = if let Some(ino) = self.tree.child(dir, name) {
            ino
        } else if let (NATIVE, Some(target)) = (name, dir.native()) {
            self.tree.link_to(target)
        } else if let Some(target) = self.tree.fallback(dir, name) {
            self.tree.link_to(target)
        } else {
            return Ok(Lookup::Missing);
        };
        self.getattr(ino).map(Lookup::Found)
    }

    /// The target of a link: the sibling file's name.
    pub fn readlink(&self, ino: Ino) -> Result<Vec<u8>, Errno> {
        match self.tree.entry(ino).ok_or(Errno::ENOENT)? {
            Entry::Link(target) => Ok(self
                .tree
                .name(target)
                .ok_or(Errno::EIO)?
                .as_bytes()
                .to_vec()),
            _ => Err(Errno::EINVAL),
        }
    }

    /// Checks that `ino` may be opened with `flags` (read-only, a regular file) and returns
    /// the file; no decoding.
    fn openable(&self, ino: Ino, flags: i32) -> Result<&FileNode, Errno> {
        if flags & libc::O_ACCMODE != libc::O_RDONLY || flags & libc::O_TRUNC != 0 {
            return Err(Errno::EROFS);
        }
        match self.tree.entry(ino).ok_or(Errno::ENOENT)? {
            Entry::File(f) => Ok(f),
            Entry::Dir(_) => Err(Errno::EISDIR),
            Entry::Link(_) => Err(Errno::EINVAL),
        }
    }

    /// Opens a file for reading (any write access is EROFS) and waits for it: makes sure its
    /// backing file exists, decoding the kernel on this thread if no other is, and returns the
    /// new handle. A kernel that cannot be decoded fails here, with EIO. (The mount itself uses
    /// [`open_start`](Self::open_start), which never waits.)
    pub fn open(&self, ino: Ino, flags: i32) -> Result<u64, Errno> {
        let (tx, rx) = std::sync::mpsc::channel();
        let done = Box::new(move |r| drop(tx.send(r)));
        if let Some(job) = self.open_start(ino, flags, false, done) {
            self.run_fill(job);
        }
        let opened = rx.recv().map_err(|_| Errno::EIO)??;
        Ok(self.add_handle(opened).fh)
    }

    /// Starts an open without waiting: `done` gets the file at once when it is stored, when
    /// its decode starts streaming, or when the decode completes (a kernel that must be
    /// checked whole first), or the error. A returned job must be run
    /// ([`run_fill`](Self::run_fill)), off the request threads: it is the kernel's one decode,
    /// which every open of the kernel meanwhile joins. [`add_handle`](Self::add_handle) turns
    /// the answer into a handle. `passthrough`: the kernel would read a complete file itself.
    pub fn open_start(
        &self,
        ino: Ino,
        flags: i32,
        passthrough: bool,
        done: OpenDone,
    ) -> Option<FillJob> {
        self.opens.fetch_add(1, Ordering::Relaxed);
        let file = match self.openable(ino, flags) {
            Ok(f) => f,
            Err(e) => {
                done(Err(e));
                return None;
            }
        };
        let in_scan = self.scan.opened(ino).is_some();
        if file.size == 0 {
            done(self.empty_backing(file).map(OpenedFile::complete));
            return None;
        }
        // An open that continues a scan, while files are decoded ahead of it, gets the complete
        // file: its reader gains nothing from the first bytes early (the decode threads are
        // busy either way) and much from passthrough, which a handle opened before the file is
        // complete cannot use.
        let whole = in_scan && self.decodes_ahead() && passthrough;
        self.start_or_join(ino, file, whole, done)
    }

    /// Answers `done` with the kernel's complete file from the store, or joins its decode job,
    /// or starts one (returned, to be run); with `whole`, `done` waits for the complete file.
    /// A file decoded ahead is taken from its pin.
    fn start_or_join(
        &self,
        ino: Ino,
        file: &FileNode,
        whole: bool,
        done: OpenDone,
    ) -> Option<FillJob> {
        // The job's file is checked once it is there (see `check_len`).
        let size = file.size;
        let name = self.name_for_log(file);
        let mut done: OpenDone = Box::new(move |r: Result<OpenedFile, Errno>| {
            done(r.and_then(|o| {
                len_matches(&o.backing, size, &name)?;
                Ok(o)
            }))
        });
        loop {
            let found = {
                let fills = lock(&self.fills);
                self.find_or_start(fills, ino, file, Make::File)
            };
            let (fill, job) = match found {
                Found::Held(Body::File(b)) => {
                    done(Ok(OpenedFile::complete(b)));
                    return None;
                }
                Found::Held(Body::Bytes(_)) => unreachable!("an open is never given bytes"),
                Found::Job(fill, job) => (fill, job),
            };
            match fill.join(whole, done) {
                Ok(()) => return job,
                // The job it found ended with the kernel in memory, and has left the map of
                // jobs: the next round finds the bytes and starts a job that writes them to a
                // file.
                Err(back) => done = back,
            }
        }
    }

    /// After an open of `ino`: when it continues a scan (see `scan.rs`), the decode jobs of the
    /// first files past the scan's front that are neither decoded nor decoding, one for each of
    /// the `idle_workers` decode threads, up to [`scan::MAX_RUNNING`] running at once. No open
    /// waits for them; the opens that come for their files join them like any decode (and, as
    /// they continue the scan, get the complete file: see `open_start`).
    pub fn decode_ahead(&self, ino: Ino, idle_workers: usize) -> Vec<FillJob> {
        // `open_start` noted the open in the scan.
        if !matches!(self.tree.entry(ino), Some(Entry::File(_))) || self.scan.front().is_none() {
            return Vec::new();
        }
        (0..idle_workers)
            .map_while(|_| self.continue_ahead())
            .collect()
    }

    /// While the scan the last open continued goes on, the next decode ahead of it: the first
    /// file within [`scan::WINDOW`] inodes past its front, of at most a [`scan::CACHE_SHARE`]
    /// of the cache, that is neither decoded nor decoding (a decode thread that just finished
    /// a job asks, so it stays busy until the readers open their next files).
    /// Never with memory backing: its memory cannot be reclaimed, so nothing is decoded into
    /// it before it is asked for.
    ///
    /// Its file is pinned in the store until its first open, and the pins count in the
    /// store's bound: when they (with the decodes ahead running) would take more than their
    /// share of it ([`store::PIN_SHARE`]), nothing more is decoded ahead until opens take
    /// them. Pins the scan can no longer reach (more than [`scan::WINDOW`] inodes from its
    /// front) are released first.
    pub fn continue_ahead(&self) -> Option<FillJob> {
        let front = self.scan.front()?;
        if !self.decodes_ahead() || !self.scan.claim() {
            return None;
        }
        self.store
            .unpin_unless(|tag| tag.abs_diff(front) <= scan::WINDOW);
        let largest = self.store.stats().capacity / scan::CACHE_SHARE;
        for ino in front + 1..=front + scan::WINDOW {
            let Some(Entry::File(file)) = self.tree.entry(ino) else {
                continue;
            };
            let id = kernel_id(file);
            let mut fills = lock(&self.fills);
            if file.size == 0
                || file.size > largest
                || self.store.contains(id)
                || fills.contains_key(&id)
            {
                continue;
            }
            if !self.store.reserve_pin(file.size) {
                break;
            }
            let fill = Arc::new(Fill::for_kernel(file.size));
            fills.insert(id, fill.clone());
            drop(fills);
            self.scan.started.fetch_add(1, Ordering::Relaxed);
            self.prefetch_after(ino, front + scan::WINDOW);
            return Some(FillJob {
                ino,
                id,
                fill,
                make: Make::Ahead {
                    reserved: file.size,
                },
            });
        }
        self.scan.release();
        None
    }

    /// Asks the archives to read ahead the stored bytes of the next [`scan::PREFETCH`] files
    /// past `ino` (up to `last`) that are neither decoded nor decoding: the decode thread that
    /// takes one of them next finds its frame in the page cache instead of waiting on the disk
    /// (archives are read with random-access advice, so nothing else reads ahead of a scan).
    fn prefetch_after(&self, ino: Ino, last: Ino) {
        let mut hinted = 0;
        for next in ino + 1..=last {
            if hinted == scan::PREFETCH {
                return;
            }
            let Some(Entry::File(file)) = self.tree.entry(next) else {
                continue;
            };
            let id = kernel_id(file);
            if file.stored_size == 0
                || self.store.contains(id)
                || lock(&self.fills).contains_key(&id)
            {
                continue;
            }
            self.archive_of(file)
                .will_need_at(file.binary as usize, file.entry as usize);
            hinted += 1;
        }
    }

    /// Whether files are decoded ahead of scans: not when turned off (as in page-cache mode,
    /// where no open walks the files), or with memory backing.
    fn decodes_ahead(&self) -> bool {
        self.scan.enabled.load(Ordering::Relaxed) && !self.store.in_memory()
    }

    /// Turns decoding ahead of scans on or off (on by default).
    pub fn set_decode_ahead(&self, on: bool) {
        self.scan.enabled.store(on, Ordering::Relaxed);
    }

    /// Runs a job to its end, answering everyone waiting on it: what it made is kept in the
    /// store (pinned, for a decode ahead), then the job leaves the map of jobs, then its
    /// waiters are answered. A later request finds the kernel in the store, or (after a
    /// failure, or when the store could not keep it) starts a new job. Opens that waited for a
    /// job that decoded into memory get a file written from its bytes.
    pub fn run_fill(&self, job: FillJob) {
        let FillJob {
            ino,
            id,
            fill,
            make,
        } = job;
        let Some(Entry::File(file)) = self.tree.entry(ino) else {
            unreachable!("a job is made for a file of the tree");
        };
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match make {
            Make::Bytes => self.decode_small(file).map(|b| (Body::Bytes(b), true)),
            Make::File | Make::FileForRead | Make::Ahead { .. } => self
                .fill_kernel(file, &fill)
                .map(|(b, keep)| (Body::File(b), keep)),
        }))
        .unwrap_or_else(|_| {
            log::error!("a decode job panicked");
            Err(Errno::EIO)
        });
        match (&result, make) {
            (Ok((body, true)), _) => self.hold(ino, id, body, make),
            (_, Make::Ahead { reserved }) => self.store.cancel_pin(reserved),
            _ => {}
        }
        lock(&self.fills).remove(&id);
        let reopen = match &result {
            Ok((body, _)) => fill.complete(body),
            Err(e) => {
                fill.fail(*e);
                Vec::new()
            }
        };
        if let Make::Ahead { .. } = make {
            self.scan.release();
        }
        self.store.tidy();
        if let (false, Ok((Body::Bytes(bytes), _))) = (reopen.is_empty(), &result) {
            self.reopen(id, file, bytes, reopen);
        }
    }

    /// Answers the opens that waited for a job that decoded into memory: with a file written
    /// from its bytes (kept in the store in their place), or the error of making it.
    fn reopen(&self, id: KernelId, file: &FileNode, bytes: &[u8], opens: Vec<OpenDone>) {
        let made = self.file_from_bytes(file, bytes).map(|(b, keep)| {
            if keep {
                self.store.keep(id, Body::File(b.clone()));
            }
            b
        });
        for done in opens {
            done(made.clone().map(OpenedFile::complete));
        }
    }

    /// Keeps what a job made in the store: pinned for a decode ahead (its reservation becomes
    /// the pin). A file for READs by inode that the store cannot keep (larger than its bound)
    /// is held aside, since no handle holds it for the READs that follow.
    fn hold(&self, ino: Ino, id: KernelId, body: &Body, make: Make) {
        if let Make::Ahead { reserved } = make {
            self.store.keep_pinned(id, body.clone(), ino, reserved);
            return;
        }
        if !self.store.keep(id, body.clone()) && matches!(make, Make::FileForRead) {
            if let Body::File(f) = body {
                self.store.hold_oversized(id, f.clone());
            }
        }
    }

    /// Makes the backing file of a kernel: from its bytes held in memory, from the cache
    /// directory, decoded in steps (serving readers through `fill` as it goes), or decoded
    /// whole. Returns it with whether the store may keep it (see [`Store::finish`]).
    fn fill_kernel(
        &self,
        file: &FileNode,
        fill: &Arc<Fill>,
    ) -> Result<(Arc<BackingFile>, bool), Errno> {
        if let Some(Body::Bytes(bytes)) = self.store.take(kernel_id(file)) {
            return self.file_from_bytes(file, &bytes);
        }
        let (kref, spec) = match self.cached_or_located(file)? {
            Source::Dir(found) => return Ok((found, true)),
            Source::Located(kref, spec) => (kref, spec),
        };
        let (buf, start) = match self.plan(file, &kref)? {
            Plan::Whole => return self.write_whole(file, &kref, &spec),
            Plan::Stream(buf, start) => (buf, start),
        };
        // read_verified_frame checked that the frame can produce this many bytes, so the space
        // reserved here is what the frame really needs.
        let mut pending = self.store.begin(&spec)?;
        fill.streaming(pending.backing());
        // Every step is published as it is decoded, the last one too: keeping the file (a
        // cache directory hashes, records and renames it) is no reader's business, and a
        // failure to keep it only means the file is not kept.
        let frame = &buf[start..];
        let decoded = stream::decode_into(frame, spec.len, &mut pending, fill);
        stream::keep_frame_buffer(buf);
        decoded.map_err(|e| self.failed(file, &e, Errno::EIO))?;
        Ok(self.store.finish(&spec, pending))
    }

    /// A backing file of a kernel decoded into memory (for an open, which needs a file): its
    /// bytes written, nothing decoded.
    fn file_from_bytes(
        &self,
        file: &FileNode,
        bytes: &[u8],
    ) -> Result<(Arc<BackingFile>, bool), Errno> {
        let spec = self.spec_of(file)?;
        let mut pending = self.store.begin(&spec)?;
        pending
            .write_at(0, bytes)
            .map_err(|e| self.failed(file, &e, Errno::EIO))?;
        Ok(self.store.finish(&spec, pending))
    }

    /// What making a kernel's backing file starts from: a valid file in the cache directory,
    /// else the kernel located (counted as a decode) with the spec of its file. Located once,
    /// with both digests (one read when they come from the file): the kernel's for the cache
    /// directory, the frame's for the decode. A failure to locate it is reported only if the
    /// cache directory cannot serve the kernel either.
    fn cached_or_located<'a>(&'a self, file: &FileNode) -> Result<Source<'a>, Errno> {
        let archive = self.archive_of(file);
        let located = archive.locate_at(file.binary as usize, file.entry as usize);
        let spec = match &located {
            Ok(kref) => self.spec_with(file, kref.digest),
            Err(_) => self.spec_of(file)?,
        };
        if let Some(found) = self.store.find_in_dir(&spec) {
            return Ok(Source::Dir(found));
        }
        self.count_decode(spec.id);
        Ok(Source::Located(self.checked(file, located)?, spec))
    }

    /// Whether `file` streams, and its frame if so: kernels whose frame digest matched (before
    /// anything is decoded) and kernels without any digest. Bytes are never served before they
    /// are checked: a kernel whose only digest is of its decoded bytes is decoded whole.
    fn plan(&self, file: &FileNode, kref: &KernelRef<'_>) -> Result<Plan, Errno> {
        let archive = self.archive_of(file);
        if archive.scheme() != crate::archive::format::Scheme::ZstdPerKernel {
            return Ok(Plan::Whole);
        }
        let fail = |e: &crate::Error| self.failed(file, e, Errno::from(e));
        // A frame digest vouches for every byte the frame decodes to; a digest of the decoded
        // bytes alone can only be checked once all of them are out.
        if kref.digest.is_some() && kref.frame_digest.is_none() {
            return Ok(Plan::Whole);
        }
        let mut frame = stream::frame_buffer();
        let start = archive
            .read_verified_frame(kref, &mut frame)
            .map_err(|e| fail(&e))?;
        // As for every read of the mount: an archive that changed since open serves nothing
        // more (what is decoded is this copy of the frame, read before the check).
        archive.check_unchanged().map_err(|e| fail(&e))?;
        Ok(Plan::Stream(frame, start))
    }

    /// Registers an opened file as a new handle.
    pub fn add_handle(&self, opened: OpenedFile) -> NewHandle {
        // Warm: answered from what was kept (not by a decode job) with a file that an earlier
        // open got too.
        let seen = opened.backing.reopened();
        let complete = opened.is_complete();
        let handle = NewHandle {
            fh: self.next_fh.fetch_add(1, Ordering::Relaxed),
            complete,
            warm: seen && opened.fill.is_none(),
        };
        if !complete {
            self.opens_while_decoding.fetch_add(1, Ordering::Relaxed);
        }
        lock(&self.handles).insert(handle.fh, opened);
        handle
    }

    /// The backing file an open handle reads.
    pub fn backing_of(&self, fh: u64) -> Option<Arc<BackingFile>> {
        lock(&self.handles).get(&fh).map(|h| h.backing.clone())
    }

    /// Drops a handle; its backing file goes when no handle and no store entry holds it.
    pub fn release(&self, fh: u64) {
        // Closed after the lock is released: the last handle of a large unlinked file frees it.
        let removed = lock(&self.handles).remove(&fh);
        drop(removed);
    }

    /// Reads up to `size` bytes at `offset` and waits for them; short only at end of file.
    pub fn read(&self, _ino: Ino, fh: u64, offset: u64, size: u32) -> Result<ReadSlice, Errno> {
        let (tx, rx) = std::sync::mpsc::channel();
        self.read_start(
            fh,
            offset,
            size,
            Box::new(move |r| drop(tx.send(r.map(<[u8]>::to_vec)))),
        );
        rx.recv().map_err(|_| Errno::EIO)?.map(ReadSlice)
    }

    /// Reads up to `size` bytes at `offset` from the handle's backing file (the daemon read
    /// path: with passthrough the kernel reads the file itself). `done` gets them at once, or,
    /// while the file is still being decoded, as soon as the job has written them.
    pub fn read_start(&self, fh: u64, offset: u64, size: u32, done: ReadDone) {
        self.reads.fetch_add(1, Ordering::Relaxed);
        let opened = {
            let mut handles = lock(&self.handles);
            let Some(h) = handles.get_mut(&fh) else {
                drop(handles);
                return done(Err(Errno::EBADF));
            };
            // Once its decode is done, a handle reads its file like any other (the Fill goes
            // with the job; the file it wrote is the handle's too, so nothing is closed here).
            if h.fill.as_ref().is_some_and(|f| f.is_done()) {
                h.fill = None;
            }
            h.clone()
        };
        read_opened(&opened, offset, size, done, &self.reads_while_decoding);
    }

    fn spec_of(&self, file: &FileNode) -> Result<KernelSpec, Errno> {
        Ok(self.spec_with(file, self.digest_of(file)?))
    }

    /// [`spec_of`](Self::spec_of) with the kernel's digest already at hand.
    fn spec_with(&self, file: &FileNode, digest: Option<[u8; 32]>) -> KernelSpec {
        KernelSpec {
            id: kernel_id(file),
            len: file.size,
            cache_key: self.cache_key(file),
            digest,
        }
    }

    /// Locates a kernel for a read (see [`Archive::locate_for_read_at`]), checked as
    /// [`checked`](Self::checked) checks it.
    fn locate_for_read(&self, file: &FileNode) -> Result<KernelRef<'_>, Errno> {
        let located = self
            .archive_of(file)
            .locate_for_read_at(file.binary as usize, file.entry as usize);
        self.checked(file, located)
    }

    /// A located kernel, or the error logged with archive, key and arch; a kernel whose size
    /// is no longer the one the tree shows is EIO.
    fn checked<'a>(
        &self,
        file: &FileNode,
        located: crate::Result<KernelRef<'a>>,
    ) -> Result<KernelRef<'a>, Errno> {
        let kref = located.map_err(|e| self.failed(file, &e, Errno::from(&e)))?;
        if kref.size != file.size {
            let why = format!("size changed from {} to {}", file.size, kref.size);
            return Err(self.failed(file, &why, Errno::EIO));
        }
        Ok(kref)
    }

    /// The backing file of an empty kernel, answered on the request's thread: from the store,
    /// else as a decode job would make it (reading and checking its frame and digests costs
    /// next to nothing), but at once.
    fn empty_backing(&self, file: &FileNode) -> Result<Arc<BackingFile>, Errno> {
        let id = kernel_id(file);
        if let Some(Body::File(b)) = self.store.take(id) {
            self.store.count(true);
            self.store.touch(&b);
            // Kept for another entry naming the same ordinal with another size?
            self.check_len(file, &b)?;
            return Ok(b);
        }
        self.store.count(false);
        let (b, keep) = match self.cached_or_located(file)? {
            Source::Dir(found) => (found, true),
            Source::Located(kref, spec) => self.write_whole(file, &kref, &spec)?,
        };
        if keep {
            self.store.keep(id, Body::File(b.clone()));
        }
        Ok(b)
    }

    /// Makes the backing file of a kernel checked whole before it is served (see
    /// [`stream::write_whole`]): nobody reads it before it is complete and every digest matched.
    /// Returns it with whether the store may keep it. Failures are logged with archive, key
    /// and arch.
    fn write_whole(
        &self,
        file: &FileNode,
        kref: &KernelRef<'_>,
        spec: &KernelSpec,
    ) -> Result<(Arc<BackingFile>, bool), Errno> {
        let archive = self.archive_of(file);
        let fail = |e: &crate::Error| self.failed(file, e, Errno::from(e));
        let pending =
            stream::write_whole(archive, kref, || self.store.begin(spec)).map_err(|e| match e {
                stream::WholeError::Store(errno) => errno,
                stream::WholeError::Read(e) => fail(&e),
            })?;
        // Bytes of a file rewritten in place may decode without any error.
        archive.check_unchanged().map_err(|e| fail(&e))?;
        Ok(self.store.finish(spec, pending))
    }

    /// Two TOC entries may name the same ordinal with different sizes (a malformed archive):
    /// a file made for the other entry must not be served for this one.
    fn check_len(&self, file: &FileNode, b: &BackingFile) -> Result<(), Errno> {
        if b.len() == file.size {
            return Ok(());
        }
        len_matches(b, file.size, &self.name_for_log(file))
    }

    /// "ARCHIVE: KEY [ARCH]", as failures of one kernel are logged.
    fn name_for_log(&self, file: &FileNode) -> String {
        let (key, arch) = self.names_of(file);
        format!("{}: {key} [{arch}]", self.archive_of(file).path().display())
    }

    /// Logs a failure of one kernel with its archive, key and arch; returns `errno`.
    fn failed(&self, file: &FileNode, e: &dyn std::fmt::Display, errno: Errno) -> Errno {
        log::error!("{}: {e}", self.name_for_log(file));
        errno
    }

    /// The archive's BLAKE3 of a kernel's decoded bytes, when it records one.
    /// A large archive's digests are read from its TOC in the file: a failed read is EIO.
    fn digest_of(&self, f: &FileNode) -> Result<Option<[u8; 32]>, Errno> {
        let archive = self.archive_of(f);
        let entry = archive
            .entry_at(f.binary as usize, f.entry as usize)
            .expect("the tree holds indices of its archives' entries");
        archive.entry_digest(&entry).map_err(|e| {
            log::error!("{e}");
            Errno::EIO
        })
    }

    /// The key of a kernel in a persistent cache directory: BLAKE3 of what identifies its
    /// archive, then key, NUL, arch. A replaced or rewritten archive gets new keys.
    pub fn cache_key(&self, file: &FileNode) -> [u8; 32] {
        let (key, arch) = self.names_of(file);
        let mut h = blake3::Hasher::new();
        h.update(&self.archive_tokens[file.archive as usize]);
        h.update(key.as_bytes());
        h.update(&[0]);
        h.update(arch.as_bytes());
        *h.finalize().as_bytes()
    }

    /// Decodes one kernel into the buffer `alloc` makes (called once the archive has checked
    /// that the stored kernel produces that many bytes). Failures are logged with archive, key
    /// and arch.
    fn decode_with<T: crate::archive::codec::KernelBuf>(
        &self,
        file: &FileNode,
        kref: &KernelRef<'_>,
        alloc: impl FnOnce(usize) -> Option<T>,
    ) -> Result<T, Errno> {
        let archive = self.archive_of(file);
        let fail = |e: &crate::Error| self.failed(file, e, Errno::from(e));
        // read_with checks that a frame can produce the TOC's size before allocating, and the
        // bytes against the archive's digest when it records one.
        // read_with already reports a failed read of a changed archive as "changed"; bytes of a
        // file rewritten in place may also decode without any error, hence the check after.
        let buf = archive.read_with(kref, alloc).map_err(|e| fail(&e))?;
        archive.check_unchanged().map_err(|e| fail(&e))?;
        Ok(buf)
    }

    /// Lists a directory from `offset` (0 = start; each entry carries the offset of the next).
    pub fn readdir(&self, ino: Ino, offset: u64, sink: &mut dyn DirSink) -> Result<(), Errno> {
        let dir = match self.tree.entry(ino).ok_or(Errno::ENOENT)? {
            Entry::Dir(d) => d,
            _ => return Err(Errno::ENOTDIR),
        };
        let parent = self.tree.parent(ino).unwrap_or(ROOT);
        let fixed = [(".", ino, Kind::Dir), ("..", parent, Kind::Dir)];
        let children = self.tree.children(dir).map(|(name, child, is_dir)| {
            (name, child, if is_dir { Kind::Dir } else { Kind::File })
        });
        let native = dir
            .native()
            .map(|t| (NATIVE, self.tree.link_to(t), Kind::Symlink));
        let all = fixed.into_iter().chain(children).chain(native);
        for (i, (name, child, kind)) in all.enumerate().skip(offset as usize) {
            if sink.add(child, i as u64 + 1, kind, name) {
                break;
            }
        }
        Ok(())
    }

    /// The `user.kpack.stats` text, one `name value` per line: the backing store's counters
    /// (`decodes` counts kernels actually decoded), the lookup counters, then the read path
    /// (`daemon_opens` and `daemon_reads` count the OPEN and READ requests the daemon
    /// answered, `reads_while_decoding` the READs of kernels still being decoded,
    /// `opens_while_decoding` the handles made before their file was complete), where backing
    /// files live (`backing_in_memory`), the bytes of backing files open now, and the cache
    /// directory's counters; then the adapter's and the program's (see
    /// [`KpackFs::add_stats`]: the open policy's `passthrough` and `page_cache_mode`, remote
    /// sources' request counters).
    pub fn stats_text(&self) -> String {
        let d = self.store.dir_stats();
        let mut text = format!(
            "{}lookups {}\nlookups_missing {}\n\
             daemon_opens {}\nopen_handles {}\ndaemon_reads {}\nreads_while_decoding {}\n\
             opens_while_decoding {}\ndecodes_ahead {}\nbacking_in_memory {}\n\
             backing_bytes {}\ncache_dir_hits {}\ncache_dir_misses {}\n\
             cache_dir_rejected {}\ncache_dir_evictions {}\n",
            self.cache_stats().to_text(),
            self.lookups.load(Ordering::Relaxed),
            self.lookups_missing.load(Ordering::Relaxed),
            self.opens.load(Ordering::Relaxed),
            self.open_handles(),
            self.reads.load(Ordering::Relaxed),
            self.reads_while_decoding.load(Ordering::Relaxed),
            self.opens_while_decoding.load(Ordering::Relaxed),
            self.scan.started.load(Ordering::Relaxed),
            u8::from(self.store.in_memory()),
            self.store.live_bytes(),
            d.hits,
            d.misses,
            d.rejected,
            d.evictions,
        );
        for lines in &self.extra_stats {
            text.push_str(&lines());
        }
        text
    }

    /// The extended attributes of an inode, in listing order.
    fn xattrs(&self, ino: Ino) -> Vec<(&'static str, Vec<u8>)> {
        match self.tree.entry(ino) {
            Some(Entry::Dir(_)) if ino == ROOT => {
                vec![("user.kpack.stats", self.stats_text().into_bytes())]
            }
            Some(Entry::File(f)) => {
                let archive = self.archive_of(f);
                let (key, arch) = self.names_of(f);
                let mut attrs = vec![
                    (
                        "user.kpack.archive",
                        archive.path().as_os_str().as_encoded_bytes().to_vec(),
                    ),
                    ("user.kpack.arch", arch.as_bytes().to_vec()),
                    ("user.kpack.key", key.as_bytes().to_vec()),
                    (
                        "user.kpack.scheme",
                        archive.scheme().name().as_bytes().to_vec(),
                    ),
                    ("user.kpack.ordinal", f.ordinal.to_string().into_bytes()),
                    (
                        "user.kpack.stored_size",
                        f.stored_size.to_string().into_bytes(),
                    ),
                ];
                // Archives we write record each kernel's digest; reference archives do not.
                if let Ok(Some(d)) = self.digest_of(f) {
                    attrs.push(("user.kpack.blake3", cache_dir::hex(&d).into_bytes()));
                }
                attrs
            }
            _ => Vec::new(),
        }
    }

    pub fn getxattr(&self, ino: Ino, name: &[u8]) -> Result<Vec<u8>, Errno> {
        if self.tree.entry(ino).is_none() {
            return Err(Errno::ENOENT);
        }
        self.xattrs(ino)
            .into_iter()
            .find(|(n, _)| n.as_bytes() == name)
            .map(|(_, v)| v)
            .ok_or(Errno::ENODATA)
    }

    /// Attribute names, each followed by a NUL, as `listxattr(2)` returns them.
    pub fn listxattr(&self, ino: Ino) -> Result<Vec<u8>, Errno> {
        if self.tree.entry(ino).is_none() {
            return Err(Errno::ENOENT);
        }
        let mut out = Vec::new();
        for (name, _) in self.xattrs(ino) {
            out.extend_from_slice(name.as_bytes());
            out.push(0);
        }
        Ok(out)
    }

    pub fn statfs(&self) -> StatFs {
        const BSIZE: u32 = 4096;
        let bytes: u64 = self
            .tree
            .files()
            .iter()
            .map(|f| f.size.div_ceil(u64::from(BSIZE)))
            .sum();
        StatFs {
            blocks: bytes,
            files: self.tree.len(),
            bsize: BSIZE,
            namelen: tree::NAME_MAX as u32,
            frsize: BSIZE,
        }
    }
}

/// Answers `done` with up to `size` bytes of `opened`'s file at `offset` (short only at end of
/// file): through its decode job while that still runs (counted in `while_decoding`), else
/// straight from the file.
fn read_opened(
    opened: &OpenedFile,
    offset: u64,
    size: u32,
    done: ReadDone,
    while_decoding: &AtomicU64,
) {
    match opened.fill.as_ref().filter(|f| !f.is_done()) {
        Some(fill) => {
            while_decoding.fetch_add(1, Ordering::Relaxed);
            fill.read(opened.backing.len(), offset, size, done)
        }
        None => {
            let end = offset.saturating_add(u64::from(size));
            opened.backing.with_range(offset, end, done)
        }
    }
}

/// EIO, logged with `name`, unless `b` holds `size` bytes.
fn len_matches(b: &BackingFile, size: u64, name: &str) -> Result<(), Errno> {
    if b.len() == size {
        return Ok(());
    }
    log::error!(
        "{name}: its kernel decodes to {} bytes, the TOC says {size}",
        b.len()
    );
    Err(Errno::EIO)
}

fn kernel_id(f: &FileNode) -> KernelId {
    KernelId {
        archive: f.archive,
        ordinal: f.ordinal,
    }
}

/// What identifies an archive for cache-directory keys: the digest of its TOC (which holds
/// every kernel's digest in archives we write) and its source's identity (a local file's
/// device, inode, length and modification time), so a replaced or rewritten archive gets new
/// keys.
fn archive_token(a: &Archive) -> Vec<u8> {
    let mut t = a.toc_digest().to_vec();
    t.extend_from_slice(a.source().identity().as_bytes());
    t.push(0);
    t
}

#[cfg(test)]
mod model_tests;
#[cfg(test)]
mod tests;
