//! Bytes of one remote object already fetched, kept in an unlinked sparse file on local disk
//! (so a large blob region costs disk, not daemon memory) with the set of ranges it holds.
//!
//! Used for the small reads of an archive's open (header, and for archives without frame
//! positions the chain of frame size words): those are fetched in large ranges once and every
//! later read inside them is local.

use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::Mutex;

#[derive(Debug)]
pub struct FetchedRanges {
    file: File,
    /// start -> end of disjoint, non-adjacent ranges present in `file`.
    held: Mutex<BTreeMap<u64, u64>>,
}

impl FetchedRanges {
    /// An empty store in `dir` (an anonymous file: nothing to clean up, even after a crash).
    pub fn new(dir: &Path) -> io::Result<FetchedRanges> {
        let file = File::options()
            .read(true)
            .write(true)
            .custom_flags(libc::O_TMPFILE)
            .mode(0o600)
            .open(dir)?;
        Ok(FetchedRanges {
            file,
            held: Mutex::new(BTreeMap::new()),
        })
    }

    /// Copies `[offset, offset + buf.len())` into `buf` if it is all held.
    pub fn read(&self, buf: &mut [u8], offset: u64) -> io::Result<bool> {
        let end = offset + buf.len() as u64;
        let covered = {
            let held = self.held.lock().unwrap_or_else(|p| p.into_inner());
            held.range(..=offset)
                .next_back()
                .is_some_and(|(_, &e)| e >= end)
        };
        if !covered {
            return Ok(false);
        }
        self.file.read_exact_at(buf, offset)?;
        Ok(true)
    }

    /// The first part of `range` not held: from its first missing byte to the next held byte
    /// (or the range's end); `None` when all of it is held.
    pub fn first_missing(&self, range: std::ops::Range<u64>) -> Option<std::ops::Range<u64>> {
        let held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let mut start = range.start;
        if let Some((_, &end)) = held.range(..=start).next_back() {
            start = start.max(end);
        }
        if start >= range.end {
            return None;
        }
        let end = held
            .range(start..range.end)
            .next()
            .map_or(range.end, |(&s, _)| s);
        Some(start..end)
    }

    /// Stores `bytes` fetched from `offset`.
    pub fn insert(&self, bytes: &[u8], offset: u64) -> io::Result<()> {
        if bytes.is_empty() {
            return Ok(());
        }
        self.file.write_all_at(bytes, offset)?;
        let (mut start, mut end) = (offset, offset + bytes.len() as u64);
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        // Merge with every range that overlaps or touches [start, end).
        let touching: Vec<(u64, u64)> = held
            .range(..=end)
            .rev()
            .take_while(|(_, e)| **e >= start)
            .map(|(s, e)| (*s, *e))
            .collect();
        for (s, e) in touching {
            held.remove(&s);
            start = start.min(s);
            end = end.max(e);
        }
        held.insert(start, end);
        Ok(())
    }

    /// Stops holding `[offset, offset + len)` (bytes that failed a check): later reads there
    /// fetch again. The rest of each range is kept.
    pub fn forget(&self, offset: u64, len: u64) {
        let end = offset.saturating_add(len);
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let overlapping: Vec<(u64, u64)> = held
            .range(..end)
            .rev()
            .take_while(|(_, e)| **e > offset)
            .map(|(s, e)| (*s, *e))
            .collect();
        for (s, e) in overlapping {
            held.remove(&s);
            if s < offset {
                held.insert(s, offset);
            }
            if e > end {
                held.insert(end, e);
            }
        }
    }

    /// Bytes held.
    #[cfg(test)]
    pub fn held_bytes(&self) -> u64 {
        let held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        held.iter().map(|(s, e)| e - s).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_missing_skips_what_is_held() {
        let r = FetchedRanges::new(&std::env::temp_dir()).unwrap();
        r.insert(&[1; 10], 10).unwrap();
        r.insert(&[2; 10], 30).unwrap();
        assert_eq!(r.first_missing(0..50), Some(0..10));
        assert_eq!(r.first_missing(10..50), Some(20..30));
        assert_eq!(r.first_missing(12..25), Some(20..25));
        assert_eq!(r.first_missing(30..40), None);
        assert_eq!(r.first_missing(35..45), Some(40..45));
    }

    #[test]
    fn ranges_merge_and_serve_only_what_is_held() {
        let dir = std::env::temp_dir();
        let r = FetchedRanges::new(&dir).unwrap();
        let mut b = [0u8; 4];
        assert!(!r.read(&mut b, 0).unwrap());
        r.insert(b"abcd", 10).unwrap();
        r.insert(b"ijkl", 18).unwrap();
        assert!(r.read(&mut b, 10).unwrap());
        assert_eq!(&b, b"abcd");
        assert!(!r.read(&mut b, 12).unwrap(), "straddles a hole");
        r.insert(b"efgh", 14).unwrap(); // touches both neighbours: one range 10..22
        assert_eq!(r.held_bytes(), 12);
        let mut all = [0u8; 12];
        assert!(r.read(&mut all, 10).unwrap());
        assert_eq!(&all, b"abcdefghijkl");
        r.insert(b"XY", 9).unwrap(); // overlapping start
        assert_eq!(r.held_bytes(), 13);
        let mut two = [0u8; 3];
        assert!(r.read(&mut two, 9).unwrap());
        assert_eq!(&two, b"XYb");
        assert!(!r.read(&mut two, 21).unwrap());
        // Forgetting the middle keeps both ends; reads across the hole fetch again.
        r.forget(12, 4);
        assert_eq!(r.held_bytes(), 9);
        assert!(r.read(&mut two, 9).unwrap());
        assert!(!r.read(&mut two, 11).unwrap());
        assert!(!r.read(&mut two, 14).unwrap());
        let mut tail = [0u8; 6];
        assert!(r.read(&mut tail, 16).unwrap());
        assert_eq!(&tail, b"ghijkl");
        r.forget(0, 100);
        assert_eq!(r.held_bytes(), 0);
    }
}
