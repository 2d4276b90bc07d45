//! Decoding ahead of scans: when opens walk the files in order, decode threads that would idle
//! decode the next files before they are opened (see `scan.rs` for when opens form a scan).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::fill::Fill;
use super::scan;
use super::{FillJob, Make};
use crate::fs::tree::{Entry, Ino};
use crate::fs::{KpackFs, kernel_id};
use crate::sync::lock;

impl KpackFs {
    /// After an open of `ino`: when it continues a scan (see `scan.rs`), the decode jobs of the
    /// first files past the scan's front that are neither decoded nor decoding, one for each of
    /// the `idle_workers` decode threads, up to [`scan::MAX_RUNNING`] running at once. No open
    /// waits for them; the opens that come for their files join them like any decode (and, as
    /// they continue the scan, get the complete file: see `open_start`).
    pub fn decode_ahead(&self, ino: Ino, idle_workers: usize) -> Vec<FillJob> {
        // `open_start` noted the open in the scan.
        if !matches!(self.tree.entry(ino), Some(Entry::File(_))) || self.scan.front().is_none() {
            return Vec::new();
        }
        (0..idle_workers)
            .map_while(|_| self.continue_ahead())
            .collect()
    }

    /// While the scan the last open continued goes on, the next decode ahead of it: the first
    /// file within [`scan::WINDOW`] inodes past its front, of at most a [`scan::CACHE_SHARE`]
    /// of the cache, that is neither decoded nor decoding (a decode thread that just finished
    /// a job asks, so it stays busy until the readers open their next files).
    /// Never with memory backing: its memory cannot be reclaimed, so nothing is decoded into
    /// it before it is asked for.
    ///
    /// Its file is pinned in the store until its first open, and the pins count in the store's
    /// bound: when they (with the decodes ahead running) would take more than their share of it
    /// ([`PIN_SHARE`](crate::fs::store::PIN_SHARE)), nothing more is decoded ahead until opens take
    /// them. Pins the scan can no longer reach (more than [`scan::WINDOW`] inodes from its front)
    /// are released first.
    pub fn continue_ahead(&self) -> Option<FillJob> {
        let front = self.scan.front()?;
        if !self.decodes_ahead() || !self.scan.claim() {
            return None;
        }
        self.store
            .unpin_unless(|tag| tag.abs_diff(front) <= scan::WINDOW);
        let largest = self.store.stats().capacity / scan::CACHE_SHARE;
        for ino in front + 1..=front + scan::WINDOW {
            let Some(Entry::File(file)) = self.tree.entry(ino) else {
                continue;
            };
            let id = kernel_id(file);
            let mut fills = lock(&self.fills);
            if file.size == 0
                || file.size > largest
                || self.store.contains(id)
                || fills.contains_key(&id)
            {
                continue;
            }
            if !self.store.reserve_pin(file.size) {
                break;
            }
            let fill = Arc::new(Fill::for_kernel(file.size));
            fills.insert(id, fill.clone());
            drop(fills);
            self.scan.started.fetch_add(1, Ordering::Relaxed);
            self.prefetch_after(ino, front + scan::WINDOW);
            return Some(FillJob {
                ino,
                id,
                fill,
                make: Make::Ahead {
                    reserved: file.size,
                },
            });
        }
        self.scan.release();
        None
    }

    /// Asks the archives to read ahead the stored bytes of the next [`scan::PREFETCH`] files
    /// past `ino` (up to `last`) that are neither decoded nor decoding: the decode thread that
    /// takes one of them next finds its frame in the page cache instead of waiting on the disk
    /// (archives are read with random-access advice, so nothing else reads ahead of a scan).
    pub(super) fn prefetch_after(&self, ino: Ino, last: Ino) {
        let mut hinted = 0;
        for next in ino + 1..=last {
            if hinted == scan::PREFETCH {
                return;
            }
            let Some(Entry::File(file)) = self.tree.entry(next) else {
                continue;
            };
            let id = kernel_id(file);
            if file.stored_size == 0
                || self.store.contains(id)
                || lock(&self.fills).contains_key(&id)
            {
                continue;
            }
            self.archive_of(file)
                .will_need_at(file.binary as usize, file.entry as usize);
            hinted += 1;
        }
    }

    /// Whether files are decoded ahead of scans: not when turned off (as in page-cache mode,
    /// where no open walks the files), or with memory backing.
    pub(super) fn decodes_ahead(&self) -> bool {
        self.scan.enabled.load(Ordering::Relaxed) && !self.store.in_memory()
    }

    /// Turns decoding ahead of scans on or off (on by default).
    pub fn set_decode_ahead(&self, on: bool) {
        self.scan.enabled.store(on, Ordering::Relaxed);
    }
}
