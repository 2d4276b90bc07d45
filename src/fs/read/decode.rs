//! What a decode job does: where a kernel's bytes come from (the cache directory, or the
//! archive decoded in steps into a backing file, decoded whole, or decoded into memory), with
//! every failure logged by archive, key and arch. Keeping the result, ending the job and
//! answering its waiters are the kernel's decode life's (`kernel_life.rs`).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::fill::Fill;
use super::kernel_life::{FillJob, Make};
use super::stream;
use crate::archive::KernelRef;
use crate::archive::codec::SharedKernel;
use crate::fs::errno::Errno;
use crate::fs::store::BackingFile;
use crate::fs::store::Body;
use crate::fs::store::KernelSpec;
use crate::fs::tree::{Entry, FileNode};
use crate::fs::{KpackFs, kernel_id};

/// Where a kernel's backing file comes from, before any decode (see
/// [`KpackFs::cached_or_located`]). Made once per decode and taken apart at once, so the size of
/// its larger variant costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
enum Source<'a> {
    /// A valid file found in the cache directory.
    Dir(Arc<BackingFile>),
    /// The located kernel and the spec of the file to make for it.
    Located(KernelRef<'a>, KernelSpec),
}

/// How a kernel's bytes are produced.
enum Plan {
    /// Checked whole, then served: its digest covers only the decoded bytes (or it is stored
    /// as is, scheme `none`).
    Whole,
    /// Decoded in steps from this frame, `.0[.1..]` (verified against its digest when it has
    /// one), served as it goes.
    Stream(Vec<u8>, usize),
}

impl KpackFs {
    /// Runs a decode job to its end on this thread (a decode thread): makes the kernel's body
    /// as the job asks, and hands it to the kernel's decode life, which keeps it, ends the job
    /// and answers everyone waiting on it (`kernel_life.rs`).
    pub fn run_fill(&self, job: FillJob) {
        let ino = job.ino;
        self.decodes.run(&self.store, job, |fill, make| {
            let Some(Entry::File(file)) = self.tree.entry(ino) else {
                log::error!("a decode job was made for inode {ino}, which is not a file");
                return Err(Errno::EIO);
            };
            match make {
                Make::Bytes => self.decode_small(file).map(|b| (Body::Bytes(b), true)),
                Make::File | Make::FileForRead | Make::Ahead { .. } => self
                    .fill_kernel(file, fill)
                    .map(|(b, keep)| (Body::File(b), keep)),
            }
        });
    }

    /// Makes the backing file of a kernel: from the cache directory,
    /// decoded in steps (serving readers through `fill` as it goes), or decoded whole. Returns it
    /// with whether the store may keep it (see [`Store::finish`](crate::fs::store::Store::finish)).
    pub(super) fn fill_kernel(
        &self,
        file: &FileNode,
        fill: &Arc<Fill>,
    ) -> Result<(Arc<BackingFile>, bool), Errno> {
        let (kref, spec) = match self.cached_or_located(file)? {
            Source::Dir(found) => return Ok((found, true)),
            Source::Located(kref, spec) => (kref, spec),
        };
        let (buf, start) = match self.plan(file, &kref)? {
            Plan::Whole => return self.write_whole(file, &kref, &spec),
            Plan::Stream(buf, start) => (buf, start),
        };
        // read_verified_frame checked that the frame can produce this many bytes, so the space
        // reserved here is what the frame really needs.
        let mut pending = self
            .store
            .begin(&spec)
            .map_err(|e| self.failed(file, &e, e.errno))?;
        fill.streaming(pending.backing());
        // Every step is published as it is decoded, the last one too: keeping the file (a
        // cache directory hashes, records and renames it) is no reader's business, and a
        // failure to keep it only means the file is not kept.
        let frame = &buf[start..];
        let decoded = stream::decode_into(frame, spec.len, &mut pending, fill);
        stream::keep_frame_buffer(buf);
        decoded.map_err(|e| self.failed(file, &e.message, e.errno))?;
        Ok(self.store.finish(&spec, pending))
    }

    /// What making a kernel's backing file starts from: a valid file in the cache directory,
    /// else the kernel located (counted as a decode) with the spec of its file. Located once,
    /// with both digests (one read when they come from the file): the kernel's for the cache
    /// directory, the frame's for the decode. A failure to locate it is reported only if the
    /// cache directory cannot serve the kernel either.
    fn cached_or_located<'a>(&'a self, file: &FileNode) -> Result<Source<'a>, Errno> {
        let archive = self.archive_of(file);
        let located = archive.locate_at(file.binary as usize, file.entry as usize);
        let spec = match &located {
            Ok(kref) => self.spec_with(file, kref.digest),
            Err(_) => self.spec_of(file)?,
        };
        if let Some(found) = self.store.find_in_dir(&spec) {
            return Ok(Source::Dir(found));
        }
        self.decoded.fetch_add(1, Ordering::Relaxed);
        Ok(Source::Located(self.checked(file, located)?, spec))
    }

    /// Whether `file` streams, and its frame if so: kernels whose frame digest matched (before
    /// anything is decoded) and kernels without any digest. Bytes are never served before they
    /// are checked: a kernel whose only digest is of its decoded bytes is decoded whole.
    fn plan(&self, file: &FileNode, kref: &KernelRef<'_>) -> Result<Plan, Errno> {
        let archive = self.archive_of(file);
        if archive.scheme() != crate::archive::format::Scheme::ZstdPerKernel {
            return Ok(Plan::Whole);
        }
        let fail = |e: &crate::Error| self.failed(file, e, Errno::from(e));
        // A frame digest vouches for every byte the frame decodes to; a digest of the decoded
        // bytes alone can only be checked once all of them are out.
        if kref.digest.is_some() && kref.frame_digest.is_none() {
            return Ok(Plan::Whole);
        }
        let mut frame = stream::frame_buffer();
        let start = archive
            .read_verified_frame(kref, &mut frame)
            .map_err(|e| fail(&e))?;
        // As for every read of the mount: an archive that changed since open serves nothing
        // more (what is decoded is this copy of the frame, read before the check).
        archive.check_unchanged().map_err(|e| fail(&e))?;
        Ok(Plan::Stream(frame, start))
    }

    /// Decodes a small kernel into memory (on a decode-pool thread).
    pub(super) fn decode_small(&self, file: &FileNode) -> Result<Arc<[u8]>, Errno> {
        self.decoded.fetch_add(1, Ordering::Relaxed);
        let kref = self.locate_for_read(file)?;
        let buf = self.decode_with(file, &kref, |n| Some(SharedKernel::new(n)))?;
        // SAFETY: a decode returns its buffer only once every byte is written.
        Ok(unsafe { buf.into_filled() })
    }

    pub(super) fn spec_of(&self, file: &FileNode) -> Result<KernelSpec, Errno> {
        Ok(self.spec_with(file, self.digest_of(file)?))
    }

    /// [`spec_of`](Self::spec_of) with the kernel's digest already at hand.
    pub(super) fn spec_with(&self, file: &FileNode, digest: Option<[u8; 32]>) -> KernelSpec {
        KernelSpec {
            id: kernel_id(file),
            len: file.size,
            cache_key: self.cache_key(file),
            digest,
        }
    }

    /// Locates a kernel for a read (see
    /// [`Archive::locate_for_read_at`](crate::archive::Archive::locate_for_read_at)), checked as
    /// [`checked`](Self::checked) checks it.
    pub(super) fn locate_for_read(&self, file: &FileNode) -> Result<KernelRef<'_>, Errno> {
        let located = self
            .archive_of(file)
            .locate_for_read_at(file.binary as usize, file.entry as usize);
        self.checked(file, located)
    }

    /// A located kernel, or the error logged with archive, key and arch; a kernel whose size
    /// is no longer the one the tree shows is EIO.
    pub(super) fn checked<'a>(
        &self,
        file: &FileNode,
        located: crate::Result<KernelRef<'a>>,
    ) -> Result<KernelRef<'a>, Errno> {
        let kref = located.map_err(|e| self.failed(file, &e, Errno::from(&e)))?;
        if kref.size != file.size {
            let why = format!("size changed from {} to {}", file.size, kref.size);
            return Err(self.failed(file, &why, Errno::EIO));
        }
        Ok(kref)
    }

    /// Makes the backing file of a kernel checked whole before it is served (see
    /// [`stream::write_whole`]): nobody reads it before it is complete and every digest matched.
    /// Returns it with whether the store may keep it. Failures are logged with archive, key
    /// and arch.
    pub(super) fn write_whole(
        &self,
        file: &FileNode,
        kref: &KernelRef<'_>,
        spec: &KernelSpec,
    ) -> Result<(Arc<BackingFile>, bool), Errno> {
        let archive = self.archive_of(file);
        let fail = |e: &crate::Error| self.failed(file, e, Errno::from(e));
        let pending =
            stream::write_whole(archive, kref, || self.store.begin(spec)).map_err(|e| match e {
                stream::WholeError::Store(e) => self.failed(file, &e, e.errno),
                stream::WholeError::Write(e) => self.failed(file, &e.message, e.errno),
                stream::WholeError::Read(e) => fail(&e),
            })?;
        // Bytes of a file rewritten in place may decode without any error.
        archive.check_unchanged().map_err(|e| fail(&e))?;
        Ok(self.store.finish(spec, pending))
    }

    /// Decodes one kernel into the buffer `alloc` makes (called once the archive has checked
    /// that the stored kernel produces that many bytes). Failures are logged with archive, key
    /// and arch.
    pub(super) fn decode_with<T: crate::archive::codec::KernelBuf>(
        &self,
        file: &FileNode,
        kref: &KernelRef<'_>,
        alloc: impl FnOnce(usize) -> Option<T>,
    ) -> Result<T, Errno> {
        let archive = self.archive_of(file);
        let fail = |e: &crate::Error| self.failed(file, e, Errno::from(e));
        // read_with checks that a frame can produce the TOC's size before allocating, and the
        // bytes against the archive's digest when it records one.
        // read_with already reports a failed read of a changed archive as "changed"; bytes of a
        // file rewritten in place may also decode without any error, hence the check after.
        let buf = archive.read_with(kref, alloc).map_err(|e| fail(&e))?;
        archive.check_unchanged().map_err(|e| fail(&e))?;
        Ok(buf)
    }
}
