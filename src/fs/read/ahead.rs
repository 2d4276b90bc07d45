//! Decoding ahead of scans: when opens (or, in page-cache mode, first READs) walk the files in
//! order, decode threads that would idle decode the next files before they are asked for (see
//! `scan.rs` for when requests form a scan), and each decode thread that finishes a job goes on
//! with the next file ahead while no other job waits for a thread.

use super::kernel_life::{FillJob, Start};
use super::scan;
use crate::fs::tree::{Entry, Ino};
use crate::fs::{KpackFs, kernel_id};

impl KpackFs {
    /// After a first open (or first READ) of `ino`: when it continues a scan (see `scan.rs`),
    /// the decode jobs of the first files past the scan's front that are neither decoded nor
    /// decoding, one for each of the `idle_workers` decode threads. No request waits for them;
    /// the ones that come for their files join them like any decode. The open moves its scan
    /// even when no thread is idle: the busy ones go on ahead of the scan's new front when they
    /// finish ([`continue_ahead`](Self::continue_ahead)).
    pub(crate) fn jobs_ahead_of(&self, ino: Ino, idle_workers: usize) -> Vec<FillJob> {
        if !self.decodes_ahead() || !matches!(self.tree.entry(ino), Some(Entry::File(_))) {
            return Vec::new();
        }
        let Some(front) = self.scans.opened(ino) else {
            return Vec::new();
        };
        if idle_workers == 0 {
            return Vec::new();
        }
        self.release_unreachable_pins();
        let mut jobs = Vec::new();
        while jobs.len() < idle_workers {
            match self.next_ahead(front) {
                Some(job) => jobs.push(job),
                None => break,
            }
        }
        jobs
    }

    /// Runs `job`, then, on the same thread, decodes ahead of the scans going on (the one that
    /// moved last first) for as long as there is a file to decode ahead and `others_wait`
    /// says no other job waits for a thread.
    pub(crate) fn run_then_decode_ahead(&self, job: FillJob, others_wait: impl Fn() -> bool) {
        let mut next = Some(job);
        while let Some(job) = next {
            self.run_fill(job);
            next = if others_wait() {
                None
            } else {
                self.continue_ahead()
            };
        }
    }

    /// The next decode ahead of any scan going on, the one that moved last first.
    pub(in crate::fs) fn continue_ahead(&self) -> Option<FillJob> {
        if !self.decodes_ahead() {
            return None;
        }
        self.release_unreachable_pins();
        self.scans
            .fronts()
            .into_iter()
            .find_map(|front| self.next_ahead(front))
    }

    /// Pins the scans can no longer reach (see [`Scans::reach`](scan::Scans::reach)) are
    /// released: the entries stay, as ordinary ones.
    fn release_unreachable_pins(&self) {
        let reach = self.scans.reach();
        self.store
            .unpin_unless(|tag| reach.iter().any(|&(from, to)| (from..=to).contains(&tag)));
    }

    /// The decode job of the first file within [`scan::AHEAD`] inodes past `front`, of at most
    /// a [`scan::CACHE_SHARE`] of the cache, that is cold and not given up (see
    /// `kernel_life.rs`). Never with memory backing: its memory cannot be reclaimed, so nothing
    /// is decoded into it before it is asked for. Not a kernel page-cache mode decodes straight
    /// into a READ's reply: a backing file for it would cost more than its decode.
    ///
    /// Its file is pinned in the store until its first open, and the pins count in the store's
    /// bound: when they (with the decodes ahead running) would take more than their share of it
    /// ([`PIN_SHARE`](crate::fs::store::PIN_SHARE)), nothing more is decoded ahead until opens
    /// take them.
    fn next_ahead(&self, front: Ino) -> Option<FillJob> {
        let largest = self.store.stats().capacity / scan::CACHE_SHARE;
        let last = front + scan::AHEAD;
        for ino in front + 1..=last {
            let Some(Entry::File(file)) = self.tree.entry(ino) else {
                continue;
            };
            if file.size == 0 || file.size > largest || self.decodes_into_reply(file) {
                continue;
            }
            match self
                .decodes
                .start_ahead(&self.store, ino, kernel_id(file), file.size)
            {
                Start::Busy => continue,
                Start::NoRoom => return None,
                Start::Started(job) => {
                    self.prefetch_after(ino, last);
                    return Some(job);
                }
            }
        }
        None
    }

    /// Asks the archives to read ahead the stored bytes of the next [`scan::PREFETCH`] files
    /// past `ino` (up to `last`) that are neither decoded nor decoding: the decode thread that
    /// takes one of them next finds its frame in the page cache instead of waiting on the disk
    /// (archives are read with random-access advice, so nothing else reads ahead of a scan).
    fn prefetch_after(&self, ino: Ino, last: Ino) {
        let mut hinted = 0;
        for next in ino + 1..=last {
            if hinted == scan::PREFETCH {
                return;
            }
            let Some(Entry::File(file)) = self.tree.entry(next) else {
                continue;
            };
            if file.stored_size == 0 || !self.decodes.is_cold(&self.store, kernel_id(file)) {
                continue;
            }
            self.archive_of(file)
                .will_need_at(file.binary as usize, file.entry as usize);
            hinted += 1;
        }
    }

    /// Whether files are decoded ahead of scans: not when turned off, or with memory backing.
    pub(super) fn decodes_ahead(&self) -> bool {
        self.scans.enabled() && !self.store.in_memory()
    }

    /// Turns decoding ahead of scans on or off (on by default).
    pub fn set_decode_ahead(&self, on: bool) {
        self.scans.set_enabled(on);
    }
}
