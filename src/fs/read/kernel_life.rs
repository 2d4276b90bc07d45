//! A kernel's decode life, in one place: the states a kernel file of the mount goes through and
//! every transition between them. The rest of the read path asks this type ("held? decoding?
//! start one") and hands it what a decode made; only here does a kernel enter or leave the
//! map of running decodes, is a pin reserved, made or given back, and is a decode ahead given
//! up.
//!
//! ```text
//!            asked for (open, READ)                      kept
//!   cold ─────────────────────────▶ decoding ─────────────────────▶ held ──evicted──▶ cold*
//!    │                                 │  failed, not kept, panicked       ▲
//!    │                                 └──────────────────────────▶ cold   │ first open takes it,
//!    │  ahead of a scan (bytes reserved)          kept (reservation →      │ or the scan passes
//!    └───────────────────────────────▶ decoding ───── pin) ──────▶ held, pinned
//!                                          │  failed, not kept, panicked:
//!                                          └── reservation given back, given up ──▶ cold
//! ```
//!
//! * **cold**: neither in the store nor decoding. (*A kernel the store evicted whose file an
//!   open handle still holds is found through the store's record of the files it made, so it
//!   counts as held: nothing decodes it again while anyone holds it.)
//! * **decoding**: one [`Fill`] in the map of running decodes, the mount's only single flight:
//!   every request for the kernel joins it. It is started by a request that waits for it, or
//!   ahead of a scan, with the bytes of its pin reserved in the store first ([`Start`]).
//! * **held**: an entry of the store, pinned when it was decoded ahead, until its first open
//!   takes it or the scans can no longer reach it (`ahead.rs`).
//! * **given up**: a decode ahead that failed, or whose file the store did not keep, is never
//!   tried ahead again (a scan would find it missing and take it up again at once); an open
//!   still decodes it.
//!
//! A decode always ends here ([`Decodes::run`]), whatever happens inside it: its result is kept
//! in the store (pinned for a decode ahead) before the kernel leaves the map, and only then are
//! its waiters answered, so a later request finds it in one of the two. A decode that panics
//! (in the decode, in the store, or in answering) is ended as a failure by a guard: the
//! reservation is given back, the kernel leaves the map and every waiter still waiting gets
//! EIO, so no later request waits on it.

use std::collections::{HashMap, HashSet};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::fill::Fill;
use crate::fs::errno::Errno;
use crate::fs::store::{Body, KernelId, Store};
use crate::fs::tree::Ino;
use crate::sync::lock;

/// What a decode makes, and why it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Make {
    /// A backing file, for opens.
    File,
    /// A backing file for READs by inode (page-cache mode), which no handle holds.
    FileForRead,
    /// The decoded bytes in memory: a small kernel decoded for READs by inode in page-cache
    /// mode, where no open needs a file.
    Bytes,
    /// A backing file decoded ahead of a scan, pinned in the store until its first open;
    /// `reserved` bytes of pins were reserved for it.
    Ahead { reserved: u64 },
}

/// A started decode, to be run off the request threads ([`Decodes::run`]); until it ends, its
/// kernel is decoding and every request for it joins `fill`.
pub struct FillJob {
    pub(crate) ino: Ino,
    pub(crate) id: KernelId,
    pub(crate) fill: Arc<Fill>,
    pub(crate) make: Make,
}

/// What a request found (see [`Decodes::find_or_start`]).
pub(crate) enum Found {
    /// The kernel, held in the store (a pin on it is released: its purpose is served).
    Held(Body),
    /// Its decode, and the job to run when the request started it.
    Job(Arc<Fill>, Option<FillJob>),
}

/// What [`Decodes::start_ahead`] did.
pub(crate) enum Start {
    /// The kernel is held or decoding already: nothing to start.
    Busy,
    /// Pins and reservations already take their share of the store: nothing more ahead.
    NoRoom,
    /// Started, with its pin reserved.
    Started(FillJob),
}

/// The kernels decoding now, and those given up for decoding ahead (see the module's text).
#[derive(Default)]
pub(crate) struct Decodes {
    running: Mutex<HashMap<KernelId, Arc<Fill>>>,
    given_up: Mutex<HashSet<Ino>>,
    /// Decodes started ahead of a scan.
    started_ahead: AtomicU64,
}

impl Decodes {
    /// A request for kernel `id` (file `ino`, `len` decoded bytes): its body when the store
    /// holds it, else its decode, joined or started (returned with it) to make `make`. Counts
    /// the request in the store: a hit when it finds the kernel complete, else a miss.
    pub(crate) fn find_or_start(
        &self,
        store: &Store,
        ino: Ino,
        id: KernelId,
        len: u64,
        make: Make,
    ) -> Found {
        // The map is locked before the store is asked: a decode keeps its kernel before it
        // leaves the map, so one of the two always has it.
        let mut running = lock(&self.running);
        if let Some(body) = store.take(id) {
            store.count(true);
            // Marking a cache directory's file as used may write its inode: not under the lock.
            drop(running);
            if let Body::File(b) = &body {
                store.touch(b);
            }
            return Found::Held(body);
        }
        if let Some(f) = running.get(&id) {
            store.count(f.is_done());
            return Found::Job(f.clone(), None);
        }
        store.count(false);
        let job = Self::insert(&mut running, ino, id, len, make);
        Found::Job(job.fill.clone(), Some(job))
    }

    /// Starts decoding kernel `id` (file `ino`, `len` bytes) ahead of a scan, when it is cold
    /// and not given up, reserving its pin in the store first.
    pub(crate) fn start_ahead(&self, store: &Store, ino: Ino, id: KernelId, len: u64) -> Start {
        if self.is_given_up(ino) {
            return Start::Busy;
        }
        let mut running = lock(&self.running);
        if store.contains(id) || running.contains_key(&id) {
            return Start::Busy;
        }
        if !store.reserve_pin(len) {
            return Start::NoRoom;
        }
        self.started_ahead.fetch_add(1, Ordering::Relaxed);
        Start::Started(Self::insert(
            &mut running,
            ino,
            id,
            len,
            Make::Ahead { reserved: len },
        ))
    }

    fn insert(
        running: &mut HashMap<KernelId, Arc<Fill>>,
        ino: Ino,
        id: KernelId,
        len: u64,
        make: Make,
    ) -> FillJob {
        let fill = Arc::new(Fill::for_kernel(len));
        running.insert(id, fill.clone());
        FillJob {
            ino,
            id,
            fill,
            make,
        }
    }

    /// Whether kernel `id` is cold: neither held nor decoding.
    pub(crate) fn is_cold(&self, store: &Store, id: KernelId) -> bool {
        !store.contains(id) && !lock(&self.running).contains_key(&id)
    }

    /// Whether file `ino` was given up for decoding ahead.
    pub(crate) fn is_given_up(&self, ino: Ino) -> bool {
        lock(&self.given_up).contains(&ino)
    }

    /// Decodes started ahead of a scan so far.
    pub(crate) fn started_ahead(&self) -> u64 {
        self.started_ahead.load(Ordering::Relaxed)
    }

    /// Runs `job` to its end: `decode` makes the kernel's body (with whether the store may keep
    /// it), answering the job's early waiters through `fill` as it goes; the body is then kept
    /// in the store (pinned for a decode ahead; a file for READs by inode that the store
    /// cannot keep is held aside, since no handle holds it for the READs that follow), the
    /// kernel leaves the map, and every waiter is answered. A panic anywhere in this ends the
    /// job as a failure (see the module's text) and goes on unwinding.
    pub(crate) fn run(
        &self,
        store: &Store,
        job: FillJob,
        decode: impl FnOnce(&Arc<Fill>, Make) -> Result<(Body, bool), Errno>,
    ) {
        let mut ending = Ending {
            decodes: self,
            store,
            job,
            reserved: true,
            left: false,
        };
        let result = catch_unwind(AssertUnwindSafe(|| {
            decode(&ending.job.fill, ending.job.make)
        }))
        .unwrap_or_else(|_| {
            log::error!("a decode job panicked");
            Err(Errno::EIO)
        });
        let kept = match &result {
            Ok((body, true)) => ending.keep(body),
            _ => false,
        };
        ending.end(kept, result.map(|(body, _)| body));
    }
}

/// A running decode on its way out of the map. Dropped before [`Ending::end`] (a panic on the
/// way), it ends the decode as a failure.
struct Ending<'a> {
    decodes: &'a Decodes,
    store: &'a Store,
    job: FillJob,
    /// A decode ahead's reservation is still the job's (not yet a pin, not given back).
    reserved: bool,
    /// The kernel has left the map of running decodes.
    left: bool,
}

impl Ending<'_> {
    /// Keeps what the decode made (see [`Decodes::run`]); returns whether the store kept it.
    fn keep(&mut self, body: &Body) -> bool {
        let FillJob { ino, id, make, .. } = self.job;
        if let Make::Ahead { reserved } = make {
            // The reservation becomes the pin, or is given back, inside the store's one call.
            self.reserved = false;
            return self.store.keep_pinned(id, body.clone(), ino, reserved);
        }
        let kept = self.store.keep(id, body.clone());
        if !kept && make == Make::FileForRead {
            if let Body::File(f) = body {
                self.store.hold_oversized(id, f.clone());
            }
        }
        kept
    }

    /// Ends the decode with `result`: a decode ahead that kept nothing gives its reservation
    /// back and is given up, the kernel leaves the map, and the waiters are answered.
    fn end(mut self, kept: bool, result: Result<Body, Errno>) {
        self.leave(kept);
        match &result {
            Ok(body) => self.job.fill.complete(body),
            Err(e) => self.job.fill.fail(*e),
        }
        self.store.tidy();
    }

    fn leave(&mut self, kept: bool) {
        if std::mem::replace(&mut self.left, true) {
            return;
        }
        let FillJob { ino, id, make, .. } = self.job;
        if let Make::Ahead { reserved } = make {
            if std::mem::take(&mut self.reserved) {
                self.store.cancel_pin(reserved);
            }
            if !kept {
                lock(&self.decodes.given_up).insert(ino);
            }
        }
        let mut running = lock(&self.decodes.running);
        // Only this job's own entry: a newer decode of the kernel may have started since.
        if running
            .get(&id)
            .is_some_and(|f| Arc::ptr_eq(f, &self.job.fill))
        {
            running.remove(&id);
        }
    }
}

impl Drop for Ending<'_> {
    /// Ends a decode that did not reach [`Ending::end`], or panicked in answering its waiters:
    /// every waiter not answered yet gets EIO (a file already complete stays complete).
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.leave(false);
            self.job.fill.fail(Errno::EIO);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::store::Placement;
    use std::sync::mpsc::{Receiver, channel};

    fn id(ordinal: u32) -> KernelId {
        KernelId {
            archive: 0,
            ordinal,
        }
    }

    fn store(capacity: u64) -> Store {
        Store::new(&Placement::Memory, capacity, 64).unwrap()
    }

    fn bytes(n: usize, v: u8) -> Body {
        Body::Bytes(vec![v; n].into())
    }

    /// A READ of the whole kernel that joins `fill`; its answer lands in the channel.
    fn read(fill: &Arc<Fill>, len: u64) -> Receiver<Result<Vec<u8>, Errno>> {
        let (tx, rx) = channel();
        fill.read(
            len,
            0,
            len as u32,
            Box::new(move |r| drop(tx.send(r.map(<[u8]>::to_vec)))),
        );
        rx
    }

    fn started(found: Found) -> FillJob {
        match found {
            Found::Job(_, Some(job)) => job,
            _ => panic!("expected a new decode"),
        }
    }

    #[test]
    fn a_request_starts_one_decode_that_others_join_and_that_ends_held() {
        let (d, s) = (Decodes::default(), store(100));
        let job = started(d.find_or_start(&s, 5, id(1), 10, Make::Bytes));
        assert!(!d.is_cold(&s, id(1)), "decoding");
        let Found::Job(joined, None) = d.find_or_start(&s, 5, id(1), 10, Make::Bytes) else {
            panic!("a second request joins the first decode");
        };
        assert!(Arc::ptr_eq(&joined, &job.fill));
        let waiting = read(&joined, 10);
        d.run(&s, job, |_, make| {
            assert_eq!(make, Make::Bytes);
            Ok((bytes(10, 7), true))
        });
        assert_eq!(waiting.try_recv().unwrap(), Ok(vec![7; 10]));
        assert!(matches!(
            d.find_or_start(&s, 5, id(1), 10, Make::Bytes),
            Found::Held(_)
        ));
        let st = s.stats();
        assert_eq!((st.hits, st.misses, st.bytes_cached), (1, 2, 10));
    }

    #[test]
    fn a_failed_or_unkept_decode_leaves_the_kernel_cold() {
        let (d, s) = (Decodes::default(), store(100));
        let job = started(d.find_or_start(&s, 5, id(1), 10, Make::Bytes));
        let waiting = read(&job.fill, 10);
        d.run(&s, job, |_, _| Err(Errno(libc::ENOSPC)));
        assert_eq!(waiting.try_recv().unwrap(), Err(Errno::EIO));
        assert!(d.is_cold(&s, id(1)));
        // Larger than the store: served to its waiters, not kept.
        let job = started(d.find_or_start(&s, 5, id(1), 200, Make::Bytes));
        let waiting = read(&job.fill, 200);
        d.run(&s, job, |_, _| Ok((bytes(200, 1), true)));
        assert_eq!(waiting.try_recv().unwrap(), Ok(vec![1; 200]));
        assert!(d.is_cold(&s, id(1)));
        assert!(!d.is_given_up(5), "only decodes ahead are given up");
    }

    #[test]
    fn a_decode_ahead_reserves_its_pin_and_keeps_it_pinned() {
        let (d, s) = (Decodes::default(), store(100));
        let Start::Started(job) = d.start_ahead(&s, 7, id(2), 30) else {
            panic!("a cold kernel is started ahead");
        };
        assert!(matches!(d.start_ahead(&s, 7, id(2), 30), Start::Busy));
        assert!(
            matches!(d.start_ahead(&s, 8, id(3), 21), Start::NoRoom),
            "the reservation counts: pins take at most half the bound"
        );
        d.run(&s, job, |_, make| {
            assert_eq!(make, Make::Ahead { reserved: 30 });
            Ok((bytes(30, 2), true))
        });
        assert_eq!(d.started_ahead(), 1);
        // Pinned: a full store evicts everything else first.
        assert!(s.keep(id(4), bytes(70, 4)));
        assert!(s.keep(id(5), bytes(70, 5)));
        assert!(!d.is_cold(&s, id(2)));
        // The first open takes the pin; its bytes are now evictable.
        assert!(matches!(
            d.find_or_start(&s, 7, id(2), 30, Make::File),
            Found::Held(_)
        ));
        assert!(s.keep(id(6), bytes(100, 6)));
        assert!(d.is_cold(&s, id(2)));
    }

    #[test]
    fn a_failed_decode_ahead_gives_its_reservation_back_and_is_given_up() {
        let (d, s) = (Decodes::default(), store(100));
        let Start::Started(job) = d.start_ahead(&s, 7, id(2), 50) else {
            panic!("started");
        };
        d.run(&s, job, |_, _| Err(Errno::EIO));
        assert!(d.is_given_up(7) && d.is_cold(&s, id(2)));
        assert!(matches!(d.start_ahead(&s, 7, id(2), 50), Start::Busy));
        // The reservation is back: another kernel may take the whole share.
        assert!(matches!(d.start_ahead(&s, 8, id(3), 50), Start::Started(_)));
    }

    /// A panic after the decode (here in keeping its result, as a broken store would) ends the
    /// job as a failure: the waiters get EIO, the reservation is given back, the kernel is cold
    /// again, and the next request starts a new decode that succeeds.
    #[test]
    fn a_panic_after_the_decode_answers_every_waiter_and_frees_the_kernel() {
        let (d, s) = (Decodes::default(), store(100));
        let Start::Started(job) = d.start_ahead(&s, 7, id(2), 50) else {
            panic!("started");
        };
        let Found::Job(fill, None) = d.find_or_start(&s, 7, id(2), 50, Make::File) else {
            panic!("joined");
        };
        let waiting = read(&fill, 50);
        let unwound = catch_unwind(AssertUnwindSafe(|| {
            let mut ending = Ending {
                decodes: &d,
                store: &s,
                job,
                reserved: true,
                left: false,
            };
            let body = bytes(50, 9);
            assert!(ending.keep(&body));
            panic!("the store broke after keeping the kernel");
        }));
        assert!(unwound.is_err());
        assert_eq!(waiting.try_recv().unwrap(), Err(Errno::EIO));
        assert!(d.is_given_up(7));
        assert!(!lock(&d.running).contains_key(&id(2)), "left the map");
        let job = started(d.find_or_start(&s, 8, id(3), 10, Make::Bytes));
        let waiting = read(&job.fill, 10);
        d.run(&s, job, |_, _| Ok((bytes(10, 3), true)));
        assert_eq!(waiting.try_recv().unwrap(), Ok(vec![3; 10]));
    }

    /// A panic in the decode itself, or in the answer to a waiter, never leaves the kernel
    /// decoding: a waiter answered before the panic keeps its answer, the rest get EIO.
    #[test]
    fn a_panic_in_the_decode_or_in_an_answer_ends_the_job() {
        let (d, s) = (Decodes::default(), store(100));
        let job = started(d.find_or_start(&s, 5, id(1), 10, Make::Bytes));
        let waiting = read(&job.fill, 10);
        d.run(&s, job, |_, _| panic!("a decoder bug"));
        assert_eq!(waiting.try_recv().unwrap(), Err(Errno::EIO));
        assert!(d.is_cold(&s, id(1)));

        let job = started(d.find_or_start(&s, 5, id(1), 10, Make::Bytes));
        job.fill
            .read(10, 0, 10, Box::new(|_| panic!("a reply that panics")));
        let after = read(&job.fill, 10);
        let fill = job.fill.clone();
        let unwound = catch_unwind(AssertUnwindSafe(|| {
            d.run(&s, job, |_, _| Ok((bytes(10, 4), true)))
        }));
        assert!(unwound.is_err(), "the panic goes on to the pool's worker");
        assert!(fill.is_done());
        assert!(!lock(&d.running).contains_key(&id(1)));
        // The read parked after the panicking one was dropped unanswered, which its channel
        // reports as an error; the kernel was kept, so the next request finds it.
        assert!(after.try_recv().is_err());
        assert!(matches!(
            d.find_or_start(&s, 5, id(1), 10, Make::Bytes),
            Found::Held(_)
        ));
    }
}
