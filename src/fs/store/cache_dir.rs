//! The persistent decoded-kernel cache directory (`--cache-dir`), shared by mounts, restarts
//! and several daemons at once.
//!
//! Layout, under `DIR/kpack-v1/`:
//! * `XY/HEX`: the decoded bytes of one kernel, exactly, so it can be a passthrough backing
//!   file. `HEX` is the 64-digit BLAKE3 key of (archive TOC, archive identity, key, arch), see
//!   `KpackFs::cache_key`; `XY` its first two digits (keeps directories small).
//! * `XY/HEX.b3`: `kpack-fuse cache v1`, `len N`, `blake3 HEX` (one per line): what the data
//!   file must be. Used to validate files of archives that carry no per-kernel digest.
//! * `XY/.tmp.*`: files being written; renamed into place when complete. Their writer holds an
//!   exclusive `flock` on each until it closes it, so a temporary nobody holds a lock on belongs
//!   to a daemon that died (or was killed) while writing it, and the next listing removes it.
//!
//! Nothing is locked against readers or other writers: every file is written under a unique
//! temporary name and renamed into place (readers see a whole old file or a whole new one, never
//! a partial one); two daemons missing the same kernel both decode it and the second rename
//! replaces identical bytes;
//! removing a file another daemon has open leaves that daemon's descriptor valid. Before use, a
//! file's length and BLAKE3 are checked (against the archive's digest when it has one, else the
//! `.b3` file); a file that fails is decoded again, never served.
//!
//! Bounded by `--disk-cache-size`: recency is the data file's modification time (touched when used,
//! at most once a minute per file); when the bytes written by this daemon push its estimate past
//! the bound, the directory is listed and the least recently used files are removed until it fits.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use super::kernel::{FileError, KernelSpec, fail};
use crate::error::hex;
use crate::fs::errno::Errno;

/// Where the layout above starts, inside the directory the user named.
const VERSION_DIR: &str = "kpack-v1";
const META_HEADER: &str = "kpack-fuse cache v1";
/// A temporary file older than this is removed even when locked (a writer that never finishes).
const STALE_TMP: Duration = Duration::from_secs(3600);

/// Counters of the persistent cache directory (all zero without one).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DirStats {
    /// Kernels found there, valid, and used without decoding.
    pub hits: u64,
    /// Kernels not there (decoded and written).
    pub misses: u64,
    /// Files found there but refused: wrong length or digest (decoded again).
    pub rejected: u64,
    /// Files removed to keep the directory within its bound.
    pub evictions: u64,
}

pub struct CacheDir {
    root: PathBuf,
    capacity: u64,
    /// Bytes in the directory as last listed, plus what this daemon wrote since.
    estimate: AtomicU64,
    next_tmp: AtomicU64,
    hits: AtomicU64,
    misses: AtomicU64,
    rejected: AtomicU64,
    evictions: AtomicU64,
}

impl CacheDir {
    /// Opens (creating it if needed) the cache under `dir`, bounded to `capacity` bytes.
    pub fn open(dir: &Path, capacity: u64) -> io::Result<CacheDir> {
        let root = dir.join(VERSION_DIR);
        std::fs::create_dir_all(&root)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", root.display())))?;
        let c = CacheDir {
            root,
            capacity,
            estimate: AtomicU64::new(0),
            next_tmp: AtomicU64::new(0),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
        };
        c.sweep();
        Ok(c)
    }

    pub fn stats(&self) -> DirStats {
        DirStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            rejected: self.rejected.load(Ordering::Relaxed),
            evictions: self.evictions.load(Ordering::Relaxed),
        }
    }

    fn paths(&self, key: &[u8; 32]) -> (PathBuf, PathBuf, PathBuf) {
        let name = hex(key);
        let sub = self.root.join(&name[..2]);
        let meta = sub.join(format!("{name}.b3"));
        (sub.join(&name), meta, sub)
    }

    /// Marks a file as just used (its modification time is the LRU order).
    pub fn touch(&self, file: &File) {
        // SAFETY: futimens on a descriptor we own; a null times pointer means "now".
        unsafe { libc::futimens(file.as_raw_fd(), std::ptr::null()) };
    }

    /// The cached file of `spec` if there is one and it is valid (a hit); an invalid one is
    /// counted and left for the next write to replace.
    pub fn find(&self, spec: &KernelSpec) -> Option<File> {
        let (data, meta, _) = self.paths(&spec.cache_key);
        let file = File::open(&data).ok()?;
        match self.validate(&file, &meta, spec) {
            Ok(()) => {
                self.hits.fetch_add(1, Ordering::Relaxed);
                self.touch(&file);
                Some(file)
            }
            Err(why) => {
                self.rejected.fetch_add(1, Ordering::Relaxed);
                log::warn!("{}: {why}; decoding it again", data.display());
                None
            }
        }
    }

    /// A new temporary file for `spec` (a miss), removed again unless it is committed.
    pub fn create(&self, spec: &KernelSpec) -> Result<(File, TmpFile), FileError> {
        self.misses.fetch_add(1, Ordering::Relaxed);
        let (_, _, sub) = self.paths(&spec.cache_key);
        std::fs::create_dir_all(&sub)
            .map_err(|e| FileError::new(&format!("cannot create {}", sub.display()), &e))?;
        let (file, path) = self.create_locked(&sub).map_err(|(path, e)| {
            FileError::new(&format!("cannot create {}", path.display()), &e)
        })?;
        let tmp = TmpFile { path: Some(path) };
        Ok((file, tmp))
    }

    /// Puts a completely written file (still open by the caller) in place, with its record
    /// (`digest`: the BLAKE3 of what was written). The caller keeps the directory within its
    /// bound ([`sweep_if_due`](Self::sweep_if_due)).
    pub fn commit(
        &self,
        mut tmp: TmpFile,
        spec: &KernelSpec,
        digest: [u8; 32],
    ) -> Result<(), Errno> {
        let (data, meta, sub) = self.paths(&spec.cache_key);
        let text = format!("{META_HEADER}\nlen {}\nblake3 {}\n", spec.len, hex(&digest));
        let (mut f, tmp_meta) = self
            .create_locked(&sub)
            .map_err(|(_, e)| fail(&format!("cannot write {}", meta.display()), &e))?;
        f.write_all(text.as_bytes())
            .and_then(|()| std::fs::rename(&tmp_meta, &meta))
            .map_err(|e| {
                let _ = std::fs::remove_file(&tmp_meta);
                fail(&format!("cannot write {}", meta.display()), &e)
            })?;
        let path = tmp.path.take().expect("a TmpFile is committed once");
        if let Err(e) = std::fs::rename(&path, &data) {
            let _ = std::fs::remove_file(&path);
            return Err(fail(&format!("cannot rename into {}", data.display()), &e));
        }
        self.estimate.fetch_add(spec.len, Ordering::Relaxed);
        Ok(())
    }

    /// Brings the directory back within its bound when the files written since the last sweep
    /// may have taken it over (called off readers' paths, once a decode job has answered them).
    pub fn sweep_if_due(&self) {
        if self.estimate.load(Ordering::Relaxed) > self.capacity {
            self.sweep();
        }
    }

    /// Makes room for a new file of `len` bytes before its space is reserved: when it would
    /// take the directory past its bound, removes least recently used files until it fits
    /// (a file larger than the whole bound makes no room: it is decoded, not kept for long).
    pub fn make_room(&self, len: u64) {
        if len <= self.capacity && self.estimate.load(Ordering::Relaxed) + len > self.capacity {
            self.sweep_to(|_| self.capacity - len);
        }
    }

    /// The file system is full: removes least recently used files of at least `len` bytes in
    /// all (within the bound or not). Returns whether any was removed.
    pub fn free(&self, len: u64) -> bool {
        self.sweep_to(|total| total.saturating_sub(len.max(1))) > 0
    }

    /// Where the files are (`DIR/kpack-v1`).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// A new temporary file in `sub`, under its name and holding its lock. Another daemon's
    /// listing may find the file between its creation and its lock, take it for a dead
    /// writer's and remove it; a file whose lock is taken, or whose name no longer leads to it
    /// once locked, is given up for a new name. Once locked under its name, no listing removes
    /// it. The error carries the name it happened on.
    fn create_locked(&self, sub: &Path) -> Result<(File, PathBuf), (PathBuf, io::Error)> {
        // Each try loses only to a listing caught inside a window of a few system calls.
        const TRIES: usize = 16;
        let mut tries = 0;
        loop {
            let n = self.next_tmp.fetch_add(1, Ordering::Relaxed);
            let path = sub.join(format!(".tmp.{}.{n}", std::process::id()));
            let file = File::options()
                .read(true)
                .write(true)
                .create_new(true)
                .mode(0o644)
                .open(&path)
                .map_err(|e| (path.clone(), e))?;
            let locked = lock_while_open(&file).and_then(|()| {
                let (ours, named) = (file.metadata()?, std::fs::symlink_metadata(&path)?);
                Ok(ours.dev() == named.dev() && ours.ino() == named.ino())
            });
            match locked {
                Ok(true) => return Ok((file, path)),
                // Taken by a listing: the listing removes the name, or already has.
                Ok(false) => {}
                Err(e) if e.raw_os_error() == Some(libc::EWOULDBLOCK) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => {
                    let _ = std::fs::remove_file(&path);
                    return Err((path, e));
                }
            }
            tries += 1;
            if tries == TRIES {
                let e = io::Error::other(format!(
                    "{TRIES} new temporary files in a row were removed by other daemons' listings"
                ));
                return Err((path, e));
            }
        }
    }

    /// Checks a cached file against its expected length and digest.
    fn validate(&self, file: &File, meta: &Path, spec: &KernelSpec) -> Result<(), String> {
        let len = file
            .metadata()
            .map_err(|e| format!("cannot stat: {e}"))?
            .len();
        if len != spec.len {
            return Err(format!("{len} bytes, expected {}", spec.len));
        }
        let want = match spec.digest {
            Some(d) => d,
            None => read_meta(meta, spec.len)?,
        };
        let got = hash_file(file, len).map_err(|e| format!("cannot read: {e}"))?;
        if got != want {
            return Err(format!(
                "content digest {} differs from the expected {}",
                hex(&got),
                hex(&want)
            ));
        }
        Ok(())
    }

    /// Lists the directory: removes stale temporary files, recounts the bytes, and removes
    /// least recently used kernels until the bound holds.
    fn sweep(&self) {
        self.sweep_to(|_| self.capacity);
    }

    /// [`sweep`](Self::sweep) down to `target(bytes listed)` bytes; returns how many files it
    /// removed.
    fn sweep_to(&self, target: impl FnOnce(u64) -> u64) -> u64 {
        let now = SystemTime::now();
        let mut files: Vec<(SystemTime, u64, PathBuf)> = Vec::new();
        let mut total = 0u64;
        let subs = std::fs::read_dir(&self.root)
            .into_iter()
            .flatten()
            .flatten();
        for sub in subs {
            for e in std::fs::read_dir(sub.path())
                .into_iter()
                .flatten()
                .flatten()
            {
                let (path, name) = (e.path(), e.file_name());
                let Ok(m) = e.metadata() else { continue };
                let mtime = m.modified().unwrap_or(SystemTime::UNIX_EPOCH);
                let name = name.to_string_lossy();
                if name.starts_with(".tmp.") {
                    let old = now.duration_since(mtime).is_ok_and(|age| age > STALE_TMP);
                    if old {
                        let _ = std::fs::remove_file(&path);
                    } else {
                        remove_if_abandoned(&path);
                    }
                    continue;
                }
                if name.ends_with(".b3") || !m.is_file() {
                    continue;
                }
                total += m.size();
                files.push((mtime, m.size(), path));
            }
        }
        let target = target(total);
        let mut removed = 0;
        if total > target {
            files.sort();
            for (_, size, path) in files {
                if total <= target {
                    break;
                }
                if std::fs::remove_file(&path).is_ok() {
                    let _ = std::fs::remove_file(path.with_extension("b3"));
                    self.evictions.fetch_add(1, Ordering::Relaxed);
                    removed += 1;
                }
                total -= size;
            }
        }
        self.estimate.store(total, Ordering::Relaxed);
        removed
    }
}

/// Bytes of kernels in the cache directory `dir` (as `--cache-dir` names it), from a listing:
/// what a mount's default bound counts as the cache's own, beside the free space.
pub fn bytes_in(dir: &Path) -> u64 {
    let subs = std::fs::read_dir(dir.join(VERSION_DIR))
        .into_iter()
        .flatten()
        .flatten();
    subs.flat_map(|sub| {
        std::fs::read_dir(sub.path())
            .into_iter()
            .flatten()
            .flatten()
    })
    .filter(|e| {
        let name = e.file_name();
        let name = name.to_string_lossy();
        !name.starts_with(".tmp.") && !name.ends_with(".b3")
    })
    .filter_map(|e| e.metadata().ok())
    .filter(|m| m.is_file())
    .map(|m| m.size())
    .sum()
}

/// The temporary name of a file being written; the file is removed on drop unless committed.
pub struct TmpFile {
    /// `None` once committed.
    path: Option<PathBuf>,
}

/// Takes an exclusive `flock` on a new temporary file, held until its last descriptor closes:
/// the kernel drops it when the writer dies, however it dies.
fn lock_while_open(file: &File) -> io::Result<()> {
    // SAFETY: flock on a descriptor we own.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Removes the temporary file at `path` if no process holds its lock (its writer is gone),
/// holding the lock across the removal: a writer that locks the file after that finds its name
/// gone. One caught between its creation and its lock looks abandoned too; its writer sees
/// that and starts again under a new name (see [`CacheDir::create_locked`]).
fn remove_if_abandoned(path: &Path) {
    let Ok(file) = File::options()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
    else {
        return;
    };
    // SAFETY: flock on a descriptor we own; it is released when `file` is dropped, after the
    // removal.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        let _ = std::fs::remove_file(path);
    }
}

impl Drop for TmpFile {
    fn drop(&mut self) {
        if let Some(path) = &self.path {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// The digest recorded for a file of `len` bytes.
fn read_meta(meta: &Path, len: u64) -> Result<[u8; 32], String> {
    let mut text = String::new();
    File::open(meta)
        .and_then(|f| f.take(4096).read_to_string(&mut text))
        .map_err(|e| format!("no usable {}: {e}", meta.display()))?;
    let mut lines = text.lines();
    let bad = || format!("{} is not a kpack-fuse cache record", meta.display());
    if lines.next() != Some(META_HEADER) {
        return Err(bad());
    }
    let recorded: u64 = lines
        .next()
        .and_then(|l| l.strip_prefix("len "))
        .and_then(|v| v.parse().ok())
        .ok_or_else(bad)?;
    if recorded != len {
        return Err(format!("recorded for {recorded} bytes, expected {len}"));
    }
    let digest = lines
        .next()
        .and_then(|l| l.strip_prefix("blake3 "))
        .ok_or_else(bad)?;
    parse_hex32(digest).ok_or_else(bad)
}

fn parse_hex32(s: &str) -> Option<[u8; 32]> {
    if s.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// BLAKE3 of the first `len` bytes of `file`, read in large positioned chunks.
fn hash_file(file: &File, len: u64) -> io::Result<[u8; 32]> {
    let mut hasher = blake3::Hasher::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut off = 0u64;
    while off < len {
        let want = buf.len().min((len - off) as usize);
        let n = file.read_at(&mut buf[..want], off)?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("ends at byte {off}"),
            ));
        }
        hasher.update(&buf[..n]);
        off += n as u64;
    }
    Ok(*hasher.finalize().as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trip() {
        let d: [u8; 32] = std::array::from_fn(|i| (i * 7) as u8);
        assert_eq!(parse_hex32(&hex(&d)), Some(d));
        assert_eq!(parse_hex32("zz"), None);
        assert_eq!(hex(&[0x0f, 0xa0]), "0fa0");
    }

    /// Two daemons on one directory: one writes kernels while the other lists the directory
    /// without pause (as a daemon over its bound does). A writer's temporary is never taken
    /// for a dead daemon's, and every kernel is created, written and put in place.
    #[test]
    fn a_listing_daemon_never_takes_a_live_writers_temporary() {
        let d = tempfile::tempdir().unwrap();
        let writer = CacheDir::open(d.path(), 1 << 30).unwrap();
        // Small enough that the lister evicts as it goes, keeping its listings short.
        let lister = CacheDir::open(d.path(), 64).unwrap();
        let stop = std::sync::atomic::AtomicBool::new(false);
        let failures = std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| {
                    while !stop.load(Ordering::Relaxed) {
                        lister.sweep();
                    }
                });
            }
            let mut failures = Vec::new();
            for i in 0..20_000u32 {
                let mut key = [0u8; 32];
                key[0] = (i % 4) as u8;
                key[4..8].copy_from_slice(&i.to_le_bytes());
                let spec = KernelSpec {
                    id: crate::fs::store::kernel::KernelId {
                        archive: 0,
                        ordinal: i,
                    },
                    len: 4,
                    cache_key: key,
                    digest: None,
                };
                // Every failure is collected: a panic here would leave the listers running.
                let made = writer
                    .create(&spec)
                    .map_err(|e| e.errno)
                    .and_then(|(mut file, tmp)| {
                        file.write_all(b"abcd").map_err(|_| Errno::EIO)?;
                        writer.commit(tmp, &spec, *blake3::hash(b"abcd").as_bytes())
                    });
                if let Err(e) = made {
                    failures.push((i, e));
                }
            }
            stop.store(true, Ordering::Relaxed);
            failures
        });
        assert!(
            failures.is_empty(),
            "{} of 20000 failed: {failures:?}",
            failures.len()
        );
    }
}
