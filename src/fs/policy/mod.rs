//! The open policy: which read path each open of a kernel file gets ([`OpenPolicy::opened`]:
//! passthrough or the daemon), given the mount's open mode (`mode.rs`). Plain state and
//! decisions, with no FUSE types and no lock of its own: the adapter keeps it behind one mutex,
//! feeds it the events (an open's file ready, a backing id registered or refused, a release)
//! and carries out what it returns (`fs/steps.rs`).
//!
//! The read paths:
//! * **passthrough**: the kernel reads the decoded file itself through a backing id. Linux
//!   wants one id per inode for all its open handles, so the id lives here with the inode and
//!   goes when the inode's last passthrough handle is released.
//! * **daemon**: the daemon answers every READ of the handle, and the kernel keeps its pages
//!   cached across opens. With passthrough on, an open waits for its complete file, so this is
//!   the path of inodes that have a daemon handle already, and of mounts where passthrough is
//!   not granted or an id was refused.
//! * **page cache**: OPEN is answered ENOSYS, after which the kernel opens every file of the
//!   mount without the daemon, keeps its page cache, and sends READs with handle 0.
//!
//! Whether opens go through the daemon or the mount is in page-cache mode, and whether
//! passthrough is on, is the mount's [`Mode`] (`mode.rs`), decided once; this type keeps the
//! open handles of each inode. The invariant Linux enforces, and this type keeps: an inode
//! never has passthrough handles and daemon handles open at once (the kernel fails the second
//! kind of open with EIO).

use std::collections::HashMap;

use super::tree::Ino;

mod mode;

pub use mode::{Granted, Mode, OpenMode, PAGE_CACHE_MEDIAN_MAX};

/// How a new handle is answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Handle<B> {
    /// Passthrough with the inode's backing id.
    Passthrough(B),
    /// Register a backing id for the handle's file (without holding the policy's lock), then
    /// report it with [`OpenPolicy::registered`] or [`OpenPolicy::refused`].
    Register,
    /// Read by the daemon.
    Daemon,
}

/// What an open handle reads through, as recorded for its release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Path {
    Passthrough,
    Daemon,
    /// Waiting for its backing id.
    Registering,
}

/// One inode's open handles, and its backing id while passthrough handles have it.
#[derive(Debug)]
struct Inode<B> {
    backing: Option<B>,
    passthrough: u32,
    daemon: u32,
    registering: u32,
}

impl<B> Default for Inode<B> {
    fn default() -> Self {
        Inode {
            backing: None,
            passthrough: 0,
            daemon: 0,
            registering: 0,
        }
    }
}

impl<B> Inode<B> {
    fn is_idle(&self) -> bool {
        self.passthrough == 0 && self.daemon == 0 && self.registering == 0
    }
}

/// The open handles of one mount (see the module documentation). `B` is the kernel's backing
/// id; the policy only keeps, clones and gives it back.
#[derive(Debug)]
pub struct OpenPolicy<B> {
    inodes: HashMap<Ino, Inode<B>>,
    handles: HashMap<u64, (Ino, Path)>,
}

impl<B> Default for OpenPolicy<B> {
    fn default() -> Self {
        OpenPolicy {
            inodes: HashMap::new(),
            handles: HashMap::new(),
        }
    }
}

impl<B: Clone> OpenPolicy<B> {
    /// An open of `ino` has its file as handle `fh`: `complete` when every byte is decoded;
    /// `passthrough` when the mount registers backing ids now ([`Mode::passthrough`]).
    pub fn opened(&mut self, ino: Ino, fh: u64, complete: bool, passthrough: bool) -> Handle<B> {
        // An inode with a backing id opens every handle with it: its file holds the same
        // bytes, and Linux refuses an open without it meanwhile.
        if let Some(id) = self.join_backing(ino, fh) {
            return Handle::Passthrough(id);
        }
        if passthrough && complete && self.passthrough_allowed(ino) {
            self.inodes.entry(ino).or_default().registering += 1;
            self.handles.insert(fh, (ino, Path::Registering));
            return Handle::Register;
        }
        self.add_daemon_handle(ino, fh);
        Handle::Daemon
    }

    /// A new passthrough handle `fh` of `ino` with the inode's backing id, if it has one.
    fn join_backing(&mut self, ino: Ino, fh: u64) -> Option<B> {
        let inode = self.inodes.get_mut(&ino)?;
        let id = inode.backing.clone()?;
        inode.passthrough += 1;
        self.handles.insert(fh, (ino, Path::Passthrough));
        Some(id)
    }

    /// Linux refuses a passthrough open of an inode with daemon handles open.
    fn passthrough_allowed(&self, ino: Ino) -> bool {
        self.inodes.get(&ino).is_none_or(|i| i.daemon == 0)
    }

    fn add_daemon_handle(&mut self, ino: Ino, fh: u64) {
        self.inodes.entry(ino).or_default().daemon += 1;
        self.handles.insert(fh, (ino, Path::Daemon));
    }

    /// Handle `fh` got backing id `id`. Returns the answer, and an id to close (without the
    /// lock) when another one is used instead or the handle is read by the daemon after all.
    pub fn registered(&mut self, fh: u64, id: B) -> (Handle<B>, Option<B>) {
        let Some(ino) = self.stop_registering(fh) else {
            return (Handle::Daemon, Some(id));
        };
        // Another open of the inode registered first.
        if let Some(theirs) = self.join_backing(ino, fh) {
            return (Handle::Passthrough(theirs), Some(id));
        }
        // A daemon handle of the inode was opened meanwhile: a passthrough open now would fail.
        if !self.passthrough_allowed(ino) {
            self.add_daemon_handle(ino, fh);
            return (Handle::Daemon, Some(id));
        }
        let inode = self.inodes.entry(ino).or_default();
        inode.backing = Some(id.clone());
        inode.passthrough += 1;
        self.handles.insert(fh, (ino, Path::Passthrough));
        (Handle::Passthrough(id), None)
    }

    /// The kernel refused a backing id for handle `fh` (the mount's [`Mode`] turns
    /// passthrough off). Returns the answer: an inode that got an id from another open
    /// meanwhile is opened with it, since Linux fails an open without one beside a handle that
    /// has one; else the daemon reads.
    pub fn refused(&mut self, fh: u64) -> Handle<B> {
        let Some(ino) = self.stop_registering(fh) else {
            return Handle::Daemon;
        };
        if let Some(id) = self.join_backing(ino, fh) {
            return Handle::Passthrough(id);
        }
        self.add_daemon_handle(ino, fh);
        Handle::Daemon
    }

    fn stop_registering(&mut self, fh: u64) -> Option<Ino> {
        let (ino, path) = self.handles.remove(&fh)?;
        debug_assert_eq!(path, Path::Registering);
        if let Some(inode) = self.inodes.get_mut(&ino) {
            inode.registering = inode.registering.saturating_sub(1);
        }
        Some(ino)
    }

    /// Handle `fh` is released. Returns the inode's backing id when this was its last
    /// passthrough handle, to be closed without the lock.
    pub fn release(&mut self, fh: u64) -> Option<B> {
        let (ino, path) = self.handles.remove(&fh)?;
        let inode = self.inodes.get_mut(&ino)?;
        let mut closed = None;
        match path {
            Path::Passthrough => {
                inode.passthrough -= 1;
                if inode.passthrough == 0 {
                    closed = inode.backing.take();
                }
            }
            Path::Daemon => inode.daemon -= 1,
            Path::Registering => inode.registering -= 1,
        }
        if inode.is_idle() {
            self.inodes.remove(&ino);
        }
        closed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl<B> OpenPolicy<B> {
        /// Open handles of `ino`: (passthrough, daemon).
        pub(crate) fn handles_of(&self, ino: Ino) -> (u32, u32) {
            self.inodes
                .get(&ino)
                .map_or((0, 0), |i| (i.passthrough, i.daemon))
        }

        /// Whether `ino` has a backing id now.
        pub(crate) fn has_backing(&self, ino: Ino) -> bool {
            self.inodes.get(&ino).is_some_and(|i| i.backing.is_some())
        }
    }

    /// A mount with passthrough on.
    fn passthrough_mount() -> OpenPolicy<u32> {
        OpenPolicy::default()
    }

    #[test]
    fn one_backing_id_per_inode_closed_with_its_last_handle() {
        let mut p = passthrough_mount();
        assert_eq!(p.opened(5, 1, true, true), Handle::Register);
        assert_eq!(p.registered(1, 50), (Handle::Passthrough(50), None));
        // A second open reuses the id without registering.
        assert_eq!(p.opened(5, 2, true, true), Handle::Passthrough(50));
        assert_eq!(p.handles_of(5), (2, 0));
        assert_eq!(p.release(1), None);
        assert!(p.has_backing(5));
        assert_eq!(p.release(2), Some(50));
        assert!(!p.has_backing(5));
        assert_eq!(
            p.release(2),
            None,
            "a second release of a handle is ignored"
        );
    }

    #[test]
    fn without_passthrough_every_handle_is_the_daemons() {
        let mut p = passthrough_mount();
        assert_eq!(p.opened(5, 1, true, false), Handle::Daemon);
        assert_eq!(p.opened(5, 2, false, false), Handle::Daemon);
        assert_eq!(p.handles_of(5), (0, 2));
    }

    #[test]
    fn racing_registrations_keep_the_first_id() {
        let mut p = passthrough_mount();
        assert_eq!(p.opened(5, 1, true, true), Handle::Register);
        assert_eq!(p.opened(5, 2, true, true), Handle::Register);
        assert_eq!(p.registered(2, 20), (Handle::Passthrough(20), None));
        assert_eq!(p.registered(1, 10), (Handle::Passthrough(20), Some(10)));
        assert_eq!(p.handles_of(5), (2, 0));
        assert_eq!(p.release(2), None);
        assert_eq!(p.release(1), Some(20));
    }

    #[test]
    fn a_file_still_decoding_is_read_by_the_daemon_and_blocks_passthrough() {
        let mut p = passthrough_mount();
        assert_eq!(p.opened(5, 1, false, true), Handle::Daemon);
        // Complete now, but the inode has a daemon handle: Linux would refuse passthrough.
        assert_eq!(p.opened(5, 2, true, true), Handle::Daemon);
        assert_eq!(p.handles_of(5), (0, 2));
        p.release(1);
        p.release(2);
        assert_eq!(p.opened(5, 3, true, true), Handle::Register);
    }

    #[test]
    fn a_daemon_handle_opened_during_registration_wins() {
        let mut p = passthrough_mount();
        assert_eq!(p.opened(5, 1, true, true), Handle::Register);
        assert_eq!(p.opened(5, 2, false, true), Handle::Daemon);
        assert_eq!(p.registered(1, 10), (Handle::Daemon, Some(10)));
        assert_eq!(p.handles_of(5), (0, 2));
    }

    #[test]
    fn a_refused_id_leaves_the_handle_to_the_daemon() {
        let mut p = passthrough_mount();
        assert_eq!(p.opened(5, 1, true, true), Handle::Register);
        assert_eq!(p.opened(6, 2, true, true), Handle::Register);
        assert_eq!(p.refused(1), Handle::Daemon);
        assert_eq!(p.refused(2), Handle::Daemon);
        assert_eq!(p.handles_of(5), (0, 1));
        assert_eq!(p.opened(7, 3, false, false), Handle::Daemon);
    }

    /// Two opens of one inode register at once; the kernel takes one id and refuses the
    /// other: the refused open joins the id, since a daemon handle beside it would fail.
    #[test]
    fn a_refused_open_joins_an_id_registered_meanwhile() {
        let mut p = passthrough_mount();
        assert_eq!(p.opened(5, 1, true, true), Handle::Register);
        assert_eq!(p.opened(5, 2, true, true), Handle::Register);
        assert_eq!(p.registered(1, 10), (Handle::Passthrough(10), None));
        assert_eq!(p.refused(2), Handle::Passthrough(10));
        assert_eq!(p.handles_of(5), (2, 0));
    }
}
