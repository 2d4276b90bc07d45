//! The parallel encoding pipeline behind `split`, `pack --from-fatbin` and `pack`: the caller's
//! thread reads kernels and submits them; one worker per core compresses each into a zstd frame
//! (or keeps it as is for `none`) and hashes it; one writer thread receives the results back in
//! submission order and stores them. Reading, compressing, hashing and writing overlap.
//!
//! Memory is bounded by a byte budget: a submission waits while the kernels submitted but not
//! yet stored add up to more than the budget (a single kernel larger than the budget is let
//! through alone), so what is held never depends on the size of the input, only on the budget
//! and the largest kernel. The output does not depend on the number of threads.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::mpsc::{Receiver, SyncSender, channel, sync_channel};

use crate::codec::FrameEncoder;
use crate::error::Error;
use crate::writer::Compression;

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
    /// decided by [`crate::writer::Digests`].
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
type Done<T> = (u64, T, Result<Encoded, String>);

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
    mut store: impl FnMut(T, Encoded) -> Result<(), E> + Send,
) -> Result<R, E>
where
    T: Send,
    E: From<Error> + Send,
{
    let threads = opts.threads.max(1);
    let budget = Budget::new(opts.budget);
    let level = match opts.compression {
        Compression::Zstd { level } => Some(level),
        Compression::None => None,
    };
    // An invalid level is reported before anything starts.
    if let Some(level) = level {
        FrameEncoder::new(level).map_err(|e| E::from(Error::InvalidArgument(e)))?;
    }
    let (job_tx, job_rx) = sync_channel::<Job<T>>(threads * 2);
    let job_rx = Mutex::new(job_rx);
    // One spare per worker and two more, within half the budget: what the producer needs to
    // read ahead while every worker holds a kernel.
    let spares = Spares::new(
        threads + 2,
        usize::try_from(opts.budget / 2).unwrap_or(usize::MAX),
    );
    std::thread::scope(|s| {
        let (done_tx, done_rx) = channel::<Done<T>>();
        for _ in 0..threads {
            let done_tx = done_tx.clone();
            let job_rx = &job_rx;
            let spares = &spares;
            let hash = opts.hash;
            s.spawn(move || work(job_rx, done_tx, spares, level, hash));
        }
        drop(done_tx);
        let budget = &budget;
        let writer = s.spawn(move || {
            let mut pending: BTreeMap<u64, (T, Result<Encoded, String>)> = BTreeMap::new();
            let mut next = 0u64;
            let mut failed: Option<E> = None;
            for (seq, tag, result) in done_rx {
                pending.insert(seq, (tag, result));
                while let Some((tag, result)) = pending.remove(&next) {
                    next += 1;
                    let size = match &result {
                        Ok(e) => e.original_size,
                        Err(_) => 0,
                    };
                    if failed.is_none() {
                        let outcome = match result {
                            Ok(encoded) => store(tag, encoded),
                            Err(e) => Err(E::from(Error::InvalidArgument(format!(
                                "compressing a kernel: {e}"
                            )))),
                        };
                        if let Err(e) = outcome {
                            failed = Some(e);
                            budget.stop();
                        }
                    }
                    budget.release(size);
                }
            }
            (failed, next)
        });
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
            (None, Ok(_)) if stored != submitted => Err(E::from(Error::InvalidArgument(format!(
                "{} of {submitted} kernels were not encoded",
                submitted - stored
            )))),
            (None, Ok(r)) => Ok(r),
        }
    })
}

fn work<T>(
    jobs: &Mutex<Receiver<Job<T>>>,
    done: std::sync::mpsc::Sender<Done<T>>,
    spares: &Spares,
    level: Option<i32>,
    hash: bool,
) {
    let mut encoder = level.map(FrameEncoder::new);
    let digests = crate::writer::Digests::written(hash, level.is_some());
    loop {
        let job = crate::sync::lock(jobs).recv();
        let Ok((seq, tag, data)) = job else {
            return;
        };
        let original_size = data.len() as u64;
        let digest = digests.of_kernel(&data);
        let stored = match &mut encoder {
            None => Ok(data),
            Some(Ok(enc)) => {
                let frame = enc.encode(&data).map(|mut frame| {
                    // The encoder reserves the worst case; give the rest back while it waits.
                    frame.shrink_to_fit();
                    frame
                });
                spares.put(data);
                frame
            }
            Some(Err(e)) => Err(e.clone()),
        };
        let result = stored.map(|stored| Encoded {
            frame_digest: digests.of_frame(&stored),
            stored,
            original_size,
            digest,
        });
        if done.send((seq, tag, result)).is_err() {
            return;
        }
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

/// Writes the archive of `kernels` (key, arch, file, in ordinal order) at `path`: files are
/// read on this thread with `read` (best into a buffer from the [`Spares`] it is given) while the workers compress and hash and a writer thread
/// appends, into a temporary file in the same directory renamed into place once complete (and
/// removed on failure). `progress` receives each kernel's size once it is stored. Returns the
/// archive's size.
pub fn pack_files<P, E>(
    path: &std::path::Path,
    head: &ArchiveHead,
    threads: Option<usize>,
    kernels: &[(String, String, P)],
    read: impl Fn(&P, &Spares) -> Result<Vec<u8>, E>,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<u64, PackFilesError<E>>
where
    P: Sync,
    E: Send,
{
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(std::path::Path::new("."));
    let name = path
        .file_name()
        .ok_or_else(|| Error::InvalidArgument(format!("{}: not a file path", path.display())))?;
    let tmp = dir.join(format!(
        ".{}.tmp{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let file = std::fs::File::create(&tmp).map_err(|e| Error::io(path, "cannot create", e))?;
    let mut opts = Options::new(head.compression);
    opts.hash = !head.reference_layout;
    if let Some(t) = threads {
        opts.threads = t.max(1);
    }
    let mut archive = ArchiveFile::new(file, path, head.compression, head.reference_layout);
    let result = run(
        opts,
        |feed| {
            for (i, (_, _, source)) in kernels.iter().enumerate() {
                let data = read(source, feed.spares()).map_err(PackFilesError::Read)?;
                feed.submit(i, data)?;
            }
            Ok(())
        },
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
        let (file, size) = (done.file, done.size);
        file.sync_all()
            .map_err(|e| Error::io(path, "cannot sync", e))?;
        std::fs::rename(&tmp, path).map_err(|e| Error::io(path, "cannot rename into place", e))?;
        Ok(size)
    });
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
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
                    assert_eq!(e.original_size, input[i].len() as u64);
                    assert_eq!(e.digest, Some(*blake3::hash(&input[i]).as_bytes()));
                    assert_eq!(e.frame_digest, Some(*blake3::hash(&e.stored).as_bytes()));
                    got.push((i, e.stored));
                    Ok(())
                },
            )
            .unwrap();
            let order: Vec<usize> = got.iter().map(|g| g.0).collect();
            assert_eq!(order, (0..input.len()).collect::<Vec<_>>());
            let frames: Vec<Vec<u8>> = got.into_iter().map(|g| g.1).collect();
            assert_eq!(frames, expect, "threads {threads}, budget {budget}");
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
                if i == 3 {
                    Err(Error::InvalidArgument("disk full".into()))
                } else {
                    Ok(())
                }
            },
        );
        assert_eq!(
            r.unwrap_err().to_string(),
            Error::InvalidArgument("disk full".into()).to_string()
        );
        assert!(submitted < 1000, "the producer kept going: {submitted}");
    }

    #[test]
    fn a_bad_level_is_refused_before_starting() {
        let opts = Options::new(Compression::Zstd { level: 99 });
        let r: Result<(), Error> = run(opts, |_| panic!("must not run"), |_: (), _| Ok(()));
        assert!(r.unwrap_err().to_string().contains("99"));
    }
}
