//! One kernel's decode in progress, and everyone waiting on it, without blocking anyone.
//!
//! Every decode of the mount is one of these jobs, and the mount's map of running jobs (one
//! per kernel) is its only single flight: a cold open, a READ by inode, a small kernel decoded
//! into memory for page-cache mode, and a decode ahead of a scan all start or join the job of
//! their kernel. The job first prepares
//! (checks the cache directory, reads and verifies the compressed frame); then it either
//! streams (decodes in steps into the backing file, publishing how many leading bytes are
//! final) or decodes whole (archives whose digest covers only the decoded bytes: nothing may
//! be served before all of them are checked; a small kernel decoded into memory). Its result
//! is a [`Body`]: a file, or bytes in memory. Waiters are callbacks, so no thread is held:
//! * opens are answered when the job starts streaming (the handle then reads through the
//!   daemon while the file fills) or when the file is complete, or with the job's error; an
//!   open that asks for the whole file is answered only when the file is complete;
//! * a read of bytes not decoded yet is parked and answered by the job as soon as they are;
//! * an open needs a file: one that meets a job whose result is bytes in memory (made only in
//!   page-cache mode, which Linux sends no OPEN) gets EIO.
//!
//! A failed job answers every waiter with its error; reads of handles opened while it streamed
//! get EIO from then on. Only decoded bytes are served: of a frame that matched its digest when
//! the archive records one (an archive without digests has nothing to check them against).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use crate::fs::errno::Errno;
use crate::fs::store::BackingFile;
use crate::fs::store::Body;
use crate::sync::lock;

/// How an open file reads: the file is complete (passthrough may serve it), or it is still
/// being filled by `fill` (reads go through the daemon and may wait).
#[derive(Clone)]
pub struct OpenedFile {
    pub(crate) backing: Arc<BackingFile>,
    pub(crate) fill: Option<Arc<Fill>>,
}

impl OpenedFile {
    pub fn complete(backing: Arc<BackingFile>) -> OpenedFile {
        OpenedFile {
            backing,
            fill: None,
        }
    }

    /// Whether every byte of the file is written and checked now.
    pub fn is_complete(&self) -> bool {
        self.fill.as_ref().is_none_or(|f| f.is_done())
    }
}

/// Receives the outcome of an open.
pub type OpenDone = Box<dyn FnOnce(Result<OpenedFile, Errno>) + Send>;
/// Receives the bytes of a read (short only at the end of the kernel) or its error.
pub type ReadDone = Box<dyn FnOnce(Result<&[u8], Errno>) + Send>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Preparing,
    Streaming,
    Done,
    Failed(Errno),
}

struct Parked {
    offset: u64,
    end: u64,
    done: ReadDone,
}

struct State {
    phase: Phase,
    /// The file being written (from `Streaming`), or the result (`Done`).
    body: Option<Body>,
    /// Leading bytes of `body` that are final.
    ready: u64,
    reads: Vec<Parked>,
    /// Opens answered when the job starts streaming.
    opens: Vec<OpenDone>,
    /// Opens answered when the file is complete.
    opens_whole: Vec<OpenDone>,
}

impl State {
    /// Every waiting open, of either kind: the job has ended (complete or failed).
    fn take_opens(&mut self) -> Vec<OpenDone> {
        let mut opens = std::mem::take(&mut self.opens);
        opens.append(&mut self.opens_whole);
        opens
    }
}

/// The shared state of one kernel's decode job.
pub struct Fill {
    /// The decoded size of the job's kernel.
    len: u64,
    state: Mutex<State>,
    /// Set with `Phase::Done`: readers of a finished file check it without the lock.
    done: AtomicBool,
}

impl Fill {
    /// The job of a kernel of `len` decoded bytes.
    pub fn for_kernel(len: u64) -> Fill {
        Fill {
            len,
            state: Mutex::new(State {
                phase: Phase::Preparing,
                body: None,
                ready: 0,
                reads: Vec::new(),
                opens: Vec::new(),
                opens_whole: Vec::new(),
            }),
            done: AtomicBool::new(false),
        }
    }

    /// The decoded size of the job's kernel.
    pub fn kernel_len(&self) -> u64 {
        self.len
    }

    pub fn is_done(&self) -> bool {
        self.done.load(Ordering::Acquire)
    }

    /// Adds an open: answered now when the job streams (unless `whole`) or has finished, else
    /// when it does. With `whole` the open gets the complete file, which passthrough can serve.
    /// A job that ended with bytes in memory has no file for it: EIO.
    pub fn join(self: &Arc<Self>, whole: bool, done: OpenDone) {
        let answer = {
            let mut s = lock(&self.state);
            match (s.phase, &s.body) {
                (Phase::Failed(e), _) => Err(e),
                (Phase::Done, Some(Body::File(file))) => Ok(self.opened(file.clone())),
                (Phase::Done, _) => Err(Errno::EIO),
                (Phase::Streaming, Some(Body::File(file))) if !whole => {
                    Ok(self.opened(file.clone()))
                }
                _ if whole => return s.opens_whole.push(done),
                _ => return s.opens.push(done),
            }
        };
        done(answer);
    }

    fn opened(self: &Arc<Self>, backing: Arc<BackingFile>) -> OpenedFile {
        OpenedFile {
            backing,
            fill: Some(self.clone()),
        }
    }

    /// The job writes `file` from now on, publishing with [`progress`](Self::progress):
    /// waiting opens are answered.
    pub fn streaming(self: &Arc<Self>, file: &Arc<BackingFile>) {
        let opens = {
            let mut s = lock(&self.state);
            s.phase = Phase::Streaming;
            s.body = Some(Body::File(file.clone()));
            std::mem::take(&mut s.opens)
        };
        for done in opens {
            done(Ok(self.opened(file.clone())));
        }
    }

    /// Every byte of the file up to the end of `piece` (the file's bytes from `start`, in the
    /// job's memory, just written) is final: parked reads they cover are answered, from `piece`
    /// itself when they lie in it (no read back from the file), else from the file.
    pub fn progress(&self, start: u64, piece: &[u8]) {
        let ready = start + piece.len() as u64;
        let (due, file) = {
            let mut s = lock(&self.state);
            s.ready = ready;
            // Every byte written: the file is complete from here on, so an open arriving while
            // the job still keeps it (seal, record, rename) gets the complete file.
            if s.body.as_ref().is_some_and(|f| f.len() == ready) {
                s.phase = Phase::Done;
                self.done.store(true, Ordering::Release);
            }
            let (due, wait): (Vec<Parked>, Vec<Parked>) = std::mem::take(&mut s.reads)
                .into_iter()
                .partition(|r| r.end <= ready);
            s.reads = wait;
            (due, s.body.clone())
        };
        for r in due {
            match (r.offset.checked_sub(start), &file) {
                (Some(from), _) => {
                    let from = (from as usize).min(piece.len());
                    (r.done)(Ok(&piece[from..(r.end - start) as usize]))
                }
                (None, Some(file)) => answer(file, r),
                (None, None) => (r.done)(Err(Errno::EIO)),
            }
        }
    }

    /// The kernel is complete (and kept, where the store keeps it): every read is answered,
    /// and every open (EIO when `body` is bytes in memory, which no open can use).
    pub fn complete(self: &Arc<Self>, body: &Body) {
        let (opens, reads) = {
            let mut s = lock(&self.state);
            s.phase = Phase::Done;
            self.done.store(true, Ordering::Release);
            s.ready = body.len();
            s.body = Some(body.clone());
            (s.take_opens(), std::mem::take(&mut s.reads))
        };
        for r in reads {
            answer(body, r);
        }
        for done in opens {
            done(match body {
                Body::File(file) => Ok(self.opened(file.clone())),
                Body::Bytes(_) => Err(Errno::EIO),
            });
        }
    }

    /// The job failed: waiting opens get `e`, reads (now and later) EIO. A file whose every
    /// byte was written stays complete: the opens still waiting for it get it.
    pub fn fail(self: &Arc<Self>, e: Errno) {
        let (opens, reads, complete) = {
            let mut s = lock(&self.state);
            let complete = match (s.phase, &s.body) {
                (Phase::Done, Some(Body::File(file))) => Some(file.clone()),
                _ => None,
            };
            if s.phase != Phase::Done {
                s.phase = Phase::Failed(e);
            }
            (s.take_opens(), std::mem::take(&mut s.reads), complete)
        };
        for done in opens {
            done(match &complete {
                Some(file) => Ok(self.opened(file.clone())),
                None => Err(e),
            });
        }
        for r in reads {
            (r.done)(Err(Errno::EIO));
        }
    }

    /// Reads `size` bytes at `offset` of this job's kernel, `len` bytes long: now when they
    /// are final, else when the job has written them.
    pub fn read(&self, len: u64, offset: u64, size: u32, done: ReadDone) {
        let end = offset.saturating_add(u64::from(size)).min(len);
        let parked = Parked { offset, end, done };
        let body = {
            let mut s = lock(&self.state);
            match (s.phase, &s.body) {
                (Phase::Failed(_), _) => None,
                (_, _) if end <= offset => {
                    drop(s);
                    return (parked.done)(Ok(&[]));
                }
                (Phase::Done, Some(body)) => Some(body.clone()),
                (_, Some(body)) if s.ready >= end => Some(body.clone()),
                _ => return s.reads.push(parked),
            }
        };
        match body {
            Some(body) => answer(&body, parked),
            None => (parked.done)(Err(Errno::EIO)),
        }
    }
}

/// Answers a read from the job's result (whose range is final).
fn answer(body: &Body, r: Parked) {
    body.with_range(r.offset, r.end, r.done);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::store::{KernelId, KernelSpec, Placement, Store};
    use std::sync::mpsc::{Receiver, channel};

    type Got = Result<Vec<u8>, Errno>;

    fn spec(len: u64) -> KernelSpec {
        KernelSpec {
            id: KernelId {
                archive: 0,
                ordinal: 1,
            },
            len,
            cache_key: [0; 32],
            digest: None,
        }
    }

    /// A read whose answer lands in the returned channel.
    fn read(fill: &Fill, file: &Arc<BackingFile>, offset: u64, size: u32) -> Receiver<Got> {
        let (tx, rx) = channel();
        fill.read(
            file.len(),
            offset,
            size,
            Box::new(move |r| tx.send(r.map(<[u8]>::to_vec)).unwrap()),
        );
        rx
    }

    /// An open whose answer (the file complete?) lands in the returned channel.
    fn open(fill: &Arc<Fill>) -> Receiver<Result<bool, Errno>> {
        open_as(fill, false)
    }

    /// The same for an open of the whole file with `whole`.
    fn open_as(fill: &Arc<Fill>, whole: bool) -> Receiver<Result<bool, Errno>> {
        let (tx, rx) = channel();
        fill.join(
            whole,
            Box::new(move |r| tx.send(r.map(|o| o.is_complete())).unwrap()),
        );
        rx
    }

    #[test]
    fn reads_wait_for_their_bytes_and_opens_for_the_stream() {
        let store = Store::new(&Placement::Memory, 1 << 20, 16).unwrap();
        let data: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        let fill = Arc::new(Fill::for_kernel(data.len() as u64));
        let early = open(&fill);
        assert!(early.try_recv().is_err(), "no answer while preparing");
        let mut pending = store.begin(&spec(data.len() as u64)).unwrap();
        let file = pending.backing().clone();
        fill.streaming(&file);
        assert_eq!(
            early.try_recv().unwrap(),
            Ok(false),
            "answered once streaming"
        );
        let (head, tail, past) = (
            read(&fill, &file, 0, 100),
            read(&fill, &file, 9_000, 5_000),
            read(&fill, &file, 20_000, 10),
        );
        assert_eq!(
            past.try_recv().unwrap(),
            Ok(Vec::new()),
            "past the end: at once"
        );
        assert!(head.try_recv().is_err() && tail.try_recv().is_err());
        pending.write_at(0, &data[..4096]).unwrap();
        fill.progress(0, &data[..4096]);
        assert_eq!(head.try_recv().unwrap(), Ok(data[..100].to_vec()));
        assert!(tail.try_recv().is_err(), "its bytes are not final yet");
        // A read that starts before the last piece is answered from the file.
        let across = read(&fill, &file, 4000, 1000);
        pending.write_at(4096, &data[4096..8192]).unwrap();
        fill.progress(4096, &data[4096..8192]);
        assert_eq!(across.try_recv().unwrap(), Ok(data[4000..5000].to_vec()));
        pending.write_at(8192, &data[8192..]).unwrap();
        // A read of final bytes is answered at once (from the file).
        assert_eq!(
            read(&fill, &file, 10, 20).try_recv().unwrap(),
            Ok(data[10..30].to_vec())
        );
        let kept = Body::File(store.finish(&spec(data.len() as u64), pending).0);
        fill.complete(&kept);
        assert_eq!(tail.try_recv().unwrap(), Ok(data[9_000..].to_vec()));
        assert_eq!(open(&fill).try_recv().unwrap(), Ok(true));
    }

    #[test]
    fn an_open_of_the_whole_file_waits_for_it_to_complete() {
        let store = Store::new(&Placement::Memory, 1 << 20, 16).unwrap();
        let data: Vec<u8> = (0..9000u32).map(|i| (i % 7) as u8).collect();
        let fill = Arc::new(Fill::for_kernel(data.len() as u64));
        let (early, streamed) = (open_as(&fill, true), open(&fill));
        let mut pending = store.begin(&spec(data.len() as u64)).unwrap();
        let file = pending.backing().clone();
        fill.streaming(&file);
        assert_eq!(streamed.try_recv().unwrap(), Ok(false));
        let late = open_as(&fill, true);
        pending.write_at(0, &data[..4096]).unwrap();
        fill.progress(0, &data[..4096]);
        assert!(early.try_recv().is_err() && late.try_recv().is_err());
        pending.write_at(4096, &data[4096..]).unwrap();
        fill.progress(4096, &data[4096..]);
        // Every byte is final: an open now gets the complete file at once...
        assert_eq!(open_as(&fill, true).try_recv().unwrap(), Ok(true));
        // ...and the ones waiting get it when the job keeps the file.
        assert!(early.try_recv().is_err());
        let kept = Body::File(store.finish(&spec(data.len() as u64), pending).0);
        fill.complete(&kept);
        assert_eq!(early.try_recv().unwrap(), Ok(true));
        assert_eq!(late.try_recv().unwrap(), Ok(true));
        // A job that fails answers them with its error.
        let fill = Arc::new(Fill::for_kernel(100));
        let pending = store.begin(&spec(100)).unwrap();
        fill.streaming(pending.backing());
        let waiting = open_as(&fill, true);
        fill.fail(Errno::EIO);
        assert_eq!(waiting.try_recv().unwrap(), Err(Errno::EIO));
    }

    #[test]
    fn a_file_with_every_byte_published_is_complete_before_it_is_kept() {
        let store = Store::new(&Placement::Memory, 1 << 20, 16).unwrap();
        let data: Vec<u8> = (0..5000u32).map(|i| (i % 13) as u8).collect();
        let fill = Arc::new(Fill::for_kernel(data.len() as u64));
        let mut pending = store.begin(&spec(data.len() as u64)).unwrap();
        let file = pending.backing().clone();
        fill.streaming(&file);
        pending.write_at(0, &data).unwrap();
        fill.progress(0, &data[..4999]);
        assert_eq!(open(&fill).try_recv().unwrap(), Ok(false));
        fill.progress(4999, &data[4999..]);
        assert!(fill.is_done());
        assert_eq!(open(&fill).try_recv().unwrap(), Ok(true));
        // Keeping it failed (or the job broke afterwards): the bytes still read.
        fill.fail(Errno::EIO);
        assert_eq!(
            read(&fill, &file, 4990, 100).try_recv().unwrap(),
            Ok(data[4990..].to_vec())
        );
        assert_eq!(open(&fill).try_recv().unwrap(), Ok(true));
    }

    #[test]
    fn an_open_waiting_for_the_whole_file_is_answered_when_the_job_breaks_after_the_last_byte() {
        let store = Store::new(&Placement::Memory, 1 << 20, 16).unwrap();
        let data = vec![5u8; 3000];
        let fill = Arc::new(Fill::for_kernel(data.len() as u64));
        let mut pending = store.begin(&spec(data.len() as u64)).unwrap();
        fill.streaming(pending.backing());
        let waiting = open_as(&fill, true);
        pending.write_at(0, &data).unwrap();
        fill.progress(0, &data);
        assert!(waiting.try_recv().is_err(), "answered when the job ends");
        // The frame's end does not check out after its last byte: the file stays complete,
        // as for the opens that come now, and the waiting open gets it.
        fill.fail(Errno::EIO);
        assert_eq!(waiting.try_recv().unwrap(), Ok(true));
        assert_eq!(open_as(&fill, true).try_recv().unwrap(), Ok(true));
    }

    #[test]
    fn a_failure_answers_every_waiter_and_later_reads_with_eio() {
        let store = Store::new(&Placement::Memory, 1 << 20, 16).unwrap();
        let fill = Arc::new(Fill::for_kernel(8192));
        let waiting = open(&fill);
        let pending = store.begin(&spec(8192)).unwrap();
        let file = pending.backing().clone();
        fill.streaming(&file);
        let late_open = open(&fill);
        let parked = read(&fill, &file, 4096, 4096);
        fill.fail(Errno::ENOMEM);
        assert_eq!(waiting.try_recv().unwrap(), Ok(false));
        assert_eq!(late_open.try_recv().unwrap(), Ok(false));
        assert_eq!(parked.try_recv().unwrap(), Err(Errno::EIO));
        assert_eq!(
            read(&fill, &file, 0, 1).try_recv().unwrap(),
            Err(Errno::EIO)
        );
        // An open arriving after the failure gets the job's error.
        assert_eq!(open(&fill).try_recv().unwrap(), Err(Errno::ENOMEM));
        // One that waited in preparation gets it too.
        let fill = Arc::new(Fill::for_kernel(8192));
        let waiting = open(&fill);
        fill.fail(Errno::EIO);
        assert_eq!(waiting.try_recv().unwrap(), Err(Errno::EIO));
    }

    #[test]
    fn a_job_that_decodes_into_memory_answers_reads_and_opens_with_eio() {
        let fill = Arc::new(Fill::for_kernel(10));
        assert_eq!(fill.kernel_len(), 10);
        let (tx, rx) = channel();
        fill.read(
            10,
            4,
            100,
            Box::new(move |r| tx.send(r.map(<[u8]>::to_vec)).unwrap()),
        );
        let waiting = open(&fill);
        assert!(rx.try_recv().is_err(), "parked while the job prepares");
        let bytes: Arc<[u8]> = (0..10u8).collect::<Vec<_>>().into();
        fill.complete(&Body::Bytes(bytes));
        assert_eq!(rx.try_recv().unwrap(), Ok((4..10u8).collect::<Vec<_>>()));
        assert_eq!(
            waiting.try_recv().unwrap(),
            Err(Errno::EIO),
            "an open needs a file"
        );
        // A read after the end is answered from the bytes; an open gets EIO at once.
        let (tx, rx) = channel();
        fill.read(
            10,
            0,
            2,
            Box::new(move |r| tx.send(r.map(<[u8]>::to_vec)).unwrap()),
        );
        assert_eq!(rx.try_recv().unwrap(), Ok(vec![0, 1]));
        assert_eq!(open(&fill).try_recv().unwrap(), Err(Errno::EIO));
    }
}
