//! How a new handle's answer is carried out: the policy decides under the caller's lock,
//! except for the registration of a backing id (an ioctl on the FUSE device), which is made
//! without it and then squared with what other opens of the inode did meanwhile. The adapter
//! and the model test (`fs/model_tests.rs`) both run these steps, so the test covers the
//! sequence the mount runs.

use std::fmt::Display;
use std::sync::Mutex;

use super::{Handle, OpenPolicy};
use crate::fs::tree::Ino;
use crate::sync::lock;

impl<B: Clone> OpenPolicy<B> {
    /// How new handle `fh` of `ino` is answered, carried out under `policy`'s lock except for
    /// the registration of a backing id (`register`, an ioctl), which is made without it and
    /// then checked against what other opens of the inode did meanwhile. An id that is not
    /// used is dropped once the lock is released. Returns [`Handle::Passthrough`] or
    /// [`Handle::Daemon`].
    pub fn answer<E: Display>(
        policy: &Mutex<Self>,
        ino: Ino,
        fh: u64,
        complete: bool,
        warm: bool,
        register: impl FnOnce() -> Result<B, E>,
    ) -> Handle<B> {
        let handle = lock(policy).opened(ino, fh, complete, warm);
        if !matches!(handle, Handle::Register) {
            return handle;
        }
        match register() {
            Ok(id) => {
                let (handle, spare) = lock(policy).registered(fh, id);
                drop(spare);
                handle
            }
            Err(e) => {
                let (handle, first) = lock(policy).refused(fh);
                if first {
                    log::warn!(
                        "the kernel refused a passthrough backing file ({e}); \
                         reads go through the daemon from now on"
                    );
                }
                handle
            }
        }
    }
}
