//! The parallel encoding pipeline behind `split`, `pack --from-fatbin` and `pack`: kernels are
//! read, then one worker per core compresses each into a zstd frame (or keeps it as is for
//! `none`) and hashes it, and one writer receives the results back in submission order and
//! stores them. Reading, compressing, hashing and writing overlap. In [`run`], the caller's
//! thread walks its input (a host binary's bundles) and submits kernels, and the writer is a
//! thread of its own; in [`run_loaded`], where the inputs are known up front (files), each
//! worker reads the next one itself, so the bytes it hashes and compresses are still in its
//! core's cache, and the caller's thread is the writer: no third thread takes turns with the
//! workers on the cores.
//!
//! Memory is bounded by a byte budget: a submission waits while the kernels submitted but not
//! yet stored add up to more than the budget (a single kernel larger than the budget is let
//! through alone), so what is held never depends on the size of the input, only on the budget
//! and the largest kernel. The output does not depend on the number of threads.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::mpsc::{Receiver, SyncSender, channel, sync_channel};

use crate::archive::codec::FrameEncoder;
use crate::archive::writer::Compression;
use crate::atomic_file::{self, AtomicFile};
use crate::error::Error;

mod archive_file;
mod budget;
mod spares;
pub use archive_file::{ArchiveFile, Finished};
pub(crate) use budget::Budget;
pub use spares::Spares;

/// One kernel after the workers.
#[derive(Debug)]
pub struct Encoded {
    /// The zstd frame, or the kernel's bytes for `none`.
    pub stored: Vec<u8>,
    /// Size of the kernel's bytes.
    pub original_size: u64,
    /// BLAKE3 of the kernel's bytes, when [`Options::hash`] is set.
    pub digest: Option<[u8; 32]>,
    /// BLAKE3 of the zstd frame in `stored`, when [`Options::hash`] is set and compressing.
    pub frame_digest: Option<[u8; 32]>,
}

#[derive(Debug, Clone, Copy)]
pub struct Options {
    pub compression: Compression,
    /// Worker threads (at least one).
    pub threads: usize,
    /// Bytes of kernels in flight before a submission waits.
    pub budget: u64,
    /// Compute the digests our layout records (off for `--reference-layout`); which ones is
    /// decided by [`crate::archive::writer::Digests`].
    pub hash: bool,
}

/// Kernels in flight by default, per worker: a few real code objects (up to 15 MB each) per
/// core keep every core busy; the total stays between these bounds.
pub const BUDGET_PER_THREAD: u64 = 24 << 20;
pub const MIN_BUDGET: u64 = 64 << 20;
pub const MAX_BUDGET: u64 = 256 << 20;

impl Options {
    pub fn new(compression: Compression) -> Options {
        let threads = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1);
        Options {
            compression,
            threads,
            budget: (threads as u64 * BUDGET_PER_THREAD).clamp(MIN_BUDGET, MAX_BUDGET),
            hash: true,
        }
    }
}

type Job<T> = (u64, T, Vec<u8>);
/// A job's sequence number, its tag, the budget it holds and its outcome.
type Done<T, E> = (u64, T, u64, Result<Encoded, Failed<E>>);
/// A [`Done`] waiting for its turn, by sequence number.
type Waiting<T, E> = (T, u64, Result<Encoded, Failed<E>>);

/// Why a kernel has no encoding.
enum Failed<E> {
    Encode(String),
    Load(E),
}

/// Where the producer submits kernels.
pub struct Feed<'p, T> {
    jobs: SyncSender<Job<T>>,
    budget: &'p Budget,
    spares: &'p Spares,
    next: std::cell::Cell<u64>,
}

impl<T> Feed<'_, T> {
    /// Buffers the workers have finished with: reading the next kernel into one of them costs
    /// no page faults (see [`Spares`]).
    pub fn spares(&self) -> &Spares {
        self.spares
    }

    /// Queues one kernel; `tag` comes back with its encoding. Waits while the budget is spent.
    /// An error means the pipeline stopped (the writer failed): stop producing.
    pub fn submit(&self, tag: T, data: Vec<u8>) -> Result<(), Error> {
        let stopped = || Error::InvalidArgument("the archive writer stopped".into());
        if !self.budget.acquire(data.len() as u64) {
            return Err(stopped());
        }
        let seq = self.next.get();
        self.next.set(seq + 1);
        self.jobs.send((seq, tag, data)).map_err(|_| stopped())
    }
}

/// Runs `produce` on this thread with a [`Feed`], encodes what it submits on `opts.threads`
/// workers, and calls `store` on a writer thread with each result in submission order. The
/// first error wins: the writer's or an encoding failure (then the producer's submissions fail
/// and its own error is dropped), else the producer's.
pub fn run<T, R, E>(
    opts: Options,
    produce: impl FnOnce(&Feed<'_, T>) -> Result<R, E>,
    store: impl FnMut(T, Encoded) -> Result<(), E> + Send,
) -> Result<R, E>
where
    T: Send,
    E: From<Error> + Send,
{
    let threads = opts.threads.max(1);
    let level = checked_level(opts.compression).map_err(E::from)?;
    let budget = Budget::new(opts.budget);
    let (job_tx, job_rx) = sync_channel::<Job<T>>(threads * 2);
    let job_rx = Mutex::new(job_rx);
    let spares = input_spares(threads, opts.budget);
    std::thread::scope(|s| {
        let (done_tx, done_rx) = channel::<Done<T, E>>();
        for _ in 0..threads {
            let done_tx = done_tx.clone();
            let job_rx = &job_rx;
            let spares = &spares;
            let hash = opts.hash;
            s.spawn(move || work(job_rx, done_tx, spares, level, hash));
        }
        drop(done_tx);
        let budget = &budget;
        let writer = s.spawn(move || store_in_order(done_rx, budget, store));
        let feed = Feed {
            jobs: job_tx,
            budget,
            spares: &spares,
            next: std::cell::Cell::new(0),
        };
        let produced = produce(&feed);
        let submitted = feed.next.get();
        drop(feed);
        let (failed, stored) = writer
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p));
        match (failed, produced) {
            (Some(e), _) => Err(e),
            (None, Err(e)) => Err(e),
            (None, Ok(r)) => all_stored(stored, submitted).map(|()| r),
        }
    })
}

/// Like [`run`], for `count` inputs known up front that the workers read themselves with
/// `load(i, spares)` (best into a buffer from `spares`). A worker claims the next index and,
/// holding the claim, waits for budget for `size_of(i)` bytes: indices get their budget in
/// order, so the writer never waits for one whose worker waits for budget. `store(i, ..)` is
/// called in index order. A load error is returned in its turn, once every kernel before it
/// was stored; the first error in index order wins, the writer's included.
pub fn run_loaded<E>(
    opts: Options,
    count: usize,
    size_of: impl Fn(usize) -> u64 + Sync,
    load: impl Fn(usize, &Spares) -> Result<Vec<u8>, E> + Sync,
    store: impl FnMut(usize, Encoded) -> Result<(), E>,
) -> Result<(), E>
where
    E: From<Error> + Send,
{
    let threads = opts.threads.max(1);
    let level = checked_level(opts.compression).map_err(E::from)?;
    let budget = Budget::new(opts.budget);
    let spares = input_spares(threads, opts.budget);
    let next = Mutex::new(0usize);
    std::thread::scope(|s| {
        let (done_tx, done_rx) = channel::<Done<usize, E>>();
        for _ in 0..threads {
            let done_tx = done_tx.clone();
            let (next, budget, spares) = (&next, &budget, &spares);
            let (size_of, load) = (&size_of, &load);
            s.spawn(move || {
                let mut encoder = Encoder::new(level, opts.hash);
                loop {
                    let (i, charged) = {
                        let mut next = crate::sync::lock(next);
                        let i = *next;
                        if i == count {
                            return;
                        }
                        let charged = size_of(i);
                        if !budget.acquire(charged) {
                            return;
                        }
                        *next += 1;
                        (i, charged)
                    };
                    let result = match load(i, spares) {
                        Ok(data) => encoder.encode(data, spares).map_err(Failed::Encode),
                        Err(e) => Err(Failed::Load(e)),
                    };
                    if done_tx.send((i as u64, i, charged, result)).is_err() {
                        return;
                    }
                }
            });
        }
        drop(done_tx);
        let (failed, stored) = store_in_order(done_rx, &budget, store);
        match failed {
            Some(e) => Err(e),
            None => all_stored(stored, count as u64),
        }
    })
}

/// Input buffers to read kernels into: one per worker and two more, within half the budget,
/// what is needed to read ahead while every worker holds a kernel.
fn input_spares(threads: usize, budget: u64) -> Spares {
    Spares::new(
        threads + 2,
        usize::try_from(budget / 2).unwrap_or(usize::MAX),
    )
}

/// The compression level to use, checked before anything starts; `None` for `none`.
fn checked_level(compression: Compression) -> Result<Option<i32>, Error> {
    match compression {
        Compression::Zstd { level } => FrameEncoder::new(level)
            .map(|_| Some(level))
            .map_err(Error::InvalidArgument),
        Compression::None => Ok(None),
    }
}

fn all_stored<E: From<Error>>(stored: u64, submitted: u64) -> Result<(), E> {
    if stored == submitted {
        Ok(())
    } else {
        Err(E::from(Error::InvalidArgument(format!(
            "{} of {submitted} kernels were not encoded",
            submitted - stored
        ))))
    }
}

/// The writer: receives the workers' results, and calls `store` with each in sequence order,
/// releasing its budget once stored. After the first error nothing more is stored and the
/// budget stops (so no more work is taken). Returns that error and how many results came in
/// order.
fn store_in_order<T, E>(
    done: Receiver<Done<T, E>>,
    budget: &Budget,
    mut store: impl FnMut(T, Encoded) -> Result<(), E>,
) -> (Option<E>, u64)
where
    E: From<Error>,
{
    let mut pending: BTreeMap<u64, Waiting<T, E>> = BTreeMap::new();
    let mut next = 0u64;
    let mut failed: Option<E> = None;
    for (seq, tag, charged, result) in done {
        pending.insert(seq, (tag, charged, result));
        while let Some((tag, charged, result)) = pending.remove(&next) {
            next += 1;
            if failed.is_none() {
                let outcome = match result {
                    Ok(encoded) => store(tag, encoded),
                    Err(Failed::Encode(e)) => Err(E::from(Error::InvalidArgument(format!(
                        "compressing a kernel: {e}"
                    )))),
                    Err(Failed::Load(e)) => Err(e),
                };
                if let Err(e) = outcome {
                    failed = Some(e);
                    budget.stop();
                }
            }
            budget.release(charged);
        }
    }
    (failed, next)
}

fn work<T, E>(
    jobs: &Mutex<Receiver<Job<T>>>,
    done: std::sync::mpsc::Sender<Done<T, E>>,
    spares: &Spares,
    level: Option<i32>,
    hash: bool,
) {
    let mut encoder = Encoder::new(level, hash);
    loop {
        let job = crate::sync::lock(jobs).recv();
        let Ok((seq, tag, data)) = job else {
            return;
        };
        let charged = data.len() as u64;
        let result = encoder.encode(data, spares).map_err(Failed::Encode);
        if done.send((seq, tag, charged, result)).is_err() {
            return;
        }
    }
}

/// One worker's compressor and digests.
struct Encoder {
    frames: Option<Result<FrameEncoder, String>>,
    digests: crate::archive::writer::Digests,
}

impl Encoder {
    fn new(level: Option<i32>, hash: bool) -> Encoder {
        Encoder {
            frames: level.map(FrameEncoder::new),
            digests: crate::archive::writer::Digests::written(hash, level.is_some()),
        }
    }

    /// Hashes and compresses one kernel; its buffer goes back to `spares` once compressed.
    fn encode(&mut self, data: Vec<u8>, spares: &Spares) -> Result<Encoded, String> {
        let original_size = data.len() as u64;
        let digest = self.digests.of_kernel(&data);
        let stored = match &mut self.frames {
            None => data,
            Some(Ok(enc)) => {
                let frame = enc.encode(&data).map(|mut frame| {
                    // The encoder reserves the worst case; give the rest back while it waits.
                    frame.shrink_to_fit();
                    frame
                });
                spares.put(data);
                frame?
            }
            Some(Err(e)) => return Err(e.clone()),
        };
        Ok(Encoded {
            frame_digest: self.digests.of_frame(&stored),
            stored,
            original_size,
            digest,
        })
    }
}

/// The archive-wide fields of an archive to write.
#[derive(Debug, Clone)]
pub struct ArchiveHead {
    pub group_name: String,
    pub gfx_arch_family: String,
    pub gfx_arches: Vec<String>,
    pub compression: Compression,
    pub reference_layout: bool,
}

/// Why [`pack_files`] failed: reading an input (the caller's error) or writing the archive.
#[derive(Debug)]
pub enum PackFilesError<E> {
    Read(E),
    Write(Error),
}

impl<E> From<Error> for PackFilesError<E> {
    fn from(e: Error) -> Self {
        PackFilesError::Write(e)
    }
}

/// Writes the archive of `kernels` (key, arch, file, in ordinal order) at `path`: the workers
/// read each file with `read` (best into a buffer from the [`Spares`] it is given; `size_of`
/// tells its size beforehand, for the budget), hash and compress it, and this thread appends
/// in order to a temporary file in the same directory, flushed to disk and renamed into place
/// once complete (and removed on failure: [`AtomicFile`]). `progress` receives each kernel's size once it is stored. Returns the
/// archive's size.
pub fn pack_files<P, E>(
    path: &std::path::Path,
    head: &ArchiveHead,
    threads: Option<usize>,
    kernels: &[(String, String, P)],
    size_of: impl Fn(&P) -> u64 + Sync,
    read: impl Fn(&P, &Spares) -> Result<Vec<u8>, E> + Sync,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<u64, PackFilesError<E>>
where
    P: Sync,
    E: Send,
{
    let (tmp, file) =
        AtomicFile::create(path, atomic_file::Options::DURABLE).map_err(Error::from)?;
    let mut opts = Options::new(head.compression);
    opts.hash = !head.reference_layout;
    if let Some(t) = threads {
        opts.threads = t.max(1);
    }
    let mut archive = ArchiveFile::new(file, path, head.compression, head.reference_layout);
    run_loaded(
        opts,
        kernels.len(),
        |i| size_of(&kernels[i].2),
        |i, spares| read(&kernels[i].2, spares).map_err(PackFilesError::Read),
        |i: usize, encoded| {
            let size = encoded.original_size;
            let (key, arch, _) = &kernels[i];
            archive.append(key, arch, Vec::new(), encoded)?;
            progress(size);
            Ok(())
        },
    )
    .and_then(|()| {
        let done = archive.finish(&head.group_name, &head.gfx_arch_family, &head.gfx_arches)?;
        tmp.commit(done.file).map_err(Error::from)?;
        Ok(done.size)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kernels() -> Vec<Vec<u8>> {
        (0..40u32)
            .map(|i| {
                let n = 1000 + (i as usize * 7919) % 50_000;
                (0..n).map(|j| (j as u32 * (i + 3) / 7) as u8).collect()
            })
            .collect()
    }

    /// An encoding of `input` as our layout records it: its size and both digests.
    fn check_encoded(input: &[u8], e: &Encoded) {
        assert_eq!(e.original_size, input.len() as u64);
        assert_eq!(e.digest, Some(*blake3::hash(input).as_bytes()));
        assert_eq!(e.frame_digest, Some(*blake3::hash(&e.stored).as_bytes()));
    }

    /// `got` holds every index once, in order, with the frames expected.
    fn assert_frames_in_order(got: Vec<(usize, Vec<u8>)>, expect: &[Vec<u8>], what: &str) {
        let order: Vec<usize> = got.iter().map(|g| g.0).collect();
        assert_eq!(order, (0..expect.len()).collect::<Vec<_>>(), "{what}");
        let frames: Vec<Vec<u8>> = got.into_iter().map(|g| g.1).collect();
        assert!(frames == expect, "{what}");
    }

    #[test]
    fn results_come_back_in_order_whatever_the_threads_and_budget() {
        let input = kernels();
        let expect: Vec<Vec<u8>> = input
            .iter()
            .map(|k| FrameEncoder::new(3).unwrap().encode(k).unwrap())
            .collect();
        for (threads, budget) in [(1, 1), (2, 10_000), (4, 1 << 30)] {
            let mut got = Vec::new();
            let opts = Options {
                compression: Compression::Zstd { level: 3 },
                threads,
                budget,
                hash: true,
            };
            run(
                opts,
                |feed| {
                    for (i, k) in input.iter().enumerate() {
                        feed.submit(i, k.clone())?;
                    }
                    Ok::<_, Error>(())
                },
                |i, e| {
                    check_encoded(&input[i], &e);
                    got.push((i, e.stored));
                    Ok(())
                },
            )
            .unwrap();
            assert_frames_in_order(got, &expect, &format!("threads {threads}, budget {budget}"));
        }
    }

    #[test]
    fn a_store_error_stops_the_producer_and_is_returned() {
        let opts = Options {
            compression: Compression::None,
            threads: 2,
            budget: 10,
            hash: false,
        };
        let mut submitted = 0;
        let r: Result<(), Error> = run(
            opts,
            |feed| {
                for i in 0..1000u32 {
                    feed.submit(i, vec![1; 8])?;
                    submitted += 1;
                }
                Ok(())
            },
            |i, e| {
                assert_eq!(e.stored, vec![1; 8]);
                disk_full_at_3(i.into())
            },
        );
        assert_disk_full(r);
        assert!(submitted < 1000, "the producer kept going: {submitted}");
    }

    /// A store that fails at the fourth kernel, as a full disk would.
    fn disk_full_at_3(i: u64) -> Result<(), Error> {
        if i == 3 {
            Err(Error::InvalidArgument("disk full".into()))
        } else {
            Ok(())
        }
    }

    fn assert_disk_full(r: Result<(), Error>) {
        assert_eq!(
            r.unwrap_err().to_string(),
            Error::InvalidArgument("disk full".into()).to_string()
        );
    }

    #[test]
    fn a_bad_level_is_refused_before_starting() {
        let opts = Options::new(Compression::Zstd { level: 99 });
        let r: Result<(), Error> = run(opts, |_| panic!("must not run"), |_: (), _| Ok(()));
        assert!(r.unwrap_err().to_string().contains("99"));
        let r: Result<(), Error> = run_loaded(
            opts,
            3,
            |_| 1,
            |_, _| panic!("must not load"),
            |_, _| panic!("must not store"),
        );
        assert!(r.unwrap_err().to_string().contains("99"));
    }

    fn opts(threads: usize, budget: u64) -> Options {
        Options {
            compression: Compression::Zstd { level: 3 },
            threads,
            budget,
            hash: true,
        }
    }

    #[test]
    fn loaded_inputs_come_back_in_order_as_frames_of_what_was_loaded() {
        let input = kernels();
        let expect: Vec<Vec<u8>> = input
            .iter()
            .map(|k| FrameEncoder::new(3).unwrap().encode(k).unwrap())
            .collect();
        // Declared sizes that are wrong both ways (a file that changed since it was listed)
        // still balance the budget: each index releases what it was charged.
        for (threads, budget, declared) in [(1, 1, 0), (2, 10_000, 7), (4, 1 << 30, 1 << 20)] {
            let loads = std::sync::atomic::AtomicUsize::new(0);
            let mut got = Vec::new();
            run_loaded(
                opts(threads, budget),
                input.len(),
                |_| declared,
                |i, spares| {
                    loads.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let mut buf = spares.take(input[i].len()).unwrap();
                    buf.extend_from_slice(&input[i]);
                    Ok::<_, Error>(buf)
                },
                |i, e| {
                    check_encoded(&input[i], &e);
                    got.push((i, e.stored));
                    Ok(())
                },
            )
            .unwrap();
            assert_eq!(loads.into_inner(), input.len(), "each input loaded once");
            assert_frames_in_order(got, &expect, &format!("threads {threads}, budget {budget}"));
        }
        let none: Result<(), Error> = run_loaded(
            opts(2, 100),
            0,
            |_| panic!("no size"),
            |_, _| panic!("nothing to load"),
            |_, _| panic!("nothing to store"),
        );
        none.unwrap();
    }

    #[test]
    fn a_load_error_is_returned_after_everything_before_it_was_stored() {
        for threads in [1, 2, 4] {
            let mut stored = Vec::new();
            let r: Result<(), Error> = run_loaded(
                opts(threads, 64),
                1000,
                |_| 8,
                |i, _| match i {
                    // A later index fails too: the first in index order wins, whichever
                    // worker got there first.
                    17 | 18 => Err(Error::InvalidArgument(format!("unreadable {i}"))),
                    _ => Ok(vec![i as u8; 8]),
                },
                |i, e| {
                    assert_eq!(e.original_size, 8);
                    stored.push(i);
                    Ok(())
                },
            );
            assert_eq!(
                r.unwrap_err().to_string(),
                Error::InvalidArgument("unreadable 17".into()).to_string()
            );
            assert_eq!(stored, (0..17).collect::<Vec<_>>(), "threads {threads}");
        }
    }

    #[test]
    fn a_store_error_stops_the_loading_workers_and_is_returned() {
        let loads = std::sync::atomic::AtomicUsize::new(0);
        let r: Result<(), Error> = run_loaded(
            opts(2, 10),
            1000,
            |_| 8,
            |i, _| {
                loads.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                Ok(vec![i as u8; 8])
            },
            |i, _| disk_full_at_3(i as u64),
        );
        assert_disk_full(r);
        let loads = loads.into_inner();
        assert!(loads < 1000, "the workers kept loading: {loads}");
    }
}
