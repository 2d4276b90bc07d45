//! Core benchmark: get-kernel throughput (1 and 2 threads) against plain zstd decoding of the
//! same frames, the open time of a 100,000-entry archive, and what opening a ~200 MB archive
//! costs: the share of the file in the page cache after a cold open and close (archives we write
//! and reference-layout ones), and a warm open against reading the file. Every figure is a ratio
//! against a baseline measured in the same run, so machine speed and load cancel out.
//!
//! Run: `cargo bench --bench core` (full) or `cargo bench --bench core -- --quick` (CI smoke).

#[path = "common/mod.rs"]
mod common;
use common::{CodeLike, Rounds, Sense, best_of, kernel_bytes};

use std::hint::black_box;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rocm_kpack::{Archive, ArchiveWriter, Compression};

fn mbps(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / d.as_secs_f64() / 1e6
}

struct Row {
    name: String,
    value: String,
    /// (ratio, what it is against, target): the target is a bound such as ">= 0.95" or
    /// "<= 0.02", or empty for an informative ratio.
    ratio: Option<(f64, &'static str, &'static str, Sense)>,
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let (total, runs, entries) = if quick {
        (8 << 20, 2, 10_000)
    } else {
        (96 << 20, 5, 100_000)
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let mut rows = Vec::new();

    // Kernels of 20 KB to 2 MB, one zstd-3 archive.
    let mut kernels = Vec::new();
    let mut sum = 0usize;
    let mut i = 0u64;
    let mut code = CodeLike::new(42);
    while sum < total {
        let len = 20_000 + (i as usize * 7919 * 4099) % 2_000_000;
        kernels.push((format!("lib/libbench{}.so#0", i), code.kernel(len)));
        sum += len;
        i += 1;
    }
    let path = dir.path().join("bench.kpack");
    let mut w = ArchiveWriter::new(
        "bench",
        "gfx942",
        vec!["gfx942".into()],
        Compression::Zstd { level: 3 },
    )
    .unwrap();
    for (k, d) in &kernels {
        w.add_kernel(k, "gfx942", d.clone()).unwrap();
    }
    w.write(&path, &|_| {}).unwrap();
    let archive = Arc::new(Archive::open(&path).unwrap());
    let bytes: u64 = kernels.iter().map(|(_, d)| d.len() as u64).sum();
    let stored = std::fs::metadata(&path).unwrap().len();

    // Baseline: the same frames, already in memory, decoded in a loop by one context.
    let frames: Vec<(Vec<u8>, usize)> = kernels
        .iter()
        .map(|(k, d)| {
            let r = archive.locate(k, "gfx942").unwrap();
            let mut f = vec![0u8; r.stored.size as usize];
            use std::os::unix::fs::FileExt;
            std::fs::File::open(&path)
                .unwrap()
                .read_exact_at(&mut f, r.stored.offset)
                .unwrap();
            (f, d.len())
        })
        .collect();
    let mut dctx = zstd::zstd_safe::DCtx::create();
    let mut out = vec![0u8; 2_100_000];
    let mut raw = || {
        let t = Instant::now();
        for (f, n) in &frames {
            let got = dctx.decompress(&mut out[..*n], f).unwrap();
            black_box(got);
        }
        t.elapsed()
    };
    // The floor of any reader that checks every decode: the same decodes with the
    // BLAKE3 of each frame and nothing else.
    let mut hashed_dctx = zstd::zstd_safe::DCtx::create();
    let mut hashed_out = vec![0u8; 2_100_000];
    let mut hashed = || {
        let (dctx, out) = (&mut hashed_dctx, &mut hashed_out);
        let t = Instant::now();
        for (f, n) in &frames {
            black_box(blake3::hash(f));
            let got = dctx.decompress(&mut out[..*n], f).unwrap();
            black_box(got);
        }
        t.elapsed()
    };
    let mut one = || {
        let t = Instant::now();
        for (k, _) in &kernels {
            black_box(archive.get_kernel(k, "gfx942").unwrap());
        }
        t.elapsed()
    };
    let mut two = || {
        let t = Instant::now();
        std::thread::scope(|s| {
            for part in 0..2 {
                let archive = &archive;
                let kernels = &kernels;
                s.spawn(move || {
                    for (k, _) in kernels.iter().skip(part).step_by(2) {
                        black_box(archive.get_kernel(k, "gfx942").unwrap());
                    }
                    // Each thread does the whole set once more offset by one, so both threads
                    // decode the same total as the single-thread run did twice.
                    for (k, _) in kernels.iter().skip(1 - part).step_by(2) {
                        black_box(archive.get_kernel(k, "gfx942").unwrap());
                    }
                });
            }
        });
        // Twice the set in this time: halved, it compares with the others' times directly.
        t.elapsed() / 2
    };
    // In turn within each round; ratios are medians of the ratios within a round.
    let (raw_i, one_i, two_i, hashed_i) = (0, 1, 2, 3);
    let mut rounds = Rounds::new(4);
    for round in 0..runs * 3 {
        for i in rounds.order(round).collect::<Vec<_>>() {
            let f: &mut dyn FnMut() -> Duration = match i {
                0 => &mut raw,
                1 => &mut one,
                2 => &mut two,
                _ => &mut hashed,
            };
            let t = f();
            rounds.push(i, t);
        }
    }
    let rate_raw = mbps(bytes, rounds.best(raw_i));
    let rate_one = mbps(bytes, rounds.best(one_i));
    let rate_two = mbps(bytes, rounds.best(two_i));
    rows.push(Row {
        name: format!(
            "plain zstd decode ({} kernels, {:.1} MB)",
            kernels.len(),
            bytes as f64 / 1e6
        ),
        value: format!("{rate_raw:.0} MB/s"),
        ratio: None,
    });
    rows.push(Row {
        name: "get_kernel, 1 thread".into(),
        value: format!("{rate_one:.0} MB/s"),
        ratio: Some((
            rounds.median_ratio(one_i, raw_i),
            "plain zstd",
            ">= 0.95",
            Sense::Faster,
        )),
    });
    rows.push(Row {
        name: "  floor: plain zstd + frame BLAKE3, 1 thread".into(),
        value: format!("{:.0} MB/s", mbps(bytes, rounds.best(hashed_i))),
        ratio: Some((
            rounds.median_ratio(hashed_i, raw_i),
            "plain zstd",
            "",
            Sense::Faster,
        )),
    });
    rows.push(Row {
        name: "get_kernel, 2 threads".into(),
        value: format!("{rate_two:.0} MB/s"),
        ratio: Some((
            rounds.median_ratio(two_i, one_i),
            "1 thread",
            ">= 1.8",
            Sense::Faster,
        )),
    });
    rows.push(Row {
        name: "archive size / input".into(),
        value: format!("{stored} B"),
        ratio: Some((stored as f64 / bytes as f64, "input", "", Sense::Size)),
    });

    // Open time of an archive with many 1 KiB entries, file in the page cache.
    let big = dir.path().join("many.kpack");
    let mut w = ArchiveWriter::new(
        "bench",
        "gfx942",
        vec!["gfx942".into()],
        Compression::Zstd { level: 3 },
    )
    .unwrap();
    for e in 0..entries {
        w.add_kernel(
            &format!("lib/dir{}/libk{e}.so#0", e % 100),
            "gfx942",
            kernel_bytes(e as u64, 1024),
        )
        .unwrap();
    }
    w.write(&big, &|_| {}).unwrap();
    let _ = std::fs::read(&big);
    let open = best_of(runs, || {
        let t = Instant::now();
        black_box(Archive::open(&big).unwrap());
        t.elapsed()
    });
    let read_file = best_of(runs, || {
        let t = Instant::now();
        black_box(std::fs::read(&big).unwrap());
        t.elapsed()
    });
    rows.push(Row {
        name: format!(
            "open, {entries} entries ({} KB file)",
            std::fs::metadata(&big).unwrap().len() / 1000
        ),
        value: format!("{:.1} ms", open.as_secs_f64() * 1e3),
        ratio: Some((
            open.as_secs_f64() / read_file.as_secs_f64(),
            "reading the file",
            "",
            Sense::Time,
        )),
    });

    open_cost(&mut rows, dir.path(), quick, runs);
    drop(archive);
    print_table(&rows, quick, Path::new(&path));
}

/// Incompressible bytes, so that a ~200 MB archive needs only ~200 MB of input.
fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// Opens cold (the file evicted from the page cache) and warm, for an archive with frame
/// positions and for the same kernels in the reference layout.
fn open_cost(rows: &mut Vec<Row>, dir: &Path, quick: bool, runs: usize) {
    // ~777 kernels of 20 KB to ~500 KB, about 200 MB (quick: 8 MB).
    let total: usize = if quick { 8 << 20 } else { 200 << 20 };
    let mut kernels = Vec::new();
    let mut sum = 0;
    let mut i = 0u64;
    while sum < total {
        let len = 20_000 + (i as usize * 7919 * 4099) % 500_000;
        kernels.push((
            format!("lib/librocblas{}.so#0", i / 8),
            format!("gfx{}", 900 + i % 8),
            noise(i, len),
        ));
        sum += len;
        i += 1;
    }
    let arches: Vec<String> = (0..8).map(|a| format!("gfx{}", 900 + a)).collect();
    for reference in [false, true] {
        let path = dir.join(if reference { "ref.kpack" } else { "ours.kpack" });
        let mut w = ArchiveWriter::new(
            "bench",
            "gfx9",
            arches.clone(),
            Compression::Zstd { level: 1 },
        )
        .unwrap();
        w.set_reference_layout(reference);
        for (k, a, d) in &kernels {
            w.add_kernel(k, a, d.clone()).unwrap();
        }
        w.write(&path, &|_| {}).unwrap();
        drop(w);
        let len = std::fs::metadata(&path).unwrap().len();
        let layout = if reference {
            "reference layout"
        } else {
            "our layout"
        };

        // Cold: evict the (synced, so clean) file, open + close, count resident pages.
        let resident = (0..runs)
            .map(|_| {
                evict(&path);
                drop(Archive::open(&path).unwrap());
                resident_bytes(&path)
            })
            .min()
            .unwrap();
        rows.push(Row {
            name: format!(
                "cold open+close, {layout} ({} kernels, {} MB)",
                kernels.len(),
                len / 1_000_000
            ),
            value: format!("{} KB cached", resident / 1000),
            ratio: Some((
                resident as f64 / len as f64,
                "file size",
                if reference { "<= 0.05" } else { "<= 0.02" },
                Sense::Size,
            )),
        });

        // Warm: the whole file in the page cache.
        let _ = std::fs::read(&path).unwrap();
        let open = best_of(runs, || {
            let t = Instant::now();
            black_box(Archive::open(&path).unwrap());
            t.elapsed()
        });
        let read = best_of(runs, || {
            let t = Instant::now();
            black_box(std::fs::read(&path).unwrap());
            t.elapsed()
        });
        rows.push(Row {
            name: format!("warm open, {layout}"),
            value: format!("{:.2} ms", open.as_secs_f64() * 1e3),
            ratio: Some((
                open.as_secs_f64() / read.as_secs_f64(),
                "reading the file",
                "<= 0.25",
                Sense::Time,
            )),
        });
        std::fs::remove_file(&path).unwrap();
    }
}

/// Drops a file's pages from the page cache (they are clean: the writer synced the file).
fn evict(path: &Path) {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(path).unwrap();
    // SAFETY: advice on a descriptor we own.
    let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    assert_eq!(rc, 0, "posix_fadvise(DONTNEED)");
}

/// Bytes of the file in the page cache, from `mincore` over a mapping (mapping faults nothing in).
fn resident_bytes(path: &Path) -> u64 {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(path).unwrap();
    let len = f.metadata().unwrap().len() as usize;
    let page = 4096usize;
    let pages = len.div_ceil(page);
    let mut vec = vec![0u8; pages];
    // SAFETY: a read-only private mapping of a file we hold open, unmapped before returning;
    // mincore writes one byte per page into `vec`, which has exactly that many.
    unsafe {
        let addr = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_PRIVATE,
            f.as_raw_fd(),
            0,
        );
        assert_ne!(addr, libc::MAP_FAILED, "mmap");
        let rc = libc::mincore(addr, len, vec.as_mut_ptr());
        libc::munmap(addr, len);
        assert_eq!(rc, 0, "mincore");
    }
    vec.iter().filter(|b| **b & 1 != 0).count() as u64 * page as u64
}

fn print_table(rows: &[Row], quick: bool, _archive: &Path) {
    println!(
        "kpack core benchmark{}",
        if quick { " (quick smoke run)" } else { "" }
    );
    println!(
        "{:<48} {:>14} {:>10}  {}",
        "measurement",
        "value",
        "ratio",
        if quick { "against" } else { "against (target)" }
    );
    for r in rows {
        match r.ratio {
            Some((ratio, against, target, sense)) => {
                // A smoke run is not a measurement: no target, no verdict.
                let verdict = match verdict(ratio, target) {
                    Some(true) => " ok",
                    Some(false) => " MISSED",
                    None => "",
                };
                let target = if target.is_empty() || quick {
                    String::new()
                } else {
                    format!(" ({target}{verdict})")
                };
                println!(
                    "{:<48} {:>14} {:>9.3}x  {against}{target}: {}",
                    r.name,
                    r.value,
                    ratio,
                    common::plainly(ratio, sense)
                );
            }
            None => println!("{:<48} {:>14} {:>10}  baseline", r.name, r.value, "1.00x"),
        }
    }
}

/// Whether `ratio` meets a target written as ">= x" or "<= x"; `None` for no target.
fn verdict(ratio: f64, target: &str) -> Option<bool> {
    let (op, bound) = target.split_once(' ')?;
    let bound: f64 = bound.parse().ok()?;
    match op {
        ">=" => Some(ratio >= bound),
        "<=" => Some(ratio <= bound),
        _ => None,
    }
}
