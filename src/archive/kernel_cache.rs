//! A byte-bounded LRU of decoded kernels, shared by threads. What it holds is the caller's
//! choice; it only needs each value's weight in bytes. The mount uses two: the backing store's
//! (`fs/backing.rs`: backing files on disk or in memfds) and the small kernels' cache of
//! page-cache mode (`fs/mod.rs`: decoded bytes).
//!
//! * Bounded in bytes, and optionally in entries: entries are evicted least recently used first
//!   until the new one fits.
//! * The mount runs its own single flight (the decode jobs of `fs/fill.rs`) and uses
//!   [`KernelCache::get`], [`KernelCache::peek`], [`KernelCache::count`] and
//!   [`KernelCache::put`]. [`KernelCache::get_or_load`] offers single-flight loading through a
//!   closure (concurrent misses of one kernel share one load); only this module's tests call it.
//! * The map lock is only held to look up, insert or evict; never while decoding, so a slow
//!   decode of one kernel does not hold up hits on others.
//! * A kernel larger than the whole cache is not kept; whoever made it (an open file handle)
//!   holds it until it is released.
//!
//! This module knows nothing about archives or FUSE.

use crate::sync::lock;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use lru::LruCache;

/// What the cache can hold: a cheaply cloned handle to a decoded kernel, and its size.
pub trait Weighed: Clone {
    /// Bytes this value counts for against the bound.
    fn weight(&self) -> u64;
}

impl Weighed for Arc<Vec<u8>> {
    fn weight(&self) -> u64 {
        self.len() as u64
    }
}

impl Weighed for Arc<[u8]> {
    fn weight(&self) -> u64 {
        self.len() as u64
    }
}

/// Identifies one stored kernel: which archive of the mount, and its ordinal in that archive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KernelId {
    pub archive: u32,
    pub ordinal: u32,
}

/// A snapshot of the counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Lookups served from the cache.
    pub hits: u64,
    /// Lookups that did not find the kernel (including those that then waited for another
    /// thread's decode of it).
    pub misses: u64,
    /// Loader calls of [`KernelCache::get_or_load`]; the mount reports its own count of kernels
    /// decoded here instead.
    pub decodes: u64,
    /// Bytes currently held by cached entries.
    pub bytes_cached: u64,
    /// Entries dropped to make room.
    pub evictions: u64,
    /// The byte bound.
    pub capacity: u64,
}

impl CacheStats {
    /// The `user.kpack.stats` text: one `name value` per line.
    pub fn to_text(&self) -> String {
        format!(
            "hits {}\nmisses {}\ndecodes {}\nbytes_cached {}\nevictions {}\ncapacity {}\n",
            self.hits, self.misses, self.decodes, self.bytes_cached, self.evictions, self.capacity
        )
    }
}

/// What a lookup produced.
#[derive(Debug, Clone)]
pub struct Fetched<V> {
    pub value: V,
    /// False when the kernel is larger than the cache and was therefore not kept: the caller
    /// must hold on to `value` itself if it wants to avoid another decode.
    pub cached: bool,
}

/// The state of one in-progress decode that other threads may wait on.
enum FlightState<V, E> {
    Running,
    Done(Result<Fetched<V>, E>),
    /// The decoding thread unwound without a result (a panic); waiters retry.
    Abandoned,
}

struct Flight<V, E> {
    state: Mutex<FlightState<V, E>>,
    done: Condvar,
}

struct Inner<V, E> {
    lru: LruCache<KernelId, V>,
    bytes: u64,
    flights: HashMap<KernelId, Arc<Flight<V, E>>>,
}

/// The byte-bounded, single-flight kernel cache. `E` is the loader's error, cloned to every
/// waiter of a failed decode.
pub struct KernelCache<V: Weighed, E: Clone> {
    inner: Mutex<Inner<V, E>>,
    capacity: u64,
    /// Most entries kept (each may hold a file descriptor).
    max_entries: usize,
    hits: AtomicU64,
    misses: AtomicU64,
    decodes: AtomicU64,
    evictions: AtomicU64,
}

/// Marks a flight abandoned and unregisters it if the decoding thread unwinds.
struct FlightGuard<'a, V: Weighed, E: Clone> {
    cache: &'a KernelCache<V, E>,
    id: KernelId,
    flight: Arc<Flight<V, E>>,
    finished: bool,
}

impl<V: Weighed, E: Clone> Drop for FlightGuard<'_, V, E> {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        lock(&self.cache.inner).flights.remove(&self.id);
        *lock(&self.flight.state) = FlightState::Abandoned;
        self.flight.done.notify_all();
    }
}

impl<V: Weighed, E: Clone> KernelCache<V, E> {
    /// A cache holding at most `capacity` bytes of decoded kernels (0 keeps nothing).
    pub fn new(capacity: u64) -> Self {
        Self::with_max_entries(capacity, usize::MAX)
    }

    /// A cache bounded in bytes and also in number of entries.
    pub fn with_max_entries(capacity: u64, max_entries: usize) -> Self {
        KernelCache {
            max_entries: max_entries.max(1),
            inner: Mutex::new(Inner {
                lru: LruCache::unbounded(),
                bytes: 0,
                flights: HashMap::new(),
            }),
            capacity,
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            decodes: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
        }
    }

    /// Returns the kernel `id`, decoding it with `load` when it is neither cached nor being
    /// decoded by another thread. Concurrent callers for the same `id` share one `load` call
    /// and its result (or its error).
    pub fn get_or_load<F>(&self, id: KernelId, load: F) -> Result<Fetched<V>, E>
    where
        F: FnOnce() -> Result<V, E>,
    {
        let mut load = Some(load);
        loop {
            let flight = {
                let mut inner = lock(&self.inner);
                if let Some(value) = inner.lru.get(&id) {
                    self.hits.fetch_add(1, Ordering::Relaxed);
                    return Ok(Fetched {
                        value: value.clone(),
                        cached: true,
                    });
                }
                self.misses.fetch_add(1, Ordering::Relaxed);
                match inner.flights.get(&id) {
                    Some(f) => Err(f.clone()),
                    None => {
                        let f = Arc::new(Flight {
                            state: Mutex::new(FlightState::Running),
                            done: Condvar::new(),
                        });
                        inner.flights.insert(id, f.clone());
                        Ok(f)
                    }
                }
            };
            match flight {
                // We lead: decode without any cache lock held.
                Ok(flight) => {
                    let load = load.take().expect("a caller leads at most one flight");
                    return self.lead(id, flight, load);
                }
                // Someone else is decoding it: wait for their result.
                Err(flight) => {
                    let mut state = lock(&flight.state);
                    while matches!(*state, FlightState::Running) {
                        state = flight.done.wait(state).unwrap_or_else(|p| p.into_inner());
                    }
                    match &*state {
                        FlightState::Done(result) => return result.clone(),
                        // The leader unwound: try again (we may lead this time).
                        _ => continue,
                    }
                }
            }
        }
    }

    fn lead<F>(&self, id: KernelId, flight: Arc<Flight<V, E>>, load: F) -> Result<Fetched<V>, E>
    where
        F: FnOnce() -> Result<V, E>,
    {
        let mut guard = FlightGuard {
            cache: self,
            id,
            flight,
            finished: false,
        };
        self.decodes.fetch_add(1, Ordering::Relaxed);
        let result = load().map(|value| {
            let cached = self.insert(id, &value);
            Fetched { value, cached }
        });
        // Publish: unregister first, so that a caller arriving after this point finds the
        // entry in the LRU (or, if it was not kept, starts a new flight).
        lock(&self.inner).flights.remove(&id);
        *lock(&guard.flight.state) = FlightState::Done(result.clone());
        guard.flight.done.notify_all();
        guard.finished = true;
        result
    }

    /// Inserts unless the kernel alone exceeds the bound; evicts least recently used entries
    /// until it fits. Returns whether it was kept.
    fn insert(&self, id: KernelId, value: &V) -> bool {
        let size = value.weight();
        if size > self.capacity {
            return false;
        }
        // Evicted values are dropped once the lock is released: dropping the last reference
        // to a large file closes (and frees) it.
        let mut evicted = Vec::new();
        {
            let mut inner = lock(&self.inner);
            while inner.bytes + size > self.capacity
                || (inner.lru.len() >= self.max_entries && !inner.lru.contains(&id))
            {
                match inner.lru.pop_lru() {
                    Some((_, old)) => {
                        inner.bytes -= old.weight();
                        self.evictions.fetch_add(1, Ordering::Relaxed);
                        evicted.push(old);
                    }
                    None => break,
                }
            }
            if let Some(old) = inner.lru.put(id, value.clone()) {
                inner.bytes -= old.weight();
                evicted.push(old);
            }
            inner.bytes += size;
        }
        drop(evicted);
        true
    }

    /// The cached kernel `id`, counted as a hit or a miss. For callers that run their own
    /// single flight (the mount's streaming decodes) and then [`put`](Self::put) the result.
    pub fn get(&self, id: KernelId) -> Option<V> {
        let found = lock(&self.inner).lru.get(&id).cloned();
        let counter = if found.is_some() {
            &self.hits
        } else {
            &self.misses
        };
        counter.fetch_add(1, Ordering::Relaxed);
        found
    }

    /// The cached kernel `id` (now the most recently used), not counted: the caller counts the
    /// request with [`count`](Self::count) once it knows what it found.
    pub fn peek(&self, id: KernelId) -> Option<V> {
        lock(&self.inner).lru.get(&id).cloned()
    }

    /// Counts one request as a hit (it found the complete kernel) or a miss.
    pub fn count(&self, hit: bool) {
        let counter = if hit { &self.hits } else { &self.misses };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Keeps a kernel made outside [`get_or_load`](Self::get_or_load) (decoded, or found in a
    /// cache directory: the caller counts its own decodes); evicts as an insert there does.
    /// Returns whether it was kept (not when larger than the whole cache).
    pub fn put(&self, id: KernelId, value: &V) -> bool {
        self.insert(id, value)
    }

    /// Whether `id` is cached now. Not counted as a lookup and leaves the LRU order alone.
    pub fn contains(&self, id: KernelId) -> bool {
        lock(&self.inner).lru.contains(&id)
    }

    pub fn stats(&self) -> CacheStats {
        let bytes_cached = lock(&self.inner).bytes;
        CacheStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            decodes: self.decodes.load(Ordering::Relaxed),
            bytes_cached,
            evictions: self.evictions.load(Ordering::Relaxed),
            capacity: self.capacity,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Barrier;
    use std::sync::atomic::AtomicUsize;
    use std::thread;
    use std::time::Duration;

    type Bytes = Arc<Vec<u8>>;

    fn b(v: Vec<u8>) -> Bytes {
        Arc::new(v)
    }

    fn id(ordinal: u32) -> KernelId {
        KernelId {
            archive: 0,
            ordinal,
        }
    }

    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn cache_is_send_and_sync() {
        assert_send_sync::<KernelCache<Bytes, String>>();
    }

    #[test]
    fn hit_after_miss_and_exact_counters() {
        let c: KernelCache<Bytes, String> = KernelCache::new(100);
        let a = c.get_or_load(id(1), || Ok(b(vec![7u8; 10]))).unwrap();
        assert!(a.cached);
        assert_eq!(*a.value, vec![7u8; 10]);
        let b = c
            .get_or_load(id(1), || panic!("must not decode again"))
            .unwrap();
        assert!(Arc::ptr_eq(&a.value, &b.value));
        assert_eq!(
            c.stats(),
            CacheStats {
                hits: 1,
                misses: 1,
                decodes: 1,
                bytes_cached: 10,
                evictions: 0,
                capacity: 100
            }
        );
    }

    #[test]
    fn get_and_put_count_and_bound_like_get_or_load() {
        let c: KernelCache<Bytes, String> = KernelCache::new(25);
        assert!(c.get(id(1)).is_none());
        assert!(c.put(id(1), &b(vec![1u8; 10])));
        assert!(c.put(id(2), &b(vec![2u8; 10])));
        assert_eq!(*c.get(id(1)).unwrap(), vec![1u8; 10]);
        // 3 pushes out the least recently used (2); one larger than the cache is not kept.
        assert!(c.put(id(3), &b(vec![3u8; 10])));
        assert!(!c.put(id(4), &b(vec![4u8; 26])));
        assert!(c.get(id(2)).is_none());
        let s = c.stats();
        assert_eq!(
            (s.hits, s.misses, s.decodes, s.bytes_cached, s.evictions),
            (1, 2, 0, 20, 1)
        );
    }

    #[test]
    fn evicts_least_recently_used_to_stay_within_bytes() {
        let c: KernelCache<Bytes, String> = KernelCache::new(30);
        for i in 0..3 {
            c.get_or_load(id(i), || Ok(b(vec![i as u8; 10]))).unwrap();
        }
        // Touch 0 so that 1 is now the least recently used.
        c.get_or_load(id(0), || panic!("cached")).unwrap();
        c.get_or_load(id(3), || Ok(b(vec![3; 10]))).unwrap();
        let s = c.stats();
        assert_eq!((s.bytes_cached, s.evictions), (30, 1));
        c.get_or_load(id(0), || panic!("0 must still be cached"))
            .unwrap();
        c.get_or_load(id(2), || panic!("2 must still be cached"))
            .unwrap();
        let reloaded = AtomicUsize::new(0);
        c.get_or_load(id(1), || {
            reloaded.fetch_add(1, Ordering::SeqCst);
            Ok(b(vec![1; 10]))
        })
        .unwrap();
        assert_eq!(reloaded.load(Ordering::SeqCst), 1, "1 was the one evicted");
        // Reloading 1 evicted 3, the least recently used at that point.
        assert_eq!(c.stats().evictions, 2);
        c.get_or_load(id(0), || panic!("0 must still be cached"))
            .unwrap();
        // One 25-byte entry needs all three 10-byte ones gone.
        c.get_or_load(id(9), || Ok(b(vec![9; 25]))).unwrap();
        let s = c.stats();
        assert_eq!(s.bytes_cached, 25);
        assert_eq!(s.evictions, 2 + 3);
    }

    #[test]
    fn entry_count_bound_evicts_least_recently_used() {
        let c: KernelCache<Bytes, String> = KernelCache::with_max_entries(1000, 2);
        for i in 0..3 {
            c.get_or_load(id(i), || Ok(b(vec![i as u8; 10]))).unwrap();
        }
        let s = c.stats();
        assert_eq!((s.bytes_cached, s.evictions), (20, 1));
        assert!(!c.contains(id(0)) && c.contains(id(1)) && c.contains(id(2)));
    }

    #[test]
    fn oversized_kernels_are_returned_but_not_kept() {
        let c: KernelCache<Bytes, String> = KernelCache::new(8);
        c.get_or_load(id(1), || Ok(b(vec![1; 8]))).unwrap();
        let big = c.get_or_load(id(2), || Ok(b(vec![2; 9]))).unwrap();
        assert!(!big.cached);
        assert_eq!(big.value.len(), 9);
        let s = c.stats();
        assert_eq!((s.bytes_cached, s.evictions, s.decodes), (8, 0, 2));
        // Not kept: the next lookup decodes again (the fs layer pins it per handle instead).
        let again = c.get_or_load(id(2), || Ok(b(vec![2; 9]))).unwrap();
        assert!(!again.cached);
        assert_eq!(c.stats().decodes, 3);
    }

    #[test]
    fn errors_are_not_cached() {
        let c: KernelCache<Bytes, String> = KernelCache::new(100);
        assert_eq!(
            c.get_or_load(id(1), || Err("bad frame".to_owned()))
                .unwrap_err(),
            "bad frame"
        );
        assert_eq!(
            *c.get_or_load(id(1), || Ok(b(vec![1]))).unwrap().value,
            vec![1]
        );
        assert_eq!(c.stats().decodes, 2);
    }

    #[test]
    fn concurrent_misses_share_one_decode() {
        const N: usize = 8;
        let c: Arc<KernelCache<Bytes, String>> = Arc::new(KernelCache::new(1 << 20));
        let decodes = Arc::new(AtomicUsize::new(0));
        let start = Arc::new(Barrier::new(N));
        let threads: Vec<_> = (0..N)
            .map(|_| {
                let (c, decodes, start) = (c.clone(), decodes.clone(), start.clone());
                thread::spawn(move || {
                    start.wait();
                    c.get_or_load(id(5), || {
                        decodes.fetch_add(1, Ordering::SeqCst);
                        // Slow enough that every other thread arrives while this runs.
                        thread::sleep(Duration::from_millis(300));
                        Ok(b(vec![0xab; 4096]))
                    })
                    .unwrap()
                })
            })
            .collect();
        let results: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        assert_eq!(decodes.load(Ordering::SeqCst), 1);
        for r in &results {
            assert!(Arc::ptr_eq(&r.value, &results[0].value));
        }
        let s = c.stats();
        assert_eq!((s.decodes, s.misses + s.hits), (1, N as u64));
    }

    #[test]
    fn waiters_share_the_error_of_a_failed_decode() {
        const N: usize = 4;
        let c: Arc<KernelCache<Bytes, String>> = Arc::new(KernelCache::new(1 << 20));
        let start = Arc::new(Barrier::new(N));
        let threads: Vec<_> = (0..N)
            .map(|_| {
                let (c, start) = (c.clone(), start.clone());
                thread::spawn(move || {
                    start.wait();
                    c.get_or_load(id(5), || {
                        thread::sleep(Duration::from_millis(300));
                        Err("corrupt".to_owned())
                    })
                })
            })
            .collect();
        for t in threads {
            assert_eq!(t.join().unwrap().unwrap_err(), "corrupt");
        }
        assert_eq!(c.stats().decodes, 1);
    }

    #[test]
    fn a_slow_decode_does_not_block_hits_on_other_kernels() {
        let c: Arc<KernelCache<Bytes, String>> = Arc::new(KernelCache::new(1 << 20));
        c.get_or_load(id(1), || Ok(b(vec![1; 16]))).unwrap();
        let entered = Arc::new(Barrier::new(2));
        let release = Arc::new(Barrier::new(2));
        let slow = {
            let (c, entered, release) = (c.clone(), entered.clone(), release.clone());
            thread::spawn(move || {
                c.get_or_load(id(2), || {
                    entered.wait();
                    release.wait();
                    Ok(b(vec![2; 16]))
                })
                .unwrap()
            })
        };
        entered.wait();
        // The decode of 2 is in progress; a hit on 1 must complete now.
        assert_eq!(
            *c.get_or_load(id(1), || panic!("cached")).unwrap().value,
            vec![1; 16]
        );
        release.wait();
        assert_eq!(*slow.join().unwrap().value, vec![2; 16]);
    }

    #[test]
    fn a_panicking_leader_lets_waiters_retry() {
        let c: Arc<KernelCache<Bytes, String>> = Arc::new(KernelCache::new(1 << 20));
        let entered = Arc::new(Barrier::new(2));
        let leader = {
            let (c, entered) = (c.clone(), entered.clone());
            thread::spawn(move || {
                let _ = c.get_or_load(id(3), || {
                    entered.wait();
                    thread::sleep(Duration::from_millis(200));
                    panic!("decoder bug");
                });
            })
        };
        entered.wait();
        let got = c.get_or_load(id(3), || Ok(b(vec![3; 4]))).unwrap();
        assert_eq!(*got.value, vec![3; 4]);
        assert!(leader.join().is_err());
    }

    #[test]
    fn stats_text_format() {
        let s = CacheStats {
            hits: 1,
            misses: 2,
            decodes: 3,
            bytes_cached: 4,
            evictions: 5,
            capacity: 6,
        };
        assert_eq!(
            s.to_text(),
            "hits 1\nmisses 2\ndecodes 3\nbytes_cached 4\nevictions 5\ncapacity 6\n"
        );
    }
}
