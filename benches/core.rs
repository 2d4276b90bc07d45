//! Core benchmark: get-kernel throughput (1 and 2 threads) against plain zstd decoding of the
//! same frames, and the open time of a 100,000-entry archive. Every figure is a ratio against a
//! baseline measured in the same run, so machine speed and load cancel out.
//!
//! Run: `cargo bench --bench core` (full) or `cargo bench --bench core -- --quick` (CI smoke).

#[path = "common/mod.rs"]
mod common;
use common::{best_of, kernel_bytes};

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
    ratio: Option<(f64, &'static str, f64)>,
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
    while sum < total {
        let len = 20_000 + (i as usize * 7919 * 4099) % 2_000_000;
        kernels.push((format!("lib/libbench{}.so#0", i), kernel_bytes(i, len)));
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
    let raw = best_of(runs, || {
        let t = Instant::now();
        for (f, n) in &frames {
            let got = dctx.decompress(&mut out[..*n], f).unwrap();
            black_box(got);
        }
        t.elapsed()
    });

    let one = best_of(runs, || {
        let t = Instant::now();
        for (k, _) in &kernels {
            black_box(archive.get_kernel(k, "gfx942").unwrap());
        }
        t.elapsed()
    });
    let two = best_of(runs, || {
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
        t.elapsed()
    });
    // `two` decoded the set twice (once per thread pair of halves): compare rates.
    let rate_raw = mbps(bytes, raw);
    let rate_one = mbps(bytes, one);
    let rate_two = mbps(2 * bytes, two);
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
        ratio: Some((rate_one / rate_raw, "plain zstd", 0.95)),
    });
    rows.push(Row {
        name: "get_kernel, 2 threads".into(),
        value: format!("{rate_two:.0} MB/s"),
        ratio: Some((rate_two / rate_one, "1 thread", 1.8)),
    });
    rows.push(Row {
        name: "archive size / input".into(),
        value: format!("{stored} B"),
        ratio: Some((stored as f64 / bytes as f64, "input", f64::NAN)),
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
            f64::NAN,
        )),
    });

    print_table(&rows, quick, Path::new(&path));
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
            Some((ratio, against, target)) => {
                // A smoke run is not a measurement: no target, no verdict.
                let target = if target.is_nan() || quick {
                    String::new()
                } else {
                    format!(" (>= {target})")
                };
                println!(
                    "{:<48} {:>14} {:>9.2}x  {against}{target}",
                    r.name, r.value, ratio
                );
            }
            None => println!("{:<48} {:>14} {:>10}  baseline", r.name, r.value, "1.00x"),
        }
    }
}
