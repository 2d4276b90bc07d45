//! Decoding ahead of a scan: when opens walk a mount's files in order (`cp -r`, `tar`,
//! checksumming a tree, a runtime loading every kernel of a library), the first file past the
//! furthest one opened that is not decoded yet is decoded on an idle decode thread before anyone
//! asks for it.
//!
//! Inode numbers follow the TOC, which is the order such walks take (sorted names inside a
//! directory may visit its files in another order, hence a window rather than "the next
//! inode"). An open within [`WINDOW`] inodes of the previous one continues the scan; any other
//! starts a new one and decodes nothing ahead, so a loader that opens a few kernels here and
//! there costs what it reads. At most [`MAX_RUNNING`] decodes run ahead at a time, each on a
//! decode thread that would otherwise idle (at an open, or when a thread finishes a job and no
//! other job waits), never more than [`WINDOW`] inodes past the furthest open. Without it, the decode threads
//! would sit idle while each reader finishes a file and opens the next. A decode ahead also asks the archive to read
//! the stored bytes of the next [`PREFETCH`] files into the page cache: archives are opened with
//! random-access advice (a loader reads what it needs), so without the hint a cold scan's decode
//! threads each wait on the disk for their frame.
//!
//! A file decoded ahead is pinned in the store until its first open (`store/mod.rs`: pins count in
//! its bound, and decoding ahead waits while they take their share of it).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use crate::fs::tree::Ino;

/// How far (in inodes) an open may be from the previous one and still continue a scan, and
/// how far past the scan's front a file to decode ahead is looked for.
pub const WINDOW: u64 = 16;

/// Decodes ahead of a scan running at once, at most (each also needs a decode thread that would
/// otherwise idle).
pub const MAX_RUNNING: usize = 2;

/// Files past the one a decode ahead takes whose stored bytes are read ahead from the archive
/// at the same time, so that the next decodes do not wait on the disk.
pub const PREFETCH: usize = 2;

/// A file is decoded ahead only if it takes at most this share of the store's bound: its pin
/// counts in the bound (see `store/mod.rs`), and a few such pins must leave room for the rest.
pub const CACHE_SHARE: u64 = 4;

#[derive(Debug)]
pub struct Scan {
    /// Whether decoding ahead is on (`--no-decode-ahead` turns it off).
    pub enabled: AtomicBool,
    /// The furthest inode an open of the current scan reached (0: none yet).
    front: AtomicU64,
    /// The last open's inode.
    last: AtomicU64,
    /// Whether the last open continued a scan.
    active: AtomicBool,
    /// Decodes ahead running now.
    running: AtomicUsize,
    /// Decodes started ahead of a scan.
    pub started: AtomicU64,
}

impl Default for Scan {
    fn default() -> Self {
        Scan {
            enabled: AtomicBool::new(true),
            front: AtomicU64::new(0),
            last: AtomicU64::new(0),
            active: AtomicBool::new(false),
            running: AtomicUsize::new(0),
            started: AtomicU64::new(0),
        }
    }
}

impl Scan {
    /// Notes an open of file `ino`; returns the scan's front when it continues a scan (the
    /// inodes after it are the ones to decode ahead).
    pub fn opened(&self, ino: Ino) -> Option<Ino> {
        let last = self.last.swap(ino, Ordering::AcqRel);
        if last == 0 || last == ino || ino.abs_diff(last) > WINDOW {
            self.front.store(ino, Ordering::Release);
            self.active.store(false, Ordering::Release);
            return None;
        }
        self.active.store(true, Ordering::Release);
        let front = self.front.fetch_max(ino, Ordering::AcqRel).max(ino);
        Some(front)
    }

    /// The front of the scan the last open continued, if it did.
    pub fn front(&self) -> Option<Ino> {
        self.active
            .load(Ordering::Acquire)
            .then(|| self.front.load(Ordering::Acquire))
    }

    /// Claims one decode ahead; `false` when [`MAX_RUNNING`] run or decoding ahead is off.
    pub fn claim(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
            && self
                .running
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                    (n < MAX_RUNNING).then_some(n + 1)
                })
                .is_ok()
    }

    /// A claimed decode ahead ended (or was not started).
    pub fn release(&self) {
        self.running.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearby_opens_make_a_scan_and_far_ones_start_over() {
        let s = Scan::default();
        assert_eq!(s.opened(10), None, "one open is not a scan");
        assert_eq!(s.front(), None);
        assert_eq!(s.opened(12), Some(12));
        assert_eq!(s.front(), Some(12));
        // Out of order within the window (sorted names): the front stays the furthest.
        assert_eq!(s.opened(11), Some(12));
        assert_eq!(s.opened(15), Some(15));
        assert_eq!(s.opened(15), None, "the same file again continues nothing");
        // A jump elsewhere starts a new scan there.
        assert_eq!(s.opened(500), None);
        assert_eq!(s.front(), None, "no scan goes on");
        assert_eq!(s.opened(20), None);
        assert_eq!(s.opened(21), Some(21));
    }

    #[test]
    fn a_bounded_number_of_decodes_ahead_and_none_when_off() {
        let s = Scan::default();
        for _ in 0..MAX_RUNNING {
            assert!(s.claim());
        }
        assert!(!s.claim(), "{MAX_RUNNING} are running");
        s.release();
        assert!(s.claim());
        s.release();
        s.enabled.store(false, Ordering::Relaxed);
        assert!(!s.claim());
    }
}
