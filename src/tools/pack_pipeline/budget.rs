//! A byte budget shared by a producer and the threads consuming what it hands over: the
//! producer waits while what it handed over and was not yet released adds up to more than the
//! limit. One item larger than the whole limit is let through alone, so the limit bounds memory
//! without ever deadlocking on a big item.

use std::sync::{Condvar, Mutex};

/// Bytes in flight, and whether the consumer gave up (so the producer stops waiting).
pub(crate) struct Budget {
    state: Mutex<(u64, bool)>,
    freed: Condvar,
    limit: u64,
}

impl Budget {
    pub(crate) fn new(limit: u64) -> Budget {
        Budget {
            state: Mutex::new((0, false)),
            freed: Condvar::new(),
            limit: limit.max(1),
        }
    }

    /// Waits for room for `n` bytes; false once the pipeline stopped.
    pub(crate) fn acquire(&self, n: u64) -> bool {
        let mut s = crate::sync::lock(&self.state);
        while !s.1 && s.0 > 0 && s.0.saturating_add(n) > self.limit {
            s = self.freed.wait(s).unwrap_or_else(|p| p.into_inner());
        }
        if s.1 {
            return false;
        }
        s.0 += n;
        true
    }

    pub(crate) fn release(&self, n: u64) {
        let mut s = crate::sync::lock(&self.state);
        s.0 -= n;
        self.freed.notify_all();
    }

    pub(crate) fn stop(&self) {
        crate::sync::lock(&self.state).1 = true;
        self.freed.notify_all();
    }
}
