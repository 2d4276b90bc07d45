//! Writing an archive to a file as its kernels arrive, in ordinal order: the blob is appended
//! kernel by kernel, the TOC (encoded by [`crate::archive::writer::encode_toc`], so the bytes are those
//! [`crate::ArchiveWriter`] writes for the same kernels) goes after it, and the header and the
//! zstd frame count, which depend on everything before, are written last at their places.
//! Only the TOC's per-kernel records stay in memory.
//!
//! Writeback of the blob is started as it grows (`sync_file_range`, asynchronous), so the
//! disk writes overlap with compressing the next kernels and the final `fsync` of the caller
//! has little left to wait for: that wait is otherwise a serial phase at the end of every pack.

use std::collections::HashSet;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::Encoded;
use crate::archive::format::{self, Header};
use crate::archive::writer::{Compression, TocEntry, TocHead, encode_toc};
use crate::error::{Error, Result};

struct Kept {
    key: String,
    arch: String,
    original_size: u64,
    metadata: Vec<(String, String)>,
    digest: Option<[u8; 32]>,
    frame_digest: Option<[u8; 32]>,
}

/// Blob bytes between two writeback starts: large enough to be a handful of calls per
/// hundred megabytes, small enough that little is left for the final `fsync`.
const WRITEBACK_CHUNK: u64 = 8 << 20;

pub struct ArchiveFile {
    file: File,
    /// Named in errors.
    path: PathBuf,
    compression: Compression,
    reference_layout: bool,
    /// Where the next kernel goes.
    at: u64,
    /// Writeback was started for the blob up to here.
    kicked: u64,
    kernels: Vec<Kept>,
    /// Per ordinal, as `encode_toc` wants them.
    spans: Vec<(u64, u64)>,
    added: HashSet<(String, String)>,
}

impl ArchiveFile {
    /// Starts an archive in `file` (empty, opened for writing); `path` names it in errors.
    pub fn new(
        file: File,
        path: &Path,
        compression: Compression,
        reference_layout: bool,
    ) -> ArchiveFile {
        let blob_start = match compression {
            Compression::None => format::BLOB_ALIGNMENT,
            Compression::Zstd { .. } => format::BLOB_ALIGNMENT + 4,
        };
        ArchiveFile {
            file,
            path: path.to_path_buf(),
            compression,
            reference_layout,
            at: blob_start,
            kicked: 0,
            kernels: Vec::new(),
            spans: Vec::new(),
            added: HashSet::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.kernels.len()
    }

    pub fn is_empty(&self) -> bool {
        self.kernels.is_empty()
    }

    fn write_at(&self, bytes: &[u8], at: u64) -> Result<()> {
        self.file
            .write_all_at(bytes, at)
            .map_err(|e| Error::io(&self.path, "cannot write", e))
    }

    /// Appends the next kernel. As with [`crate::ArchiveWriter::add_kernel`], backslashes in
    /// the key become `/` and a (key, arch) pair may come once.
    pub fn append(
        &mut self,
        key: &str,
        arch: &str,
        metadata: Vec<(String, String)>,
        encoded: Encoded,
    ) -> Result<()> {
        let key = key.replace('\\', "/");
        if !self.added.insert((key.clone(), arch.to_owned())) {
            return Err(Error::InvalidArgument(format!(
                "kernel {key} [{arch}] was already added"
            )));
        }
        let stored = encoded.stored.len() as u64;
        match self.compression {
            Compression::None => {
                self.spans.push((self.at, stored));
                self.write_at(&encoded.stored, self.at)?;
                self.at += stored;
            }
            Compression::Zstd { .. } => {
                if self.kernels.len() as u64 >= u64::from(format::MAX_ZSTD_FRAMES) {
                    return Err(Error::InvalidArgument(format!(
                        "{} kernels exceed the format's limit",
                        self.kernels.len() + 1
                    )));
                }
                let len = u32::try_from(stored).map_err(|_| {
                    Error::InvalidArgument("a compressed kernel exceeds 4 GiB".into())
                })?;
                let end = self.at + 4 + stored;
                if end - format::BLOB_ALIGNMENT > format::MAX_ZSTD_BLOB {
                    return Err(Error::InvalidArgument(
                        "the zstd blob would exceed 4 GiB".into(),
                    ));
                }
                self.spans.push((self.at, stored));
                self.write_at(&len.to_le_bytes(), self.at)?;
                self.write_at(&encoded.stored, self.at + 4)?;
                self.at = end;
            }
        }
        self.start_writeback();
        self.kernels.push(Kept {
            key,
            arch: arch.to_owned(),
            original_size: encoded.original_size,
            metadata,
            digest: encoded.digest,
            frame_digest: encoded.frame_digest,
        });
        Ok(())
    }

    /// Starts writing the blob written since the last call to disk once there is enough of it.
    /// Only a hint: errors (and file systems without the call) surface, if ever, at `fsync`.
    fn start_writeback(&mut self) {
        use std::os::fd::AsRawFd;
        if self.at - self.kicked < WRITEBACK_CHUNK {
            return;
        }
        let (Ok(from), Ok(len)) = (
            libc::off64_t::try_from(self.kicked),
            libc::off64_t::try_from(self.at - self.kicked),
        ) else {
            return;
        };
        // SAFETY: a plain system call on a descriptor we own; no memory is passed.
        unsafe {
            libc::sync_file_range(
                self.file.as_raw_fd(),
                from,
                len,
                libc::SYNC_FILE_RANGE_WRITE,
            );
        }
        self.kicked = self.at;
    }

    /// Writes the TOC, the frame count and the header; returns the file, its size and its TOC
    /// digest.
    pub fn finish(
        self,
        group_name: &str,
        gfx_arch_family: &str,
        gfx_arches: &[String],
    ) -> Result<Finished> {
        let head = TocHead {
            group_name,
            gfx_arch_family,
            gfx_arches,
            compression: self.compression,
            reference_layout: self.reference_layout,
        };
        let entries: Vec<TocEntry<'_>> = self
            .kernels
            .iter()
            .map(|k| TocEntry {
                key: &k.key,
                arch: &k.arch,
                original_size: k.original_size,
                metadata: &k.metadata,
                digest: k.digest,
                frame_digest: k.frame_digest,
            })
            .collect();
        let blob_len = self.at - format::BLOB_ALIGNMENT;
        let toc = encode_toc(&head, &entries, &self.spans, blob_len);
        self.write_at(&toc, self.at)?;
        if let Compression::Zstd { .. } = self.compression {
            let count = self.kernels.len() as u32;
            self.write_at(&count.to_le_bytes(), format::BLOB_ALIGNMENT)?;
        }
        let mut header = [0u8; format::BLOB_ALIGNMENT as usize];
        header[..format::HEADER_SIZE].copy_from_slice(&Header::encode(self.at));
        self.write_at(&header, 0)?;
        let size = self.at + toc.len() as u64;
        Ok(Finished {
            file: self.file,
            size,
            // The TOC ends the file, so these are exactly the bytes `Archive::toc_digest` hashes.
            toc_digest: *blake3::hash(&toc).as_bytes(),
        })
    }
}

/// A finished archive file.
#[derive(Debug)]
pub struct Finished {
    pub file: File,
    pub size: u64,
    /// `Archive::toc_digest()` of the archive written: what a split binary pins.
    pub toc_digest: [u8; 32],
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ArchiveWriter;
    use crate::archive::codec::FrameEncoder;

    /// Same kernels, same bytes as the in-memory writer, for both schemes and both layouts.
    #[test]
    fn writes_what_the_archive_writer_writes() {
        let kernels: Vec<(String, &str, Vec<u8>)> = (0..9u8)
            .map(|i| {
                let key = format!("lib/x.so#{}", i / 3);
                let arch = ["gfx90a", "gfx942", "gfx1100"][i as usize % 3];
                (key, arch, vec![i; 100 + i as usize * 37])
            })
            .collect();
        let arches: Vec<String> = ["gfx90a", "gfx942", "gfx1100"].map(String::from).to_vec();
        for compression in [Compression::None, Compression::Zstd { level: 3 }] {
            for reference_layout in [false, true] {
                let mut w = ArchiveWriter::new("g", "fam", arches.clone(), compression).unwrap();
                w.set_reference_layout(reference_layout);
                let dir = tempfile::tempdir().unwrap();
                let path = dir.path().join("a.kpack");
                let mut f = ArchiveFile::new(
                    File::create(&path).unwrap(),
                    &path,
                    compression,
                    reference_layout,
                );
                for (key, arch, data) in &kernels {
                    let meta = vec![("target".to_owned(), format!("t-{arch}"))];
                    w.add_kernel_with_metadata(key, arch, data.clone(), meta.clone())
                        .unwrap();
                    let stored = match compression {
                        Compression::None => data.clone(),
                        Compression::Zstd { level } => {
                            FrameEncoder::new(level).unwrap().encode(data).unwrap()
                        }
                    };
                    let hash = !reference_layout;
                    let encoded = Encoded {
                        frame_digest: (hash && compression != Compression::None)
                            .then(|| *blake3::hash(&stored).as_bytes()),
                        stored,
                        original_size: data.len() as u64,
                        digest: hash.then(|| *blake3::hash(data).as_bytes()),
                    };
                    f.append(key, arch, meta, encoded).unwrap();
                }
                let mut expect = Vec::new();
                w.write_to(&mut expect, &|_| {}).unwrap();
                let done = f.finish("g", "fam", &arches).unwrap();
                let got = std::fs::read(&path).unwrap();
                assert_eq!(done.size, got.len() as u64);
                assert_eq!(
                    done.toc_digest,
                    crate::Archive::open(&path).unwrap().toc_digest()
                );
                assert!(
                    got == expect,
                    "{compression:?} reference_layout={reference_layout}"
                );
            }
        }
    }
}
