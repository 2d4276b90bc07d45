//! zstd frames in and out. Decoding uses one context per thread (contexts are not shareable and
//! creating one per call costs more than decoding a small kernel) and writes straight into the
//! caller's buffer, which is exactly the expected size: a frame that decodes to more or fewer
//! bytes is an error, never a reallocation.

use std::cell::RefCell;

use zstd::zstd_safe::{self, CCtx, CParameter, DCtx};

/// zstd levels the writer accepts.
pub const MIN_LEVEL: i32 = 1;
pub const MAX_LEVEL: i32 = 22;
/// The reference writer's default.
pub const DEFAULT_LEVEL: i32 = 3;

thread_local! {
    static DCTX: RefCell<Option<DCtx<'static>>> = const { RefCell::new(None) };
}

/// A buffer a kernel is written into, exactly the kernel's size. Its bytes need not be
/// initialised before they are filled: a C caller's `malloc`'d buffer is decoded into as it comes,
/// since clearing it first would cost a pass over every kernel.
///
/// # Safety
/// `as_mut_ptr` points at `size()` bytes, writable through that pointer for as long as the value
/// lives.
pub unsafe trait KernelBuf {
    fn size(&self) -> usize;
    fn as_mut_ptr(&mut self) -> *mut u8;
    /// The bytes as an initialised slice, for a reader that copies into them (cleared first when
    /// they might not be initialised).
    fn init_mut(&mut self) -> &mut [u8];
    /// The bytes once they have been filled.
    ///
    /// # Safety
    /// Every one of the `size()` bytes has been written.
    unsafe fn filled_mut(&mut self) -> &mut [u8];
}

// SAFETY: the vector's own initialised bytes.
unsafe impl KernelBuf for Vec<u8> {
    fn size(&self) -> usize {
        self.len()
    }
    fn as_mut_ptr(&mut self) -> *mut u8 {
        self.as_mut_slice().as_mut_ptr()
    }
    fn init_mut(&mut self) -> &mut [u8] {
        self
    }
    unsafe fn filled_mut(&mut self) -> &mut [u8] {
        self
    }
}

// SAFETY: the slice's own initialised bytes.
unsafe impl KernelBuf for &mut [u8] {
    fn size(&self) -> usize {
        self.len()
    }
    fn as_mut_ptr(&mut self) -> *mut u8 {
        <[u8]>::as_mut_ptr(self)
    }
    fn init_mut(&mut self) -> &mut [u8] {
        self
    }
    unsafe fn filled_mut(&mut self) -> &mut [u8] {
        self
    }
}

/// A kernel decoded straight into the shared buffer that will hold it (`Arc<[u8]>`, as caches
/// keep kernels): neither cleared before decoding nor copied after.
pub(crate) struct SharedKernel(std::sync::Arc<[std::mem::MaybeUninit<u8>]>);

impl SharedKernel {
    pub fn new(len: usize) -> SharedKernel {
        SharedKernel(std::sync::Arc::new_uninit_slice(len))
    }

    /// The bytes, once filled.
    ///
    /// # Safety
    /// Every byte has been written (a read that returned this buffer as a success wrote them).
    pub(crate) unsafe fn into_filled(self) -> std::sync::Arc<[u8]> {
        // SAFETY: all bytes initialised (the caller's promise).
        unsafe { self.0.assume_init() }
    }

    fn slots(&mut self) -> &mut [std::mem::MaybeUninit<u8>] {
        // The buffer is made here and handed out only by `into_filled`: never shared before.
        std::sync::Arc::get_mut(&mut self.0).expect("a SharedKernel is unshared until filled")
    }
}

// SAFETY: `len` bytes owned by the unshared Arc; `init_mut` writes every byte before handing
// out a slice; `filled_mut` relies on the caller's promise that they were written.
unsafe impl KernelBuf for SharedKernel {
    fn size(&self) -> usize {
        self.0.len()
    }
    fn as_mut_ptr(&mut self) -> *mut u8 {
        self.slots().as_mut_ptr().cast()
    }
    fn init_mut(&mut self) -> &mut [u8] {
        let slots = self.slots();
        slots.fill(std::mem::MaybeUninit::new(0));
        // SAFETY: every byte was just written; MaybeUninit<u8> has u8's layout.
        unsafe { &mut *(slots as *mut [std::mem::MaybeUninit<u8>] as *mut [u8]) }
    }
    unsafe fn filled_mut(&mut self) -> &mut [u8] {
        let slots = self.slots();
        // SAFETY: all bytes written (the caller's promise); same layout.
        unsafe { &mut *(slots as *mut [std::mem::MaybeUninit<u8>] as *mut [u8]) }
    }
}

/// A [`KernelBuf`] as zstd's output: it only ever writes, and reports how much.
struct Output {
    ptr: *mut u8,
    capacity: usize,
    filled: usize,
}

// SAFETY: `ptr` is valid for `capacity` writable bytes (KernelBuf's contract) while `Output`
// lives; `as_slice` covers only the `filled` bytes zstd has written.
unsafe impl zstd_safe::WriteBuf for Output {
    fn as_slice(&self) -> &[u8] {
        // SAFETY: the first `filled` bytes were written by the decoder.
        unsafe { std::slice::from_raw_parts(self.ptr, self.filled) }
    }
    fn capacity(&self) -> usize {
        self.capacity
    }
    fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr
    }
    unsafe fn filled_until(&mut self, n: usize) {
        self.filled = n;
    }
}

/// Decodes `frame` (one or more complete zstd frames) into `dst`, which must come out exactly
/// full.
pub fn decode_frame_into<B: KernelBuf + ?Sized>(frame: &[u8], dst: &mut B) -> Result<(), String> {
    let expected = dst.size();
    let mut out = Output {
        ptr: dst.as_mut_ptr(),
        capacity: expected,
        filled: 0,
    };
    let mut run = |dctx: &mut DCtx<'static>| -> Result<(), String> {
        match dctx.decompress(&mut out, frame) {
            Ok(n) if n == expected => Ok(()),
            Ok(n) => Err(format!("decoded {n} bytes, the TOC says {expected}")),
            Err(code) => Err(format!(
                "{} (the TOC says {expected} bytes)",
                zstd_safe::get_error_name(code),
            )),
        }
    };
    DCTX.with(move |cell| match cell.try_borrow_mut() {
        Ok(mut slot) => {
            let dctx = slot.get_or_insert_with(DCtx::create);
            run(dctx)
        }
        Err(_) => run(&mut DCtx::create()),
    })
}

/// Decodes `frame` (one or more complete zstd frames) to exactly `expected` bytes in pieces of
/// at most `step` bytes, so a reader can be served the start of a kernel while the rest is still
/// decoding. Each piece is decoded into a buffer from `buffer()` (small, reused: it stays in the
/// CPU's cache) and handed to `sink(window_start, buffer, fresh, end)`, which writes it where
/// it belongs and may pass it to another thread (a `pwrite` into a backing file is several times
/// cheaper than faulting in a writable file mapping page by page).
///
/// The window is `buffer[..end]`: up to `keep` bytes of what came before the piece, then the
/// piece from `fresh` on. Readers' requests rarely line up with the pieces (they follow the pages
/// of the reader's buffer), so one that began a little before the piece can still be answered
/// from memory. Nothing of the frames may be left over; an error of `buffer` or `sink` stops the
/// decode and is returned as it is.
pub(crate) fn decode_frame_steps(
    frame: &[u8],
    expected: u64,
    step: usize,
    keep: usize,
    mut buffer: impl FnMut() -> Result<Vec<u8>, String>,
    mut sink: impl FnMut(u64, Vec<u8>, usize, usize) -> Result<(), String>,
) -> Result<(), String> {
    if step == 0 {
        return Err("a decode step of 0 bytes".to_owned());
    }
    let failed = |code: usize| {
        format!(
            "{} (the TOC says {expected} bytes)",
            zstd_safe::get_error_name(code)
        )
    };
    let mut run = |dctx: &mut DCtx<'static>| -> Result<(), String> {
        dctx.reset(zstd_safe::ResetDirective::SessionOnly)
            .map_err(failed)?;
        let mut input = zstd_safe::InBuffer::around(frame);
        let mut done = 0u64;
        // What the last call returned: 0 when a frame had just ended and been flushed.
        let mut hint = 1usize;
        // The last bytes decoded so far, which start the next window.
        let mut tail: Vec<u8> =
            Vec::with_capacity(keep.min(usize::try_from(expected).unwrap_or(keep)));
        while done < expected {
            let want = usize::try_from(expected - done).map_or(step, |n| n.min(step));
            let mut window = buffer()?;
            let fresh = tail.len();
            let end = fresh + want;
            // A reused buffer is long enough already: decoding overwrites it, nothing is zeroed.
            if window.len() < end {
                window.resize(end, 0);
            }
            window[..fresh].copy_from_slice(&tail);
            let mut out = zstd_safe::OutBuffer::around(&mut window[fresh..end]);
            while out.pos() < out.capacity() {
                let before = (input.pos(), out.pos());
                hint = dctx
                    .decompress_stream(&mut out, &mut input)
                    .map_err(failed)?;
                if (input.pos(), out.pos()) == before {
                    return Err(format!(
                        "decoded {} bytes, the TOC says {expected}",
                        done + out.pos() as u64
                    ));
                }
            }
            let kept = end.min(keep);
            tail.clear();
            tail.extend_from_slice(&window[end - kept..end]);
            sink(done - fresh as u64, window, fresh, end)?;
            done += want as u64;
        }
        // Every expected byte is out: what is left must end the frames without producing more.
        let mut spare = [0u8; 1];
        while hint != 0 || input.pos() < frame.len() {
            let mut out = zstd_safe::OutBuffer::around(&mut spare[..]);
            let before = input.pos();
            hint = dctx
                .decompress_stream(&mut out, &mut input)
                .map_err(failed)?;
            if out.pos() != 0 {
                return Err(format!(
                    "decodes to more than the {expected} bytes the TOC says"
                ));
            }
            if input.pos() == before && hint != 0 {
                return Err(format!(
                    "frame is truncated (the TOC says {expected} bytes)"
                ));
            }
        }
        Ok(())
    };
    DCTX.with(move |cell| match cell.try_borrow_mut() {
        Ok(mut slot) => {
            let dctx = slot.get_or_insert_with(DCtx::create);
            run(dctx)
        }
        Err(_) => run(&mut DCtx::create()),
    })
}

/// The most output one compressed byte can yield: a 4-byte RLE block expands to at most 128 KiB.
const MAX_EXPANSION: u64 = 128 * 1024 / 4;

/// Checks, before anything is allocated, that `frame` can decode to exactly `expected` bytes:
/// when the frames record their content size it must match; either way `expected` cannot exceed
/// what zstd could produce from this many bytes.
pub fn check_decoded_size(frame: &[u8], expected: u64) -> Result<(), String> {
    let ceiling = (frame.len() as u64).saturating_mul(MAX_EXPANSION);
    if expected > ceiling {
        return Err(format!(
            "the TOC says {expected} bytes, more than a {}-byte frame can hold",
            frame.len()
        ));
    }
    // A single frame that records its content size must record exactly `expected`; several
    // concatenated frames (legal, rare) are only held to the ceiling above.
    let single = zstd_safe::find_frame_compressed_size(frame).is_ok_and(|n| n == frame.len());
    match zstd_safe::get_frame_content_size(frame) {
        Err(_) => Err(format!("not a zstd frame (the TOC says {expected} bytes)")),
        Ok(Some(recorded)) if single && recorded != expected => Err(format!(
            "the frame records {recorded} bytes, the TOC says {expected}"
        )),
        Ok(_) => Ok(()),
    }
}

/// A zstd compressor at a fixed level, producing frames exactly like the reference writer
/// (content size recorded, no checksum, no dictionary).
pub struct FrameEncoder {
    cctx: CCtx<'static>,
}

impl FrameEncoder {
    pub fn new(level: i32) -> Result<FrameEncoder, String> {
        if !(MIN_LEVEL..=MAX_LEVEL).contains(&level) {
            return Err(format!(
                "zstd level {level} is outside {MIN_LEVEL}..={MAX_LEVEL}"
            ));
        }
        let mut cctx = CCtx::create();
        let set = |cctx: &mut CCtx<'static>, p| {
            cctx.set_parameter(p)
                .map(|_| ())
                .map_err(|c| zstd_safe::get_error_name(c).to_owned())
        };
        set(&mut cctx, CParameter::CompressionLevel(level))?;
        set(&mut cctx, CParameter::ContentSizeFlag(true))?;
        set(&mut cctx, CParameter::ChecksumFlag(false))?;
        Ok(FrameEncoder { cctx })
    }

    /// Compresses one kernel into one frame.
    pub fn encode(&mut self, data: &[u8]) -> Result<Vec<u8>, String> {
        let mut out = Vec::with_capacity(zstd_safe::compress_bound(data.len()));
        self.cctx
            .compress2(&mut out, data)
            .map_err(|c| zstd_safe::get_error_name(c).to_owned())?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_exact_size() {
        let data = b"hello hello hello hello".repeat(50);
        let frame = FrameEncoder::new(3).unwrap().encode(&data).unwrap();
        let mut out = vec![0u8; data.len()];
        decode_frame_into(&frame, &mut out).unwrap();
        assert_eq!(out, data);
        let mut short = vec![0u8; data.len() - 1];
        assert!(decode_frame_into(&frame, &mut short).is_err());
        let mut long = vec![0u8; data.len() + 1];
        assert!(decode_frame_into(&frame, &mut long).is_err());
    }

    /// Decodes `frame` to `expected` bytes through `decode_frame_steps` with pieces of `step`
    /// bytes and `keep` bytes kept before each, checking every window against what came
    /// before; returns the bytes and where each piece began.
    fn stepped(
        frame: &[u8],
        expected: usize,
        step: usize,
        keep: usize,
    ) -> Result<(Vec<u8>, Vec<u64>), String> {
        let (mut out, mut offsets) = (Vec::new(), Vec::new());
        let sink = |from: u64, buffer: Vec<u8>, fresh: usize, end: usize| {
            let window = &buffer[..end];
            assert_eq!(
                from + fresh as u64,
                out.len() as u64,
                "pieces come in order, back to back"
            );
            assert_eq!(fresh, keep.min(out.len()), "as much kept as there was");
            assert!(
                window[..fresh] == out[from as usize..],
                "kept bytes are the last ones"
            );
            assert!(window.len() - fresh <= step);
            offsets.push(out.len() as u64);
            out.extend_from_slice(&window[fresh..]);
            Ok(())
        };
        // Buffers come back dirty and longer than needed, as a pool hands them out.
        let dirty = || Ok(vec![0xa5; keep + step + 7]);
        decode_frame_steps(frame, expected as u64, step, keep, dirty, sink)?;
        Ok((out, offsets))
    }

    #[test]
    fn stepwise_decode_hands_out_pieces_in_order_and_exact_size() {
        let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let frame = FrameEncoder::new(3).unwrap().encode(&data).unwrap();
        let (out, offsets) = stepped(&frame, data.len(), 128 << 10, 4096).unwrap();
        assert!(out == data);
        assert_eq!(offsets, [0, 131_072, 262_144]);
        // Kept bytes across pieces shorter than what is kept, and nothing kept.
        assert!(stepped(&frame, data.len(), 1000, 4096).unwrap().0 == data);
        assert!(stepped(&frame, data.len(), 4096, 0).unwrap().0 == data);
        // One byte short, one byte too many, a truncated frame, trailing garbage.
        assert!(stepped(&frame, data.len() - 1, 1 << 20, 0).is_err());
        assert!(stepped(&frame, data.len() + 1, 1 << 20, 0).is_err());
        assert!(stepped(&frame[..frame.len() - 3], data.len(), 1 << 20, 0).is_err());
        let mut extra = frame.clone();
        extra.extend_from_slice(b"junk");
        assert!(stepped(&extra, data.len(), 1 << 20, 0).is_err());
        // Two concatenated frames decode as one kernel.
        let mut two = frame.clone();
        two.extend_from_slice(&frame);
        let (out, _) = stepped(&two, 2 * data.len(), 1 << 20, 64).unwrap();
        assert!(out[..data.len()] == data[..] && out[data.len()..] == data[..]);
        // An error of the sink or of the buffers ends the decode with that error; a step of
        // 0 bytes is refused.
        let size = data.len() as u64;
        let no_buffer = || Ok(Vec::new());
        let e = decode_frame_steps(&frame, size, 4096, 0, no_buffer, |from, _, _, _| {
            if from > 0 {
                Err("disk full".to_owned())
            } else {
                Ok(())
            }
        });
        assert_eq!(e, Err("disk full".to_owned()));
        let mut given = 0;
        let two_buffers = || {
            given += 1;
            if given > 2 {
                Err("no buffer".to_owned())
            } else {
                Ok(Vec::new())
            }
        };
        let e = decode_frame_steps(&frame, size, 4096, 0, two_buffers, |_, _, _, _| Ok(()));
        assert_eq!(e, Err("no buffer".to_owned()));
        let refused = decode_frame_steps(&frame, size, 0, 0, no_buffer, |_, _, _, _| Ok(()));
        assert!(refused.is_err());
        // An empty kernel hands out nothing.
        let empty = FrameEncoder::new(3).unwrap().encode(&[]).unwrap();
        assert_eq!(
            stepped(&empty, 0, 4096, 64).unwrap(),
            (Vec::new(), Vec::new())
        );
    }

    #[test]
    fn a_shared_kernel_is_decoded_into_and_cleared_for_copies() {
        let data = b"abc".repeat(1000);
        let frame = FrameEncoder::new(3).unwrap().encode(&data).unwrap();
        let mut buf = SharedKernel::new(data.len());
        decode_frame_into(&frame, &mut buf).unwrap();
        // SAFETY: the decode succeeded, so every byte was written.
        assert_eq!(&unsafe { buf.into_filled() }[..], &data[..]);
        // A short frame is an error, never a partly filled buffer handed on.
        let mut long = SharedKernel::new(data.len() + 1);
        assert!(decode_frame_into(&frame, &mut long).is_err());
        let mut copied = SharedKernel::new(5);
        assert_eq!(copied.init_mut(), &[0u8; 5]);
        copied.init_mut().copy_from_slice(b"12345");
        // SAFETY: init_mut wrote every byte.
        assert_eq!(&unsafe { copied.into_filled() }[..], b"12345");
        // SAFETY: nothing to write.
        assert!(unsafe { SharedKernel::new(0).into_filled() }.is_empty());
    }

    #[test]
    fn level_bounds() {
        assert!(FrameEncoder::new(0).is_err());
        assert!(FrameEncoder::new(23).is_err());
        assert!(FrameEncoder::new(22).is_ok());
    }
}
