//! A [`ByteSource`] that injects faults at the archive's own boundary: reads of chosen byte
//! ranges fail, come back short, come back late or come back with flipped bits, and every read
//! can be observed. Clones share everything, so a test keeps one clone to switch faults while
//! the archive reads through another. The integration tests reach it as `support::faulty_source`
//! and the model test of the mount's read path (`src/fs/model_tests.rs`) includes this one file
//! (`#[path]`), each with `kpack` naming the library in the parent module (`use rocm_kpack as
//! kpack;`, `use crate as kpack;`), so that the library itself carries no fault switches.

use std::io;
use std::ops::Range;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use super::kpack::{ByteSource, Result as KpackResult};

/// What a fault does to a read that touches its range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    /// The read fails with an I/O error.
    Fail,
    /// The read stops short at the start of the range, as if the source ended there.
    Truncate,
    /// The read succeeds with every byte of the range it returns inverted.
    Flip,
    /// The read succeeds after this long.
    Delay(Duration),
}

/// One fault: `kind` for every read that touches `range`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fault {
    pub range: Range<u64>,
    pub kind: FaultKind,
}

/// Called with the offset and length of every read, before it is served.
pub type Observer = Arc<dyn Fn(u64, usize) + Send + Sync>;

/// A source that reads `inner` with the faults switched on now.
#[derive(Clone)]
pub struct FaultySource {
    inner: Arc<dyn ByteSource>,
    faults: Arc<Mutex<Vec<Fault>>>,
    observer: Option<Observer>,
}

impl std::fmt::Debug for FaultySource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultySource")
            .field("inner", &self.inner)
            .field("faults", &self.faults)
            .finish_non_exhaustive()
    }
}

impl FaultySource {
    /// `inner` with no fault yet.
    pub fn new(inner: impl ByteSource + 'static) -> FaultySource {
        FaultySource {
            inner: Arc::new(inner),
            faults: Arc::default(),
            observer: None,
        }
    }

    /// Calls `observer` with every read.
    pub fn observed(mut self, observer: Observer) -> FaultySource {
        self.observer = Some(observer);
        self
    }

    /// Switches `fault` on.
    pub fn add(&self, fault: Fault) {
        self.faults.lock().unwrap().push(fault);
    }

    /// Switches every fault off.
    pub fn clear(&self) {
        self.faults.lock().unwrap().clear();
    }

    /// Whether no fault is switched on.
    pub fn is_clear(&self) -> bool {
        self.faults.lock().unwrap().is_empty()
    }

    /// The first fault whose range the read of `len` bytes at `offset` touches.
    fn fault_for(&self, offset: u64, len: usize) -> Option<Fault> {
        let end = offset.saturating_add(len as u64);
        self.faults
            .lock()
            .unwrap()
            .iter()
            .find(|f| f.range.start < end && offset < f.range.end)
            .cloned()
    }
}

impl ByteSource for FaultySource {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        if let Some(observe) = &self.observer {
            observe(offset, buf.len());
        }
        let Some(fault) = self.fault_for(offset, buf.len()) else {
            return self.inner.read_at(buf, offset);
        };
        match fault.kind {
            FaultKind::Fail => Err(io::Error::other("injected fault")),
            FaultKind::Truncate => {
                let keep = (fault.range.start.saturating_sub(offset) as usize).min(buf.len());
                self.inner.read_at(&mut buf[..keep], offset)
            }
            FaultKind::Flip => {
                let n = self.inner.read_at(buf, offset)?;
                for (i, b) in buf[..n].iter_mut().enumerate() {
                    if fault.range.contains(&(offset + i as u64)) {
                        *b = !*b;
                    }
                }
                Ok(n)
            }
            FaultKind::Delay(d) => {
                std::thread::sleep(d);
                self.inner.read_at(buf, offset)
            }
        }
    }

    fn len(&self) -> u64 {
        self.inner.len()
    }

    fn display_name(&self) -> String {
        self.inner.display_name()
    }

    fn identity(&self) -> String {
        self.inner.identity()
    }

    fn check_unchanged(&self) -> KpackResult<()> {
        self.inner.check_unchanged()
    }

    fn will_need(&self, offset: u64, len: u64) {
        self.inner.will_need(offset, len)
    }

    fn forget(&self, offset: u64, len: u64) {
        self.inner.forget(offset, len)
    }

    fn modified(&self) -> Option<SystemTime> {
        self.inner.modified()
    }
}
