//! Walking the bundles of a `.hip_fatbin` section through positioned reads, so that a section
//! of gigabytes is never held in memory: the scan for the next magic reads fixed-size windows,
//! an uncompressed bundle's entry table is read (growing the read only while the table goes on)
//! and then each code object on its own, and a CCOB bundle is read and decompressed one at a
//! time. In memory ([`Source`] for `[u8]`) the same walk borrows instead of copying, and
//! [`super::parse_fatbin`] is this walk collected.

use std::borrow::Cow;
use std::convert::Infallible;
use std::fs::File;
use std::io;

use super::{
    BUNDLE_MAGIC, BundleError, CCOB_V3_HEADER, CcobHeader, Entry, Layout, TableEntry, TableError,
    ccob_header, find_next_magic, parse_table, parse_uncompressed,
};

/// Where the bytes of a section come from.
pub trait Source {
    fn len(&self) -> u64;

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `len` bytes at `at`; callers stay within [`len`](Self::len).
    fn read(&self, at: u64, len: usize) -> io::Result<Cow<'_, [u8]>>;
}

impl Source for [u8] {
    fn len(&self) -> u64 {
        <[u8]>::len(self) as u64
    }

    fn read(&self, at: u64, len: usize) -> io::Result<Cow<'_, [u8]>> {
        let at = at as usize;
        Ok(Cow::Borrowed(&self[at..at + len]))
    }
}

/// `len` bytes of a file from `offset` (a section of a host binary).
#[derive(Debug, Clone, Copy)]
pub struct FileRange<'f> {
    pub file: &'f File,
    pub offset: u64,
    pub len: u64,
}

impl Source for FileRange<'_> {
    fn len(&self) -> u64 {
        self.len
    }

    fn read(&self, at: u64, len: usize) -> io::Result<Cow<'_, [u8]>> {
        read_exact_at_new(self.file, len, self.offset + at)
            .map(Cow::Owned)
            .map_err(|e| match e.kind() {
                io::ErrorKind::UnexpectedEof => io::Error::new(
                    e.kind(),
                    "the file ended inside its .hip_fatbin section (it changed while being read)",
                ),
                _ => e,
            })
    }
}

/// `len` bytes of `file` at `offset`, in a new vector the file is read straight into: every
/// byte of device code passes through here, and zeroing the buffer first would be one more
/// pass over all of it.
fn read_exact_at_new(file: &File, len: usize, offset: u64) -> io::Result<Vec<u8>> {
    use std::os::fd::AsRawFd;
    let mut buf: Vec<u8> = Vec::new();
    buf.try_reserve_exact(len)
        .map_err(|_| io::Error::new(io::ErrorKind::OutOfMemory, "cannot allocate"))?;
    while buf.len() < len {
        let at = offset
            .checked_add(buf.len() as u64)
            .and_then(|at| libc::off_t::try_from(at).ok())
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "offset too large"))?;
        let filled = buf.len();
        let spare = &mut buf.spare_capacity_mut()[..len - filled];
        // SAFETY: pread writes at most `spare.len()` bytes into memory we own and do not read
        // until it reports them written.
        let n =
            unsafe { libc::pread(file.as_raw_fd(), spare.as_mut_ptr().cast(), spare.len(), at) };
        match n {
            0 => return Err(io::ErrorKind::UnexpectedEof.into()),
            n if n < 0 => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
            // SAFETY: the first `n` bytes of the spare capacity were just written by pread.
            n => unsafe { buf.set_len(buf.len() + n as usize) },
        }
    }
    Ok(buf)
}

/// Where a bundle is in the section, as [`super::Bundle`] without its entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BundleHead {
    pub offset: u64,
    pub len: u64,
    pub layout: Layout,
}

/// What the walk reports, in section order: each device entry of a bundle, then the bundle's
/// end.
#[derive(Debug)]
pub enum Event<'a> {
    Entry(Entry<'a>),
    End(BundleHead),
}

#[derive(Debug)]
pub enum WalkError<E> {
    Bundle(BundleError),
    Read(io::Error),
    Visit(E),
}

/// How much the walk reads at once: the magic scan's window, and the first read of an entry
/// table (real tables are a few hundred bytes; the read grows while the table goes on).
#[derive(Clone, Copy)]
struct Reads {
    scan: u64,
    table: u64,
}

/// The walk, which reads every byte anyway, reads in large pieces.
const WALK_READS: Reads = Reads {
    scan: 1 << 20,
    table: 64 << 10,
};
/// The index reads in small ones, so that the code objects after a table or between bundles
/// are not read: padding between bundles is alignment, under a page.
const INDEX_READS: Reads = Reads {
    scan: 4 << 10,
    table: 4 << 10,
};

/// Visits every device code object of the section, in order, then each bundle's end. Memory
/// held at once: one code object (uncompressed bundles) or one decompressed bundle (CCOB).
pub(crate) fn walk_fatbin<'a, S, E>(
    src: &'a S,
    mut visit: impl FnMut(Event<'a>) -> Result<(), E>,
) -> Result<(), WalkError<E>>
where
    S: Source + ?Sized,
{
    each_bundle(src, WALK_READS, |start, avail, plain| {
        let bundle = if plain {
            uncompressed(src, start, avail, &mut visit)?
        } else {
            compressed(src, start, avail, &mut visit)?
        };
        visit(Event::End(bundle)).map_err(WalkError::Visit)?;
        Ok(bundle)
    })
}

/// Finds each bundle in turn and hands `read` its start, the section bytes from there, and
/// whether it is uncompressed (else CCOB); `read` returns where the bundle ends.
fn each_bundle<S, E>(
    src: &S,
    reads: Reads,
    mut read: impl FnMut(u64, u64, bool) -> Result<BundleHead, WalkError<E>>,
) -> Result<(), WalkError<E>>
where
    S: Source + ?Sized,
{
    let len = src.len();
    let mut pos = 0u64;
    while let Some(start) = next_magic(src, pos, reads.scan).map_err(WalkError::Read)? {
        let avail = len - start;
        let head = src
            .read(start, avail.min(BUNDLE_MAGIC.len() as u64) as usize)
            .map_err(WalkError::Read)?;
        let bundle = read(start, avail, head.starts_with(BUNDLE_MAGIC))?;
        // Both parsers guarantee len >= their header size, so the scan always moves forward.
        pos = start + bundle.len;
    }
    Ok(())
}

fn uncompressed<'a, S, E>(
    src: &'a S,
    start: u64,
    avail: u64,
    visit: &mut impl FnMut(Event<'a>) -> Result<(), E>,
) -> Result<BundleHead, WalkError<E>>
where
    S: Source + ?Sized,
{
    let (table, len) = read_table(src, start, avail, WALK_READS.table)?;
    for t in table {
        let data = src
            .read(start + t.offset, t.size as usize)
            .map_err(WalkError::Read)?;
        visit(Event::Entry(Entry {
            triple: t.triple,
            arch: t.arch,
            offset: t.offset,
            data,
        }))
        .map_err(WalkError::Visit)?;
    }
    Ok(BundleHead {
        offset: start,
        len,
        layout: Layout::Uncompressed,
    })
}

/// The entry table of the uncompressed bundle at `start` and the bundle's length, reading
/// `first` bytes, then more while the table goes on.
fn read_table<S, E>(
    src: &S,
    start: u64,
    avail: u64,
    first: u64,
) -> Result<(Vec<TableEntry>, u64), WalkError<E>>
where
    S: Source + ?Sized,
{
    let mut window = avail.min(first);
    loop {
        let data = src.read(start, window as usize).map_err(WalkError::Read)?;
        match parse_table(&data, avail) {
            Ok(t) => return Ok(t),
            // NeedMore only comes with window < avail, so the window grows.
            Err(TableError::NeedMore) => window = avail.min(window.saturating_mul(4)),
            Err(TableError::Bundle(e)) => {
                return Err(WalkError::Bundle(e.shifted(start, "uncompressed bundle")));
            }
        }
    }
}

fn compressed<'a, S, E>(
    src: &'a S,
    start: u64,
    avail: u64,
    visit: &mut impl FnMut(Event<'a>) -> Result<(), E>,
) -> Result<BundleHead, WalkError<E>>
where
    S: Source + ?Sized,
{
    let (head, bundle) = decode_ccob_at(src, start, avail)?;
    let (entries, _) = parse_uncompressed(&bundle).map_err(|e| {
        WalkError::Bundle(e.shifted(
            start,
            "inside decompressed CCOB bundle (offset relative to its start)",
        ))
    })?;
    for e in entries {
        visit(Event::Entry(into_owned(e))).map_err(WalkError::Visit)?;
    }
    Ok(head)
}

/// The header and compressed payload of the CCOB bundle at `start`.
fn read_ccob<S, E>(
    src: &S,
    start: u64,
    avail: u64,
) -> Result<(CcobHeader, Cow<'_, [u8]>), WalkError<E>>
where
    S: Source + ?Sized,
{
    let head = src
        .read(start, avail.min(CCOB_V3_HEADER as u64) as usize)
        .map_err(WalkError::Read)?;
    let h = ccob_header(&head, avail)
        .map_err(|e| WalkError::Bundle(e.shifted(start, "CCOB bundle")))?;
    let payload = src
        .read(
            start + h.header_len as u64,
            (h.total as usize) - h.header_len,
        )
        .map_err(WalkError::Read)?;
    Ok((h, payload))
}

/// Decompresses the CCOB bundle at `start` (`avail` section bytes from there): where it is, and
/// the uncompressed bundle it wraps.
fn decode_ccob_at<S, E>(
    src: &S,
    start: u64,
    avail: u64,
) -> Result<(BundleHead, Vec<u8>), WalkError<E>>
where
    S: Source + ?Sized,
{
    let (h, payload) = read_ccob(src, start, avail)?;
    let bundle = h
        .decode(&payload)
        .map_err(|e| WalkError::Bundle(e.shifted(start, "CCOB bundle")))?;
    let head = BundleHead {
        offset: start,
        len: h.total,
        layout: Layout::Compressed { version: h.version },
    };
    Ok((head, bundle))
}

/// Decompresses the CCOB bundle `head` of the section (as [`index_fatbin`] placed it): the
/// uncompressed bundle, in which [`Located::offset`] counts.
pub fn decode_ccob_bundle<S>(src: &S, head: &BundleHead) -> Result<Vec<u8>, WalkError<Infallible>>
where
    S: Source + ?Sized,
{
    let avail = src.len().checked_sub(head.offset).ok_or_else(|| {
        WalkError::Bundle(BundleError {
            offset: head.offset,
            reason: "CCOB bundle starts past the end of the section".into(),
        })
    })?;
    let (found, bundle) = decode_ccob_at(src, head.offset, avail)?;
    if found != *head {
        return Err(WalkError::Bundle(BundleError {
            offset: head.offset,
            reason: "CCOB bundle changed since it was indexed".into(),
        }));
    }
    Ok(bundle)
}

/// Where one device code object of a section lies, found from its bundle's entry table
/// without reading it: bytes `offset..offset + size` of `bundle` in its uncompressed form (the
/// section's own bytes from `bundle.offset` for an uncompressed bundle, the decompressed bundle
/// for a CCOB one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Located {
    pub triple: String,
    pub arch: String,
    pub size: u64,
    pub bundle: BundleHead,
    pub offset: u64,
}

/// Every device code object of the section and where it lies, in the order `walk_fatbin`
/// visits them. Only what locates them is read: bundle headers and entry tables of
/// uncompressed bundles (never their code objects), and each CCOB bundle's payload, decoded
/// only as far as its entry table.
pub fn index_fatbin<S>(src: &S) -> Result<Vec<Located>, WalkError<Infallible>>
where
    S: Source + ?Sized,
{
    let mut out = Vec::new();
    each_bundle(src, INDEX_READS, |start, avail, plain| {
        let (head, table) = if plain {
            let (table, len) = read_table(src, start, avail, INDEX_READS.table)?;
            let head = BundleHead {
                offset: start,
                len,
                layout: Layout::Uncompressed,
            };
            (head, table)
        } else {
            let (h, payload) = read_ccob(src, start, avail)?;
            let head = BundleHead {
                offset: start,
                len: h.total,
                layout: Layout::Compressed { version: h.version },
            };
            let table = ccob_table(&h, &payload).map_err(|e| {
                WalkError::Bundle(e.shifted(
                    start,
                    "inside decompressed CCOB bundle (offset relative to its start)",
                ))
            })?;
            (head, table)
        };
        out.extend(table.into_iter().map(|t| Located {
            triple: t.triple,
            arch: t.arch,
            size: t.size,
            bundle: head,
            offset: t.offset,
        }));
        Ok(head)
    })?;
    Ok(out)
}

/// The entry table of a CCOB bundle's uncompressed bundle, decoding the payload only until
/// the table is complete. Offsets of the errors are in the uncompressed bundle.
fn ccob_table(h: &CcobHeader, payload: &[u8]) -> Result<Vec<TableEntry>, BundleError> {
    let zstd_error = |e: std::io::Error| BundleError {
        offset: 0,
        reason: format!("zstd payload does not decode: {e}"),
    };
    let decoder = zstd::stream::read::Decoder::with_buffer(payload)
        .map_err(zstd_error)?
        .single_frame();
    let mut decoder = io::Read::take(decoder, h.declared);
    let mut buf = Vec::new();
    let mut want = WALK_READS.table.min(h.declared);
    loop {
        let have = buf.len() as u64;
        io::Read::read_to_end(&mut io::Read::take(&mut decoder, want - have), &mut buf)
            .map_err(zstd_error)?;
        match parse_table(&buf, h.declared) {
            Ok((table, _)) => return Ok(table),
            Err(TableError::Bundle(e)) => return Err(e),
            Err(TableError::NeedMore) if (buf.len() as u64) < want => {
                return Err(BundleError {
                    offset: buf.len() as u64,
                    reason: format!(
                        "payload decodes to {} bytes, the header says {}",
                        buf.len(),
                        h.declared
                    ),
                });
            }
            Err(TableError::NeedMore) => want = h.declared.min(want.saturating_mul(4)),
        }
    }
}

fn into_owned(e: Entry<'_>) -> Entry<'static> {
    Entry {
        data: Cow::Owned(e.data.into_owned()),
        ..e
    }
}

/// The first position at or after `from` where either magic starts, reading windows that
/// overlap by a magic's length less one, so a magic across a window boundary is found.
fn next_magic<S: Source + ?Sized>(src: &S, from: u64, window: u64) -> io::Result<Option<u64>> {
    let len = src.len();
    let overlap = BUNDLE_MAGIC.len() as u64 - 1;
    let mut at = from;
    while at < len {
        let n = (len - at).min(window);
        let window = src.read(at, n as usize)?;
        if let Some(i) = find_next_magic(&window, 0) {
            return Ok(Some(at + i as u64));
        }
        if at + n == len {
            break;
        }
        at += n - overlap;
    }
    Ok(None)
}
