//! The steps the mount takes for `init`, an OPEN, the answer to an open, a READ by inode and a
//! RELEASE: the open mode's and the open policy's decisions carried out on [`KpackFs`], with
//! the decode threads ([`Decoders`]) that run the decodes and keep decoding ahead of scans. No
//! FUSE types, so the model test (`model_tests.rs`) runs the very steps and decode threads the
//! adapter runs; the adapter adds only the replies.

use std::fmt::Display;
use std::sync::{Arc, Mutex};

use super::KpackFs;
use super::policy::{Granted, Handle, OpenPolicy};
use super::read::NewHandle;
use super::read::fill::{OpenDone, OpenedFile, ReadDone};
use super::read::kernel_life::FillJob;
use super::read::pool::Pool;
use super::store::BackingFile;
use super::tree::Ino;
use crate::sync::lock;

/// The mount's decode threads (one per core in a mount): each runs a decode job handed to it,
/// then goes on decoding ahead of the scans going on while no other job waits for a thread
/// ([`KpackFs::run_then_decode_ahead`]). Requests never decode on their own threads.
pub struct Decoders {
    fs: Arc<KpackFs>,
    pool: Pool,
}

impl Decoders {
    /// `threads` decode threads for `fs`.
    pub fn new(fs: Arc<KpackFs>, threads: usize) -> Decoders {
        Decoders {
            fs,
            pool: Pool::new(threads, "kpack-decode"),
        }
    }

    pub fn fs(&self) -> &KpackFs {
        &self.fs
    }

    /// Runs a decode job that a request waits for on a decode thread, before any decode ahead
    /// still queued.
    pub fn decode(&self, job: FillJob) {
        let run = self.job(job);
        self.pool.run(run);
    }

    /// Runs a decode ahead on a decode thread once no decode a request waits for is queued.
    fn queue_ahead(&self, job: FillJob) {
        let run = self.job(job);
        self.pool.run_background(run);
    }

    fn job(&self, job: FillJob) -> impl FnOnce() + Send + 'static {
        let fs = self.fs.clone();
        let queue = self.pool.queue();
        move || fs.run_then_decode_ahead(job, || queue.has_waiting())
    }

    /// How many jobs handed in now would start at once.
    pub fn idle_workers(&self) -> usize {
        self.pool.idle_workers()
    }
}

/// `init`: what the kernel granted settles the mount's open mode. Returns whether the mount
/// is in page-cache mode, and whether backing ids are registered.
pub fn granted(fs: &KpackFs, granted: Granted) -> (bool, bool) {
    fs.mode().settle(granted)
}

/// An OPEN of `ino`: refused at once in page-cache mode (ENOSYS: the kernel opens files by
/// itself from now on), else started; either way `done` gets the answer. With passthrough on,
/// the open waits for the complete file (see [`KpackFs::open_start`]). The open's own decode is
/// handed to the decode threads before anything is decoded ahead of it.
pub fn open(decoders: &Decoders, ino: Ino, flags: i32, done: OpenDone) {
    let fs = decoders.fs();
    let mode = fs.mode();
    if mode.page_cache() {
        return done(Err(fs.refuse_open(ino, flags)));
    }
    if let Some(job) = fs.open_start(ino, flags, mode.passthrough(), done) {
        decoders.decode(job);
    }
    decode_ahead(decoders, ino);
}

/// A READ by inode (page-cache mode, where Linux opens files by itself): answered from the
/// store, or by the kernel's decode job, handed to the decode threads when the READ starts it.
/// A file's first READ (at offset 0) counts as its open for the scans.
pub fn read_ino(decoders: &Decoders, ino: Ino, offset: u64, size: u32, done: ReadDone) {
    if let Some(job) = decoders.fs().read_ino_start(ino, offset, size, done) {
        decoders.decode(job);
    }
    if offset == 0 {
        decode_ahead(decoders, ino);
    }
}

/// If the request for `ino` continues a scan, decode threads left idle decode ahead of it.
fn decode_ahead(decoders: &Decoders, ino: Ino) {
    for ahead in decoders.fs().jobs_ahead_of(ino, decoders.idle_workers()) {
        decoders.queue_ahead(ahead);
    }
}

/// An open of `ino` has its file: it becomes a handle, answered as the policy decides. The
/// policy decides under its lock, except for the registration of the file as a backing id
/// (`register`, an ioctl on the FUSE device), which is made without it and then squared with
/// what other opens of the inode did meanwhile; an id left unused is closed once the lock is
/// released. Returns the handle and [`Handle::Passthrough`] or [`Handle::Daemon`].
pub fn answer<B: Clone, E: Display>(
    fs: &KpackFs,
    policy: &Mutex<OpenPolicy<B>>,
    ino: Ino,
    opened: OpenedFile,
    register: impl FnOnce(&BackingFile) -> Result<B, E>,
) -> (NewHandle, Handle<B>) {
    let file: Arc<BackingFile> = opened.backing.clone();
    let new = fs.add_handle(opened);
    let passthrough = fs.mode().passthrough();
    let handle = lock(policy).opened(ino, new.fh, new.complete, passthrough);
    if !matches!(handle, Handle::Register) {
        return (new, handle);
    }
    let handle = match register(&file) {
        Ok(id) => {
            let (handle, spare) = lock(policy).registered(new.fh, id);
            drop(spare);
            handle
        }
        Err(e) => {
            let handle = lock(policy).refused(new.fh);
            if fs.mode().refuse_passthrough() {
                log::warn!(
                    "the kernel refused a passthrough backing file ({e}); \
                     reads go through the daemon from now on"
                );
            }
            handle
        }
    };
    (new, handle)
}

/// A RELEASE of handle `fh`. The inode's backing id, when this was its last passthrough
/// handle, is closed after the policy's lock is released.
pub fn release<B: Clone>(fs: &KpackFs, policy: &Mutex<OpenPolicy<B>>, fh: u64) {
    let closed = lock(policy).release(fh);
    drop(closed);
    fs.release(fh);
}

#[cfg(test)]
mod tests {
    use super::*;

    impl Decoders {
        /// Waits until every job handed in (and every decode ahead it went on with) has ended.
        pub(crate) fn wait_idle(&self) {
            while !self.pool.is_idle() {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
    }
}
