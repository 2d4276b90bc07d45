//! An `auto` mount on its way to page-cache mode. Once it serves a warm set, every kernel a warm
//! pass has read through passthrough is put into the mount's page cache (a prefill) as soon as
//! its last passthrough handle is released, so the pass itself keeps passthrough's speed. A
//! passthrough open drops its inode's cached pages, so what a prefill stored counts only if no
//! passthrough open of the inode came after it was asked for. The mount turns at an open of a
//! kernel held in the page cache once no prefill is running: the reader is then on a pass over
//! kernels already there (a first pass opens each kernel once, before its prefill). Until the
//! turn, a kernel held in the page cache is opened as a daemon handle that reads from there.

use std::collections::{HashMap, HashSet};

use crate::fs::tree::Ino;

/// A prefill to run: put inode `ino`'s kept kernel into the mount's page cache, then report it
/// with [`OpenPolicy::prefilled`](super::OpenPolicy::prefilled).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Prefill {
    pub ino: Ino,
    /// The inode's passthrough opens when it was asked for.
    epoch: u64,
}

#[derive(Debug, Default)]
pub(super) struct Warm {
    /// A warm set was seen: prefills run from now on.
    seen: bool,
    /// The inodes of the warm opens in a row before that, prefilled first.
    recent: Vec<Ino>,
    /// Inodes whose kernel the mount's page cache holds.
    cached: HashSet<Ino>,
    /// Passthrough opens per inode.
    epochs: HashMap<Ino, u64>,
    /// Prefills asked for and not reported yet.
    pending: u64,
}

impl Warm {
    pub(super) fn seen(&self) -> bool {
        self.seen
    }

    /// `keep` warm opens in a row came, and the warm set is not seen yet.
    pub(super) fn found(&self, keep: usize) -> bool {
        !self.seen && self.recent.len() >= keep
    }

    /// An open found its kernel decoded and opened before (`warm`) or not; `keep` is how many
    /// warm opens make a warm set.
    pub(super) fn opened(&mut self, ino: Ino, warm: bool, keep: usize) {
        if self.seen {
            return;
        }
        if !warm {
            self.recent.clear();
        } else if self.recent.len() < keep {
            self.recent.push(ino);
        }
    }

    /// The warm set is seen: the prefills of its inodes that `open` says have no passthrough
    /// handle open (the others are asked for at their release).
    pub(super) fn see(&mut self, open: impl Fn(Ino) -> bool) -> Vec<Prefill> {
        self.seen = true;
        let mut recent = std::mem::take(&mut self.recent);
        recent.sort_unstable();
        recent.dedup();
        recent.retain(|&ino| !open(ino));
        recent.into_iter().map(|ino| self.ask(ino)).collect()
    }

    /// A passthrough open of `ino`: its cached pages are gone.
    pub(super) fn dropped(&mut self, ino: Ino) {
        *self.epochs.entry(ino).or_insert(0) += 1;
        self.cached.remove(&ino);
    }

    pub(super) fn ask(&mut self, ino: Ino) -> Prefill {
        self.pending += 1;
        Prefill {
            ino,
            epoch: self.epochs.get(&ino).copied().unwrap_or(0),
        }
    }

    /// A prefill ended; `stored`: every byte of the kernel reached the page cache.
    pub(super) fn done(&mut self, p: Prefill, stored: bool) {
        self.pending = self.pending.saturating_sub(1);
        if stored && self.epochs.get(&p.ino).copied().unwrap_or(0) == p.epoch {
            self.cached.insert(p.ino);
        }
    }

    pub(super) fn pending(&self) -> u64 {
        self.pending
    }

    pub(super) fn cached(&self, ino: Ino) -> bool {
        self.cached.contains(&ino)
    }

    /// The mount may turn at an open of `ino`: the reader is on a pass over kernels already
    /// put into the page cache, and no prefill is still running (after the turn, a kernel not
    /// there yet would be read through the daemon instead, which costs the same page-cache
    /// fill with a copy more).
    pub(super) fn ready(&self, ino: Ino) -> bool {
        self.seen && self.pending == 0 && self.cached.contains(&ino)
    }
}
