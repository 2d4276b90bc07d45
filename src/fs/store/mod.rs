//! The store: the one holder of the decoded kernels the mount keeps on its own account, and
//! the one interface to where their files live (memfds, a per-mount directory on disk, or a
//! persistent cache directory: [`Files`] in `backing.rs`).
//!
//! Every entry is a kernel's decoded bytes with one of two bodies ([`Body`]): a backing file,
//! or, for a small kernel page-cache mode decodes straight into a READ's reply, the bytes in
//! memory. All entries are in one LRU under one byte bound (`--memory-cache-size`, or for
//! files on disk `--disk-cache-size`): evicting an entry only drops the store's reference, so open
//! handles keep their files until they are released (those are not the store's). Two more
//! limits apply within it: at most `files_max` files (each is a descriptor), and, when files
//! live on disk, at most [`MEMORY_MAX`] bytes of bodies in memory (the disk bound must not
//! become the daemon's heap); each evicts the least recently used entries of its own kind.
//!
//! A **pin** keeps an entry from eviction: a file decoded ahead of a scan is pinned until its
//! first open takes it (or the scan leaves it behind), so that it is never decoded twice.
//! Pins count in the bound like any entry, and with the decodes ahead still running
//! (reserved by [`Store::reserve_pin`] before they start) they may take at most half of it
//! ([`PIN_SHARE`]): past that, decoding ahead starts nothing new until pins are taken.
//!
//! One exception to the bound: in page-cache mode a READ has no handle to hold its file, so
//! the files of the last [`OVERSIZED_HELD`] decode jobs that the store could not keep (each
//! larger than its whole bound) are held aside until newer such files replace them; one
//! sequential pass over such a kernel then decodes it once. They are not counted in
//! `bytes_cached`.
//!
//! A file the store let go of may still be held by open handles; the store remembers every
//! complete file it made (weakly, holding nothing), so a request for its kernel gets that file
//! while anyone holds it: nothing is decoded twice while it is held.
//!
//! **Room is made before a file's space is reserved** ([`Store::begin`]): the entries kept,
//! plus the files being written, plus the new one must fit the bound, so least recently used
//! entries go first (a kernel larger than the whole bound, which will not be kept, makes no
//! room). The file system may still be full (shared with others, or smaller than the bound):
//! when the reservation fails for want of space, the store evicts one more entry (files not
//! pinned first, then files held aside, then pinned ones; with a cache directory, its least
//! recently used files are removed first) and the reservation is tried again. A kernel is
//! refused (ENOSPC) only when nothing is left to evict, with an error that names the
//! directory, the sizes and what the store still keeps.
//!
//! The lock is held only to look up, insert, evict or pin, never while decoding or for I/O;
//! evicted bodies are dropped after it is released (closing a large file frees it).

use std::collections::{HashMap, VecDeque};
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use lru::LruCache;

mod backing;
mod cache_dir;
mod kernel;
mod scratch;

use crate::fs::errno::Errno;
use crate::sync::lock;
use backing::{Files, InFlight};
use cache_dir::DirStats;

// The store's interface: what its users name of the files it makes and where they live.
pub(crate) use backing::Pending;
pub use backing::{
    BackingFile, DEFAULT_SCRATCH_BASE, Placement, WRITE_PIECE, descriptor_budget, fs_space,
};
pub use cache_dir::bytes_in as cache_dir_bytes;
pub(crate) use kernel::{FileError, KernelId, KernelSpec};
pub use scratch::remove_if_dead as remove_dead_scratch_dir;

/// With files on disk, at most this many bytes of entries are held in memory.
pub(crate) const MEMORY_MAX: u64 = 4 << 20;

/// Pins, with the decodes ahead that will become pins, take at most `1 / PIN_SHARE` of the
/// bound, so that what opens and reads keep always has room.
pub(crate) const PIN_SHARE: u64 = 2;

/// Files larger than the whole store held aside in page-cache mode (see the module's text).
pub(crate) const OVERSIZED_HELD: usize = 2;

/// A decoded kernel: a backing file, or bytes in memory.
#[derive(Debug, Clone)]
pub(crate) enum Body {
    File(Arc<BackingFile>),
    Bytes(Arc<[u8]>),
}

impl Body {
    pub fn len(&self) -> u64 {
        match self {
            Body::File(f) => f.len(),
            Body::Bytes(b) => b.len() as u64,
        }
    }

    /// Hands `answer` the bytes of `[offset, end)`, clipped to the kernel (a file's are read
    /// into this thread's buffer; a failed read is EIO).
    pub fn with_range<R>(
        &self,
        offset: u64,
        end: u64,
        answer: impl FnOnce(Result<&[u8], Errno>) -> R,
    ) -> R {
        match self {
            Body::File(f) => f.with_range(offset, end, answer),
            Body::Bytes(b) => {
                let start = (offset as usize).min(b.len());
                let end = (end.min(b.len() as u64) as usize).max(start);
                answer(Ok(&b[start..end]))
            }
        }
    }
}

/// A snapshot of the store's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Requests that found their kernel complete (in the store, or just finished by its job).
    pub hits: u64,
    /// Requests that did not (they started or joined a decode job).
    pub misses: u64,
    /// Kernels decoded from an archive (counted by the mount: a file found valid in the
    /// cache directory is not a decode).
    pub decodes: u64,
    /// Bytes of the entries held now, pinned ones included.
    pub bytes_cached: u64,
    /// Entries dropped to make room.
    pub evictions: u64,
    /// The byte bound.
    pub capacity: u64,
    /// Of the evictions, those made because the file system was full when a file's space was
    /// reserved.
    pub space_evictions: u64,
    /// Kernels refused because the file system was full with nothing left to evict.
    pub space_refusals: u64,
}

impl CacheStats {
    /// The `user.kpack.stats` text: one `name value` per line.
    pub fn to_text(&self) -> String {
        format!(
            "hits {}\nmisses {}\ndecodes {}\nbytes_cached {}\nevictions {}\ncapacity {}\n\
             space_evictions {}\nspace_refusals {}\n",
            self.hits,
            self.misses,
            self.decodes,
            self.bytes_cached,
            self.evictions,
            self.capacity,
            self.space_evictions,
            self.space_refusals
        )
    }
}

struct Entry {
    body: Body,
    pinned: bool,
}

/// Everything under the store's lock.
struct Held {
    lru: LruCache<KernelId, Entry>,
    /// Bytes of all entries.
    bytes: u64,
    /// File entries.
    files: usize,
    /// Bytes of entries in memory.
    memory: u64,
    /// Bytes of pinned entries.
    pinned: u64,
    /// Bytes reserved for pins by decodes running ahead.
    reserved: u64,
    /// The pinned entries, oldest first, each with its tag (the inode it was decoded ahead of).
    pins: Vec<(KernelId, u64)>,
    oversized: VecDeque<(KernelId, Arc<BackingFile>)>,
    /// Every complete file made, held by nothing here: open handles may still hold one after
    /// the store let it go, and a request for its kernel then gets it rather than a decode.
    made: HashMap<KernelId, Weak<BackingFile>>,
    /// The size of `made` after its last sweep of files no one holds.
    made_swept: usize,
}

impl Held {
    /// A file of `id` held aside, or made and still held by someone.
    fn file_outside_lru(&self, id: KernelId) -> Option<Arc<BackingFile>> {
        self.oversized
            .iter()
            .find(|(k, _)| *k == id)
            .map(|(_, f)| f.clone())
            .or_else(|| self.made.get(&id).and_then(Weak::upgrade))
    }

    fn remove(&mut self, id: KernelId) -> Option<Entry> {
        let e = self.lru.pop(&id)?;
        self.forget(id, &e);
        Some(e)
    }

    /// Takes an entry (just removed from the LRU) out of the counts.
    fn forget(&mut self, id: KernelId, e: &Entry) {
        let len = e.body.len();
        self.bytes -= len;
        match e.body {
            Body::File(_) => self.files -= 1,
            Body::Bytes(_) => self.memory -= len,
        }
        if e.pinned {
            self.pinned -= len;
            self.pins.retain(|(k, _)| *k != id);
        }
    }

    /// Removes the least recently used entry whose body `which` takes, pinned or not as
    /// `pinned` says.
    fn evict_one(&mut self, which: impl Fn(&Body) -> bool, pinned: bool) -> Option<Entry> {
        let id = self
            .lru
            .iter()
            .rev()
            .find(|(_, e)| e.pinned == pinned && which(&e.body))
            .map(|(k, _)| *k)?;
        self.remove(id)
    }

    fn unpin(&mut self, id: KernelId) {
        if let Some(e) = self.lru.peek_mut(&id) {
            if e.pinned {
                e.pinned = false;
                self.pinned -= e.body.len();
                self.pins.retain(|(k, _)| *k != id);
            }
        }
    }
}

/// The store (see the module's text).
pub struct Store {
    files: Files,
    held: Mutex<Held>,
    capacity: u64,
    files_max: usize,
    memory_max: u64,
    hits: AtomicU64,
    misses: AtomicU64,
    evictions: AtomicU64,
    space_evictions: AtomicU64,
    space_refusals: AtomicU64,
    /// Bytes of the files being written (begun, not yet finished or dropped).
    writing: Arc<AtomicU64>,
}

impl Store {
    /// A store of at most `capacity` bytes and `files_max` files (each a descriptor, see
    /// [`descriptor_budget`](backing::descriptor_budget)), placing files as
    /// `placement` says (a cache directory is bounded to `capacity` too).
    pub fn new(placement: &Placement, capacity: u64, files_max: usize) -> io::Result<Store> {
        let files = Files::new(placement, capacity)?;
        let memory_max = if files.in_memory() {
            capacity
        } else {
            MEMORY_MAX.min(capacity)
        };
        Ok(Store {
            files,
            held: Mutex::new(Held {
                lru: LruCache::unbounded(),
                bytes: 0,
                files: 0,
                memory: 0,
                pinned: 0,
                reserved: 0,
                pins: Vec::new(),
                oversized: VecDeque::new(),
                made: HashMap::new(),
                made_swept: 0,
            }),
            capacity,
            files_max: files_max.max(1),
            memory_max,
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
            space_evictions: AtomicU64::new(0),
            space_refusals: AtomicU64::new(0),
            writing: Arc::new(AtomicU64::new(0)),
        })
    }

    /// The held body of `id` (now the most recently used), not counted (see
    /// [`count`](Self::count)) nor marked as used in a cache directory. An open or read
    /// takes it: a pin on it is released, its purpose served.
    pub(crate) fn take(&self, id: KernelId) -> Option<Body> {
        let mut h = lock(&self.held);
        if let Some(e) = h.lru.get(&id) {
            let body = e.body.clone();
            h.unpin(id);
            return Some(body);
        }
        h.file_outside_lru(id).map(Body::File)
    }

    /// Records a complete file of `id` (see `Held::made`).
    fn made(&self, id: KernelId, file: &Arc<BackingFile>) {
        let mut h = lock(&self.held);
        h.made.insert(id, Arc::downgrade(file));
        if h.made.len() > 2 * h.made_swept.max(256) {
            h.made.retain(|_, f| f.strong_count() > 0);
            h.made_swept = h.made.len();
        }
    }

    /// Whether `id` is held now (a read of it decodes nothing). Leaves the LRU order alone.
    pub fn contains(&self, id: KernelId) -> bool {
        let h = lock(&self.held);
        h.lru.contains(&id) || h.file_outside_lru(id).is_some()
    }

    /// Counts one request as a hit (it found a complete kernel, in the store or just finished
    /// by its decode job) or a miss.
    pub(crate) fn count(&self, hit: bool) {
        let counter = if hit { &self.hits } else { &self.misses };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Keeps `body` as the entry of `id` (replacing any), evicting least recently used entries
    /// until every limit holds. Returns whether it was kept: not when it cannot fit beside the
    /// pins.
    pub(crate) fn keep(&self, id: KernelId, body: Body) -> bool {
        self.insert(id, body, None, 0)
    }

    /// Reserves `len` bytes for a decode ahead that will be pinned; false when pins and
    /// reservations would take more than [`PIN_SHARE`] of the bound.
    pub(crate) fn reserve_pin(&self, len: u64) -> bool {
        let mut h = lock(&self.held);
        if h.pinned + h.reserved + len > self.capacity / PIN_SHARE {
            return false;
        }
        h.reserved += len;
        true
    }

    /// Gives back a reservation whose decode kept nothing (it failed, or its file may not be
    /// kept).
    pub(crate) fn cancel_pin(&self, reserved: u64) {
        let mut h = lock(&self.held);
        h.reserved -= reserved.min(h.reserved);
    }

    /// Keeps `body` pinned (tagged `tag`), turning the reservation of `reserved` bytes into
    /// the pin. Returns whether it was kept.
    pub(crate) fn keep_pinned(&self, id: KernelId, body: Body, tag: u64, reserved: u64) -> bool {
        self.insert(id, body, Some(tag), reserved)
    }

    /// Releases every pin whose tag `keep` refuses; the entries stay as ordinary ones.
    pub(crate) fn unpin_unless(&self, keep: impl Fn(u64) -> bool) {
        let mut h = lock(&self.held);
        let gone: Vec<KernelId> = h
            .pins
            .iter()
            .filter(|(_, tag)| !keep(*tag))
            .map(|(k, _)| *k)
            .collect();
        for id in gone {
            h.unpin(id);
        }
    }

    /// Holds aside a file larger than the whole store (page-cache mode; see the module's
    /// text), letting go of the oldest one held when there are more than [`OVERSIZED_HELD`].
    pub(crate) fn hold_oversized(&self, id: KernelId, file: Arc<BackingFile>) {
        let dropped = {
            let mut h = lock(&self.held);
            h.oversized.retain(|(k, _)| *k != id);
            h.oversized.push_back((id, file));
            (h.oversized.len() > OVERSIZED_HELD).then(|| h.oversized.pop_front())
        };
        drop(dropped);
    }

    fn insert(&self, id: KernelId, body: Body, pin: Option<u64>, reserved: u64) -> bool {
        let len = body.len();
        let in_memory = matches!(body, Body::Bytes(_));
        let mut dropped = Vec::new();
        let kept = {
            let mut h = lock(&self.held);
            h.reserved -= reserved.min(h.reserved);
            if let Some(old) = h.remove(id) {
                dropped.push(old);
            }
            // What eviction cannot free: the pins (and, for a file, their descriptors).
            let pinned_files = h.pins.len() + usize::from(pin.is_some());
            let fits = h.pinned + len <= self.capacity
                && if in_memory {
                    len <= self.memory_max
                } else {
                    pinned_files <= self.files_max
                };
            while fits && self.over(&h, len, in_memory) {
                // Over the byte bound, anything goes; over the limit of one kind (bytes in
                // memory, or files), only that kind: a file decoded ahead must not make way
                // for a small kernel's bytes.
                let any = h.bytes + len > self.capacity;
                match h.evict_one(|b| any || matches!(b, Body::Bytes(_)) == in_memory, false) {
                    Some(e) => {
                        self.evictions.fetch_add(1, Ordering::Relaxed);
                        dropped.push(e);
                    }
                    None => break,
                }
            }
            let room = fits && !self.over(&h, len, in_memory);
            if room {
                h.bytes += len;
                match body {
                    Body::File(_) => h.files += 1,
                    Body::Bytes(_) => h.memory += len,
                }
                if let Some(tag) = pin {
                    h.pinned += len;
                    h.pins.push((id, tag));
                }
                h.lru.put(
                    id,
                    Entry {
                        body,
                        pinned: pin.is_some(),
                    },
                );
            }
            room
        };
        drop(dropped);
        kept
    }

    /// Whether an entry of `len` bytes (in memory or a file) would break a limit now.
    fn over(&self, h: &Held, len: u64, in_memory: bool) -> bool {
        h.bytes + len > self.capacity
            || if in_memory {
                h.memory + len > self.memory_max
            } else {
                h.files >= self.files_max
            }
    }

    pub fn stats(&self) -> CacheStats {
        CacheStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            decodes: 0,
            bytes_cached: lock(&self.held).bytes,
            evictions: self.evictions.load(Ordering::Relaxed),
            capacity: self.capacity,
            space_evictions: self.space_evictions.load(Ordering::Relaxed),
            space_refusals: self.space_refusals.load(Ordering::Relaxed),
        }
    }

    // Where files live: see `backing.rs`.

    /// A valid file of `spec` in the cache directory (none without one); the caller keeps it.
    pub(crate) fn find_in_dir(&self, spec: &KernelSpec) -> Option<Arc<BackingFile>> {
        let file = self.files.find_in_dir(spec)?;
        self.made(spec.id, &file);
        Some(file)
    }

    /// Makes the file of a decode ([`Files::begin`]), its space reserved, once room is made
    /// for it (see the module's text). The error is for the caller to log with the kernel's
    /// name.
    pub(crate) fn begin(&self, spec: &KernelSpec) -> Result<Pending, FileError> {
        let in_flight = self.make_room(spec.len);
        let mut dir_freed = false;
        let begun = self.files.begin(spec, &mut || {
            // A full cache directory: its own least recently used files go first, once.
            if !std::mem::replace(&mut dir_freed, true) && self.files.free_dir(spec.len) {
                return true;
            }
            self.free_space()
        });
        match begun {
            Ok(mut pending) => {
                pending.count_in(in_flight);
                Ok(pending)
            }
            Err(mut e) => {
                if e.no_room {
                    self.space_refusals.fetch_add(1, Ordering::Relaxed);
                    let h = lock(&self.held);
                    e.message.push_str(&format!(
                        "; nothing left to evict: the store keeps {} bytes of its {}-byte bound \
                         ({} pinned), backing files open now take {} bytes",
                        h.bytes,
                        self.capacity,
                        h.pinned,
                        self.files.live_bytes()
                    ));
                }
                Err(e)
            }
        }
    }

    /// Evicts least recently used entries until those kept, the files being written and a new
    /// one of `len` bytes fit the bound; counts the new one as being written from now on. A
    /// kernel that could not be kept beside the pins makes no room.
    fn make_room(&self, len: u64) -> InFlight {
        let mut dropped = Vec::new();
        let in_flight = {
            let mut h = lock(&self.held);
            if h.pinned + len <= self.capacity {
                let writing = self.writing.load(Ordering::Relaxed);
                while h.bytes + writing + len > self.capacity {
                    let Some(e) = h.evict_one(|_| true, false) else {
                        break;
                    };
                    self.evictions.fetch_add(1, Ordering::Relaxed);
                    dropped.push(e);
                }
            }
            // Counted under the lock, so that decodes beginning together make room for each
            // other.
            InFlight::new(&self.writing, len)
        };
        drop(dropped);
        in_flight
    }

    /// The file system is full: lets go of one more file the store holds (see the module's
    /// text) and returns whether there was one. Closing it frees its space unless an open
    /// handle still holds it.
    fn free_space(&self) -> bool {
        let any = self.files.in_memory();
        let file = |b: &Body| any || matches!(b, Body::File(_));
        // An entry, or a file held aside; dropped once the lock is released.
        let (entry, aside) = {
            let mut h = lock(&self.held);
            match h.evict_one(file, false) {
                Some(e) => (Some(e), None),
                None => match h.oversized.pop_front() {
                    Some((_, f)) => (None, Some(f)),
                    None => (h.evict_one(file, true), None),
                },
            }
        };
        if entry.is_none() && aside.is_none() {
            return false;
        }
        if entry.is_some() {
            self.evictions.fetch_add(1, Ordering::Relaxed);
        }
        self.space_evictions.fetch_add(1, Ordering::Relaxed);
        drop((entry, aside));
        true
    }

    /// Makes the per-mount directory now, in the process that serves the mount; returns the
    /// directory backing files go to (none in memory). See [`Files::start`].
    pub fn start(&self) -> io::Result<Option<std::path::PathBuf>> {
        self.files.start()
    }

    /// The directory backing files go to, once there is one.
    pub fn backing_dir(&self) -> Option<std::path::PathBuf> {
        self.files.dir()
    }

    /// See [`Files::finish`]: the file, and whether it may be kept.
    pub(crate) fn finish(&self, spec: &KernelSpec, pending: Pending) -> (Arc<BackingFile>, bool) {
        let (file, keep) = self.files.finish(spec, pending);
        self.made(spec.id, &file);
        (file, keep)
    }

    /// See [`Files::touch`].
    pub(crate) fn touch(&self, b: &BackingFile) {
        self.files.touch(b)
    }

    /// See [`Files::tidy`].
    pub(crate) fn tidy(&self) {
        self.files.tidy()
    }

    pub fn is_cache_dir(&self) -> bool {
        self.files.is_cache_dir()
    }

    pub fn in_memory(&self) -> bool {
        self.files.in_memory()
    }

    /// A short name for logs: `disk`, `memory` or `cache-dir`.
    pub fn kind(&self) -> &'static str {
        self.files.kind()
    }

    pub fn dir_stats(&self) -> DirStats {
        self.files.dir_stats()
    }

    /// Bytes of backing files open now, held here or by open handles.
    pub fn live_bytes(&self) -> u64 {
        self.files.live_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl Store {
        /// Bytes of pinned entries and of reservations for pins.
        pub(crate) fn pinned_bytes(&self) -> u64 {
            let h = lock(&self.held);
            h.pinned + h.reserved
        }
    }

    fn id(ordinal: u32) -> KernelId {
        KernelId {
            archive: 0,
            ordinal,
        }
    }

    fn bytes(n: usize, v: u8) -> Body {
        Body::Bytes(vec![v; n].into())
    }

    /// A memfd of `len` bytes of `v`, as the store's files would hold it.
    fn file(files: &Store, ordinal: u32, len: usize, v: u8) -> Body {
        let spec = KernelSpec {
            id: id(ordinal),
            len: len as u64,
            cache_key: [0; 32],
            digest: None,
        };
        let mut p = files.begin(&spec).unwrap();
        p.write_at(0, &vec![v; len]).unwrap();
        Body::File(files.finish(&spec, p).0)
    }

    fn read(b: &Body) -> Vec<u8> {
        b.with_range(0, u64::MAX, |r| r.unwrap().to_vec())
    }

    #[test]
    fn bytes_files_and_pins_count_in_one_bound() {
        let s = Store::new(&Placement::Memory, 100, 64).unwrap();
        assert!(s.keep(id(1), bytes(30, 1)));
        let f2 = file(&s, 2, 30, 2);
        assert!(s.keep(id(2), f2));
        assert!(s.reserve_pin(40));
        assert!(!s.reserve_pin(11), "pins may take half the bound");
        assert_eq!(s.pinned_bytes(), 40);
        let f3 = file(&s, 3, 40, 3);
        assert!(s.keep_pinned(id(3), f3, 7, 40));
        assert_eq!(s.pinned_bytes(), 40);
        // 30 + 30 + 40 = 100: full. A new entry evicts the least recently used unpinned one.
        assert_eq!(s.stats().bytes_cached, 100);
        assert!(s.keep(id(4), bytes(30, 4)));
        assert!(!s.contains(id(1)) && s.contains(id(2)) && s.contains(id(3)));
        // One that needs the pinned bytes too is not kept, and evicts nothing.
        assert!(!s.keep(id(5), bytes(61, 5)));
        assert!(s.contains(id(2)) && s.contains(id(4)));
        let st = s.stats();
        assert_eq!((st.bytes_cached, st.evictions), (100, 1));
        // Once the pin is taken, the entry is an ordinary one (and the most recently used).
        assert_eq!(read(&s.take(id(3)).unwrap()), [3; 40]);
        assert_eq!(s.pinned_bytes(), 0);
        assert!(s.keep(id(5), bytes(60, 5)));
        assert!(!s.contains(id(2)) && !s.contains(id(4)) && s.contains(id(3)));
        let st = s.stats();
        assert_eq!((st.bytes_cached, st.evictions), (100, 3));
    }

    #[test]
    fn eviction_follows_recent_use() {
        let s = Store::new(&Placement::Memory, 30, 64).unwrap();
        for i in 0..3 {
            assert!(s.keep(id(i), bytes(10, i as u8)));
        }
        // 0 used again: 1 is now the least recently used.
        assert!(s.take(id(0)).is_some());
        assert!(s.keep(id(3), bytes(10, 3)));
        assert!(s.contains(id(0)) && !s.contains(id(1)) && s.contains(id(2)));
        // One 25-byte entry needs all three 10-byte ones gone.
        assert!(s.keep(id(9), bytes(25, 9)));
        let st = s.stats();
        assert_eq!((st.bytes_cached, st.evictions), (25, 4));
        // Larger than the whole store: not kept, nothing evicted.
        assert!(!s.keep(id(10), bytes(31, 0)));
        assert_eq!(s.stats().evictions, 4);
        assert_eq!(read(&s.take(id(9)).unwrap()), [9; 25]);
    }

    #[test]
    fn a_released_pin_becomes_evictable_and_pins_past_the_scan_are_released() {
        let s = Store::new(&Placement::Memory, 100, 64).unwrap();
        for (ordinal, tag) in [(1, 10), (2, 11)] {
            assert!(s.reserve_pin(25));
            let f = file(&s, ordinal, 25, ordinal as u8);
            assert!(s.keep_pinned(id(ordinal), f, tag, 25));
        }
        assert!(!s.reserve_pin(1), "half the bound is pinned");
        // Filling the rest evicts nothing pinned.
        assert!(s.keep(id(3), bytes(50, 3)));
        assert!(!s.keep(id(4), bytes(51, 4)));
        assert!(s.contains(id(1)) && s.contains(id(2)));
        // The scan moved on past inode 10: its pin goes, the entry stays until room is needed.
        s.unpin_unless(|tag| tag >= 11);
        assert_eq!(s.pinned_bytes(), 25);
        assert!(s.contains(id(1)));
        assert!(s.keep(id(4), bytes(30, 4)));
        assert!(!s.contains(id(1)) && s.contains(id(2)));
        // A decode ahead that kept nothing gives its reservation back.
        assert!(s.reserve_pin(25));
        assert!(!s.reserve_pin(1));
        s.cancel_pin(25);
        assert!(s.reserve_pin(25));
    }

    #[test]
    fn files_are_bounded_in_number_and_bytes_in_memory_on_disk() {
        let s = Store::new(&Placement::Memory, 1000, 2).unwrap();
        for i in 0..3 {
            let f = file(&s, i, 10, i as u8);
            assert!(s.keep(id(i), f));
        }
        assert!(!s.contains(id(0)) && s.contains(id(1)) && s.contains(id(2)));
        // Bytes in memory hold no descriptor.
        assert!(s.keep(id(5), bytes(10, 5)));
        assert!(s.contains(id(1)) && s.contains(id(2)));
        let d = tempfile::tempdir().unwrap();
        let s = Store::new(&Placement::Scratch(d.path().to_owned()), 1 << 30, 64).unwrap();
        assert!(s.keep(id(1), bytes(3 << 20, 1)));
        assert!(s.keep(id(2), bytes(2 << 20, 2)));
        assert!(!s.contains(id(1)), "at most {MEMORY_MAX} bytes in memory");
        assert!(!s.keep(id(3), bytes((MEMORY_MAX + 1) as usize, 3)));
        // Each limit evicts its own kind only: a file used longer ago than the bytes stays
        // when bytes make way for bytes, and bytes stay when files make way for files.
        let s = Store::new(&Placement::Scratch(d.path().to_owned()), 1 << 30, 2).unwrap();
        assert!(s.keep(id(1), file(&s, 1, 10, 1)));
        assert!(s.keep(id(2), bytes(3 << 20, 2)));
        assert!(s.keep(id(3), bytes(2 << 20, 3)));
        assert!(s.contains(id(1)) && !s.contains(id(2)) && s.contains(id(3)));
        assert!(s.keep(id(4), file(&s, 4, 10, 4)));
        assert!(s.keep(id(5), file(&s, 5, 10, 5)));
        assert!(!s.contains(id(1)) && s.contains(id(3)));
        assert!(s.contains(id(4)) && s.contains(id(5)));
    }

    #[test]
    fn a_file_let_go_is_found_while_anyone_holds_it() {
        let s = Store::new(&Placement::Memory, 10, 64).unwrap();
        let Body::File(held) = file(&s, 0, 20, 7) else {
            unreachable!()
        };
        assert!(
            !s.keep(id(0), Body::File(held.clone())),
            "larger than the bound"
        );
        assert!(s.contains(id(0)));
        assert_eq!(read(&s.take(id(0)).unwrap()), [7; 20]);
        drop(held);
        assert!(!s.contains(id(0)) && s.take(id(0)).is_none());
    }

    fn spec(ordinal: u32, len: u64) -> KernelSpec {
        KernelSpec {
            id: id(ordinal),
            len,
            cache_key: [0; 32],
            digest: None,
        }
    }

    /// The bound counts what is kept, the files being written and the new one: room is made
    /// before the new file's space is reserved, not after it was written.
    #[test]
    fn room_is_made_before_a_files_space_is_reserved() {
        let s = Store::new(&Placement::Memory, 100, 64).unwrap();
        for i in 1..=2 {
            let f = file(&s, i, 40, i as u8);
            assert!(s.keep(id(i), f));
        }
        let first = s.begin(&spec(3, 40)).unwrap();
        assert!(
            !s.contains(id(1)) && s.contains(id(2)),
            "evicted before writing"
        );
        // A second file begun while the first is written makes room for both.
        let second = s.begin(&spec(4, 30)).unwrap();
        assert!(!s.contains(id(2)));
        assert_eq!(s.stats().evictions, 2);
        drop((first, second));
        // A kernel larger than the whole bound will not be kept: it makes no room.
        let f = file(&s, 5, 50, 5);
        assert!(s.keep(id(5), f));
        let big = s.begin(&spec(6, 101)).unwrap();
        assert!(s.contains(id(5)));
        assert_eq!(s.stats().evictions, 2);
        drop(big);
        // Nor does one that could not be kept beside the pins.
        assert!(s.reserve_pin(50));
        let f = file(&s, 7, 50, 7);
        assert!(s.keep_pinned(id(7), f, 1, 50));
        let beside_pins = s.begin(&spec(8, 60)).unwrap();
        assert!(s.contains(id(5)) && s.contains(id(7)));
        drop(beside_pins);
    }

    /// A file system fuller than the bound knows: the reservation that fails evicts one entry
    /// after another (files no handle holds give their space back) and is tried again; a
    /// kernel is refused only once nothing is left to evict, with a message that says where
    /// and how much.
    #[test]
    fn a_full_file_system_evicts_until_the_file_fits() {
        let d = tempfile::tempdir().unwrap();
        let mut s = Store::new(&Placement::Scratch(d.path().to_owned()), 1 << 30, 64).unwrap();
        s.files.quota = Some(110);
        for i in 1..=3 {
            let f = file(&s, i, 30, i as u8);
            assert!(s.keep(id(i), f));
        }
        // A handle holds kernel 1: evicting it frees nothing, and the next one goes too.
        let held = s.take(id(1)).unwrap();
        assert!(s.take(id(2)).is_some() && s.take(id(3)).is_some());
        let mut p = s.begin(&spec(4, 50)).unwrap();
        p.write_at(0, &[4; 50]).unwrap();
        assert!(!s.contains(id(2)) && s.contains(id(3)));
        assert!(s.contains(id(1)), "found through the handle's file");
        let st = s.stats();
        assert_eq!(
            (st.evictions, st.space_evictions, st.space_refusals),
            (2, 2, 0)
        );
        let (f, _) = s.finish(&spec(4, 50), p);
        assert!(s.keep(id(4), Body::File(f)));
        assert_eq!(read(&s.take(id(4)).unwrap()), [4; 50]);
        // Larger than what the file system has even with the store empty: refused.
        let e = s.begin(&spec(5, 90)).map(drop).unwrap_err();
        assert_eq!(e.errno, Errno(libc::ENOSPC));
        assert!(e.no_room);
        let dir = s.backing_dir().unwrap();
        assert!(
            e.message.starts_with(&format!(
                "no room for its 90-byte backing file in {} (",
                dir.display()
            )),
            "{}",
            e.message
        );
        assert!(
            e.message.ends_with(
                ": No space left on device (os error 28); nothing left to evict: the store \
                 keeps 0 bytes of its 1073741824-byte bound (0 pinned), backing files open \
                 now take 30 bytes"
            ),
            "{}",
            e.message
        );
        let st = s.stats();
        assert_eq!(
            (st.evictions, st.space_evictions, st.space_refusals),
            (4, 4, 1)
        );
        drop(held);
        // The space the handle held is back.
        assert!(s.begin(&spec(5, 90)).is_ok());
    }

    #[test]
    fn oversized_files_are_held_aside_two_at_a_time() {
        let s = Store::new(&Placement::Memory, 10, 64).unwrap();
        for i in 0..3 {
            let Body::File(f) = file(&s, i, 20, i as u8) else {
                unreachable!()
            };
            assert!(!s.keep(id(i), Body::File(f.clone())));
            s.hold_oversized(id(i), f);
        }
        assert!(!s.contains(id(0)) && s.contains(id(1)) && s.contains(id(2)));
        assert_eq!(read(&s.take(id(2)).unwrap()), [2; 20]);
        assert_eq!(s.stats().bytes_cached, 0);
    }
}
