//! The read side: requests for a kernel's bytes (opens, READs through a handle, READs by
//! inode), each answered from the store or by the kernel's decode, which it starts or joins
//! through the kernel's decode life (`kernel_life.rs`); and the open handles.

use std::sync::atomic::{AtomicU64, Ordering};

mod ahead;
mod decode;
pub(crate) mod fill;
pub(crate) mod kernel_life;
pub(crate) mod pool;
mod scan;
mod stream;

use super::errno::Errno;
use super::store::Body;
use super::tree::{Entry, FileNode, Ino};
use super::{KpackFs, kernel_id};
use crate::sync::lock;
use fill::{OpenDone, OpenedFile, ReadDone};
use kernel_life::{FillJob, Found, Make};

pub(crate) use scan::Scans;

/// In page-cache mode, kernels up to this size are decoded straight into the READ reply, with
/// no backing file (the largest READ the kernel sends by default is 128 KiB).
const DIRECT_READ_MAX: u64 = 128 << 10;

/// A handle made by [`KpackFs::add_handle`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NewHandle {
    pub fh: u64,
    /// Every byte of its file is decoded and checked.
    pub complete: bool,
}

impl KpackFs {
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

    /// Starts an open without waiting: `done` gets the file at once when it is stored, or the
    /// error; else, with `passthrough` (the kernel would read a complete file itself), when
    /// its decode completes; else when the decode starts streaming, or completes (a kernel
    /// that must be checked whole first). A returned job must be run
    /// ([`run_fill`](Self::run_fill)), off the request threads: it is the kernel's one decode,
    /// which every open of the kernel meanwhile joins. [`add_handle`](Self::add_handle) turns
    /// the answer into a handle.
    ///
    /// Why a passthrough open waits for the whole file: a handle opened before its file is
    /// complete reads through the daemon for its whole life (Linux takes a backing id only at
    /// open), one READ round trip at a time; answered when the decode ends, it reads the file
    /// at page-cache speed, so the reader is done about when the decode is.
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
        self.start_or_join(ino, file, passthrough, done)
    }

    /// Answers `done` with the kernel's complete file from the store, or joins its decode job,
    /// or starts one (returned, to be run); with `whole`, `done` waits for the complete file.
    /// A file decoded ahead is taken from its pin. A kernel held as bytes in memory (decoded
    /// for page-cache mode, where Linux sends no OPEN) has no file to open: EIO.
    fn start_or_join(
        &self,
        ino: Ino,
        file: &FileNode,
        whole: bool,
        done: OpenDone,
    ) -> Option<FillJob> {
        // The job's file is checked once it is there.
        let size = file.size;
        let name = self.name_for_log(file);
        let done: OpenDone = Box::new(move |r: Result<OpenedFile, Errno>| {
            done(r.and_then(|o| {
                size_matches(o.backing.len(), size, || name)?;
                Ok(o)
            }))
        });
        let found =
            self.decodes
                .find_or_start(&self.store, ino, kernel_id(file), file.size, Make::File);
        match found {
            Found::Held(Body::File(b)) => {
                done(Ok(OpenedFile::complete(b)));
                None
            }
            Found::Held(Body::Bytes(_)) => {
                done(Err(self.failed(
                    file,
                    &"opened in page-cache mode",
                    Errno::EIO,
                )));
                None
            }
            Found::Job(fill, job) => {
                fill.join(whole, done);
                job
            }
        }
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
        let make = if self.decodes_into_reply(file) {
            Make::Bytes
        } else {
            Make::FileForRead
        };
        let found = self
            .decodes
            .find_or_start(&self.store, ino, kernel_id(file), file.size, make);
        match found {
            Found::Held(body) => {
                let end = offset.saturating_add(u64::from(size));
                match size_matches(body.len(), file.size, || self.name_for_log(file)) {
                    Ok(()) => body.with_range(offset, end, done),
                    Err(e) => done(Err(e)),
                }
                None
            }
            Found::Job(fill, job) => {
                if let Err(e) =
                    size_matches(fill.kernel_len(), file.size, || self.name_for_log(file))
                {
                    done(Err(e));
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

    /// Registers an opened file as a new handle.
    pub fn add_handle(&self, opened: OpenedFile) -> NewHandle {
        let complete = opened.is_complete();
        let handle = NewHandle {
            fh: self.next_fh.fetch_add(1, Ordering::Relaxed),
            complete,
        };
        if !complete {
            self.opens_while_decoding.fetch_add(1, Ordering::Relaxed);
        }
        lock(&self.handles).insert(handle.fh, opened);
        handle
    }

    /// Drops a handle; its backing file goes when no handle and no store entry holds it.
    pub fn release(&self, fh: u64) {
        // Closed after the lock is released: the last handle of a large unlinked file frees it.
        let removed = lock(&self.handles).remove(&fh);
        drop(removed);
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

    /// In page-cache mode, a kernel that fits in one READ is decoded straight into the reply,
    /// with no backing file (create, reserve, unlink would cost more than the decode); its bytes
    /// are kept in the store, in memory. A cache directory still gets its file. Only there: an
    /// open needs a file, and no open reaches a mount in page-cache mode.
    fn decodes_into_reply(&self, f: &FileNode) -> bool {
        f.size <= DIRECT_READ_MAX && !self.store.is_cache_dir() && self.mode.page_cache()
    }

    /// Number of open file handles.
    pub fn open_handles(&self) -> usize {
        lock(&self.handles).len()
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

/// EIO, logged with the file's name, unless a kernel's decoded bytes (`len`) are the TOC's `size`.
/// Two TOC entries may name the same ordinal with different sizes (a malformed archive): what was
/// decoded for one must not be served for the other.
fn size_matches(len: u64, size: u64, name: impl FnOnce() -> String) -> Result<(), Errno> {
    if len == size {
        return Ok(());
    }
    log::error!(
        "{}: its kernel decodes to {len} bytes, the TOC says {size}",
        name()
    );
    Err(Errno::EIO)
}
