//! The TOC's binaries and arch entries, held compactly: a TOC may list a million kernels, and
//! an open archive (and so every mount) keeps them for its whole life.
//!
//! Every key lives once in one byte arena, in key order; every arch name once in a small
//! interned list. A binary is where its key starts in the arena and where its entries start
//! (both end where the next binary's start; the second is left out when every binary has one
//! entry, the usual layout), an entry a fixed 36-byte record. No entry owns a heap allocation.
//! Digests are not held here: an entry records where its `blake3` and `frame_blake3` values lie
//! in the TOC, and the archive reads or keeps them (see `Archive`).

use std::collections::{HashMap, HashSet};

use super::{FramePos, TocError};

/// Entry flag: the entry had an `original_size` field.
const HAS_ORIGINAL_SIZE: u32 = 1 << 31;
/// Entry flag: the entry has a well-formed `metadata.frame`.
const HAS_FRAME: u32 = 1 << 30;
const FLAGS: u32 = HAS_ORIGINAL_SIZE | HAS_FRAME;
/// Distinct arch names a TOC may use (the flags share their word).
const MAX_ARCHES: usize = (1 << 30) - 1;

/// One arch entry: 36 bytes, 4-byte aligned so that the 64-bit fields add no padding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C, packed(4))]
pub(crate) struct EntryRec {
    original_size: u64,
    frame_offset: u64,
    ordinal: u32,
    frame_size: u32,
    /// Index into the interned arch names, with the flags above in the top bits.
    arch: u32,
    /// TOC-relative offset of the 32 digest bytes; 0 when absent (byte 0 is the root map).
    blake3_at: u32,
    frame_blake3_at: u32,
}

/// Binaries sorted by key (byte order), each key once, each with at least one entry.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Kernels {
    keys: Vec<u8>,
    /// Where each binary's key starts in `keys`.
    key_starts: Vec<u32>,
    /// Where each binary's entries start in `entries`; empty when each binary has exactly one
    /// (binary `i`'s entry is then entry `i`).
    firsts: Vec<u32>,
    entries: Vec<EntryRec>,
    arches: Vec<Box<str>>,
    /// The digest values by TOC position, when few enough were kept while parsing.
    digests: Option<Vec<(u32, [u8; 32])>>,
}

/// One binary key with its arch entries, in file order.
#[derive(Debug, Clone, Copy)]
pub struct TocBinary<'a> {
    pub key: &'a str,
    kernels: &'a Kernels,
    entries: &'a [EntryRec],
}

/// One `toc[key][arch]` entry, as read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TocEntry<'a> {
    pub arch: &'a str,
    pub ordinal: u32,
    /// For a `none` entry written without `original_size` (which the reference accepts), the
    /// size of its blob (0 when it has none).
    pub original_size: u64,
    /// Whether the entry had an `original_size` field.
    pub has_original_size: bool,
    /// `metadata.frame`: where the frame's size word lies and the size it holds.
    pub frame: Option<FramePos>,
    /// Where the 32 bytes of `metadata.blake3` lie, from the TOC's first byte.
    pub blake3_at: Option<u32>,
    /// Where the 32 bytes of `metadata.frame_blake3` lie, from the TOC's first byte.
    pub frame_blake3_at: Option<u32>,
}

impl<'a> TocBinary<'a> {
    /// Number of arch entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The `i`th arch entry.
    pub fn arch(&self, i: usize) -> Option<TocEntry<'a>> {
        Some(self.kernels.view(self.entries.get(i)?))
    }

    /// The arch entries in file order.
    pub fn arches(self) -> impl ExactSizeIterator<Item = TocEntry<'a>> + 'a {
        let kernels = self.kernels;
        self.entries.iter().map(move |rec| kernels.view(rec))
    }

    /// The index of the entry for `arch`, when there is one.
    pub fn position(&self, arch: &str) -> Option<usize> {
        self.entries
            .iter()
            .position(|rec| &*self.kernels.arches[(rec.arch & !FLAGS) as usize] == arch)
    }
}

impl Kernels {
    /// Number of binaries.
    pub fn len(&self) -> usize {
        self.key_starts.len()
    }

    pub fn is_empty(&self) -> bool {
        self.key_starts.is_empty()
    }

    /// The key of binary `i`; panics when out of range.
    pub fn key(&self, i: usize) -> &str {
        let start = self.key_starts[i] as usize;
        let end = self
            .key_starts
            .get(i + 1)
            .map_or(self.keys.len(), |&k| k as usize);
        // Only keys that are valid UTF-8 are stored; an empty result cannot occur.
        std::str::from_utf8(&self.keys[start..end]).unwrap_or_default()
    }

    /// The binary at index `i` (in key order).
    pub fn binary(&self, i: usize) -> Option<TocBinary<'_>> {
        if i >= self.len() {
            return None;
        }
        let (first, end) = if self.firsts.is_empty() {
            (i, i + 1)
        } else {
            let end = self
                .firsts
                .get(i + 1)
                .map_or(self.entries.len(), |&f| f as usize);
            (self.firsts[i] as usize, end)
        };
        Some(TocBinary {
            key: self.key(i),
            kernels: self,
            entries: &self.entries[first..end],
        })
    }

    /// Every binary, in key order.
    pub fn binaries(&self) -> impl ExactSizeIterator<Item = TocBinary<'_>> + '_ {
        (0..self.len()).map(|i| self.binary(i).expect("in range"))
    }

    /// The index of the binary with this key.
    pub fn find(&self, key: &str) -> Option<usize> {
        let mut lo = 0;
        let mut hi = self.len();
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            match self.key(mid).as_bytes().cmp(key.as_bytes()) {
                std::cmp::Ordering::Less => lo = mid + 1,
                std::cmp::Ordering::Greater => hi = mid,
                std::cmp::Ordering::Equal => return Some(mid),
            }
        }
        None
    }

    fn view(&self, rec: &EntryRec) -> TocEntry<'_> {
        let rec = *rec;
        let at = |pos: u32| (pos != 0).then_some(pos);
        TocEntry {
            arch: &self.arches[(rec.arch & !FLAGS) as usize],
            ordinal: rec.ordinal,
            original_size: rec.original_size,
            has_original_size: rec.arch & HAS_ORIGINAL_SIZE != 0,
            frame: (rec.arch & HAS_FRAME != 0).then_some(FramePos {
                offset: rec.frame_offset,
                size: rec.frame_size,
            }),
            blake3_at: at(rec.blake3_at),
            frame_blake3_at: at(rec.frame_blake3_at),
        }
    }

    /// The digest values kept while parsing (every entry's, sorted by TOC position), or `None`
    /// when there were more than the parse was asked to keep; leaves `None` behind.
    pub(crate) fn take_digests(&mut self) -> Option<Vec<(u32, [u8; 32])>> {
        self.digests.take()
    }

    /// Gives entries read without `original_size` a size (a `none` archive's blob sizes).
    pub(crate) fn fill_missing_sizes(&mut self, size_of: impl Fn(u32) -> u64) {
        for rec in &mut self.entries {
            if rec.arch & HAS_ORIGINAL_SIZE == 0 {
                rec.original_size = size_of(rec.ordinal);
            }
        }
    }
}

/// What the parser knows about one entry once it has read it whole.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct NewEntry {
    pub ordinal: u32,
    pub original_size: Option<u64>,
    pub frame: Option<FramePos>,
    /// Where the 32 bytes of `blake3` lie in the TOC, and what they are.
    pub blake3: Option<(usize, [u8; 32])>,
    pub frame_blake3: Option<(usize, [u8; 32])>,
}

/// A binary while parsing: its key in the arena and its entries.
#[derive(Debug, Clone, Copy)]
struct OpenBin {
    key: u32,
    key_len: u32,
    first: u32,
    count: u32,
}

/// A point of a [`KernelsBuilder`]'s progress.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Mark {
    keys: usize,
    bins: usize,
    entries: usize,
    digests: usize,
}

/// Up to this many arches under one key, a repeated arch is found by a linear search; past it, a
/// set takes over. A linear search alone made a key with many arches quadratic (found by
/// tests/it/alloc_bounds.rs: 40,000 arches under one key took 29 s to open in a debug build).
const LINEAR_ARCHES: usize = 16;

/// Collects binaries and entries in file order, then sorts and packs them.
#[derive(Debug, Default)]
pub(crate) struct KernelsBuilder {
    keys: Vec<u8>,
    bins: Vec<OpenBin>,
    entries: Vec<EntryRec>,
    arches: Vec<Box<str>>,
    arch_ids: HashMap<Box<str>, u32>,
    /// The open binary's arches, once it has more than [`LINEAR_ARCHES`].
    arch_set: Option<HashSet<u32>>,
    /// Digest values seen so far with their TOC positions, while there are at most
    /// `keep_digests`; `None` once there are more.
    digests: Option<Vec<(u32, [u8; 32])>>,
    keep_digests: usize,
}

fn too_big(what: &str) -> TocError {
    TocError {
        offset: 0,
        reason: format!("the TOC's {what} exceed 4 GiB"),
    }
}

impl KernelsBuilder {
    /// Room for `binaries` binaries of one entry each (the usual layout); the caller bounds it
    /// by the bytes present.
    /// Up to `keep_digests` digest values are kept (see [`Kernels::take_digests`]).
    pub fn with_capacity(binaries: usize, keep_digests: usize) -> Self {
        KernelsBuilder {
            bins: Vec::with_capacity(binaries),
            entries: Vec::with_capacity(binaries),
            keys: Vec::with_capacity(binaries.saturating_mul(24)),
            digests: Some(Vec::new()),
            keep_digests,
            ..Default::default()
        }
    }

    /// Where the builder stands, to [`rewind`](Self::rewind) to.
    pub fn mark(&self) -> Mark {
        Mark {
            keys: self.keys.len(),
            bins: self.bins.len(),
            entries: self.entries.len(),
            digests: self.digests.as_ref().map_or(0, Vec::len),
        }
    }

    /// Drops every binary and entry added since `mark` (arch names stay interned).
    pub(crate) fn rewind(&mut self, mark: Mark) {
        self.keys.truncate(mark.keys);
        self.bins.truncate(mark.bins);
        self.entries.truncate(mark.entries);
        if let Some(d) = &mut self.digests {
            d.truncate(mark.digests);
        }
        self.arch_set = None;
    }

    /// Starts the binary `key`; its entries follow.
    pub(crate) fn open_binary(&mut self, key: &str) -> Result<(), TocError> {
        let at = u32::try_from(self.keys.len()).map_err(|_| too_big("keys"))?;
        let key_len = u32::try_from(key.len()).map_err(|_| too_big("keys"))?;
        self.keys.extend_from_slice(key.as_bytes());
        let first = u32::try_from(self.entries.len()).map_err(|_| too_big("entries"))?;
        self.bins.push(OpenBin {
            key: at,
            key_len,
            first,
            count: 0,
        });
        self.arch_set = None;
        Ok(())
    }

    fn arch_id(&mut self, arch: &str) -> Result<u32, TocError> {
        if let Some(&id) = self.arch_ids.get(arch) {
            return Ok(id);
        }
        if self.arches.len() >= MAX_ARCHES {
            return Err(TocError {
                offset: 0,
                reason: format!("more than {MAX_ARCHES} distinct arch names"),
            });
        }
        let id = self.arches.len() as u32;
        self.arches.push(arch.into());
        self.arch_ids.insert(arch.into(), id);
        Ok(id)
    }

    /// Adds an entry to the open binary; a repeated arch is ignored (the first one counts).
    pub(crate) fn add_entry(&mut self, arch: &str, e: NewEntry) -> Result<(), TocError> {
        let id = self.arch_id(arch)?;
        let bin = *self.bins.last().expect("an open binary");
        let mine = &self.entries[bin.first as usize..];
        let repeated = match &self.arch_set {
            Some(set) => set.contains(&id),
            None => mine.iter().any(|r| r.arch & !FLAGS == id),
        };
        if repeated {
            return Ok(());
        }
        if let Some(set) = &mut self.arch_set {
            set.insert(id);
        } else if mine.len() >= LINEAR_ARCHES {
            let mut set: HashSet<u32> = mine.iter().map(|r| r.arch & !FLAGS).collect();
            set.insert(id);
            self.arch_set = Some(set);
        }
        let pos = |at: Option<usize>| -> Result<u32, TocError> {
            at.map_or(Ok(0), |p| u32::try_from(p).map_err(|_| too_big("digests")))
        };
        let mut flags = 0;
        if e.original_size.is_some() {
            flags |= HAS_ORIGINAL_SIZE;
        }
        if e.frame.is_some() {
            flags |= HAS_FRAME;
        }
        let frame = e.frame.unwrap_or(FramePos { offset: 0, size: 0 });
        self.entries.push(EntryRec {
            original_size: e.original_size.unwrap_or(0),
            frame_offset: frame.offset,
            ordinal: e.ordinal,
            frame_size: frame.size,
            arch: id | flags,
            blake3_at: pos(e.blake3.map(|(at, _)| at))?,
            frame_blake3_at: pos(e.frame_blake3.map(|(at, _)| at))?,
        });
        u32::try_from(self.entries.len()).map_err(|_| too_big("entries"))?;
        for (at, digest) in [e.blake3, e.frame_blake3].into_iter().flatten() {
            let Some(kept) = &mut self.digests else { break };
            if kept.len() >= self.keep_digests {
                // Too many to keep: the archive reads them from the file instead.
                self.digests = None;
                break;
            }
            kept.push((at as u32, digest));
        }
        self.bins.last_mut().expect("an open binary").count += 1;
        Ok(())
    }

    /// Sorts the binaries by key (a key written twice keeps its first occurrence), drops those
    /// without entries, and packs the result.
    pub fn finish(self) -> Kernels {
        let KernelsBuilder {
            keys,
            mut bins,
            entries,
            arches,
            mut digests,
            ..
        } = self;
        if let Some(d) = &mut digests {
            // In file order already, unless a parse was rewound and redone (positions are
            // unique: each is a distinct place in the TOC).
            if !d.is_sorted_by_key(|&(at, _)| at) {
                d.sort_unstable_by_key(|&(at, _)| at);
            }
            d.shrink_to_fit();
        }
        let key = |b: &OpenBin| &keys[b.key as usize..][..b.key_len as usize];
        // Writers usually emit sorted keys, so check before paying for a sort.
        if !bins.is_sorted_by(|a, b| key(a) < key(b)) {
            bins.sort_by(|a, b| key(a).cmp(key(b)));
            bins.dedup_by(|later, earlier| key(later) == key(earlier));
        }
        // Only after the first occurrence has won: `{"k": {}, "k": {...}}` has no kernels for k.
        bins.retain(|b| b.count > 0);
        // In file order with nothing dropped, the arena and entries are already packed.
        let (mut next_key, mut next_entry) = (0u64, 0u64);
        let packed = bins.iter().all(|b| {
            let ok = u64::from(b.key) == next_key && u64::from(b.first) == next_entry;
            next_key = u64::from(b.key) + u64::from(b.key_len);
            next_entry = u64::from(b.first) + u64::from(b.count);
            ok
        }) && next_key == keys.len() as u64
            && next_entry == entries.len() as u64;
        let (mut keys, mut entries, key_starts, firsts) = if packed {
            let key_starts = bins.iter().map(|b| b.key).collect();
            let firsts: Vec<u32> = bins.iter().map(|b| b.first).collect();
            (keys, entries, key_starts, firsts)
        } else {
            let mut new_keys = Vec::with_capacity(bins.iter().map(|b| b.key_len as usize).sum());
            let mut new_entries = Vec::with_capacity(bins.iter().map(|b| b.count as usize).sum());
            let mut key_starts = Vec::with_capacity(bins.len());
            let mut firsts = Vec::with_capacity(bins.len());
            for b in &bins {
                key_starts.push(new_keys.len() as u32);
                firsts.push(new_entries.len() as u32);
                new_keys.extend_from_slice(key(b));
                new_entries.extend_from_slice(&entries[b.first as usize..][..b.count as usize]);
            }
            (new_keys, new_entries, key_starts, firsts)
        };
        keys.shrink_to_fit();
        entries.shrink_to_fit();
        // Every binary has at least one entry, so as many entries as binaries means one each.
        let firsts = if entries.len() == firsts.len() {
            Vec::new()
        } else {
            firsts
        };
        Kernels {
            keys,
            key_starts,
            firsts,
            entries,
            arches,
            digests,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(ordinal: u32) -> NewEntry {
        NewEntry {
            ordinal,
            original_size: Some(u64::from(ordinal) * 10),
            ..Default::default()
        }
    }

    #[test]
    fn records_are_small() {
        assert_eq!(std::mem::size_of::<EntryRec>(), 36);
    }

    #[test]
    fn sorts_dedups_and_drops_empty_binaries() {
        let mut b = KernelsBuilder::with_capacity(4, 0);
        b.open_binary("b").unwrap();
        b.add_entry("gfx1", entry(0)).unwrap();
        b.add_entry("gfx1", entry(9)).unwrap();
        b.add_entry("gfx2", entry(1)).unwrap();
        b.open_binary("empty").unwrap();
        b.open_binary("a").unwrap();
        b.add_entry("gfx2", entry(2)).unwrap();
        b.open_binary("b").unwrap();
        b.add_entry("gfx3", entry(3)).unwrap();
        let k = b.finish();
        type Listed<'a> = Vec<(&'a str, Vec<(&'a str, u32)>)>;
        let got: Listed<'_> = k
            .binaries()
            .map(|b| {
                let arches = b.arches().map(|e| (e.arch, e.ordinal)).collect();
                (b.key, arches)
            })
            .collect();
        assert_eq!(
            got,
            [
                ("a", vec![("gfx2", 2)]),
                ("b", vec![("gfx1", 0), ("gfx2", 1)])
            ]
        );
        assert_eq!(k.find("b"), Some(1));
        assert_eq!(k.find("empty"), None);
        assert_eq!(k.find("c"), None);
        assert_eq!(k.entries.len(), 3);
        assert_eq!(k.binary(1).unwrap().position("gfx2"), Some(1));
    }

    #[test]
    fn one_entry_per_binary_keeps_no_entry_starts() {
        let mut b = KernelsBuilder::with_capacity(3, 0);
        for (i, key) in ["c", "a", "b"].into_iter().enumerate() {
            b.open_binary(key).unwrap();
            b.add_entry("gfx1", entry(i as u32)).unwrap();
        }
        let k = b.finish();
        assert!(k.firsts.is_empty());
        let got: Vec<(&str, u32)> = k
            .binaries()
            .flat_map(|b| b.arches().map(move |e| (b.key, e.ordinal)))
            .collect();
        assert_eq!(got, [("a", 1), ("b", 2), ("c", 0)]);
        assert!(k.binary(3).is_none());
        assert_eq!(k.binary(2).unwrap().len(), 1);
    }

    #[test]
    fn many_arches_under_one_key_keep_the_first() {
        let mut b = KernelsBuilder::with_capacity(1, 0);
        b.open_binary("k").unwrap();
        for round in 0..2u32 {
            for i in 0..100u32 {
                b.add_entry(&format!("gfx{i}"), entry(i + round * 1000))
                    .unwrap();
            }
        }
        let k = b.finish();
        let bin = k.binary(0).unwrap();
        assert_eq!(bin.len(), 100);
        assert!(bin.arches().all(|e| e.ordinal < 1000));
        assert_eq!(bin.arch(42).unwrap().arch, "gfx42");
    }
}
