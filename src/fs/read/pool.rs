//! A fixed set of threads for decode jobs (cold opens, cold READs in page-cache mode, decodes
//! ahead of a scan), separate from the FUSE request threads.
//!
//! Decoding a kernel can take a while; done on a request thread it would hold that thread, and
//! with few threads (`-s`) every lookup, getattr and read of other files would wait behind it.
//! Decode jobs are handed here instead (the replies travel with the job), so up to one decode per
//! core runs at once whatever `--threads` says, and request threads stay free. A job a request
//! waits for (an open's or a READ's decode) is taken before queued decodes ahead.

use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;

use crate::sync::lock;

type Job = Box<dyn FnOnce() + Send + 'static>;

/// Jobs not taken by a worker yet: those a request waits for go before those decoding ahead,
/// so a reader that jumps elsewhere waits for at most the decodes already running.
#[derive(Default)]
struct Queued {
    waited_for: VecDeque<Job>,
    background: VecDeque<Job>,
    /// Set when the pool is dropped: workers finish what is queued, then exit.
    closed: bool,
}

impl Queued {
    fn next(&mut self) -> Option<Job> {
        self.waited_for
            .pop_front()
            .or_else(|| self.background.pop_front())
    }
}

struct Shared {
    queued: Mutex<Queued>,
    wake: Condvar,
    /// Jobs handed in and not finished yet (queued or running).
    pending: AtomicUsize,
}

/// The pool; dropping it lets the threads finish queued jobs and exit.
pub struct Pool {
    shared: Arc<Shared>,
    threads: usize,
}

impl Pool {
    /// `threads` workers (at least one).
    pub fn new(threads: usize, name: &str) -> Pool {
        let shared = Arc::new(Shared {
            queued: Mutex::new(Queued::default()),
            wake: Condvar::new(),
            pending: AtomicUsize::new(0),
        });
        let mut started = 0;
        for i in 0..threads.max(1) {
            let shared = shared.clone();
            let kind = name.to_owned();
            let spawned = thread::Builder::new()
                .name(format!("{name}-{i}"))
                .spawn(move || {
                    loop {
                        // Hold the queue only to take one job, not while running it.
                        let job = {
                            let mut q = lock(&shared.queued);
                            loop {
                                if let Some(job) = q.next() {
                                    break job;
                                }
                                if q.closed {
                                    return;
                                }
                                q = shared.wake.wait(q).unwrap_or_else(|p| p.into_inner());
                            }
                        };
                        run_guarded(job, &kind);
                        shared.pending.fetch_sub(1, Ordering::AcqRel);
                    }
                });
            match spawned {
                Ok(_) => started += 1,
                Err(e) => log::warn!("cannot start a {name} thread: {e}"),
            }
        }
        Pool {
            shared,
            threads: started,
        }
    }

    /// Runs `job`, which a request waits for, on a worker, before any background job still
    /// queued; when no worker can take it (none started, or the pool is shutting down), runs it
    /// on the calling thread so it is never lost.
    pub fn run(&self, job: impl FnOnce() + Send + 'static) {
        self.hand_in(Box::new(job), false);
    }

    /// Runs `job`, which nobody waits for yet, on a worker once no job a request waits for is
    /// queued.
    pub fn run_background(&self, job: impl FnOnce() + Send + 'static) {
        self.hand_in(Box::new(job), true);
    }

    fn hand_in(&self, job: Job, background: bool) {
        let rejected = {
            let mut q = lock(&self.shared.queued);
            if q.closed || self.threads == 0 {
                Some(job)
            } else {
                self.shared.pending.fetch_add(1, Ordering::AcqRel);
                if background {
                    q.background.push_back(job);
                } else {
                    q.waited_for.push_back(job);
                }
                None
            }
        };
        match rejected {
            Some(job) => run_guarded(job, "rejected"),
            None => self.shared.wake.notify_one(),
        }
    }

    /// How many jobs handed in now workers would take at once (free workers, none queued).
    pub fn idle_workers(&self) -> usize {
        self.threads
            .saturating_sub(self.shared.pending.load(Ordering::Acquire))
    }

    /// A handle a job can use to see whether others wait for a worker.
    pub fn queue(&self) -> Queue {
        Queue {
            threads: self.threads,
            shared: self.shared.clone(),
        }
    }
}

/// See [`Pool::queue`].
pub struct Queue {
    threads: usize,
    shared: Arc<Shared>,
}

impl Queue {
    /// Whether jobs wait for a worker: more are pending (queued or running) than there are
    /// workers. A running job counts itself, so this is true only if some job has no worker.
    pub fn has_waiting(&self) -> bool {
        self.shared.pending.load(Ordering::Acquire) > self.threads
    }
}

/// Runs `job`, catching a panic: a job that panics ends itself (a decode answers its waiters
/// on the way out, see `kernel_life.rs`), and the thread lives on for the next one.
fn run_guarded(job: Job, name: &str) {
    if catch_unwind(AssertUnwindSafe(job)).is_err() {
        log::error!("a {name} job panicked; its thread goes on");
    }
}

/// The cores this process may run on (at least one).
pub fn cores() -> usize {
    thread::available_parallelism().map_or(1, |n| n.get())
}

impl Drop for Pool {
    fn drop(&mut self) {
        lock(&self.shared.queued).closed = true;
        self.shared.wake.notify_all();
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    impl Pool {
        /// Whether no job is queued or running.
        pub(crate) fn is_idle(&self) -> bool {
            self.shared.pending.load(Ordering::Acquire) == 0
        }
    }
    use std::sync::Barrier;
    use std::sync::mpsc;
    use std::time::Duration;

    #[test]
    fn jobs_run_concurrently_up_to_the_thread_count() {
        let pool = Pool::new(2, "t");
        let both = Arc::new(Barrier::new(2));
        let (tx, rx) = mpsc::channel();
        for i in 0..2 {
            let (both, tx) = (both.clone(), tx.clone());
            // Each job waits for the other: this only completes if two run at once.
            pool.run(move || {
                both.wait();
                tx.send(i).unwrap();
            });
        }
        let mut got: Vec<i32> = (0..2)
            .map(|_| rx.recv_timeout(Duration::from_secs(10)).unwrap())
            .collect();
        got.sort();
        assert_eq!(got, [0, 1]);
    }

    #[test]
    fn workers_are_idle_until_they_have_a_job() {
        let pool = Pool::new(2, "t");
        assert_eq!(pool.idle_workers(), 2);
        let (release, hold) = mpsc::channel::<()>();
        let hold = Arc::new(Mutex::new(hold));
        let (started, wait_started) = mpsc::channel();
        for _ in 0..2 {
            let (hold, started) = (hold.clone(), started.clone());
            pool.run(move || {
                started.send(()).unwrap();
                let _ = lock(&hold).recv_timeout(Duration::from_secs(10));
            });
        }
        wait_started.recv_timeout(Duration::from_secs(10)).unwrap();
        assert_eq!(pool.idle_workers(), 0, "two jobs handed to two workers");
        assert!(!pool.queue().has_waiting(), "both have a worker");
        pool.run(|| {});
        assert!(pool.queue().has_waiting(), "a third waits");
        release.send(()).unwrap();
        release.send(()).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while pool.idle_workers() < 2 || pool.queue().has_waiting() {
            assert!(std::time::Instant::now() < deadline, "jobs never finished");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn a_job_a_request_waits_for_goes_before_queued_background_jobs() {
        let pool = Pool::new(1, "t");
        let (release, hold) = mpsc::channel::<()>();
        let (started, wait_started) = mpsc::channel();
        pool.run(move || {
            started.send(()).unwrap();
            let _ = hold.recv_timeout(Duration::from_secs(10));
        });
        wait_started.recv_timeout(Duration::from_secs(10)).unwrap();
        let order = Arc::new(Mutex::new(Vec::new()));
        for name in ["ahead 1", "ahead 2"] {
            let order = order.clone();
            pool.run_background(move || lock(&order).push(name));
        }
        let (done, wait_done) = mpsc::channel();
        let waited = order.clone();
        pool.run(move || {
            lock(&waited).push("open");
            done.send(()).unwrap();
        });
        release.send(()).unwrap();
        wait_done.recv_timeout(Duration::from_secs(10)).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !pool.is_idle() {
            assert!(std::time::Instant::now() < deadline, "jobs never finished");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(*lock(&order), ["open", "ahead 1", "ahead 2"]);
    }

    /// A job that panics neither kills its worker nor stays counted: the jobs after it run,
    /// on the one worker there is, and the pool is idle again.
    #[test]
    fn a_job_that_panics_leaves_its_worker_serving() {
        let pool = Pool::new(1, "t");
        pool.run(|| panic!("a job's bug"));
        pool.run_background(|| panic!("another"));
        let (tx, rx) = mpsc::channel();
        for i in 0..3 {
            let tx = tx.clone();
            pool.run(move || tx.send(i).unwrap());
        }
        let got: Vec<i32> = (0..3)
            .map(|_| rx.recv_timeout(Duration::from_secs(10)).unwrap())
            .collect();
        assert_eq!(got, [0, 1, 2]);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !pool.is_idle() {
            assert!(
                std::time::Instant::now() < deadline,
                "a panicked job stays pending"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(pool.idle_workers(), 1);
    }

    #[test]
    fn dropping_the_pool_finishes_queued_jobs() {
        let (tx, rx) = mpsc::channel();
        {
            let pool = Pool::new(1, "t");
            for i in 0..3 {
                let tx = tx.clone();
                pool.run_background(move || tx.send(i).unwrap());
            }
        }
        let got: Vec<i32> = (0..3)
            .map(|_| rx.recv_timeout(Duration::from_secs(10)).unwrap())
            .collect();
        assert_eq!(got, [0, 1, 2]);
    }
}
