//! Backing files: each decoded kernel the mount serves from a file lives in a file of its own,
//! which the kernel reads directly (FUSE passthrough) or the daemon reads with `pread` (the
//! fallback path). This module makes, writes, seals and puts in place the files ([`Files`]);
//! which of them the mount keeps is the store's business (`store/mod.rs`), which uses this.
//!
//! Where the files live is the mount's choice ([`Placement`]):
//! * `Scratch` (the default): a directory of this mount on local disk (`scratch.rs`: made by
//!   the daemon, named after it, locked while it lives, removed by the next mount once it is
//!   dead). Files are unlinked the moment they are created, so a crashed daemon leaves nothing
//!   but an empty directory, and their pages are ordinary page cache the kernel can reclaim
//!   and read back.
//! * `Memory`: memfds, sealed once written. Nothing touches a disk, but the pages cannot be
//!   reclaimed without swap, so `--memory-cache-size` bounds them.
//! * `CacheDir`: a persistent directory shared across mounts and daemons (`cache_dir.rs`).
//!
//! The store's budget of open files is half the open-file limit ([`descriptor_budget`]), which
//! the program raised once at start-up (`setup/limits.rs`).
//!
//! A streamed kernel (the common case, see `read/fill.rs`) is decoded in steps, each written with
//! `pwrite` ([`Pending::write_at`], in pieces of [`WRITE_PIECE`] on disk): decoding into a
//! writable mapping would fault every 4 KiB page in (and dirty it) one by one, which costs more
//! CPU than the decoding itself. A kernel checked whole (digest of the decoded bytes only, or no
//! zstd) is written the same way, only published once it matched.
//! Space is reserved with `fallocate`, so a full disk or memory limit is an error for that
//! open, not a `SIGBUS` in the daemon; and [`Files::begin`] is called only once the
//! archive has checked that the stored kernel really produces that many bytes, so a hostile
//! size never claims disk or memory. When the reservation finds the file system full, the
//! caller (the store) is asked to free space and the reservation is tried again; only when it
//! has nothing left to free is the kernel refused, with a message naming the directory and
//! the sizes.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::cache_dir::{CacheDir, DirStats, TmpFile};
use super::kernel::{FileError, KernelId, KernelSpec};
use super::scratch::ScratchDir;
use crate::fs::errno::Errno;

/// Where backing files live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    /// A per-mount directory made under this one (by the daemon, see `scratch.rs`), removed
    /// when the store is dropped.
    Scratch(PathBuf),
    /// Anonymous memory (memfd).
    Memory,
    /// A persistent cache directory.
    CacheDir(PathBuf),
}

/// How often a cache directory's file in use is marked as used, at most (seconds).
const TOUCH_INTERVAL: u64 = 60;

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The default parent of the per-mount scratch directory: local disk on common systems
/// (unlike `/tmp`, which is often tmpfs, i.e. memory).
pub const DEFAULT_SCRATCH_BASE: &str = "/var/tmp";

/// One decoded kernel in a file. Reads past `len` return nothing.
#[derive(Debug)]
pub struct BackingFile {
    file: File,
    len: u64,
    live: Arc<AtomicU64>,
    /// When a cache directory's file was last marked as used (seconds since the epoch).
    touched: AtomicU64,
}

impl BackingFile {
    pub fn file(&self) -> &File {
        &self.file
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Fills `buf` from `offset`; short only at the end of the kernel.
    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let want = buf.len().min(self.len.saturating_sub(offset) as usize);
        crate::bytes::read_full_with(|b, at| self.file.read_at(b, at), &mut buf[..want], offset)
    }
}

impl BackingFile {
    /// Hands `answer` the bytes of `[offset, end)` (clipped to the kernel), read into this
    /// thread's buffer; a failed read is logged, EIO. The buffer is kept from read to read, so
    /// that a request does not fault in and zero a new one.
    pub fn with_range<R>(
        &self,
        offset: u64,
        end: u64,
        answer: impl FnOnce(Result<&[u8], Errno>) -> R,
    ) -> R {
        let want = end.min(self.len).saturating_sub(offset) as usize;
        let read = |buf: &mut Vec<u8>| {
            if buf.len() < want {
                buf.resize(want, 0);
            }
            self.read_at(&mut buf[..want], offset).map_err(|e| {
                log::error!("cannot read a backing file: {e}");
                Errno::EIO
            })
        };
        READ_BUF.with(|cell| match cell.try_borrow_mut() {
            Ok(mut buf) => {
                let got = read(&mut buf);
                answer(got.map(|n| &buf[..n]))
            }
            // Only if `answer` itself reads again on this thread.
            Err(_) => {
                let mut buf = Vec::new();
                let got = read(&mut buf);
                answer(got.map(|n| &buf[..n]))
            }
        })
    }
}

thread_local! {
    /// Each request thread's buffer for reads from backing files (as large as the largest
    /// read it answered, which FUSE bounds to its request size).
    static READ_BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl Drop for BackingFile {
    fn drop(&mut self) {
        self.live.fetch_sub(self.len, Ordering::Relaxed);
    }
}

enum Where {
    Scratch(ScratchDir),
    Memory,
    CacheDir(CacheDir),
}

/// Where the mount's backing files are made, found and kept in place (memfds, a per-mount
/// directory or a cache directory): the file side of the store (`mod.rs`), which decides
/// which of them it holds.
pub struct Files {
    place: Where,
    /// Bytes of all backing files still open (cached or held by handles).
    live: Arc<AtomicU64>,
    next_name: AtomicU64,
    /// Tests: the bytes of open files past which reserving space fails with ENOSPC, as an
    /// unlinked file's space comes back when its last descriptor closes.
    #[cfg(test)]
    pub(crate) quota: Option<u64>,
}

impl Files {
    /// Files placed as `placement` says; a cache directory is bounded to `capacity` bytes. A
    /// per-mount directory is made later, by [`start`](Self::start) or the first file.
    pub fn new(placement: &Placement, capacity: u64) -> io::Result<Files> {
        let place = match placement {
            Placement::Scratch(base) => Where::Scratch(ScratchDir::new(base.clone())),
            Placement::Memory => Where::Memory,
            Placement::CacheDir(dir) => Where::CacheDir(CacheDir::open(dir, capacity)?),
        };
        Ok(Files {
            place,
            live: Arc::new(AtomicU64::new(0)),
            next_name: AtomicU64::new(0),
            #[cfg(test)]
            quota: None,
        })
    }

    /// Makes the per-mount directory now, in the process that serves the mount (removing what
    /// dead daemons left beside it). Returns the directory files go to: the per-mount one or
    /// the cache directory's; none in memory.
    pub fn start(&self) -> io::Result<Option<PathBuf>> {
        match &self.place {
            Where::Scratch(dir) => dir.start().map(Some),
            Where::Memory => Ok(None),
            Where::CacheDir(dir) => Ok(Some(dir.root().to_owned())),
        }
    }

    /// The directory files go to, once there is one (see [`start`](Self::start)).
    pub fn dir(&self) -> Option<PathBuf> {
        match &self.place {
            Where::Scratch(dir) => dir.path(),
            Where::Memory => None,
            Where::CacheDir(dir) => Some(dir.root().to_owned()),
        }
    }

    /// Frees space in a full cache directory: removes its least recently used files, `len`
    /// bytes of them at least. Whether any was removed (none elsewhere).
    pub fn free_dir(&self, len: u64) -> bool {
        match &self.place {
            Where::CacheDir(dir) => dir.free(len),
            _ => false,
        }
    }

    /// Whether files live in a persistent cache directory.
    pub fn is_cache_dir(&self) -> bool {
        matches!(self.place, Where::CacheDir(_))
    }

    /// Whether files live in memory (memfds).
    pub fn in_memory(&self) -> bool {
        matches!(self.place, Where::Memory)
    }

    /// A short name for logs and `user.kpack.stats`.
    pub fn kind(&self) -> &'static str {
        match self.place {
            Where::Scratch(_) => "disk",
            Where::Memory => "memory",
            Where::CacheDir(_) => "cache-dir",
        }
    }

    /// A valid file of `spec` in the cache directory (none without one).
    pub fn find_in_dir(&self, spec: &KernelSpec) -> Option<Arc<BackingFile>> {
        let Where::CacheDir(dir) = &self.place else {
            return None;
        };
        let file = dir.find(spec)?;
        Some(self.wrap(file, spec.len))
    }

    /// Makes the file for a decode that serves readers while it writes (see `read/fill.rs` and
    /// `stream.rs`): the file, its space reserved, written with [`Pending::write_at`]. Call it
    /// only once the archive has checked that the stored kernel really produces `spec.len`
    /// bytes. When the file system is full, `free` is asked to free space and the reservation
    /// is tried again, until it says it freed nothing; the error is then `no_room`. Nothing is
    /// logged: the caller logs the error with the kernel's name.
    pub fn begin(
        &self,
        spec: &KernelSpec,
        free: &mut dyn FnMut() -> bool,
    ) -> Result<Pending, FileError> {
        let (file, tmp) = match &self.place {
            Where::Scratch(dir) => {
                let n = self.next_name.fetch_add(1, Ordering::Relaxed);
                let file = dir.new_file(n).map_err(|(path, e)| {
                    FileError::new(&format!("cannot create {}", path.display()), &e)
                })?;
                (file, None)
            }
            Where::Memory => (
                memfd(spec.id).map_err(|e| FileError::new("cannot create a memfd", &e))?,
                None,
            ),
            Where::CacheDir(dir) => {
                dir.make_room(spec.len);
                let (file, tmp) = dir.create(spec)?;
                (file, Some(tmp))
            }
        };
        if spec.len > 0 {
            loop {
                match self.reserve(&file, spec.len) {
                    Ok(()) => break,
                    Err(e) if self.is_full(&e) && free() => {}
                    Err(e) => return Err(self.no_room(spec.len, &e)),
                }
            }
        }
        // A cache directory records the digest of the decoded bytes; archives that have one
        // give it, the others get it hashed as the bytes are written.
        let hasher = (self.is_cache_dir() && spec.digest.is_none()).then(blake3::Hasher::new);
        let backing = self.wrap(file, spec.len);
        Ok(Pending {
            backing,
            piece: if self.in_memory() {
                usize::MAX
            } else {
                WRITE_PIECE
            },
            tmp,
            hasher,
            counted: None,
        })
    }

    /// Reserves `len` bytes for `file` (see [`reserve`]).
    fn reserve(&self, file: &File, len: u64) -> io::Result<()> {
        #[cfg(test)]
        if self
            .quota
            .is_some_and(|q| self.live_bytes().saturating_add(len) > q)
        {
            return Err(io::Error::from_raw_os_error(libc::ENOSPC));
        }
        reserve(file, len)
    }

    /// Whether a failed reservation means the place is full (so freeing space may help).
    fn is_full(&self, e: &io::Error) -> bool {
        match e.raw_os_error() {
            Some(libc::ENOSPC) | Some(libc::EDQUOT) => true,
            // A memfd over a memory cgroup's limit.
            Some(libc::ENOMEM) => self.in_memory(),
            _ => false,
        }
    }

    /// The error of a reservation that failed with nothing more to free: where, how large,
    /// and the free space there now.
    fn no_room(&self, len: u64, e: &io::Error) -> FileError {
        let place = match self.dir() {
            Some(dir) => {
                let free = free_space(&dir)
                    .map_or_else(String::new, |free| format!(" ({free} bytes free there)"));
                format!("{}{free}", dir.display())
            }
            None => "memory".to_owned(),
        };
        FileError {
            no_room: true,
            ..FileError::new(
                &format!("no room for its {len}-byte backing file in {place}"),
                e,
            )
        }
    }

    /// Completes a file [`begin`](Self::begin) made, once every byte is written: seals a memfd,
    /// renames a cache-directory file into place (with its record). Returns the file and
    /// whether it may be kept: a cache-directory file that cannot be put in place is logged
    /// and must not be (another daemon may write its name), but it holds every decoded byte
    /// all the same.
    pub fn finish(&self, spec: &KernelSpec, mut pending: Pending) -> (Arc<BackingFile>, bool) {
        // A frame that matched its digest decodes to the writer's bytes, whose digest the
        // archive records; only archives without one need the bytes hashed for the record.
        let digest = match pending.hasher.take() {
            Some(h) => *h.finalize().as_bytes(),
            None => spec.digest.unwrap_or([0; 32]),
        };
        let keep = match &self.place {
            Where::Memory => {
                seal(pending.backing.file());
                true
            }
            Where::CacheDir(dir) => {
                let tmp = pending
                    .tmp
                    .take()
                    .expect("a cache-directory file has a temporary name");
                dir.commit(tmp, spec, digest).is_ok()
            }
            Where::Scratch(_) => true,
        };
        (pending.backing, keep)
    }

    /// A file of `len` bytes as a backing file, counted in the live bytes.
    fn wrap(&self, file: File, len: u64) -> Arc<BackingFile> {
        self.live.fetch_add(len, Ordering::Relaxed);
        Arc::new(BackingFile {
            file,
            len,
            live: self.live.clone(),
            touched: AtomicU64::new(now_secs()),
        })
    }

    /// Marks a cache directory's file as used (its LRU order there), at most once per
    /// [`TOUCH_INTERVAL`] per file: the order only matters across sweeps, and a reader's
    /// every request need not write an inode. Call it holding no lock.
    pub fn touch(&self, b: &BackingFile) {
        let Where::CacheDir(dir) = &self.place else {
            return;
        };
        let now = now_secs();
        let last = b.touched.load(Ordering::Relaxed);
        if now.saturating_sub(last) >= TOUCH_INTERVAL
            && b.touched
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            dir.touch(b.file());
        }
    }

    /// Work the store defers off readers' paths: keeping a cache directory within its bound.
    pub fn tidy(&self) {
        if let Where::CacheDir(dir) = &self.place {
            dir.sweep_if_due();
        }
    }

    pub fn dir_stats(&self) -> DirStats {
        match &self.place {
            Where::CacheDir(d) => d.stats(),
            _ => DirStats::default(),
        }
    }

    /// Bytes of backing files open now, in the store or held by open handles.
    pub fn live_bytes(&self) -> u64 {
        self.live.load(Ordering::Relaxed)
    }
}

/// How many backing files a store may keep open under an open-file limit of `limit`: each is
/// a descriptor, and half of the limit is left to archives, FUSE channels and open handles. A
/// budget smaller than a tree evicts its files before their next open, and warm opens decode
/// again: hence the program raises the limit first (`setup::limits::raise_open_file_limit`).
pub fn descriptor_budget(limit: u64) -> usize {
    (limit / 2).clamp(16, 1 << 19) as usize
}

/// The bytes free for an unprivileged user on the file system of `dir` (`statvfs`).
pub fn free_space(dir: &Path) -> Option<u64> {
    fs_space(dir).map(|(_, free)| free)
}

/// The size and the bytes free for an unprivileged user of the file system of `path`
/// (`statvfs`).
pub fn fs_space(path: &Path) -> Option<(u64, u64)> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).ok()?;
    // SAFETY: a valid NUL-terminated path and a zeroed statvfs for the call to fill.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    let unit = st.f_frsize as u64;
    Some((
        (st.f_blocks as u64).saturating_mul(unit),
        (st.f_bavail as u64).saturating_mul(unit),
    ))
}

/// Counts `len` bytes in a total while it lives: the store's bytes of files being written.
pub(crate) struct InFlight {
    total: Arc<AtomicU64>,
    len: u64,
}

impl InFlight {
    /// Adds `len` to `total` until dropped.
    pub(crate) fn new(total: &Arc<AtomicU64>, len: u64) -> InFlight {
        total.fetch_add(len, Ordering::Relaxed);
        InFlight {
            total: total.clone(),
            len,
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.total.fetch_sub(self.len, Ordering::Relaxed);
    }
}

fn memfd(id: KernelId) -> io::Result<File> {
    let name = std::ffi::CString::new(format!("kpack-{}-{}", id.archive, id.ordinal))
        .expect("no NUL in a formatted number");
    // SAFETY: a valid NUL-terminated name; the returned descriptor is new and owned by us.
    let fd =
        unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd was just returned by memfd_create and nothing else owns it.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// Makes a filled memfd immutable, so nothing holding it can change what readers see.
fn seal(file: &File) {
    let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_WRITE | libc::F_SEAL_SEAL;
    // SAFETY: fcntl with integer arguments on a descriptor we own.
    unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, seals) };
}

/// The largest `pwrite` into a backing file on disk.
///
/// The page cache sizes the folios of a new file by the writes that fill it (ext4 takes large
/// folios since Linux 6.16), and the page allocator serves blocks of up to 32 KiB (order 3) from
/// per-CPU lists and the small free blocks, larger ones by splitting large free blocks. A VM
/// kernel with free page reporting hands free blocks of 2 MiB and more back to its host, and
/// each frame of those costs a host fault at first touch: once freed memory has been handed
/// back, 1 MiB writes fill new files several times slower than 32 KiB ones (figures:
/// docs/benchmarks.md, "Cold reads"). On memory freed moments before, large writes are a little
/// cheaper; elsewhere the extra system calls cost little next to decoding. Memfds are written
/// whole: their folio size is set by the shmem huge-page policy, not the writes.
pub const WRITE_PIECE: usize = 32 << 10;

/// A backing file being written by [`Files::begin`]: readable through
/// [`Pending::backing`] while it is written, removed (cache directory) if dropped unfinished.
pub struct Pending {
    backing: Arc<BackingFile>,
    /// The largest write: [`WRITE_PIECE`] on disk, unbounded for a memfd.
    piece: usize,
    tmp: Option<TmpFile>,
    /// The digest of the bytes written so far, when the file's record needs one.
    hasher: Option<blake3::Hasher>,
    /// Its bytes, counted by the store as being written until it is finished or dropped.
    counted: Option<InFlight>,
}

impl Pending {
    pub fn backing(&self) -> &Arc<BackingFile> {
        &self.backing
    }

    /// Counts the file in `in_flight` until it is finished or dropped.
    pub(crate) fn count_in(&mut self, in_flight: InFlight) {
        self.counted = Some(in_flight);
    }

    /// Writes `bytes` at `offset` (bytes not yet written read as zeros). Writes must come in
    /// order, back to back, when the file is hashed for a cache directory.
    pub fn write_at(&mut self, offset: u64, bytes: &[u8]) -> io::Result<()> {
        let end = offset.saturating_add(bytes.len() as u64);
        if end > self.backing.len {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{end} bytes for a {}-byte backing file", self.backing.len),
            ));
        }
        let mut at = offset;
        for piece in bytes.chunks(self.piece) {
            self.backing.file.write_all_at(piece, at)?;
            at += piece.len() as u64;
        }
        if let Some(h) = &mut self.hasher {
            h.update(bytes);
        }
        Ok(())
    }
}

/// `fallocate`, falling back to `ftruncate` where the filesystem cannot reserve space.
fn reserve(file: &File, len: u64) -> io::Result<()> {
    let off = libc::off_t::try_from(len).map_err(|_| io::Error::from_raw_os_error(libc::EFBIG))?;
    // SAFETY: fallocate on a descriptor we own, with integer arguments.
    let rc = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, off) };
    if rc == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS) => file.set_len(len),
        _ => Err(e),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    impl Pending {
        /// A file of `len` bytes to write, over `file` as it is (tests: a file whose writes fail).
        pub(crate) fn over(file: File, len: u64) -> Pending {
            Pending {
                backing: Arc::new(BackingFile {
                    file,
                    len,
                    live: Arc::new(AtomicU64::new(len)),
                    touched: AtomicU64::new(0),
                }),
                piece: WRITE_PIECE,
                tmp: None,
                hasher: None,
                counted: None,
            }
        }
    }

    use std::os::unix::fs::MetadataExt;

    fn spec(len: u64, key: u8) -> KernelSpec {
        KernelSpec {
            id: KernelId {
                archive: 0,
                ordinal: u32::from(key),
            },
            len,
            cache_key: [key; 32],
            digest: None,
        }
    }

    /// Every file under `dir`, recursively.
    fn files(dir: &Path) -> Vec<PathBuf> {
        let mut out = Vec::new();
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(files(&p));
            } else {
                out.push(p);
            }
        }
        out
    }

    /// A cache-directory file written by `begin`/`finish` with `data`.
    fn written(store: &Files, s: &KernelSpec, data: &[u8]) -> Arc<BackingFile> {
        let mut pending = store.begin(s, &mut || false).unwrap();
        pending.write_at(0, data).unwrap();
        let (file, kept) = store.finish(s, pending);
        assert!(kept);
        file
    }

    #[test]
    fn writes_longer_than_a_piece_land_whole_in_every_placement() {
        let d = tempfile::tempdir().unwrap();
        let len = 3 * WRITE_PIECE + 1234;
        let data: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::create_dir_all(d.path().join("scratch")).unwrap();
        for place in [
            Placement::Scratch(d.path().join("scratch")),
            Placement::Memory,
            Placement::CacheDir(d.path().join("cache")),
        ] {
            let store = Files::new(&place, 1 << 24).unwrap();
            let s = spec(len as u64, 9);
            let mut pending = store.begin(&s, &mut || false).unwrap();
            // Two writes, each across piece boundaries, the second from an odd offset.
            let cut = WRITE_PIECE + 17;
            pending.write_at(0, &data[..cut]).unwrap();
            pending.write_at(cut as u64, &data[cut..]).unwrap();
            let (file, kept) = store.finish(&s, pending);
            assert!(kept);
            let mut back = vec![0u8; len];
            assert_eq!(file.read_at(&mut back, 0).unwrap(), len);
            assert!(back == data, "{place:?}");
        }
    }

    #[test]
    fn a_cache_dir_file_is_touched_at_most_once_per_interval() {
        let d = tempfile::tempdir().unwrap();
        let store = Files::new(&Placement::CacheDir(d.path().to_owned()), 1 << 20).unwrap();
        let b = written(&store, &spec(100, 1), &[7; 100]);
        let set_old = || {
            let old = libc::timespec {
                tv_sec: 1000,
                tv_nsec: 0,
            };
            // SAFETY: futimens on a descriptor we own with two valid timespecs.
            assert_eq!(
                unsafe { libc::futimens(b.file().as_raw_fd(), [old, old].as_ptr()) },
                0
            );
        };
        let mtime = || b.file().metadata().unwrap().mtime();
        set_old();
        // Just written (a use): not marked again within the interval.
        store.touch(&b);
        assert_eq!(mtime(), 1000);
        // Once the interval has passed it is, once.
        b.touched.store(0, Ordering::Relaxed);
        store.touch(&b);
        assert!(mtime() > 1000);
        set_old();
        store.touch(&b);
        assert_eq!(mtime(), 1000);
    }

    #[test]
    fn a_cache_dir_file_that_cannot_be_put_in_place_still_reads_and_is_not_kept() {
        let d = tempfile::tempdir().unwrap();
        let store = Files::new(&Placement::CacheDir(d.path().to_owned()), 1 << 20).unwrap();
        let s = spec(4096, 2);
        let data: Vec<u8> = (0..4096u32).map(|i| (i % 199) as u8).collect();
        let mut pending = store.begin(&s, &mut || false).unwrap();
        pending.write_at(0, &data).unwrap();
        // Its temporary name is gone: the rename into place fails.
        for f in files(d.path()) {
            std::fs::remove_file(f).unwrap();
        }
        let (b, kept) = store.finish(&s, pending);
        assert_eq!(b.with_range(0, 4096, |r| r.unwrap().to_vec()), data);
        assert!(!kept);
        assert!(store.find_in_dir(&s).is_none());
        // A file that was put in place may be kept and is found.
        let s3 = spec(10, 3);
        written(&store, &s3, &[3; 10]);
        assert_eq!(
            store
                .find_in_dir(&s3)
                .unwrap()
                .with_range(0, 10, |r| r.unwrap().to_vec()),
            [3; 10]
        );
    }
}
