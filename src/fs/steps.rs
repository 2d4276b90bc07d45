//! The steps the mount takes for `init`, an OPEN, the answer to an open and a RELEASE: the open
//! policy's decisions carried out on [`KpackFs`]. No FUSE types, so the model test
//! (`model_tests.rs`) runs the very steps the adapter runs; the adapter adds only the replies,
//! and the decode pool.

use std::fmt::Display;
use std::sync::{Arc, Mutex};

use super::KpackFs;
use super::policy::{Granted, Handle, OpenPolicy, OpenStart};
use super::read::fill::{OpenDone, OpenedFile};
use super::read::{FillJob, NewHandle};
use super::store::BackingFile;
use super::tree::Ino;
use crate::sync::lock;

/// Where an open's work runs: the adapter's decode pool, or the model test's threads.
pub trait Runner {
    /// Runs a decode job off the request thread.
    fn decode(&self, job: FillJob);
    /// How many jobs handed in now would start at once.
    fn idle_workers(&self) -> usize;
}

/// `init`: what the kernel granted. Returns whether the mount opens in page-cache mode, and
/// whether backing ids are registered.
pub fn granted<B: Clone>(
    fs: &KpackFs,
    policy: &Mutex<OpenPolicy<B>>,
    granted: Granted,
) -> (bool, bool) {
    let (page_cache, passthrough) = {
        let mut policy = lock(policy);
        policy.granted(granted);
        (policy.page_cache(), policy.passthrough())
    };
    fs.set_page_cache_mode(page_cache);
    if page_cache {
        // No open walks the files: there is no scan to decode ahead of.
        fs.set_decode_ahead(false);
    }
    (page_cache, passthrough)
}

/// An OPEN of `ino`: refused at once in page-cache mode (ENOSYS: the kernel opens files by
/// itself from now on), else started; either way `done` gets the answer. The open's own
/// decode is handed to `runner` before anything is decoded ahead of it.
pub fn open<B: Clone>(
    fs: &KpackFs,
    policy: &Mutex<OpenPolicy<B>>,
    runner: &impl Runner,
    ino: Ino,
    flags: i32,
    done: OpenDone,
) {
    let start = lock(policy).open();
    match start {
        OpenStart::NoOpen => done(Err(fs.refuse_open(ino, flags))),
        OpenStart::Open { passthrough } => {
            if let Some(job) = fs.open_start(ino, flags, passthrough, done) {
                runner.decode(job);
            }
            // If this open continues a scan, decode threads left idle decode ahead of it.
            for ahead in fs.decode_ahead(ino, runner.idle_workers()) {
                runner.decode(ahead);
            }
        }
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
    let handle = lock(policy).opened(ino, new.fh, new.complete);
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
            let (handle, first) = lock(policy).refused(new.fh);
            if first {
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
