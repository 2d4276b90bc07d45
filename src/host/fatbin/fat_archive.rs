//! A fat binary read as a kpack archive: a byte source whose bytes are those of an uncompressed
//! (`none`) archive holding the binary's code objects, keyed as `pack --from-fatbin` keys them
//! (`<kernel name>#<index>`). Header and TOC are made in memory from the bundle
//! index (headers and entry tables only); a code object's bytes are read from the binary when
//! asked for: a plain bundle's from its file range, a CCOB bundle's from the bundle decoded once
//! and kept while its code objects are read (the last [`DECODED_KEPT`] bundles). So every reader
//! of archives, the mount's cache and read path among them, serves a fat binary unchanged.

use std::io;
use std::path::Path;
use std::sync::{Arc, Mutex};

use super::{HostFile, IndexedCodeObject, default_prefix, index_host_code_objects};
use crate::archive::Archive;
use crate::archive::byte_source::{ByteSource, LocalFile, read_full_at};
use crate::archive::format::{BLOB_ALIGNMENT, Header};
use crate::archive::writer::{Compression, TocEntry, TocHead, encode_toc};
use crate::error::{Error, Result};
use crate::host::bundle::{self, BundleHead, FileRange, Layout};

/// Decoded CCOB bundles kept: their code objects are usually read one after another.
const DECODED_KEPT: usize = 2;

/// Opens the fat binary at `path` as an archive, its code objects keyed `<kernel_name>#<i>`.
/// A file that is not a fat binary is refused with what it is.
pub fn open_fat_archive(path: &Path, kernel_name: &str) -> Result<Archive> {
    Archive::open_source(Box::new(FatSource::open(path, kernel_name)?))
}

#[derive(Debug)]
struct FatSource {
    file: LocalFile,
    /// The same file, for the bundle walk's positioned reads.
    raw: std::fs::File,
    /// Where `.hip_fatbin` is in the file.
    section: (u64, u64),
    /// The archive's header and the zeros up to the first blob.
    head: Vec<u8>,
    /// Code objects in ordinal order, each with its offset in the archive.
    pieces: Vec<(u64, IndexedCodeObject)>,
    toc_at: u64,
    toc: Vec<u8>,
    decoded: Mutex<Vec<(u64, Arc<Vec<u8>>)>>,
}

impl FatSource {
    fn open(path: &Path, kernel_name: &str) -> Result<FatSource> {
        let bad = |why: String| Error::InvalidMetadata(format!("{}: {why}", path.display()));
        let host = HostFile::open_tables(path).map_err(|e| Error::io(path, "cannot read", e))?;
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| bad("not a UTF-8 file name".into()))?;
        let cos = index_host_code_objects(kernel_name, &host).map_err(|e| match e {
            super::StreamError::Fatbin(e) => bad(e.to_string()),
            super::StreamError::Read(e) => Error::io(path, "cannot read", e),
            super::StreamError::Visit(never) => match never {},
        })?;
        let section = host.fatbin().map_or((0, 0), |r| (r.offset, r.len));
        let mut arches: Vec<String> = Vec::new();
        let mut pieces = Vec::with_capacity(cos.len());
        let mut at = BLOB_ALIGNMENT;
        for co in cos {
            if !arches.contains(&co.arch) {
                arches.push(co.arch.clone());
            }
            let size = co.size;
            pieces.push((at, co));
            at += size;
        }
        let entries: Vec<TocEntry<'_>> = pieces
            .iter()
            .map(|(_, c)| TocEntry {
                key: &c.key,
                arch: &c.arch,
                original_size: c.size,
                metadata: &[],
                digest: None,
                frame_digest: None,
            })
            .collect();
        let spans: Vec<(u64, u64)> = pieces.iter().map(|(at, c)| (*at, c.size)).collect();
        let head = TocHead {
            group_name: &default_prefix(name),
            gfx_arch_family: &arches.join(","),
            gfx_arches: &arches,
            compression: Compression::None,
            reference_layout: true,
        };
        let toc = encode_toc(&head, &entries, &spans, at - BLOB_ALIGNMENT);
        let mut header = Header::encode(at).to_vec();
        header.resize(BLOB_ALIGNMENT as usize, 0);
        drop(entries);
        let raw = host
            .file()
            .try_clone()
            .map_err(|e| Error::io(path, "cannot open", e))?;
        Ok(FatSource {
            file: LocalFile::open(path)?,
            raw,
            section,
            head: header,
            pieces,
            toc_at: at,
            toc,
            decoded: Mutex::new(Vec::new()),
        })
    }

    /// The section, as bundles are read.
    fn fatbin(&self) -> FileRange<'_> {
        FileRange {
            file: &self.raw,
            offset: self.section.0,
            len: self.section.1,
        }
    }

    /// The decoded CCOB bundle `head`, decoded now or kept from before.
    fn decoded(&self, head: &BundleHead) -> io::Result<Arc<Vec<u8>>> {
        if let Some((_, b)) = crate::sync::lock(&self.decoded)
            .iter()
            .find(|(at, _)| *at == head.offset)
        {
            return Ok(Arc::clone(b));
        }
        // Decoded without the lock held: another bundle may be read meanwhile.
        let bundle = bundle::decode_ccob_bundle(&self.fatbin(), head).map_err(|e| {
            let why = match e {
                bundle::WalkError::Bundle(e) => e.to_string(),
                bundle::WalkError::Read(e) => e.to_string(),
                bundle::WalkError::Visit(never) => match never {},
            };
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: .hip_fatbin: {why}", self.file.path().display()),
            )
        })?;
        let bundle = Arc::new(bundle);
        let mut kept = crate::sync::lock(&self.decoded);
        if kept.len() == DECODED_KEPT {
            kept.remove(0);
        }
        kept.push((head.offset, Arc::clone(&bundle)));
        Ok(bundle)
    }

    /// Fills `buf` from the code object `co`, from `skip` bytes into it.
    fn read_piece(&self, co: &IndexedCodeObject, skip: u64, buf: &mut [u8]) -> io::Result<()> {
        match co.bundle.layout {
            Layout::Uncompressed => {
                let at = self.section.0 + co.bundle.offset + co.offset + skip;
                let got = read_full_at(&self.file, buf, at)?;
                if got < buf.len() {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the file ended inside its .hip_fatbin section (it changed while being read)",
                    ));
                }
            }
            Layout::Compressed { .. } => {
                let bundle = self.decoded(&co.bundle)?;
                let from = (co.offset + skip) as usize;
                // Inside the bundle when it was indexed; a file changed since may say otherwise.
                let part = from
                    .checked_add(buf.len())
                    .and_then(|end| bundle.get(from..end))
                    .ok_or_else(|| {
                        io::Error::new(
                            io::ErrorKind::InvalidData,
                            format!(
                                "{}: .hip_fatbin changed since it was indexed",
                                self.file.path().display()
                            ),
                        )
                    })?;
                buf.copy_from_slice(part);
            }
        }
        Ok(())
    }
}

impl ByteSource for FatSource {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let len = self.len();
        let want = (buf.len() as u64).min(len.saturating_sub(offset)) as usize;
        let mut done = 0usize;
        while done < want {
            let at = offset + done as u64;
            let out = &mut buf[done..want];
            let n = if at < BLOB_ALIGNMENT {
                let n = out.len().min((BLOB_ALIGNMENT - at) as usize);
                out[..n].copy_from_slice(&self.head[at as usize..at as usize + n]);
                n
            } else if at >= self.toc_at {
                let from = (at - self.toc_at) as usize;
                let n = out.len().min(self.toc.len() - from);
                out[..n].copy_from_slice(&self.toc[from..from + n]);
                n
            } else {
                // The last code object starting at or before `at`.
                let i = self.pieces.partition_point(|(start, _)| *start <= at) - 1;
                let (start, co) = &self.pieces[i];
                let skip = at - start;
                let n = out.len().min((co.size - skip) as usize);
                self.read_piece(co, skip, &mut out[..n])?;
                n
            };
            done += n;
        }
        Ok(want)
    }

    fn len(&self) -> u64 {
        self.toc_at + self.toc.len() as u64
    }

    fn display_name(&self) -> String {
        self.file.display_name()
    }

    fn identity(&self) -> String {
        format!("fat:{}", self.file.identity())
    }

    fn check_unchanged(&self) -> Result<()> {
        self.file.check_unchanged()
    }

    fn modified(&self) -> Option<std::time::SystemTime> {
        self.file.modified()
    }
}
