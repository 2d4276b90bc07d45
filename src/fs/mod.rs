//! The read-only filesystem over kpack archives, without FUSE in the loop.
//!
//! [`KpackFs`] answers lookups, attributes, directory listings, extended attributes and reads
//! with this module's own types ([`Attr`], [`Errno`], [`DirSink`], [`ReadSlice`]), so every
//! behaviour can be unit-tested by calling it directly. `fuse.rs` is the only file that knows
//! `fuser`; it translates these answers into kernel replies.
//!
//! A read goes: kernel READ -> `KpackFs::read` -> the open handle's pinned copy (kernels larger
//! than the cache) or the shared [`KernelCache`] -> on a miss, one decode of the whole kernel
//! (`Archive::read_into`, straight into the cache's buffer) -> the requested byte range.

pub mod fuse;
pub mod gpus;
pub mod mountinfo;
pub mod source;
pub mod tree;

use crate::sync::lock;
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use crate::archive::Archive;
use crate::cache::{Bytes, CacheStats, KernelCache, KernelId};
use tree::{Entry, FileNode, Ino, ROOT, Tree, TreeBuilder, TreeError};

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
    pub const ERANGE: Errno = Errno(libc::ERANGE);
    pub const ENODATA: Errno = Errno(libc::ENODATA);
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

/// Part of a decoded kernel, handed to the kernel without copying.
#[derive(Debug, Clone)]
pub struct ReadSlice {
    bytes: Option<Bytes>,
    start: usize,
    end: usize,
}

impl ReadSlice {
    pub fn as_slice(&self) -> &[u8] {
        match &self.bytes {
            Some(b) => &b[self.start..self.end],
            None => &[],
        }
    }
}

/// What the mount was asked for, besides its archives.
#[derive(Debug, Clone)]
pub struct FsOptions {
    /// Byte bound of the decoded-kernel cache.
    pub cache_size: u64,
    /// Device ISAs, in order, for `native.hsaco`.
    pub gpus: Vec<String>,
    /// Owner of every inode.
    pub uid: u32,
    pub gid: u32,
}

/// One open file.
struct OpenFile {
    ino: Ino,
    /// A kernel too large for the cache, decoded for this handle and dropped on release.
    pinned: Mutex<Option<Bytes>>,
}

/// The filesystem.
pub struct KpackFs {
    tree: Tree,
    archives: Vec<Arc<Archive>>,
    cache: KernelCache<Errno>,
    handles: Mutex<HashMap<u64, Arc<OpenFile>>>,
    next_fh: AtomicU64,
    /// LOOKUP requests answered, and how many of them found nothing. Reported in
    /// `user.kpack.stats` so that the effect of the kernel's entry caching can be observed.
    lookups: AtomicU64,
    lookups_missing: AtomicU64,
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
        let fs = KpackFs {
            tree,
            archives,
            cache: KernelCache::new(opts.cache_size),
            handles: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            lookups: AtomicU64::new(0),
            lookups_missing: AtomicU64::new(0),
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

    pub fn tree(&self) -> &Tree {
        &self.tree
    }

    pub fn cache_stats(&self) -> CacheStats {
        self.cache.stats()
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
        let binary = &self.archive_of(f).binaries()[f.binary as usize];
        (
            binary.key.as_str(),
            binary.arches[f.entry as usize].arch.as_str(),
        )
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

    /// Opens a file for reading; any write access is EROFS.
    pub fn open(&self, ino: Ino, flags: i32) -> Result<u64, Errno> {
        if flags & libc::O_ACCMODE != libc::O_RDONLY || flags & libc::O_TRUNC != 0 {
            return Err(Errno::EROFS);
        }
        match self.tree.entry(ino).ok_or(Errno::ENOENT)? {
            Entry::File(_) => {}
            Entry::Dir(_) => return Err(Errno::EISDIR),
            Entry::Link(_) => return Err(Errno::EINVAL),
        }
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        lock(&self.handles).insert(
            fh,
            Arc::new(OpenFile {
                ino,
                pinned: Mutex::new(None),
            }),
        );
        Ok(fh)
    }

    /// Drops a handle and anything pinned for it.
    pub fn release(&self, fh: u64) {
        lock(&self.handles).remove(&fh);
    }

    /// Reads up to `size` bytes at `offset`; short only at end of file.
    pub fn read(&self, ino: Ino, fh: u64, offset: u64, size: u32) -> Result<ReadSlice, Errno> {
        let handle = lock(&self.handles).get(&fh).cloned();
        let ino = handle.as_ref().map_or(ino, |h| h.ino);
        let file = match self.tree.entry(ino).ok_or(Errno::EBADF)? {
            Entry::File(f) => f,
            Entry::Dir(_) => return Err(Errno::EISDIR),
            Entry::Link(_) => return Err(Errno::EINVAL),
        };
        let empty = ReadSlice {
            bytes: None,
            start: 0,
            end: 0,
        };
        if offset >= file.size || size == 0 {
            return Ok(empty);
        }
        let bytes = self.kernel_bytes(file, handle.as_deref())?;
        let len = bytes.len() as u64;
        if offset >= len {
            return Ok(empty);
        }
        let end = offset.saturating_add(u64::from(size)).min(len);
        Ok(ReadSlice {
            bytes: Some(bytes),
            start: offset as usize,
            end: end as usize,
        })
    }

    /// The whole decoded kernel: from the handle's pinned copy, else through the shared cache.
    fn kernel_bytes(&self, file: &FileNode, handle: Option<&OpenFile>) -> Result<Bytes, Errno> {
        if let Some(h) = handle {
            if let Some(b) = lock(&h.pinned).as_ref() {
                return Ok(b.clone());
            }
        }
        let id = KernelId {
            archive: file.archive,
            ordinal: file.ordinal,
        };
        let fetched = self.cache.get_or_load(id, || self.decode(file))?;
        // Two TOC entries may name the same ordinal with different sizes (a malformed archive):
        // the cached bytes then belong to the other entry and must not be served for this one.
        if fetched.bytes.len() as u64 != file.size {
            let (key, arch) = self.names_of(file);
            log::error!(
                "{}: {key} [{arch}]: ordinal {} decodes to {} bytes, the TOC says {}",
                self.archive_of(file).path().display(),
                file.ordinal,
                fetched.bytes.len(),
                file.size
            );
            return Err(Errno::EIO);
        }
        if !fetched.cached {
            if let Some(h) = handle {
                *lock(&h.pinned) = Some(fetched.bytes.clone());
            }
        }
        Ok(fetched.bytes)
    }

    /// Decodes one kernel. Failures are logged with archive, key and arch, and become EIO.
    fn decode(&self, file: &FileNode) -> Result<Vec<u8>, Errno> {
        let archive = self.archive_of(file);
        let (key, arch) = self.names_of(file);
        let fail = |e: &dyn std::fmt::Display| {
            log::error!("{}: {key} [{arch}]: {e}", archive.path().display());
            Errno::EIO
        };
        let kref = archive.locate(key, arch).map_err(|e| fail(&e))?;
        if kref.size != file.size {
            return Err(fail(&format!(
                "size changed from {} to {}",
                file.size, kref.size
            )));
        }
        // read_with checks that a frame can produce the TOC's size before allocating it.
        let buf = archive
            .read_with(&kref, crate::archive::zeroed_vec)
            .map_err(|e| match e.kind() {
                crate::ErrorKind::OutOfMemory => {
                    log::error!("{}: {key} [{arch}]: {e}", archive.path().display());
                    Errno::ENOMEM
                }
                _ => fail(&e),
            })?;
        // Bytes decoded from a file rewritten in place may be wrong without any decode error.
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

    /// The `user.kpack.stats` text: the cache's counters, the lookup counters, then the
    /// program's (see [`KpackFs::add_stats`]).
    pub fn stats_text(&self) -> String {
        let mut text = format!(
            "{}lookups {}\nlookups_missing {}\n",
            self.cache.stats().to_text(),
            self.lookups.load(Ordering::Relaxed),
            self.lookups_missing.load(Ordering::Relaxed)
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
                vec![
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
                ]
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

    /// The archive paths, for the mount's source name.
    pub fn archive_paths(&self) -> impl Iterator<Item = &Path> {
        self.archives.iter().map(|a| a.path())
    }
}

#[cfg(test)]
mod tests;
