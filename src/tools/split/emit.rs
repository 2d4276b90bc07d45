//! Producing a rewritten binary from its [`Rewrite`] description: kept ranges of the input,
//! then small edits, zeroed ranges, a new tail and the new file header. In memory for callers
//! holding the input ([`Rewrite::to_vec`]); from file to file for the streaming split
//! ([`Rewrite::write_file`]), where the kept ranges (almost the whole host part) are copied by
//! the kernel with `copy_file_range` when the file system supports it, so they never pass
//! through our memory, and otherwise through one fixed-size buffer.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;

/// The rewritten binary and what was done to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SplitResult {
    pub bytes: Vec<u8>,
    /// Wrappers rewritten to HIPK (wrapper `i` carries index `i`).
    pub wrappers: usize,
    /// Dynamic relocations that set a wrapper pointer and now point at the marker.
    pub relocations_rewritten: usize,
    /// File bytes removed (whole pages of device code).
    pub removed: u64,
    /// Size of the original `.hip_fatbin` section.
    pub device_code: u64,
    /// Where the marker is loaded (before relocation by the load bias).
    pub marker_vaddr: u64,
}

/// How the rewritten binary is made from the input. Offsets are output offsets unless named
/// otherwise.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rewrite {
    /// (input offset, length, output offset) of the input ranges kept, in output order.
    pub copies: Vec<(u64, u64, u64)>,
    /// (input offset, bytes) written over the kept ranges: wrappers and relocations.
    pub patches: Vec<(u64, Vec<u8>)>,
    /// (offset, length) zeroed after the patches: the partial pages of device code left.
    pub zeros: Vec<(u64, u64)>,
    /// Where `tail` starts: right after the kept ranges.
    pub tail_at: u64,
    pub tail: Vec<u8>,
    /// The new ELF file header, written last at offset 0.
    pub header: [u8; 64],
    pub wrappers: usize,
    pub relocations_rewritten: usize,
    pub removed: u64,
    pub device_code: u64,
    pub marker_vaddr: u64,
}

/// Copies go through a buffer of this size when `copy_file_range` cannot be used.
const COPY_CHUNK: usize = 1 << 20;

impl Rewrite {
    /// Size of the rewritten binary.
    pub fn len(&self) -> u64 {
        self.tail_at + self.tail.len() as u64
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The parts of input range `[at, at + len)` that are kept: (input offset, length, output
    /// offset) each.
    fn kept(&self, at: u64, len: u64) -> impl Iterator<Item = (u64, u64, u64)> + '_ {
        self.copies.iter().filter_map(move |&(src, n, dst)| {
            let lo = at.max(src);
            let hi = (at + len).min(src + n);
            (lo < hi).then(|| (lo, hi - lo, dst + (lo - src)))
        })
    }

    /// The rewritten binary, from the whole input in memory.
    pub fn to_vec(&self, input: &[u8]) -> Vec<u8> {
        let mut out = vec![0u8; self.len() as usize];
        for &(src, n, dst) in &self.copies {
            out[dst as usize..(dst + n) as usize]
                .copy_from_slice(&input[src as usize..(src + n) as usize]);
        }
        for (at, bytes) in &self.patches {
            for (src, n, dst) in self.kept(*at, bytes.len() as u64) {
                let from = (src - at) as usize;
                out[dst as usize..(dst + n) as usize]
                    .copy_from_slice(&bytes[from..from + n as usize]);
            }
        }
        for &(at, n) in &self.zeros {
            out[at as usize..(at + n) as usize].fill(0);
        }
        out[self.tail_at as usize..].copy_from_slice(&self.tail);
        out[..self.header.len()].copy_from_slice(&self.header);
        out
    }

    /// Writes the rewritten binary to `out` (an empty file) from the input file, reading only
    /// what is kept.
    pub fn write_file(&self, input: &File, out: &File) -> io::Result<()> {
        let mut buf = Vec::new();
        for &(src, n, dst) in &self.copies {
            copy_range(input, src, out, dst, n, &mut buf)?;
        }
        for (at, bytes) in &self.patches {
            for (src, n, dst) in self.kept(*at, bytes.len() as u64) {
                let from = (src - at) as usize;
                out.write_all_at(&bytes[from..from + n as usize], dst)?;
            }
        }
        for &(at, n) in &self.zeros {
            let zeros = vec![0u8; (n as usize).min(COPY_CHUNK)];
            let mut done = 0;
            while done < n {
                let k = (n - done).min(zeros.len() as u64) as usize;
                out.write_all_at(&zeros[..k], at + done)?;
                done += k as u64;
            }
        }
        out.write_all_at(&self.tail, self.tail_at)?;
        out.write_all_at(&self.header, 0)?;
        Ok(())
    }

    /// The summary callers report, with the output bytes when they were made in memory.
    pub fn into_result(self, bytes: Vec<u8>) -> SplitResult {
        SplitResult {
            bytes,
            wrappers: self.wrappers,
            relocations_rewritten: self.relocations_rewritten,
            removed: self.removed,
            device_code: self.device_code,
            marker_vaddr: self.marker_vaddr,
        }
    }
}

/// Copies a whole file of `len` bytes (a binary without device code) to `out`.
pub fn copy_file(input: &File, out: &File, len: u64) -> io::Result<()> {
    copy_range(input, 0, out, 0, len, &mut Vec::new())
}

/// Copies `len` bytes at `src` of `input` to `dst` of `out`: by `copy_file_range` (which may
/// share extents on file systems that can), else through `buf`. An input that ends early (it
/// changed under us) is an error, never a short output.
fn copy_range(
    input: &File,
    src: u64,
    out: &File,
    dst: u64,
    len: u64,
    buf: &mut Vec<u8>,
) -> io::Result<()> {
    let (mut done, mut kernel_copy) = (0u64, true);
    while done < len {
        let want = (len - done).min(1 << 30) as usize;
        if kernel_copy {
            let mut off_in = (src + done) as libc::loff_t;
            let mut off_out = (dst + done) as libc::loff_t;
            // SAFETY: both descriptors are open for the duration of the call and the offsets
            // are passed by pointer to locals; the call reads and writes only file data.
            let n = unsafe {
                libc::copy_file_range(
                    input.as_raw_fd(),
                    &mut off_in,
                    out.as_raw_fd(),
                    &mut off_out,
                    want,
                    0,
                )
            };
            if n > 0 {
                done += n as u64;
                continue;
            }
            if n == 0 {
                return Err(input_ended());
            }
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EXDEV | libc::ENOSYS | libc::EOPNOTSUPP | libc::EINVAL)
                | Some(libc::EBADF | libc::EPERM | libc::ETXTBSY) => kernel_copy = false,
                Some(libc::EINTR) => {}
                _ => return Err(e),
            }
            continue;
        }
        buf.resize(COPY_CHUNK, 0);
        let k = want.min(COPY_CHUNK);
        let got = read_full_at(input, &mut buf[..k], src + done)?;
        if got < k {
            return Err(input_ended());
        }
        out.write_all_at(&buf[..k], dst + done)?;
        done += k as u64;
    }
    Ok(())
}

fn input_ended() -> io::Error {
    io::Error::new(
        io::ErrorKind::UnexpectedEof,
        "the input binary became shorter while being split",
    )
}

/// Reads until `buf` is full or the file ends; returns the bytes read.
fn read_full_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    crate::bytes::read_full_with(|b, at| file.read_at(b, at), buf, offset)
}
