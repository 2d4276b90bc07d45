//! The floor of a cold read: every zstd frame of an archive, already in memory, decoded on one
//! thread with the zstd this project links, as CPU time per decoded byte. `bench/cold-cpu.sh`
//! sets a mount's cold passes against it.
//!
//!   cargo run --release --example zstd_frames -- ARCHIVE [--write-frames FILE]
//!   cargo run --release --example zstd_frames -- ARCHIVE --page-cache DIR [--piece BYTES]
//!
//! Prints `bytes N cpu_ns C ns_per_byte X`. With `--write-frames`, also writes the frames one
//! after another to FILE, which `zstd -d` (the system's library) decodes as one stream.
//!
//! With `--page-cache DIR`, measures instead what holding the decoded kernels in the page cache
//! costs beyond decoding them, the way the mount's backing files do it: each kernel written
//! into a new unlinked file in DIR (space reserved with `fallocate`, then written in pieces of
//! the mount's `WRITE_PIECE`, or of `--piece` bytes), then every file read back in 128 KiB
//! reads, as `cat` reads. Prints `bytes N fill_ns_per_byte F read_ns_per_byte R`: this
//! thread's CPU time (user and system) of each phase, not counting the decoding. Run it on a
//! dropped page cache to see a cold pass's cost.

use std::fs::File;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use rocm_kpack::Archive;
use rocm_kpack::fs::store::WRITE_PIECE;

#[path = "../benches/common/mod.rs"]
mod common;

/// This thread's CPU time so far, in nanoseconds.
fn thread_cpu_ns() -> u128 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid timespec for the call to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    t.tv_sec as u128 * 1_000_000_000 + t.tv_nsec as u128
}

fn main() {
    const USAGE: &str =
        "usage: zstd_frames ARCHIVE [--write-frames FILE | --page-cache DIR [--piece BYTES]]";
    let usage = || -> ! {
        eprintln!("{USAGE}");
        std::process::exit(2);
    };
    let mut args = std::env::args_os().skip(1);
    let Some(archive) = args.next().map(PathBuf::from) else {
        usage()
    };
    let rest: Vec<_> = args.collect();
    let rest: Vec<&str> = rest
        .iter()
        .map(|a| a.to_str().unwrap_or_else(|| usage()))
        .collect();
    let (write_to, page_cache) = match rest[..] {
        ["--write-frames", file] => (Some(PathBuf::from(file)), None),
        ["--page-cache", dir] => (None, Some((PathBuf::from(dir), WRITE_PIECE))),
        ["--page-cache", dir, "--piece", n] => match n.parse::<usize>() {
            Ok(piece) if piece > 0 => (None, Some((PathBuf::from(dir), piece))),
            _ => usage(),
        },
        [] => (None, None),
        _ => usage(),
    };
    let a = Archive::open(&archive).unwrap_or_else(|e| {
        eprintln!("zstd_frames: {e}");
        std::process::exit(3);
    });
    if a.scheme() != rocm_kpack::Scheme::ZstdPerKernel {
        eprintln!(
            "zstd_frames: {}: not an archive of zstd frames",
            archive.display()
        );
        std::process::exit(4);
    }
    let frames = common::frames_in_memory(&a);
    if let Some(path) = &write_to {
        let mut out = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
        for (frame, _) in &frames {
            out.write_all(frame).unwrap();
        }
        out.flush().unwrap();
    }
    let largest = frames.iter().map(|(_, n)| *n).max().unwrap_or(0);
    let mut out = vec![0u8; largest];
    let mut dctx = zstd::zstd_safe::DCtx::create();
    if let Some((dir, piece)) = page_cache {
        page_cache_cost(&dir, piece, &frames, &mut out, &mut dctx);
        return;
    }
    let start = thread_cpu_ns();
    let mut bytes = 0u64;
    for (frame, size) in &frames {
        bytes += dctx
            .decompress(&mut out[..*size], frame)
            .unwrap_or_else(|e| panic!("a frame does not decode: {e}")) as u64;
    }
    let cpu = thread_cpu_ns() - start;
    println!(
        "bytes {bytes} cpu_ns {cpu} ns_per_byte {:.3}",
        cpu as f64 / bytes.max(1) as f64
    );
}

/// The `--page-cache` measure: the CPU time of filling a new file per kernel and of reading the
/// files back, each over the decoded bytes (decoding itself not counted).
fn page_cache_cost(
    dir: &Path,
    piece: usize,
    frames: &[(Vec<u8>, usize)],
    out: &mut [u8],
    dctx: &mut zstd::zstd_safe::DCtx<'_>,
) {
    const READ: usize = 128 << 10;
    let mut files = Vec::with_capacity(frames.len());
    let (mut fill, mut bytes) = (0u128, 0u64);
    for (frame, size) in frames {
        let kernel = &mut out[..*size];
        dctx.decompress(kernel, frame)
            .unwrap_or_else(|e| panic!("a frame does not decode: {e}"));
        let start = thread_cpu_ns();
        let file = File::options()
            .read(true)
            .write(true)
            .custom_flags(libc::O_TMPFILE)
            .open(dir)
            .unwrap_or_else(|e| panic!("cannot make a file in {}: {e}", dir.display()));
        // SAFETY: fallocate on a descriptor we own, with integer arguments.
        let reserved = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, *size as libc::off_t) };
        assert_eq!(
            reserved,
            0,
            "fallocate: {}",
            std::io::Error::last_os_error()
        );
        for (i, bytes) in kernel.chunks(piece).enumerate() {
            file.write_all_at(bytes, (i * piece) as u64).unwrap();
        }
        fill += thread_cpu_ns() - start;
        bytes += *size as u64;
        files.push(file);
    }
    let mut buf = vec![0u8; READ];
    let start = thread_cpu_ns();
    for file in &files {
        let mut at = 0u64;
        loop {
            let n = file.read_at(&mut buf, at).unwrap();
            if n == 0 {
                break;
            }
            at += n as u64;
        }
    }
    let read = thread_cpu_ns() - start;
    let per_byte = |ns: u128| ns as f64 / bytes.max(1) as f64;
    println!(
        "bytes {bytes} fill_ns_per_byte {:.3} read_ns_per_byte {:.3}",
        per_byte(fill),
        per_byte(read)
    );
}
