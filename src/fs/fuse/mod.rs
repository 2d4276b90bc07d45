//! The FUSE adapter: the only module that imports `fuser`. `adapter.rs` translates kernel
//! requests into calls on [`KpackFs`](crate::fs::KpackFs) and the steps that carry out the
//! open policy's decisions (`fs/steps.rs`), and their answers back into replies; `mount.rs`
//! mounts, serves and tells our mount from a later one at the same path.
//!
//! * `init` asks the kernel for what the open mode wants (opening without the daemon,
//!   passthrough where this daemon may register backing files) and settles the mode from what
//!   was granted (`policy/mode.rs`).
//! * An OPEN runs `steps::open`: answered ENOSYS in page-cache mode, else its file is made
//!   ready and the policy says how the new handle is answered (`steps::answer`). The backing
//!   id is registered through the open's reply, without the policy's lock.
//! * Cold kernels decode on the decode threads (`steps::Decoders`), so request threads are never held by
//!   a decode. Opens and reads that must wait travel with the job as callbacks that own their
//!   replies (`read/fill.rs`).
//! * A READ with handle 0 is a file the kernel opened by itself (page-cache mode) and is served
//!   by inode; any other reads its handle's file.

mod adapter;
mod mount;

pub use mount::{Access, MountConfig, Mounted, OwnMount, SUBTYPE, escape_fsname, mount, serve_fd};
