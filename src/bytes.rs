//! Little-endian field readers and the short-read loop, shared by every parser of on-disk
//! formats (archive header, zstd frame index, offload bundles, ELF, HIPK wrappers); `byte_source`
//! builds its `read_full_at` on [`read_full_with`].
//!
//! The readers return `None` instead of panicking when the field runs past the slice (or its
//! offset overflows), so hostile offsets become the caller's error, never a crash.

use std::io::{self, Read};

fn field<const N: usize>(b: &[u8], at: usize) -> Option<[u8; N]> {
    let end = at.checked_add(N)?;
    b.get(at..end)?.try_into().ok()
}

/// The little-endian `u16` at `at`, if the slice holds it.
pub fn le_u16(b: &[u8], at: usize) -> Option<u16> {
    field(b, at).map(u16::from_le_bytes)
}

/// The little-endian `u32` at `at`, if the slice holds it.
pub fn le_u32(b: &[u8], at: usize) -> Option<u32> {
    field(b, at).map(u32::from_le_bytes)
}

/// The little-endian `u64` at `at`, if the slice holds it.
pub fn le_u64(b: &[u8], at: usize) -> Option<u64> {
    field(b, at).map(u64::from_le_bytes)
}

/// The big-endian `u32` at `at` (big-endian ELF files), if the slice holds it.
pub fn be_u32(b: &[u8], at: usize) -> Option<u32> {
    field(b, at).map(u32::from_be_bytes)
}

/// Fills `buf` from a positioned reader starting at `offset`, retrying short and interrupted
/// reads; returns how many bytes were read (fewer than `buf.len()` only at the end of the
/// source).
pub fn read_full_with(
    mut read_at: impl FnMut(&mut [u8], u64) -> io::Result<usize>,
    buf: &mut [u8],
    offset: u64,
) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match read_at(&mut buf[got..], offset + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// Fills `buf` from a stream, retrying short and interrupted reads; returns how many bytes were
/// read (fewer only at end of stream).
pub fn read_full(reader: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match reader.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_past_the_end_or_overflowing_are_none() {
        let b = [1u8, 2, 3, 4, 5, 6, 7, 8, 9];
        assert_eq!(le_u16(&b, 7), Some(0x0908));
        assert_eq!(le_u16(&b, 8), None);
        assert_eq!(le_u32(&b, 0), Some(0x0403_0201));
        assert_eq!(be_u32(&b, 0), Some(0x0102_0304));
        assert_eq!(le_u64(&b, 1), Some(0x0908_0706_0504_0302));
        assert_eq!(le_u64(&b, 2), None);
        assert_eq!(le_u32(&b, usize::MAX - 1), None);
    }

    #[test]
    fn short_and_interrupted_reads_are_retried() {
        let data: Vec<u8> = (0..100).collect();
        let mut calls = 0;
        let mut buf = [0u8; 40];
        let got = read_full_with(
            |b, at| {
                calls += 1;
                if calls == 2 {
                    return Err(io::Error::from(io::ErrorKind::Interrupted));
                }
                let at = at as usize;
                let n = b.len().min(7).min(data.len().saturating_sub(at));
                b[..n].copy_from_slice(&data[at..at + n]);
                Ok(n)
            },
            &mut buf,
            70,
        )
        .unwrap();
        assert_eq!(got, 30);
        assert_eq!(&buf[..30], &data[70..]);
        let err = read_full_with(|_, _| Err(io::Error::other("boom")), &mut buf, 0);
        assert_eq!(err.unwrap_err().to_string(), "boom");
        let mut r: &[u8] = b"abc";
        assert_eq!(read_full(&mut r, &mut buf).unwrap(), 3);
    }
}
