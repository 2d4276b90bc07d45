//! How a decode thread writes a kernel into its backing file: in steps, through buffers the
//! thread keeps from job to job (fresh ones would be faulted in and zeroed for every job), each
//! step published to the readers waiting for it (`fill.rs`) as soon as it is written, or, for a
//! kernel checked whole, nothing published before the last step matched the digest. The thread
//! that decodes also writes and answers: with the cores already busy decoding, a second thread
//! per kernel for the writing would only compete with them.

use std::cell::{Cell, RefCell};

use super::fill::Fill;
use crate::archive::codec::decode_frame_steps;
use crate::archive::{Archive, KernelRef};
use crate::fs::errno::Errno;
use crate::fs::store::{FileError, Pending};

/// How far a decode gets before it publishes the bytes it wrote (and answers the reads waiting
/// for them): large enough that publishing costs little next to decoding, small enough to stay
/// in the CPU's cache.
pub const STEP: usize = 1 << 20;

/// How much of the previous step stays in memory before each new one. A reader's requests
/// follow the pages of its buffer, which rarely starts on a page boundary, so most of them begin
/// a few bytes before the step that completes them; with these bytes kept they are answered
/// from memory instead of being read back from the backing file.
pub const KEEP: usize = 64 << 10;

/// The largest compressed frame buffer a decode thread keeps for its next job.
const FRAME_BUFFER_KEPT: usize = 8 << 20;

thread_local! {
    /// Each decode thread's step buffer, kept from job to job so it stays mapped.
    static BUFFER: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    /// Each decode thread's buffer for compressed frames.
    static FRAME: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// This thread's buffer to read a frame into (empty or left over from an earlier frame).
pub fn frame_buffer() -> Vec<u8> {
    FRAME.with_borrow_mut(std::mem::take)
}

/// Gives a frame buffer back for this thread's next job, unless it is unusually large.
pub fn keep_frame_buffer(buf: Vec<u8>) {
    if buf.capacity() <= FRAME_BUFFER_KEPT {
        FRAME.with_borrow_mut(|kept| *kept = buf);
    }
}

/// Why [`decode_into`] failed: what to log, and what readers see (EIO for a frame that does
/// not decode; a failed write keeps its meaning, such as ENOSPC).
#[derive(Debug)]
pub struct DecodeError {
    pub message: String,
    pub errno: Errno,
}

impl DecodeError {
    /// A write into the backing file failed.
    pub fn write(e: &std::io::Error) -> DecodeError {
        DecodeError {
            message: format!("cannot write the backing file: {e}"),
            errno: Errno::from(e),
        }
    }
}

/// Writes one step into `pending` for a reader of the archive, which carries errors as text: a
/// failed write is kept in `failed`, so that its errno reaches the readers.
fn write_step(
    pending: &mut Pending,
    at: u64,
    bytes: &[u8],
    failed: &mut Option<DecodeError>,
) -> Result<(), String> {
    pending.write_at(at, bytes).map_err(|e| {
        let e = DecodeError::write(&e);
        let message = e.message.clone();
        *failed = Some(e);
        message
    })
}

/// Decodes `frame` (checked to produce `len` bytes) into `pending`, publishing each step
/// through `fill` as soon as it is written.
pub fn decode_into(
    frame: &[u8],
    len: u64,
    pending: &mut Pending,
    fill: &Fill,
) -> Result<(), DecodeError> {
    // Taken from the thread for the job and given back after it: a step's answer cannot
    // start another decode on this thread, but nothing is borrowed across it all the same.
    let spare = Cell::new(BUFFER.with_borrow_mut(std::mem::take));
    let mut write_error = None;
    let result = decode_frame_steps(
        frame,
        len,
        STEP,
        KEEP,
        || Ok(spare.take()),
        |from, buffer, fresh, end| {
            write_step(
                pending,
                from + fresh as u64,
                &buffer[fresh..end],
                &mut write_error,
            )?;
            fill.progress(from, &buffer[..end]);
            spare.set(buffer);
            Ok(())
        },
    );
    BUFFER.with_borrow_mut(|kept| *kept = spare.take());
    result.map_err(|message| {
        write_error.unwrap_or(DecodeError {
            message,
            errno: Errno::EIO,
        })
    })
}

/// Why [`write_whole`] failed: the backing file could not be made, a write into it failed, or
/// the archive's read or check failed.
pub enum WholeError {
    Store(FileError),
    Write(DecodeError),
    Read(crate::Error),
}

/// Writes a kernel that is checked whole before anyone may read it (its archive records only
/// the digest of its decoded bytes, or stores it uncompressed) into the file `begin` makes, in
/// steps through this thread's buffers, like a streamed decode but publishing nothing (see
/// [`Archive::read_in_steps`]). The file is made when the first step is ready, once the archive
/// has checked that the kernel produces that many bytes (an empty kernel's, after the read).
pub fn write_whole(
    archive: &Archive,
    kref: &KernelRef<'_>,
    mut begin: impl FnMut() -> Result<Pending, FileError>,
) -> Result<Pending, WholeError> {
    let mut frame = frame_buffer();
    let mut piece = BUFFER.with_borrow_mut(std::mem::take);
    // Made with the first piece; a failure to make it stops the read there.
    let mut made: Option<Result<Pending, FileError>> = None;
    let mut write_error = None;
    let written = archive.read_in_steps(kref, STEP, &mut frame, &mut piece, |at, bytes| match made
        .get_or_insert_with(&mut begin)
    {
        Ok(pending) => write_step(pending, at, bytes, &mut write_error),
        Err(_) => Err("no backing file".into()),
    });
    keep_frame_buffer(frame);
    BUFFER.with_borrow_mut(|kept| *kept = piece);
    match (made, written, write_error) {
        // The read's own error is then only the refusal, or the failed write.
        (Some(Err(e)), _, _) => Err(WholeError::Store(e)),
        (_, Err(_), Some(e)) => Err(WholeError::Write(e)),
        (_, Err(e), None) => Err(WholeError::Read(e)),
        (Some(Ok(pending)), Ok(()), _) => Ok(pending),
        // An empty kernel: no piece, the file is made once the read checked it.
        (None, Ok(()), _) => begin().map_err(WholeError::Store),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A write that fails while a frame decodes keeps its errno (a full disk is ENOSPC to the
    /// reader, not EIO); a frame that does not decode is EIO.
    #[test]
    fn a_failed_write_keeps_its_errno() {
        let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        let frame = zstd::bulk::compress(&data, 3).unwrap();
        let len = data.len() as u64;
        let full = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap();
        let mut pending = Pending::over(full, len);
        let fill = std::sync::Arc::new(Fill::for_kernel(len));
        fill.streaming(pending.backing());
        let e = decode_into(&frame, len, &mut pending, &fill).unwrap_err();
        assert_eq!(e.errno, Errno(libc::ENOSPC));
        assert!(
            e.message
                .starts_with("cannot write the backing file: No space left on device"),
            "{}",
            e.message
        );

        let file = tempfile::tempfile().unwrap();
        let mut pending = Pending::over(file, len);
        let fill = std::sync::Arc::new(Fill::for_kernel(len));
        fill.streaming(pending.backing());
        let e = decode_into(&frame[..frame.len() / 2], len, &mut pending, &fill).unwrap_err();
        assert_eq!(e.errno, Errno::EIO, "{}", e.message);
    }
}
