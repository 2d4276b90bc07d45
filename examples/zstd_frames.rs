//! The floor of a cold read: every zstd frame of an archive, already in memory, decoded on one
//! thread with the zstd this project links, as CPU time per decoded byte. `bench/cold-cpu.sh`
//! sets a mount's cold passes against it.
//!
//!   cargo run --release --example zstd_frames -- ARCHIVE [--write-frames FILE]
//!
//! Prints `bytes N cpu_ns C ns_per_byte X`. With `--write-frames`, also writes the frames one
//! after another to FILE, which `zstd -d` (the system's library) decodes as one stream.

use std::io::Write;
use std::path::PathBuf;

use rocm_kpack::Archive;

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
    let mut args = std::env::args_os().skip(1);
    let Some(archive) = args.next().map(PathBuf::from) else {
        eprintln!("usage: zstd_frames ARCHIVE [--write-frames FILE]");
        std::process::exit(2);
    };
    let write_to = match (args.next(), args.next()) {
        (Some(flag), Some(file)) if flag == "--write-frames" => Some(PathBuf::from(file)),
        (None, None) => None,
        _ => {
            eprintln!("usage: zstd_frames ARCHIVE [--write-frames FILE]");
            std::process::exit(2);
        }
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
