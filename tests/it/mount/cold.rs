//! Cold reads while the kernel is still decoding (serve while filling, on the daemon read path
//! and in page-cache open mode; with passthrough an open waits for the complete file instead):
//! concurrent readers from byte 0, random offsets, `mmap`, daemon handles then passthrough, and
//! a decode that fails part way. Archives without digests stream; scenarios named `cold_*` run in the I/O
//! child and check bytes against the archive API and counters in `user.kpack.stats`.

use std::fs::File;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Barrier};

use rocm_kpack::{Archive, ArchiveWriter, Compression};

use super::scenarios::{stats, wait_released};
use crate::support::mount::{Mount, fuse_available};
use crate::support::xorshift;

/// Bytes that compress about 2x and decode at entropy-coding speed (like code objects, not
/// like runs), so a decode of a few tens of MiB takes long enough to read during it.
pub(super) fn code_like(len: usize, seed: u64) -> Vec<u8> {
    let mut next = xorshift(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    (0..len)
        .map(|_| ((next() >> 60) as u8).wrapping_mul(17))
        .collect()
}

const BIG: usize = 24 << 20;
const KERNELS: [&str; 4] = ["gfx900", "gfx906", "gfx90a", "gfx942"];

/// An archive of four big kernels (`lib/big.so#0`, one per arch in [`KERNELS`]) and a small
/// one, with no digests (`--reference-layout`): they stream.
fn streaming_archive(path: &Path) -> PathBuf {
    let mut arches: Vec<String> = KERNELS.iter().map(|s| s.to_string()).collect();
    arches.push("gfx1100".into());
    let mut w = ArchiveWriter::new("it", "cold", arches, Compression::Zstd { level: 1 }).unwrap();
    w.set_reference_layout(true);
    for (i, arch) in KERNELS.iter().enumerate() {
        w.add_kernel(
            "lib/big.so#0",
            arch,
            code_like(BIG + i * 4099, i as u64 + 1),
        )
        .unwrap();
    }
    w.add_kernel("lib/big.so#0", "gfx1100", code_like(5000, 9))
        .unwrap();
    w.write(path, &|_| {}).unwrap();
    path.to_path_buf()
}

fn want(archive: &Path, arch: &str) -> Vec<u8> {
    Archive::open(archive)
        .unwrap()
        .get_kernel("lib/big.so#0", arch)
        .unwrap()
}

fn path_of(mnt: &Path, arch: &str) -> PathBuf {
    mnt.join("lib/big.so#0").join(format!("{arch}.hsaco"))
}

/// Drops the file's pages from the page cache, so the next reads reach the filesystem.
fn drop_cache(f: &File) {
    // SAFETY: fadvise on a descriptor we hold; no memory is passed.
    let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    assert_eq!(rc, 0);
}

fn read_all(f: &File, len: usize, step: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    let mut at = 0;
    while at < len {
        let n = f
            .read_at(&mut out[at..(at + step).min(len)], at as u64)
            .unwrap();
        assert!(n > 0, "early end of file at {at} of {len}");
        at += n;
    }
    out
}

/// The `cold_*` I/O child scenarios; `arg` names the arch of a cold kernel.
pub fn run(name: &str, mnt: &Path, archive: &Path, arg: &str) {
    let data = match name {
        "cold_eio" => code_like(BIG, 7),
        "cold_refused" => Vec::new(),
        _ => want(archive, arg),
    };
    let path = path_of(mnt, arg);
    let before = stats(mnt);
    match name {
        // Three readers open at once and read from byte 0 to the end.
        "cold_readers" => {
            let data = Arc::new(data);
            let start = Arc::new(Barrier::new(3));
            let threads: Vec<_> = (0..3)
                .map(|t| {
                    let (path, data, start) = (path.clone(), data.clone(), start.clone());
                    std::thread::spawn(move || {
                        start.wait();
                        let mut got = Vec::new();
                        File::open(&path).unwrap().read_to_end(&mut got).unwrap();
                        assert!(got == *data, "reader {t}: {} bytes", got.len());
                    })
                })
                .collect();
            for t in threads {
                t.join().unwrap();
            }
        }
        // Reads at scattered offsets and sizes, the first near the end.
        "cold_random" => {
            let f = File::open(&path).unwrap();
            let mut next = xorshift(0x2545_f491_4f6c_dd1d);
            for i in 0..64 {
                let x = next();
                let off = if i == 0 {
                    data.len() - 1000
                } else {
                    (x % data.len() as u64) as usize
                };
                let mut buf = vec![0u8; 1 + (x >> 40) as usize % (300 << 10)];
                let n = f.read_at(&mut buf, off as u64).unwrap();
                let end = (off + buf.len()).min(data.len());
                assert_eq!(n, end - off, "read of {} at {off}", buf.len());
                assert!(buf[..n] == data[off..end], "bytes at {off}");
            }
        }
        // Maps the file while it decodes and reads the last page first.
        "cold_mmap" => {
            let f = File::open(&path).unwrap();
            // SAFETY: a read-only private mapping of exactly the file's length, of a file we
            // hold open, unmapped below before it is closed.
            unsafe {
                let p = libc::mmap(
                    std::ptr::null_mut(),
                    data.len(),
                    libc::PROT_READ,
                    libc::MAP_SHARED,
                    f.as_raw_fd(),
                    0,
                );
                assert_ne!(p, libc::MAP_FAILED);
                let mapped = std::slice::from_raw_parts(p.cast::<u8>(), data.len());
                let last = data.len() - 100;
                assert!(mapped[last..] == data[last..], "last bytes");
                assert!(mapped == &data[..], "mapped bytes differ");
                libc::munmap(p, data.len());
            }
        }
        // A handle opened while decoding, a second one opened while the first is open (both
        // in page-cache mode), then, once both are released, a passthrough one.
        "cold_modes" => {
            let a = File::open(&path).unwrap();
            let mut head = [0u8; 4096];
            a.read_exact_at(&mut head, 0).unwrap();
            assert!(head[..] == data[..4096]);
            // Reading all of it waits for the end of the decode.
            assert!(read_all(&a, data.len(), 1 << 20) == data);
            let b = File::open(&path).unwrap();
            drop_cache(&b);
            assert!(read_all(&b, data.len(), 128 << 10) == data, "second handle");
            drop((a, b));
            // The third open is a passthrough candidate only once the daemon has seen both
            // handles go.
            wait_released(mnt);
            let c = File::open(&path).unwrap();
            drop_cache(&c);
            let reads = stats(mnt)["daemon_reads"];
            assert!(read_all(&c, data.len(), 128 << 10) == data, "third handle");
            let after = stats(mnt);
            if after["passthrough"] == 1 {
                assert_eq!(
                    after["daemon_reads"], reads,
                    "the third handle is passthrough"
                );
            } else {
                assert!(after["daemon_reads"] > reads);
            }
        }
        // A kernel whose frame fails its digest, or, with passthrough (where an open waits for
        // the whole file), one whose decode fails part way: the open fails with EIO (twice: a
        // failure is not kept) and no read of it ever reached the daemon.
        "cold_refused" | "cold_eio" if name == "cold_refused" || before["passthrough"] == 1 => {
            for _ in 0..2 {
                let e = File::open(&path).map(|_| ()).unwrap_err();
                assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
            }
            let after = stats(mnt);
            assert_eq!(after["decodes"] - before["decodes"], 2);
            assert_eq!(after["daemon_reads"], before["daemon_reads"]);
            assert_eq!(
                after["reads_while_decoding"],
                before["reads_while_decoding"]
            );
            return;
        }
        // The decode fails part way on the daemon read path: reads reaching the damage get
        // EIO (the bytes before it may have been served: the archive has no digest to check
        // them against), at once and again later; a new open decodes again and fails the same
        // way.
        "cold_eio" => {
            for round in 0..2 {
                let f = File::open(&path).unwrap();
                let failed_at = read_until_error(&f, &data);
                let mut buf = vec![0u8; 4096];
                let again = f.read_at(&mut buf, failed_at).unwrap_err();
                assert_eq!(again.raw_os_error(), Some(libc::EIO), "round {round}");
            }
            let after = stats(mnt);
            assert_eq!(after["decodes"] - before["decodes"], 2);
            return;
        }
        other => panic!("unknown scenario {other}"),
    }
    let after = stats(mnt);
    println!("stats before {before:?}\nafter {after:?}");
    assert_eq!(after["decodes"] - before["decodes"], 1, "one decode");
    if after["passthrough"] == 1 {
        for counter in ["reads_while_decoding", "opens_while_decoding"] {
            assert_eq!(
                after[counter], before[counter],
                "{counter}: a passthrough open waits for the complete file"
            );
        }
    } else {
        assert!(
            after["reads_while_decoding"] > before["reads_while_decoding"],
            "some read was served while the kernel decoded"
        );
    }
}

/// Reads `f` in 1 MiB steps until a read fails, which must be with EIO before the end;
/// every byte read before must be right. Returns the offset of the failed read.
fn read_until_error(f: &File, data: &[u8]) -> u64 {
    let mut buf = vec![0u8; 1 << 20];
    let mut at = 0usize;
    loop {
        match f.read_at(&mut buf, at as u64) {
            Ok(0) => panic!("read to the end of a kernel that cannot decode"),
            Ok(n) => {
                assert!(buf[..n] == data[at..at + n], "bytes at {at}");
                at += n;
            }
            Err(e) => {
                assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
                return at as u64;
            }
        }
    }
}

/// An archive without digests of one kernel whose frame is damaged near its end: the header
/// of a block past 90% of the frame is given the reserved block type, which zstd refuses there
/// (after decoding everything before it).
fn damaged_archive(path: &Path) -> Vec<u8> {
    let data = code_like(BIG, 7);
    let mut w = ArchiveWriter::new(
        "it",
        "cold",
        vec!["gfx942".into()],
        Compression::Zstd { level: 1 },
    )
    .unwrap();
    w.set_reference_layout(true);
    w.add_kernel("lib/big.so#0", "gfx942", data.clone())
        .unwrap();
    let mut bytes = Vec::new();
    w.write_to(&mut bytes, &|_| {}).unwrap();
    // The blob of zstd frames starts at 64 with a frame count; the first frame's size word
    // follows, then the frame.
    let size = u32::from_le_bytes(bytes[68..72].try_into().unwrap()) as usize;
    let frame = 72..72 + size;
    // Frame header: magic, descriptor, then window, dictionary id and content size fields.
    let fhd = bytes[frame.start + 4];
    let single = (fhd >> 5) & 1 == 1;
    let fcs = match fhd >> 6 {
        0 => usize::from(single),
        1 => 2,
        2 => 4,
        _ => 8,
    };
    let dict = [0, 1, 2, 4][usize::from(fhd & 3)];
    let mut at = frame.start + 5 + usize::from(!single) + dict + fcs;
    loop {
        let h = u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], 0]);
        let (last, kind, len) = (h & 1 == 1, (h >> 1) & 3, (h >> 3) as usize);
        assert!(!last, "no block past 90% of the frame");
        if at - frame.start > size * 9 / 10 {
            bytes[at] |= 3 << 1;
            break;
        }
        at += 3 + if kind == 1 { 1 } else { len };
    }
    assert!(zstd::bulk::decompress(&bytes[frame], BIG + 1).is_err());
    std::fs::write(path, &bytes).unwrap();
    data
}

#[test]
fn cold_reads_are_served_while_the_kernel_decodes() {
    if !fuse_available() {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let archive = streaming_archive(&d.path().join("cold.kpack"));
    let cache = d.path().join("cache");
    let modes: &[&[&str]] = &[
        &[],
        &["--no-passthrough"],
        &["--backing", "memory"],
        &["--cache-dir", cache.to_str().unwrap()],
        // No OPEN reaches the daemon: READs by inode join the decode job the same way.
        &["--open-mode", "page-cache"],
    ];
    for extra in modes {
        // Each scenario counts the one decode of its kernel: none may be decoded ahead of it
        // (tested in `ahead.rs`).
        let mut args = extra.to_vec();
        args.push("--no-decode-ahead");
        let m = Mount::start(&archive, &args);
        let scenarios = ["cold_readers", "cold_random", "cold_mmap", "cold_modes"];
        for (scenario, arch) in scenarios.iter().zip(KERNELS) {
            m.check(scenario, arch);
        }
        m.stop();
    }
}

#[test]
fn a_decode_failing_part_way_is_eio_for_every_reader() {
    if !fuse_available() {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let archive = d.path().join("bad.kpack");
    damaged_archive(&archive);
    let cache = d.path().join("cache");
    let modes: &[&[&str]] = &[&[], &["--cache-dir", cache.to_str().unwrap()]];
    for extra in modes {
        let m = Mount::start(&archive, extra);
        m.check("cold_eio", "gfx942");
        let log = m.daemon_log();
        assert!(log.contains("lib/big.so#0 [gfx942]"), "{log}");
        m.stop();
    }
    // Nothing of the failed decodes stays in the cache directory.
    let left: Vec<_> = walkdir(&cache.join("kpack-v1"));
    assert!(left.is_empty(), "{left:?}");
}

fn walkdir(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if e.file_type().unwrap().is_dir() {
            out.extend(walkdir(&e.path()));
        } else {
            out.push(e.path());
        }
    }
    out
}

#[test]
fn kernels_with_a_frame_digest_stream_once_it_matched_and_a_bad_frame_serves_nothing() {
    if !fuse_available() {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    // Our writer's layout: `blake3` and `frame_blake3` on every entry.
    let good = d.path().join("good.kpack");
    let mut w = ArchiveWriter::new(
        "it",
        "cold",
        vec!["gfx942".into()],
        Compression::Zstd { level: 1 },
    )
    .unwrap();
    w.add_kernel("lib/big.so#0", "gfx942", code_like(BIG, 3))
        .unwrap();
    w.write(&good, &|_| {}).unwrap();
    assert!(
        Archive::open(&good)
            .unwrap()
            .locate("lib/big.so#0", "gfx942")
            .unwrap()
            .frame_digest
            .is_some()
    );
    let m = Mount::start(&good, &[]);
    m.check("cold_readers", "gfx942");
    m.stop();

    // One byte of the frame flipped (it still decodes, to other bytes): refused before any
    // byte is decoded or served.
    let bad = d.path().join("bad.kpack");
    let kernels = [
        ("lib/big.so#0", "gfx942", super::pattern(1 << 20, 3)),
        ("lib/big.so#0", "gfx900", super::pattern(5000, 4)),
    ];
    let bytes = crate::support::craft::flipped_archive(Compression::Zstd { level: 3 }, &kernels, 0);
    std::fs::write(&bad, bytes).unwrap();
    // Its kernels are small: the open mode is asked for, since page-cache mode opens nothing.
    let m = Mount::start(&bad, &["--open-mode", "daemon"]);
    m.check("cold_refused", "gfx942");
    m.check("walk_one", "lib/big.so#0/gfx900.hsaco");
    let log = m.daemon_log();
    assert!(
        log.contains("lib/big.so#0 [gfx942]") && log.contains("compressed frame's bytes hash to"),
        "{log}"
    );
    m.stop();
}
