//! The read-only filesystem over kpack archives. [`KpackFs`] answers every request with this
//! module's own types ([`Attr`], [`Errno`], [`DirSink`]), so all of it is
//! unit-tested by direct calls; only `fuse/` knows `fuser`. Its parts, each importing only the
//! ones before it (`tests/it/layers.rs` checks this):
//!
//! * `errno.rs`: the error numbers readers see, and the one mapping to them.
//! * `tree.rs`: the directory tree built from the archives' TOCs at mount time.
//! * `store/`: the one holder of decoded kernels the mount keeps (one LRU, one byte bound,
//!   pins for files decoded ahead), and where their files live: memfds, a per-mount directory,
//!   or a persistent cache directory.
//! * `read/`: requests for a kernel's bytes (opens, READs through a handle, READs by inode),
//!   each kernel's decode life (`read/kernel_life.rs`: its states, the one single flight of
//!   decodes, pins and reservations), decoding ahead of scans, and the decode pool.
//! * `namespace.rs`: lookups, attributes, listings, extended attributes, `statfs`.
//! * `policy/`: the open mode (`policy/mode.rs`: page-cache mode or opens through the daemon,
//!   and passthrough, decided once) and the open handles of each inode (`policy/mod.rs`);
//!   plain state and decisions.
//! * `setup/`: what a mount is made from (sources, local GPUs, the mount table, the open-file
//!   limit).
//! * `steps.rs`: the policy's decisions carried out for `init`, an open, its answer and a
//!   release, with no FUSE types (the adapter and the model test run the same steps).
//! * `fuse/`: the adapter, which translates requests and replies, and the mount itself.
//!
//! This file holds the shared types, [`KpackFs`] itself, its statistics, and the naming and
//! logging of one kernel's failures. How a read flows through these parts is drawn in
//! docs/architecture.md.

mod errno;
pub mod fuse;
mod namespace;
mod policy;
mod read;
pub mod setup;
mod steps;
pub mod store;
mod tree;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use crate::archive::Archive;
use policy::Mode;
use read::Scans;
use read::kernel_life::Decodes;
use store::KernelId;
use store::Placement;
use store::{CacheStats, Store};
use tree::{FileNode, Ino, Tree, TreeBuilder};

pub use errno::Errno;
pub use policy::{OpenMode, PAGE_CACHE_MEDIAN_MAX};
// The request API for callers without a mount: requests start (`open_start`, `read_start`,
// `read_ino_start`), a started decode is a job to run (`run_fill`), answers come through
// callbacks.
pub use read::NewHandle;
pub use read::fill::{OpenDone, OpenedFile, ReadDone};
pub use read::kernel_life::FillJob;
pub use tree::{Duplicate, NATIVE, TreeError};

/// How long the kernel may trust entries, attributes and negative lookups. The archives are
/// immutable while mounted, so this is long: re-reads and repeated probes of missing arches
/// then never reach the daemon.
pub const TTL: Duration = Duration::from_secs(365 * 24 * 3600);

/// `st_blksize`: a hint to readers such as `cp` to ask for large chunks.
pub const BLKSIZE: u32 = 128 * 1024;

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

/// What the mount was asked for, besides its archives.
#[derive(Debug, Clone)]
pub struct FsOptions {
    /// Byte bound of everything the store holds for kernels no handle has open: backing
    /// files, small kernels' bytes in memory, and files pinned by decoding ahead.
    pub cache_size: u64,
    /// Where backing files live.
    pub backing: Placement,
    /// Most backing files kept open for kernels no handle has open (each is a descriptor):
    /// [`store::descriptor_budget`] of the limit the program raised at start-up
    /// ([`setup::limits::raise_open_file_limit`]).
    pub files_max: usize,
    /// Device ISAs, in order, for `native.hsaco`.
    pub gpus: Vec<String>,
    /// Owner of every inode.
    pub uid: u32,
    pub gid: u32,
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
    /// The open mode: page-cache mode or opens through the daemon, and passthrough.
    mode: Mode,
    handles: Mutex<HashMap<u64, OpenedFile>>,
    /// Every kernel's decode life (`read/kernel_life.rs`): the one single flight of every
    /// decode (opens, reads by inode, small kernels, decodes ahead).
    decodes: Decodes,
    next_fh: AtomicU64,
    /// LOOKUP requests answered, and how many of them found nothing. Reported in
    /// `user.kpack.stats` so that the effect of the kernel's entry caching can be observed.
    lookups: AtomicU64,
    lookups_missing: AtomicU64,
    /// READ requests the daemon served (none while passthrough is on).
    reads: AtomicU64,
    /// Of those, reads of a kernel still being decoded (answered at once or once their bytes
    /// were written).
    reads_while_decoding: AtomicU64,
    /// Kernels decoded from an archive (a backing file found valid in the cache directory is
    /// not a decode).
    decoded: AtomicU64,
    /// Readers walking the files in order, and the decodes started ahead of them.
    scans: Scans,
    uid: u32,
    gid: u32,
    /// Time shown on directories: the newest archive's modification time.
    dir_time: SystemTime,
    /// More `name value` lines for `user.kpack.stats` from the program (remote sources' request
    /// counters): the library knows nothing of where the archives' bytes come from.
    extra_stats: Vec<StatsLines>,
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
            mode: Mode::default(),
            handles: Mutex::new(HashMap::new()),
            decodes: Decodes::default(),
            next_fh: AtomicU64::new(1),
            lookups: AtomicU64::new(0),
            lookups_missing: AtomicU64::new(0),
            reads: AtomicU64::new(0),
            reads_while_decoding: AtomicU64::new(0),
            decoded: AtomicU64::new(0),
            scans: Scans::default(),
            uid: opts.uid,
            gid: opts.gid,
            dir_time,
            extra_stats: Vec::new(),
        };
        Ok((fs, duplicates))
    }

    /// Appends `lines()` to every `user.kpack.stats` answer.
    pub fn add_stats(&mut self, lines: StatsLines) {
        self.extra_stats.push(lines);
    }

    /// Plans the open mode: `open_mode` over this tree's kernels, with passthrough asked for or
    /// not. Settled at `init` ([`steps::granted`]); until then, and without a plan, opens go
    /// through the daemon.
    pub fn plan_open_mode(&mut self, open_mode: OpenMode, passthrough: bool) {
        self.mode = Mode::plan(open_mode, self.median_kernel_size(), passthrough);
    }

    /// The open mode: the one place every open and READ asks it.
    pub(crate) fn mode(&self) -> &Mode {
        &self.mode
    }

    /// The store's counters, with `decodes` counting kernels decoded from archives.
    pub fn cache_stats(&self) -> CacheStats {
        CacheStats {
            decodes: self.decoded.load(Ordering::Relaxed),
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

    pub(in crate::fs) fn archive_of(&self, f: &FileNode) -> &Archive {
        &self.archives[f.archive as usize]
    }

    /// The (key, arch) names of a file.
    pub(in crate::fs) fn names_of(&self, f: &FileNode) -> (&str, &str) {
        let archive = self.archive_of(f);
        let binary = archive
            .binary(f.binary as usize)
            .expect("the tree holds indices of its archives' entries");
        let entry = binary
            .arch(f.entry as usize)
            .expect("the tree holds indices of its archives' entries");
        (binary.key, entry.arch)
    }

    /// `ARCHIVE: KEY [ARCH]`, as failures of one kernel are logged.
    pub(in crate::fs) fn name_for_log(&self, file: &FileNode) -> String {
        let (key, arch) = self.names_of(file);
        format!("{}: {key} [{arch}]", self.archive_of(file).path().display())
    }

    /// Logs a failure of one kernel with its archive, key and arch; returns `errno`.
    pub(in crate::fs) fn failed(
        &self,
        file: &FileNode,
        e: &dyn std::fmt::Display,
        errno: Errno,
    ) -> Errno {
        log::error!("{}: {e}", self.name_for_log(file));
        errno
    }

    /// The archive's BLAKE3 of a kernel's decoded bytes, when it records one.
    /// A large archive's digests are read from its TOC in the file: a failed read is EIO.
    pub(in crate::fs) fn digest_of(&self, f: &FileNode) -> Result<Option<[u8; 32]>, Errno> {
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

    /// The `user.kpack.stats` text, one `name value` per line: the backing store's counters
    /// (`decodes` counts kernels actually decoded), the lookup counters, then the read path
    /// (`daemon_opens` and `daemon_reads` count the OPEN and READ requests the daemon
    /// answered, `reads_while_decoding` the READs of kernels still being decoded,
    /// `opens_while_decoding` the handles made before their file was complete), where backing
    /// files live (`backing_in_memory`), the bytes of backing files open now, the cache
    /// directory's counters, and the open mode (`passthrough`, `page_cache_mode`); then the
    /// program's (see [`KpackFs::add_stats`]: remote sources' request counters).
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
            self.decodes.started_ahead(),
            u8::from(self.store.in_memory()),
            self.store.live_bytes(),
            d.hits,
            d.misses,
            d.rejected,
            d.evictions,
        );
        text.push_str(&self.mode.stats_text());
        for lines in &self.extra_stats {
            text.push_str(&lines());
        }
        text
    }
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
