//! Page-cache mode's cache of small kernels: those that fit in one READ are decoded straight
//! into the reply (a backing file would cost more than the decode), and kept here, bounded by
//! bytes, so that the other READs of the same kernel (concurrent readers, readahead windows, a
//! kernel whose page cache was dropped) do not decode it again.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::kernel_cache::KernelId;
use crate::sync::lock;

/// At most this many bytes of small kernels are kept (within the mount's `--cache-size`).
pub const SMALL_CACHE_MAX: u64 = 4 << 20;

struct Inner {
    lru: lru::LruCache<KernelId, Arc<[u8]>>,
    bytes: u64,
}

/// A byte-bounded LRU of decoded small kernels.
pub struct SmallKernels {
    inner: Mutex<Inner>,
    capacity: u64,
    hits: AtomicU64,
    misses: AtomicU64,
}

impl SmallKernels {
    pub fn new(capacity: u64) -> SmallKernels {
        SmallKernels {
            inner: Mutex::new(Inner {
                lru: lru::LruCache::unbounded(),
                bytes: 0,
            }),
            capacity,
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }

    /// The kernel's bytes, counted as a hit or a miss.
    pub fn get(&self, id: KernelId) -> Option<Arc<[u8]>> {
        let found = lock(&self.inner).lru.get(&id).cloned();
        let counter = if found.is_some() {
            &self.hits
        } else {
            &self.misses
        };
        counter.fetch_add(1, Ordering::Relaxed);
        found
    }

    /// The kernel's bytes, not counted (a second look by the job a miss started).
    pub fn peek(&self, id: KernelId) -> Option<Arc<[u8]>> {
        lock(&self.inner).lru.get(&id).cloned()
    }

    /// Keeps a decoded kernel, evicting the least recently used ones to stay in bounds.
    pub fn put(&self, id: KernelId, bytes: Arc<[u8]>) {
        let size = bytes.len() as u64;
        if size > self.capacity {
            return;
        }
        // Evicted kernels are freed after the lock is released.
        let mut evicted = Vec::new();
        {
            let mut inner = lock(&self.inner);
            if let Some(old) = inner.lru.pop(&id) {
                inner.bytes -= old.len() as u64;
                evicted.push(old);
            }
            while inner.bytes + size > self.capacity {
                match inner.lru.pop_lru() {
                    Some((_, old)) => {
                        inner.bytes -= old.len() as u64;
                        evicted.push(old);
                    }
                    None => break,
                }
            }
            inner.lru.put(id, bytes);
            inner.bytes += size;
        }
        drop(evicted);
    }

    /// (hits, misses, bytes kept).
    pub fn counts(&self) -> (u64, u64, u64) {
        (
            self.hits.load(Ordering::Relaxed),
            self.misses.load(Ordering::Relaxed),
            lock(&self.inner).bytes,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(ordinal: u32) -> KernelId {
        KernelId {
            archive: 0,
            ordinal,
        }
    }

    #[test]
    fn keeps_kernels_within_its_byte_bound_least_recent_out() {
        let c = SmallKernels::new(10);
        c.put(id(1), Arc::from(&[1u8; 4][..]));
        c.put(id(2), Arc::from(&[2u8; 4][..]));
        assert_eq!(c.get(id(1)).as_deref(), Some(&[1u8; 4][..]));
        // 4 + 4 + 4 > 10: the least recently used (2) goes.
        c.put(id(3), Arc::from(&[3u8; 4][..]));
        assert_eq!(c.get(id(2)), None);
        assert_eq!(c.get(id(3)).as_deref(), Some(&[3u8; 4][..]));
        // Larger than the whole bound: not kept, nothing evicted.
        c.put(id(4), Arc::from(&[4u8; 11][..]));
        assert_eq!(c.peek(id(4)), None);
        assert_eq!(c.counts(), (2, 1, 8));
    }
}
