//! `zstd_index`: arbitrary bytes as a zstd blob (frame count, then size-prefixed frames).
//!
//! The first input byte chooses how the reader behaves (short reads of a few bytes, an
//! `Interrupted` error before each read, or whole reads), so the windowed header reader's retry
//! paths are covered, and at which file offset the blob starts (the reader aligns its reads to
//! pages of the file); the rest is the blob. Invariants on success: at most `MAX_ZSTD_FRAMES`
//! frames, in order, each right after its 4-byte size, all inside the blob. Each indexed frame
//! then goes through the codec's pre-allocation size check and, when that passes with a modest
//! size, through a real decode into a buffer of exactly that size.

use std::io;

use rocm_kpack::archive::codec;
use rocm_kpack::archive::format::{self, Span};

/// Largest decode attempted per frame; larger claims were already bounded by the size check,
/// and decoding them would only slow the fuzzer down.
const DECODE_LIMIT: u64 = 1 << 20;

pub fn run(data: &[u8]) -> Result<Vec<Span>, String> {
    let Some((&mode, blob)) = data.split_first() else {
        return Err("empty input".into());
    };
    let chunk = usize::from(mode & 0x0f) + 1;
    let interrupt = mode & 0x10 != 0;
    let mut interrupted = false;
    // The top bits place the blob at different page alignments in the file.
    let base = 64 + u64::from(mode >> 6) * 1021;
    let result = format::index_zstd_frames(blob.len() as u64, base, |at, buf| {
        if interrupt && !interrupted {
            interrupted = true;
            return Err(io::Error::from(io::ErrorKind::Interrupted));
        }
        interrupted = false;
        let at = usize::try_from(at).expect("offset fits");
        assert!(
            at <= blob.len(),
            "read at {at} past a {}-byte blob",
            blob.len()
        );
        let n =
            buf.len()
                .min(blob.len() - at)
                .min(if mode & 0x20 != 0 { chunk } else { usize::MAX });
        buf[..n].copy_from_slice(&blob[at..at + n]);
        Ok(n)
    });
    let Ok(spans) = &result else { return result };
    assert!(spans.len() <= format::MAX_ZSTD_FRAMES as usize);
    assert_eq!(
        u32::from_le_bytes(blob[..4].try_into().unwrap()) as usize,
        spans.len()
    );
    let mut pos = 4u64;
    for s in spans {
        assert_eq!(s.offset, pos + 4, "frame not right after its size header");
        let header = &blob[pos as usize..s.offset as usize];
        assert_eq!(
            u64::from(u32::from_le_bytes(header.try_into().unwrap())),
            s.size
        );
        pos = s.offset + s.size;
        assert!(pos <= blob.len() as u64);
        let frame = &blob[s.offset as usize..pos as usize];
        decode_if_plausible(frame);
    }
    result
}

/// The archive's read path for one frame, with the size the frame itself records.
fn decode_if_plausible(frame: &[u8]) {
    let Ok(Some(recorded)) = zstd::zstd_safe::get_frame_content_size(frame) else {
        return;
    };
    if codec::check_decoded_size(frame, recorded).is_err() || recorded > DECODE_LIMIT {
        return;
    }
    let mut out = vec![0u8; recorded as usize];
    let _ = codec::decode_frame_into(frame, &mut out);
}
