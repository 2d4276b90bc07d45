//! One remote object as a [`ByteSource`], so `Archive` parses and checks it exactly as a local
//! file.
//!
//! Reads of [`DIRECT_MIN`] bytes or more (the TOC, a kernel's frame or blob) are one ranged GET
//! of exactly those bytes: with frame positions in the TOC a kernel costs one request. Smaller
//! reads (the header, and for archives without frame positions the 4-byte size words that open
//! walks) fetch a larger window into [`FetchedRanges`]; the window doubles while such reads move
//! forward, so the blob region of an archive without frame positions comes in a few large
//! ranges instead of one request per frame.
//!
//! On a slow link a request may not finish within the timeout: one that times out is asked for
//! again in eighths, and every later request of the object is at most that size (down to
//! [`PIECE_MIN`]), so a link of any speed gets the bytes through rather than timing out on the
//! same request again and again.
//!
//! Every request after the first asks for the version seen at open (`If-Match`, and the answer's
//! version is compared): an object replaced while mounted fails the read (EIO in the mount) with
//! one log line, and no byte of the new object is ever returned.

use std::io;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use rocm_kpack::archive::byte_source::ByteSource;
use rocm_kpack::error::{Error, Result};

use super::client::{FetchError, Fetched, Version};
use super::ranges::FetchedRanges;

/// Reads at least this long go to the server as they are.
pub const DIRECT_MIN: usize = 64 << 10;
/// First window fetched for a small read.
const WINDOW_MIN: u64 = 64 << 10;
/// Largest window.
const WINDOW_MAX: u64 = 16 << 20;
/// The smallest request a timeout shrinks requests to; one of this size that times out is
/// retried, then fails.
pub const PIECE_MIN: u64 = 64 << 10;
/// How much smaller a request that timed out is asked for again: a few steps take any window
/// down to [`PIECE_MIN`], so a server that answers nothing at all fails a read after a few
/// timeouts more than the retries, not after one per halving.
const SHRINK: u64 = 8;

#[derive(Debug)]
struct Readahead {
    /// Where the last small read that missed started.
    last_miss: u64,
    window: u64,
}

/// Where one object's bytes come from, by range: a path in an object store
/// ([`super::client::StoreObject`]) or a blob in a container registry.
pub trait Ranges: Send + Sync + std::fmt::Debug {
    /// Fetches `range` (clipped by the server to the object); with `expect`, an answer from
    /// another version of the object is [`FetchError::Changed`]. With `shrinkable`, a timeout
    /// is reported at once as [`FetchError::TimedOut`] so the caller can ask for less.
    fn get(
        &self,
        what: &str,
        range: std::ops::Range<u64>,
        expect: Option<&Version>,
        shrinkable: bool,
    ) -> std::result::Result<Fetched, FetchError>;

    /// What names these bytes in `--cache-dir` keys when the URL and version do not (a
    /// content-addressed blob is the same bytes wherever it is read from).
    fn identity(&self) -> Option<String> {
        None
    }

    /// Whether each request costs enough (a registry spends milliseconds on every blob GET,
    /// whatever its size) that large reads moving forward through the object are fetched in
    /// growing windows ([`Streams`]) rather than one request each.
    fn costly_requests(&self) -> bool {
        false
    }
}

/// How many runs of forward reads [`Streams`] follows at once (readers, and decodes ahead).
const STREAMS: usize = 4;

/// Runs of large reads that move forward through an object, each with the end of what it last
/// fetched and the size of that fetch. A read that reaches a run's end continues the run: what
/// follows the end is fetched in a window twice the last one (up to [`WINDOW_MAX`]), and the
/// read's earlier bytes come from the kept copy. Any other read starts a new run, replacing the
/// oldest, and is fetched as it is. A single kernel's read thus costs exactly its bytes, while a
/// whole pass over an archive takes the blob in a few large requests, none of them twice.
#[derive(Debug, Default)]
struct Streams {
    /// (where the run's last fetch ended, its size), most recent last.
    runs: Vec<(u64, u64)>,
}

impl Streams {
    /// The range to fetch for a read of `len` bytes at `offset`: it starts at `offset`, or
    /// for a read that continues a run, at the run's end (at or before `offset + len`).
    fn fetch_for(&mut self, offset: u64, len: u64) -> std::ops::Range<u64> {
        let end = offset + len;
        let fetch = match self
            .runs
            .iter()
            .position(|&(run_end, _)| offset <= run_end && run_end < end)
        {
            Some(i) => {
                let (run_end, last) = self.runs.remove(i);
                let window = (last * 2).clamp(WINDOW_MIN, WINDOW_MAX);
                run_end..end.max(run_end + window)
            }
            None => {
                if self.runs.len() == STREAMS {
                    self.runs.remove(0);
                }
                offset..end
            }
        };
        self.runs
            .push((fetch.end, (fetch.end - fetch.start).min(WINDOW_MAX)));
        fetch
    }
}

#[derive(Debug)]
pub struct RemoteObject {
    ranges: Arc<dyn Ranges>,
    url: String,
    version: Version,
    changed: AtomicBool,
    fetched: FetchedRanges,
    readahead: Mutex<Readahead>,
    /// The largest request: unbounded until one times out.
    piece_max: AtomicU64,
    /// Runs of large forward reads, for sources whose requests are costly.
    streams: Mutex<Streams>,
    /// Every byte was fetched and checked at open ([`RemoteObject::fetch_whole`]): reads are
    /// served from the kept copy only, and nothing is forgotten (a refetch would be unchecked).
    whole: AtomicBool,
}

impl RemoteObject {
    /// Opens the object: one GET of its first window, which also tells its length and version.
    pub fn open(
        ranges: Arc<dyn Ranges>,
        url: String,
        spill_dir: &std::path::Path,
    ) -> std::result::Result<RemoteObject, FetchError> {
        let fetched = FetchedRanges::new(spill_dir).map_err(|e| {
            FetchError::Config(format!(
                "{}: cannot create a spill file for fetched ranges: {e}",
                spill_dir.display()
            ))
        })?;
        let first = ranges.get(&url, 0..WINDOW_MIN, None, false)?;
        fetched
            .insert(&first.bytes, 0)
            .map_err(|e| FetchError::Config(format!("{url}: cannot keep fetched bytes: {e}")))?;
        let mut version = first.version;
        version.size = first.size;
        Ok(RemoteObject {
            ranges,
            url,
            version,
            changed: AtomicBool::new(false),
            fetched,
            readahead: Mutex::new(Readahead {
                last_miss: 0,
                window: WINDOW_MIN,
            }),
            piece_max: AtomicU64::new(u64::MAX),
            whole: AtomicBool::new(false),
            streams: Mutex::new(Streams::default()),
        })
    }

    /// Fetches every byte of the object into the kept copy, in requests of at most
    /// [`WINDOW_MAX`], handing each piece to `feed` in order. For objects checked as a whole (a
    /// registry blob against its digest) before any of them is used: once the caller has
    /// checked them, [`keep_whole`](Self::keep_whole) makes every later read come from the copy.
    pub fn fetch_whole(&self, feed: &mut dyn FnMut(&[u8])) -> io::Result<()> {
        let size = self.version.size;
        let mut at = 0;
        while at < size {
            let len = WINDOW_MAX.min(size - at);
            let mut held = vec![0u8; len as usize];
            let piece = if self.fetched.read(&mut held, at)? {
                held
            } else {
                let bytes = self.fetch(at, len)?;
                self.fetched.insert(&bytes, at)?;
                bytes
            };
            if piece.is_empty() {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("{}: ended after {at} of {size} bytes", self.url),
                ));
            }
            feed(&piece);
            at += piece.len() as u64;
        }
        Ok(())
    }

    /// The bytes fetched by [`fetch_whole`](Self::fetch_whole) passed the caller's check: reads
    /// are served from the kept copy only, and nothing is forgotten (a refetch would be
    /// unchecked).
    pub fn keep_whole(&self) {
        self.whole.store(true, Ordering::SeqCst);
    }

    /// Fetches `[offset, offset + len)` (clipped to the object) in requests of at most
    /// `piece_max` bytes, halving it for good when one times out.
    fn fetch(&self, offset: u64, len: u64) -> io::Result<Vec<u8>> {
        let end = (offset + len).min(self.version.size);
        let mut out = Vec::with_capacity((end - offset) as usize);
        let mut at = offset;
        while at < end {
            let piece = self.piece_max.load(Ordering::Relaxed).min(end - at);
            match self.fetch_piece(at, piece) {
                Ok(bytes) if bytes.is_empty() => break,
                Ok(bytes) => {
                    at += bytes.len() as u64;
                    out.extend_from_slice(&bytes);
                }
                Err(FetchError::TimedOut(m)) if piece > PIECE_MIN => {
                    let smaller = (piece / SHRINK).max(PIECE_MIN);
                    self.piece_max.fetch_min(smaller, Ordering::Relaxed);
                    log::warn!("{m}; asking for at most {smaller} bytes at a time from now on");
                }
                Err(e) => return Err(self.failed(e)),
            }
        }
        Ok(out)
    }

    fn fetch_piece(&self, offset: u64, len: u64) -> std::result::Result<Vec<u8>, FetchError> {
        let end = offset + len;
        let what = format!("{} bytes {offset}..{end}", self.url);
        self.ranges
            .get(&what, offset..end, Some(&self.version), len > PIECE_MIN)
            .map(|f| f.bytes)
    }

    /// The error a failed fetch gives a reader, logged once here: a timeout keeps its kind.
    fn failed(&self, e: FetchError) -> io::Error {
        match e {
            FetchError::Changed(m) => {
                if !self.changed.swap(true, Ordering::SeqCst) {
                    log::error!("{m}; its reads fail with EIO from now on (remount to see it)");
                }
                io::Error::other(m)
            }
            FetchError::TimedOut(m) => {
                log::error!("{m}");
                io::Error::new(io::ErrorKind::TimedOut, m)
            }
            e => {
                log::error!("{e}");
                io::Error::other(e.to_string())
            }
        }
    }

    fn changed_error(&self) -> io::Error {
        io::Error::other(format!(
            "{}: the object changed since it was opened",
            self.url
        ))
    }
}

impl ByteSource for RemoteObject {
    fn modified(&self) -> Option<std::time::SystemTime> {
        Some(self.version.modified)
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        if self.changed.load(Ordering::SeqCst) {
            return Err(self.changed_error());
        }
        let size = self.version.size;
        if offset >= size || buf.is_empty() {
            return Ok(0);
        }
        let n = buf.len().min((size - offset) as usize);
        let buf = &mut buf[..n];
        if self.fetched.read(buf, offset)? {
            return Ok(n);
        }
        if self.whole.load(Ordering::SeqCst) {
            return Err(io::Error::other(format!(
                "{}: bytes {offset}..{} are missing from the checked copy",
                self.url,
                offset + n as u64
            )));
        }
        if n >= DIRECT_MIN {
            let end = offset + n as u64;
            let fetch = if self.ranges.costly_requests() {
                let mut streams = self.streams.lock().unwrap_or_else(|p| p.into_inner());
                streams.fetch_for(offset, n as u64)
            } else {
                offset..end
            };
            if fetch != (offset..end) {
                // Kept for this read and the ones that follow (another run may have fetched
                // part of it already: that part is not asked for again); frames are checked
                // against their digests when read, and forgotten when they fail.
                if let Some(gap) = self.fetched.first_missing(fetch) {
                    let bytes = self.fetch(gap.start, gap.end - gap.start)?;
                    self.fetched.insert(&bytes, gap.start)?;
                }
                if self.fetched.read(buf, offset)? {
                    return Ok(n);
                }
            }
            let bytes = self.fetch(offset, n as u64)?;
            let got = bytes.len().min(n);
            buf[..got].copy_from_slice(&bytes[..got]);
            return Ok(got);
        }
        let window = {
            let mut ra = self.readahead.lock().unwrap_or_else(|p| p.into_inner());
            ra.window = if offset > ra.last_miss {
                (ra.window * 2).min(WINDOW_MAX)
            } else {
                WINDOW_MIN
            };
            ra.last_miss = offset;
            ra.window.min(self.piece_max.load(Ordering::Relaxed))
        };
        let bytes = self.fetch(offset, window.max(n as u64))?;
        self.fetched.insert(&bytes, offset)?;
        let got = bytes.len().min(n);
        buf[..got].copy_from_slice(&bytes[..got]);
        Ok(got)
    }

    fn len(&self) -> u64 {
        self.version.size
    }

    fn forget(&self, offset: u64, len: u64) {
        if !self.whole.load(Ordering::SeqCst) {
            self.fetched.forget(offset, len);
        }
    }

    fn display_name(&self) -> String {
        self.url.clone()
    }

    fn identity(&self) -> String {
        self.ranges
            .identity()
            .unwrap_or_else(|| format!("{} {}", self.url, self.version.token()))
    }

    fn check_unchanged(&self) -> Result<()> {
        if self.changed.load(Ordering::SeqCst) {
            return Err(Error::io(
                std::path::Path::new(&self.url),
                "archive changed while open",
                self.changed_error(),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_of_forward_reads_fetches_growing_windows_from_its_end() {
        let mut s = Streams::default();
        let k: u64 = 256 << 10;
        let base: u64 = 10 << 20;
        // A lone read: exactly its bytes.
        assert_eq!(s.fetch_for(base, k), base..base + k);
        // The next frame, right after: from the run's end, twice the last fetch.
        assert_eq!(s.fetch_for(base + k, k), base + k..base + 3 * k);
        // A frame inside the window is not asked for (the copy serves it); the one that
        // crosses the window's end continues the run from that end.
        assert_eq!(
            s.fetch_for(base + 3 * k - 100, k),
            base + 3 * k..base + 7 * k
        );
        // Reads elsewhere start their own runs and leave this one alone.
        assert_eq!(s.fetch_for(0, k), 0..k);
        assert_eq!(s.fetch_for(base + 7 * k, k), base + 7 * k..base + 15 * k);
        // The window stops at WINDOW_MAX; a read larger than the window is fetched whole.
        let mut at = base + 15 * k;
        for _ in 0..10 {
            at = s.fetch_for(at, k).end;
        }
        assert_eq!(s.fetch_for(at, k), at..at + WINDOW_MAX);
        assert_eq!(
            s.fetch_for(1 << 40, 3 * WINDOW_MAX),
            (1 << 40)..(1 << 40) + 3 * WINDOW_MAX
        );
    }

    #[test]
    fn at_most_a_few_runs_are_followed() {
        let mut s = Streams::default();
        let m: u64 = 1 << 20;
        for i in 0..(STREAMS as u64 + 1) {
            s.fetch_for(i << 30, m);
        }
        // The first run was dropped: its next read starts afresh.
        assert_eq!(s.fetch_for(m, m), m..2 * m);
        assert_eq!(
            s.fetch_for((4 << 30) + m, m),
            (4 << 30) + m..(4 << 30) + 3 * m
        );
    }
}
