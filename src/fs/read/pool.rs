//! A fixed set of threads for decode jobs (cold opens, cold READs in page-cache mode, decodes
//! ahead of a scan), separate from the FUSE request threads.
//!
//! Decoding a kernel can take a while; done on a request thread it would hold that thread, and
//! with few threads (`-s`) every lookup, getattr and read of other files would wait behind it.
//! Decode jobs are handed here instead (the replies travel with the job), so up to one decode per
//! core runs at once whatever `--threads` says, and request threads stay free.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Sender, channel};
use std::sync::{Arc, Mutex};
use std::thread;

use crate::sync::lock;

type Job = Box<dyn FnOnce() + Send + 'static>;

/// The pool; dropping it lets the threads finish queued jobs and exit.
pub struct Pool {
    queue: Mutex<Option<Sender<Job>>>,
    threads: usize,
    /// Jobs handed in and not finished yet (queued or running).
    pending: Arc<AtomicUsize>,
}

impl Pool {
    /// `threads` workers (at least one).
    pub fn new(threads: usize, name: &str) -> Pool {
        let (tx, rx) = channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        let pending = Arc::new(AtomicUsize::new(0));
        let mut started = 0;
        for i in 0..threads.max(1) {
            let (rx, pending) = (rx.clone(), pending.clone());
            let spawned = thread::Builder::new()
                .name(format!("{name}-{i}"))
                .spawn(move || {
                    loop {
                        // Hold the receiver only to take one job, not while running it.
                        let job = match lock(&rx).recv() {
                            Ok(job) => job,
                            Err(_) => return,
                        };
                        job();
                        pending.fetch_sub(1, Ordering::AcqRel);
                    }
                });
            match spawned {
                Ok(_) => started += 1,
                Err(e) => log::warn!("cannot start a {name} thread: {e}"),
            }
        }
        Pool {
            queue: Mutex::new(Some(tx)),
            threads: started,
            pending,
        }
    }

    /// Runs `job` on a worker; when no worker can take it (the pool is shutting down), runs it
    /// on the calling thread so it is never lost.
    pub fn run(&self, job: impl FnOnce() + Send + 'static) {
        let job: Job = Box::new(job);
        self.pending.fetch_add(1, Ordering::AcqRel);
        let rejected = match lock(&self.queue).as_ref() {
            Some(tx) => tx.send(job).err().map(|e| e.0),
            None => Some(job),
        };
        if let Some(job) = rejected {
            self.pending.fetch_sub(1, Ordering::AcqRel);
            job();
        }
    }

    /// How many jobs handed in now workers would take at once (free workers, none queued).
    pub fn idle_workers(&self) -> usize {
        self.threads
            .saturating_sub(self.pending.load(Ordering::Acquire))
    }

    /// Whether no job is queued or running.
    #[cfg(test)]
    pub fn is_idle(&self) -> bool {
        self.pending.load(Ordering::Acquire) == 0
    }

    /// A handle a job can use to see whether others wait for a worker.
    pub fn queue(&self) -> Queue {
        Queue {
            threads: self.threads,
            pending: self.pending.clone(),
        }
    }
}

/// See [`Pool::queue`].
pub struct Queue {
    threads: usize,
    pending: Arc<AtomicUsize>,
}

impl Queue {
    /// Whether jobs wait for a worker: more are pending (queued or running) than there are
    /// workers. A running job counts itself, so this is true only if some job has no worker.
    pub fn has_waiting(&self) -> bool {
        self.pending.load(Ordering::Acquire) > self.threads
    }
}

/// The cores this process may run on (at least one).
pub fn cores() -> usize {
    thread::available_parallelism().map_or(1, |n| n.get())
}

impl Drop for Pool {
    fn drop(&mut self) {
        lock(&self.queue).take();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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
}
