//! Checking a host binary's code objects against what should hold them (`verify --against`,
//! `verify --split`) while the next ones are still being read: the calling thread walks the
//! binary's device code with positioned reads (one code object, or one decompressed CCOB bundle,
//! at a time) and hands each code object to worker threads, which load the matching kernel and
//! compare. Reading and decoding overlap on different cores.
//!
//! Memory is bounded by a byte budget on the code objects handed over but not yet checked (one
//! larger than the budget goes alone), plus what each worker holds while checking one, so it
//! never grows with the binary's size. Results come back in code-object order whatever the
//! threads, so reports are deterministic.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Mutex;
use std::sync::mpsc::{Receiver, channel, sync_channel};

use crate::host::fatbin::{CodeObject, HostFile, StreamError, visit_host_code_objects};
use crate::tools::pack_pipeline::Budget;

/// Bytes of code objects read ahead of the workers: a few real code objects (up to 15 MB
/// each) per core.
const CHECK_BUDGET: u64 = 48 << 20;

/// Visits the code objects of `host` (keyed with `kernel_name`, as
/// [`visit_host_code_objects`] keys them) and runs `check` on each on one of `threads` workers;
/// returns the results in code-object order. `check` gets a scratch buffer the worker keeps from
/// one code object to the next, to decode into without allocating each time. `progress`
/// receives section bytes as bundles are read (see [`visit_host_code_objects`]), on this thread.
pub fn check_host_code_objects<P, F>(
    kernel_name: &str,
    host: &HostFile,
    threads: usize,
    check: F,
    progress: &dyn Fn(u64),
) -> Result<Vec<P>, StreamError<Infallible>>
where
    P: Send,
    F: Fn(&CodeObject, &mut Vec<u8>) -> P + Sync,
{
    let threads = threads.max(1);
    let budget = Budget::new(CHECK_BUDGET);
    let (job_tx, job_rx) = sync_channel::<(usize, CodeObject)>(threads * 2);
    let job_rx = Mutex::new(job_rx);
    let (done_tx, done_rx) = channel::<(usize, P)>();
    let walked = std::thread::scope(|s| {
        for _ in 0..threads {
            let done_tx = done_tx.clone();
            let (job_rx, budget, check) = (&job_rx, &budget, &check);
            s.spawn(move || work(job_rx, budget, check, done_tx));
        }
        drop(done_tx);
        let mut seq = 0usize;
        let walked = visit_host_code_objects(
            kernel_name,
            host,
            |co: CodeObject| {
                // Workers never stop the budget, so this only waits, never refuses.
                budget.acquire(co.data.len() as u64);
                job_tx
                    .send((seq, co))
                    .expect("workers run until the jobs end");
                seq += 1;
                Ok::<(), Infallible>(())
            },
            progress,
        );
        drop(job_tx);
        walked
    });
    walked?;
    let mut results: BTreeMap<usize, P> = done_rx.into_iter().collect();
    let n = results.len();
    Ok((0..n)
        .map(|i| results.remove(&i).expect("one result per code object"))
        .collect())
}

fn work<P, F>(
    jobs: &Mutex<Receiver<(usize, CodeObject)>>,
    budget: &Budget,
    check: &F,
    done: std::sync::mpsc::Sender<(usize, P)>,
) where
    F: Fn(&CodeObject, &mut Vec<u8>) -> P,
{
    let mut scratch = Vec::new();
    loop {
        let job = crate::sync::lock(jobs).recv();
        let Ok((seq, co)) = job else {
            return;
        };
        // Released when the code object is dropped, even if `check` panics: the walker must
        // never wait for bytes nobody will give back.
        let held = Held(budget, co.data.len() as u64);
        let result = check(&co, &mut scratch);
        drop(co);
        drop(held);
        // The caller collects only after every worker ended, so the receiver is alive.
        let _ = done.send((seq, result));
    }
}

struct Held<'b>(&'b Budget, u64);

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.0.release(self.1);
    }
}
