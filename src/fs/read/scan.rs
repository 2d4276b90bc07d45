//! Scans: readers walking a mount's files in order (`cp -r`, `tar`, checksumming a tree, a
//! runtime loading every kernel of a library), each followed on its own, so that idle decode
//! threads can decode the files each reader opens next before it asks for them.
//!
//! Inode numbers follow the TOC, which is the order such walks take (sorted names inside a
//! directory may visit its files in another order, hence a window rather than "the next
//! inode"). A file's first open (or, in page-cache mode, its first READ) within [`WINDOW`]
//! inodes of the last file a scan reached continues that scan; any other starts a new scan and
//! decodes nothing ahead, so a loader that opens a few kernels here and there costs what it
//! reads. [`SCANS`] scans are followed at once (readers in different parts of the tree do not
//! reset each other's); a new one replaces the one that moved least recently. Files are decoded
//! ahead up to [`AHEAD`] inodes past a scan's front, on decode threads that would otherwise idle,
//! as many at once as there are such threads and as the store's bound lets pins take (see
//! `ahead.rs`). Decoding ahead also asks the archive to read the stored bytes of the next
//! [`PREFETCH`] files into the page cache: archives are opened with random-access advice (a
//! loader reads what it needs), so without the hint a cold scan's decode threads each wait on
//! the disk for their frame.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::fs::tree::Ino;
use crate::sync::lock;

/// How far (in inodes) an open may be from the last one of a scan and still continue it.
pub const WINDOW: u64 = 16;

/// How far past a scan's front (in inodes) files are decoded ahead: room for one decode per
/// thread of a many-core machine, counting the directories between the files.
pub const AHEAD: u64 = 64;

/// Scans followed at once.
pub const SCANS: usize = 16;

/// Files past the one a decode ahead takes whose stored bytes are read ahead from the archive
/// at the same time, so that the next decodes do not wait on the disk.
pub const PREFETCH: usize = 2;

/// A file is decoded ahead only if it takes at most this share of the store's bound: its pin
/// counts in the bound (see `store/mod.rs`), and a few such pins must leave room for the rest.
pub const CACHE_SHARE: u64 = 4;

/// One reader's walk.
#[derive(Debug, Clone, Copy)]
struct Track {
    /// The furthest inode the scan reached.
    front: Ino,
    /// The last inode opened in it.
    last: Ino,
    /// Whether the last open continued the scan (a first open, or the same file again, does
    /// not).
    active: bool,
    /// When it last moved (a count of opens).
    moved: u64,
}

#[derive(Debug, Default)]
struct Tracks {
    list: Vec<Track>,
    clock: u64,
}

/// The scans of one mount.
#[derive(Debug)]
pub struct Scans {
    /// Whether decoding ahead is on (`--no-decode-ahead` turns it off).
    enabled: AtomicBool,
    tracks: Mutex<Tracks>,
}

impl Default for Scans {
    fn default() -> Self {
        Scans {
            enabled: AtomicBool::new(true),
            tracks: Mutex::new(Tracks::default()),
        }
    }
}

impl Scans {
    pub fn enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    pub fn set_enabled(&self, on: bool) {
        self.enabled.store(on, Ordering::Relaxed);
    }

    /// Notes a first open (or first READ) of file `ino`; returns the front of the scan it
    /// continues, if it continues one (the inodes after it are the ones to decode ahead).
    pub fn opened(&self, ino: Ino) -> Option<Ino> {
        let mut t = lock(&self.tracks);
        t.clock += 1;
        let now = t.clock;
        if let Some(same) = t.list.iter_mut().find(|s| s.last == ino) {
            same.active = false;
            same.moved = now;
            return None;
        }
        let nearest = t
            .list
            .iter_mut()
            .filter(|s| ino.abs_diff(s.last) <= WINDOW)
            .min_by_key(|s| ino.abs_diff(s.last));
        if let Some(s) = nearest {
            s.last = ino;
            s.front = s.front.max(ino);
            s.active = true;
            s.moved = now;
            return Some(s.front);
        }
        let new = Track {
            front: ino,
            last: ino,
            active: false,
            moved: now,
        };
        if t.list.len() < SCANS {
            t.list.push(new);
        } else if let Some(oldest) = t.list.iter_mut().min_by_key(|s| s.moved) {
            *oldest = new;
        }
        None
    }

    /// The fronts of the scans going on, the one that moved last first.
    pub fn fronts(&self) -> Vec<Ino> {
        let t = lock(&self.tracks);
        let mut active: Vec<&Track> = t.list.iter().filter(|s| s.active).collect();
        active.sort_unstable_by_key(|s| std::cmp::Reverse(s.moved));
        active.iter().map(|s| s.front).collect()
    }

    /// What a file pinned ahead of a scan may stay pinned for: the ranges of inodes the scans
    /// followed now may still open, `(first, last)`.
    pub fn reach(&self) -> Vec<(Ino, Ino)> {
        lock(&self.tracks)
            .list
            .iter()
            .map(|s| (s.front.saturating_sub(WINDOW), s.front + AHEAD))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearby_opens_make_a_scan_and_far_ones_start_another() {
        let s = Scans::default();
        assert_eq!(s.opened(10), None, "one open is not a scan");
        assert!(s.fronts().is_empty());
        assert_eq!(s.opened(12), Some(12));
        assert_eq!(s.fronts(), [12]);
        // Out of order within the window (sorted names): the front stays the furthest.
        assert_eq!(s.opened(11), Some(12));
        assert_eq!(s.opened(15), Some(15));
        assert_eq!(s.opened(15), None, "the same file again continues nothing");
        assert!(s.fronts().is_empty());
        assert_eq!(s.opened(16), Some(16));
        // A reader elsewhere starts its own scan, and does not reset the first one.
        assert_eq!(s.opened(500), None);
        assert_eq!(s.fronts(), [16]);
        assert_eq!(s.opened(502), Some(502));
        assert_eq!(s.fronts(), [502, 16], "the one that moved last first");
        assert_eq!(s.opened(17), Some(17));
        assert_eq!(s.fronts(), [17, 502]);
        assert_eq!(s.reach(), [(1, 17 + AHEAD), (502 - WINDOW, 502 + AHEAD)]);
    }

    #[test]
    fn a_new_scan_replaces_the_one_that_moved_least_recently() {
        let s = Scans::default();
        for i in 0..SCANS as u64 {
            let at = 1000 * (i + 1);
            s.opened(at);
            assert_eq!(s.opened(at + 1), Some(at + 1));
        }
        // The first scan moves again; a new one then replaces the second.
        assert_eq!(s.opened(1002), Some(1002));
        assert_eq!(s.opened(99_000), None);
        assert_eq!(s.fronts().len(), SCANS - 1);
        assert_eq!(s.opened(2002), None, "the second scan is gone");
        assert_eq!(s.opened(1003), Some(1003), "the first goes on");
    }

    #[test]
    fn decoding_ahead_can_be_turned_off() {
        let s = Scans::default();
        assert!(s.enabled());
        s.set_enabled(false);
        assert!(!s.enabled());
    }
}
