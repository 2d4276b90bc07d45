//! Input buffers handed back by the workers once a kernel is compressed, for whoever reads the
//! next kernels into them (the producer in `run`, each worker in `run_loaded`). A fresh buffer
//! for every kernel costs a page fault and a page of zeroing by the kernel for every 4 KiB
//! read, and the read's copy runs slower into pages not yet mapped; a buffer that comes back
//! keeps its pages. The pool is small and bounded, so what it keeps adds a fixed amount to the pipeline's
//! budget, never something that grows with the input.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

/// Spent buffers, emptied, at most `max_count` of them holding at most `max_bytes` of capacity.
/// Nothing is kept until a producer first takes a buffer: one that brings its own (`split`
/// reads code objects as it walks a binary) would only have memory held for nobody.
pub struct Spares {
    kept: Mutex<Vec<Vec<u8>>>,
    wanted: AtomicBool,
    max_count: usize,
    max_bytes: usize,
}

impl Spares {
    pub(crate) fn new(max_count: usize, max_bytes: usize) -> Spares {
        Spares {
            kept: Mutex::new(Vec::new()),
            wanted: AtomicBool::new(false),
            max_count,
            max_bytes,
        }
    }

    /// An empty buffer with room for at least `len` bytes: the smallest spare that fits, else
    /// the largest one grown (so no spare is dropped while a kernel outgrows them all), else a
    /// new one. A growth that cannot be had is the caller's out-of-memory error (`None`).
    pub fn take(&self, len: usize) -> Option<Vec<u8>> {
        self.wanted.store(true, Ordering::Relaxed);
        let picked = {
            let mut kept = crate::sync::lock(&self.kept);
            let fit = kept
                .iter()
                .enumerate()
                .filter(|(_, b)| b.capacity() >= len)
                .min_by_key(|(_, b)| b.capacity())
                .or_else(|| kept.iter().enumerate().max_by_key(|(_, b)| b.capacity()))
                .map(|(i, _)| i);
            fit.map(|i| kept.swap_remove(i))
        };
        let mut buf = picked.unwrap_or_default();
        buf.try_reserve_exact(len).ok()?;
        Some(buf)
    }

    /// Gives a buffer back. Kept while the pool has room (by count and by capacity); past that
    /// the smallest buffers are the ones let go, since a large one saves the most faults.
    pub(crate) fn put(&self, mut buf: Vec<u8>) {
        if buf.capacity() == 0 || self.max_count == 0 || !self.wanted.load(Ordering::Relaxed) {
            return;
        }
        buf.clear();
        let mut kept = crate::sync::lock(&self.kept);
        kept.push(buf);
        kept.sort_unstable_by_key(|b| std::cmp::Reverse(b.capacity()));
        let mut bytes = 0usize;
        let keep = kept
            .iter()
            .take(self.max_count)
            .take_while(|b| {
                bytes = bytes.saturating_add(b.capacity());
                bytes <= self.max_bytes
            })
            .count();
        // Dropped outside the lock: freeing a large buffer unmaps it.
        let dropped = kept.split_off(keep);
        drop(kept);
        drop(dropped);
    }

    /// Capacity held, for tests.
    #[cfg(test)]
    fn held(&self) -> (usize, usize) {
        let kept = crate::sync::lock(&self.kept);
        (kept.len(), kept.iter().map(Vec::capacity).sum())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pool a producer has taken from once, as the pipeline's is in use.
    fn in_use(max_count: usize, max_bytes: usize) -> Spares {
        let s = Spares::new(max_count, max_bytes);
        drop(s.take(0));
        s
    }

    #[test]
    fn nothing_is_kept_for_a_producer_that_never_takes() {
        let s = Spares::new(4, 1 << 20);
        s.put(vec![1; 1000]);
        assert_eq!(s.held(), (0, 0));
        drop(s.take(10));
        s.put(vec![1; 1000]);
        assert_eq!(s.held().0, 1);
    }

    #[test]
    fn take_prefers_the_smallest_fit_and_grows_the_largest_otherwise() {
        let s = in_use(4, 1 << 20);
        s.put(Vec::with_capacity(1000));
        s.put(Vec::with_capacity(5000));
        s.put(Vec::with_capacity(3000));
        let b = s.take(2000).unwrap();
        assert!(b.is_empty());
        assert!((3000..5000).contains(&b.capacity()), "{}", b.capacity());
        let b = s.take(9000).unwrap();
        assert!(b.capacity() >= 9000);
        assert_eq!(s.held().0, 1, "the largest was taken and grown");
        assert!(s.take(100).unwrap().capacity() >= 1000);
        assert!(
            s.take(100).unwrap().capacity() >= 100,
            "an empty pool makes a new one"
        );
    }

    #[test]
    fn put_keeps_within_the_count_and_byte_bounds() {
        let s = in_use(2, 10_000);
        for cap in [1000, 2000, 3000] {
            s.put(Vec::with_capacity(cap));
        }
        let (n, bytes) = s.held();
        assert_eq!(n, 2);
        assert!((5000..6000).contains(&bytes), "{bytes}: the two largest");
        s.put(Vec::with_capacity(9000));
        let (n, bytes) = s.held();
        assert_eq!(n, 1, "9000 + 3000 is over the byte bound");
        assert!((9000..10_000).contains(&bytes));
        let none = in_use(0, 10_000);
        none.put(vec![1; 10]);
        assert_eq!(none.held(), (0, 0));
    }

    #[test]
    fn a_spare_comes_back_empty() {
        let s = in_use(2, 1 << 20);
        s.put(vec![7; 500]);
        let b = s.take(10).unwrap();
        assert!(b.is_empty() && b.capacity() >= 500);
    }

    #[test]
    fn an_impossible_size_is_none() {
        assert!(Spares::new(2, 100).take(usize::MAX).is_none());
    }
}
