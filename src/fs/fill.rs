//! One kernel's decode in progress, and everyone waiting on it, without blocking anyone.
//!
//! A cold open starts (or joins) the single decode job of its kernel. The job first prepares
//! (checks the cache directory, reads and verifies the compressed frame); then it either
//! streams (decodes in steps into the backing file, publishing how many leading bytes are
//! final) or decodes whole (archives whose digest covers only the decoded bytes: nothing may
//! be served before all of them are checked). Waiters are callbacks, so no thread is held:
//! * opens are answered when the job starts streaming (the handle then reads through the
//!   daemon while the file fills) or when the file is complete, or with the job's error;
//! * a read of bytes not decoded yet is parked and answered by the job as soon as they are.
//!
//! A failed job answers every waiter with its error; reads of handles opened while it streamed
//! get EIO from then on, so nothing but verified, fully decoded ranges is ever served.

use std::sync::{Arc, Mutex};

use super::Errno;
use super::backing::BackingFile;
use crate::sync::lock;

/// How an open file reads: the file is complete (passthrough may serve it), or it is still
/// being filled by `fill` (reads go through the daemon and may wait).
#[derive(Clone)]
pub struct OpenedFile {
    pub backing: Arc<BackingFile>,
    pub fill: Option<Arc<Fill>>,
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
    file: Option<Arc<BackingFile>>,
    /// Leading bytes of `file` that are final.
    ready: u64,
    reads: Vec<Parked>,
    opens: Vec<OpenDone>,
}

/// The shared state of one kernel's decode job.
pub struct Fill {
    state: Mutex<State>,
}

impl Default for Fill {
    fn default() -> Self {
        Fill::new()
    }
}

impl Fill {
    pub fn new() -> Fill {
        Fill {
            state: Mutex::new(State {
                phase: Phase::Preparing,
                file: None,
                ready: 0,
                reads: Vec::new(),
                opens: Vec::new(),
            }),
        }
    }

    pub fn is_done(&self) -> bool {
        lock(&self.state).phase == Phase::Done
    }

    /// Adds an open: answered now when the job streams or has finished, else when it does.
    pub fn join(self: &Arc<Self>, done: OpenDone) {
        let answer = {
            let mut s = lock(&self.state);
            match (s.phase, &s.file) {
                (Phase::Failed(e), _) => Err(e),
                (Phase::Streaming | Phase::Done, Some(file)) => Ok(self.opened(file.clone())),
                _ => {
                    s.opens.push(done);
                    return;
                }
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
            s.file = Some(file.clone());
            std::mem::take(&mut s.opens)
        };
        for done in opens {
            done(Ok(self.opened(file.clone())));
        }
    }

    /// The bytes of `done` (the file's first bytes, in the job's mapping) are final: parked
    /// reads they cover are answered from them, with no copy through the file.
    pub fn progress(&self, done: &[u8]) {
        let ready = done.len() as u64;
        let due = {
            let mut s = lock(&self.state);
            s.ready = ready;
            let (due, wait): (Vec<Parked>, Vec<Parked>) = std::mem::take(&mut s.reads)
                .into_iter()
                .partition(|r| r.end <= ready);
            s.reads = wait;
            due
        };
        for r in due {
            let from = (r.offset as usize).min(done.len());
            (r.done)(Ok(&done[from..r.end as usize]));
        }
    }

    /// The file is complete and kept: every waiter is answered.
    pub fn complete(self: &Arc<Self>, file: &Arc<BackingFile>) {
        let (opens, reads) = {
            let mut s = lock(&self.state);
            s.phase = Phase::Done;
            s.ready = file.len();
            s.file = Some(file.clone());
            (std::mem::take(&mut s.opens), std::mem::take(&mut s.reads))
        };
        for done in opens {
            done(Ok(self.opened(file.clone())));
        }
        for r in reads {
            answer(file, r);
        }
    }

    /// The job failed: waiting opens get `e`, reads (now and later) EIO.
    pub fn fail(&self, e: Errno) {
        let (opens, reads) = {
            let mut s = lock(&self.state);
            s.phase = Phase::Failed(e);
            (std::mem::take(&mut s.opens), std::mem::take(&mut s.reads))
        };
        for done in opens {
            done(Err(e));
        }
        for r in reads {
            (r.done)(Err(Errno::EIO));
        }
    }

    /// Reads `size` bytes at `offset` of `file` (this fill's file): now when they are final,
    /// else when the job has written them.
    pub fn read(&self, file: &Arc<BackingFile>, offset: u64, size: u32, done: ReadDone) {
        let end = offset.saturating_add(u64::from(size)).min(file.len());
        let parked = Parked { offset, end, done };
        {
            let mut s = lock(&self.state);
            match s.phase {
                Phase::Failed(_) => {
                    drop(s);
                    return (parked.done)(Err(Errno::EIO));
                }
                Phase::Done => {}
                _ if s.ready >= end || end <= offset => {}
                _ => return s.reads.push(parked),
            }
        }
        answer(file, parked);
    }
}

/// Answers a read from the file (whose range is final).
fn answer(file: &BackingFile, r: Parked) {
    let want = r.end.saturating_sub(r.offset) as usize;
    let mut buf = vec![0u8; want];
    match file.read_at(&mut buf, r.offset) {
        Ok(n) => (r.done)(Ok(&buf[..n])),
        Err(e) => {
            log::error!("cannot read a backing file: {e}");
            (r.done)(Err(Errno::EIO))
        }
    }
}
