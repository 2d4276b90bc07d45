//! Split benchmark on Debian's `librocrand.so.1.1` (fetched by `bench/fetch-rocrand.sh`): the
//! time of `kpack-fuse split` against a plain `kpack-fuse pack --from-fatbin` import of the same
//! binary (both write the same zstd-3 per-arch archives; split also rewrites the ELF file), the
//! time of `split_binary` alone (code objects extracted and ELF rewritten in memory, no
//! compression, no I/O), and the sizes: the rewritten binary against the original, and
//! the file bytes removed against the size of `.hip_fatbin`.
//!
//! Run: `cargo bench --bench split` (full: median of 5 runs after a warm-up) or
//! `cargo bench --bench split -- --quick` (one run). Skips, with a message, when the rocRAND
//! data has not been fetched. Data: `bench/data/` or `$KPACK_BENCH_DATA`, as the fetch script.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rocm_kpack::split;

const LIB: &str = "rocrand/usr/lib/x86_64-linux-gnu/librocrand.so.1.1";

fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_kpack-fuse"))
}

fn data_dir() -> PathBuf {
    std::env::var_os("KPACK_BENCH_DATA")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/data"))
}

fn timed(cmd: &mut Command) -> Duration {
    let t = Instant::now();
    let out = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .expect("spawn kpack-fuse");
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    t.elapsed()
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// Total size of the regular files in `dir`.
fn dir_size(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap())
        .filter(|m| m.is_file())
        .map(|m| m.len())
        .sum()
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let so = data_dir().join(LIB);
    if !so.is_file() {
        println!(
            "split benchmark SKIPPED: {} is absent (run bench/fetch-rocrand.sh first)",
            so.display()
        );
        return;
    }
    // Debian's layout: the root is usr/, the kernel name lib/x86_64-linux-gnu/librocrand.so.1.1.
    let root = so
        .ancestors()
        .nth(3)
        .expect("usr/lib/x86_64-linux-gnu/<lib>")
        .to_path_buf();
    let kernel_name = "lib/x86_64-linux-gnu/librocrand.so.1.1";
    let work = tempfile::tempdir().expect("temp dir");
    let runs = if quick { 1 } else { 5 };
    let original = std::fs::read(&so).unwrap();

    let split_cmd = |n: usize| {
        let mut c = Command::new(bin());
        c.arg("split")
            .arg(&so)
            .arg("--root")
            .arg(&root)
            .args(["--prefix", "rocrand", "-o"])
            .arg(work.path().join(format!("split{n}")));
        c
    };
    let import_cmd = |n: usize| {
        let mut c = Command::new(bin());
        c.args(["pack", "--from-fatbin"])
            .arg(&so)
            .arg("--root")
            .arg(&root)
            .args(["--prefix", "rocrand", "-o"])
            .arg(work.path().join(format!("import{n}")));
        c
    };
    if !quick {
        // Warm the page cache and the binary.
        timed(&mut split_cmd(100));
        timed(&mut import_cmd(100));
    }
    let mut split_times = Vec::new();
    let mut import_times = Vec::new();
    let mut rewrite_times = Vec::new();
    let mut result = None;
    for n in 0..runs {
        split_times.push(timed(&mut split_cmd(n)));
        import_times.push(timed(&mut import_cmd(n)));
        let t = Instant::now();
        let s = split::split_binary(&original, kernel_name, "rocrand").expect("rocRAND splits");
        rewrite_times.push(t.elapsed());
        result = Some(s.result);
    }
    let r = result.expect("at least one run");
    let (split_t, import_t, rewrite_t) = (
        median(split_times),
        median(import_times),
        median(rewrite_times),
    );

    let out = work.path().join("split0");
    let after = std::fs::metadata(out.join(kernel_name)).unwrap().len();
    assert_eq!(after, r.bytes.len() as u64, "CLI and library rewrite agree");
    let split_archives = dir_size(&out.join(".kpack"));
    let import_archives = dir_size(&work.path().join("import0"));
    let before = original.len() as u64;
    let ms = |d: Duration| d.as_secs_f64() * 1e3;

    println!(
        "kpack split benchmark{} on {}",
        if quick { " (quick smoke run)" } else { "" },
        so.display()
    );
    println!(
        "  runs: {runs} (median), {} CPUs",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    );
    println!(
        "  split (CLI, rewrite + zstd-3 archives):   {:9.1} ms",
        ms(split_t)
    );
    println!(
        "  pack --from-fatbin (CLI, archives only):   {:9.1} ms",
        ms(import_t)
    );
    println!(
        "  split_binary in process (no I/O, no zstd): {:9.1} ms",
        ms(rewrite_t)
    );
    println!(
        "  split time / import time:                  {:9.3}",
        split_t.as_secs_f64() / import_t.as_secs_f64()
    );
    println!("  binary size before:                        {before:>12} bytes");
    println!("  binary size after:                         {after:>12} bytes");
    println!(
        "  size after / before:                       {:9.3}",
        after as f64 / before as f64
    );
    println!(
        "  .hip_fatbin (device code):                 {:>12} bytes",
        r.device_code
    );
    println!(
        "  file bytes removed:                        {:>12} bytes",
        r.removed
    );
    println!(
        "  removed / device code:                     {:9.5}",
        r.removed as f64 / r.device_code as f64
    );
    println!(
        "  shrink (before - after) / device code:     {:9.5}",
        (before - after) as f64 / r.device_code as f64
    );
    println!("  archives written by split:                 {split_archives:>12} bytes");
    println!("  archives written by pack --from-fatbin:    {import_archives:>12} bytes");
    println!(
        "  (binary after + archives) / before:        {:9.3}",
        (after + split_archives) as f64 / before as f64
    );
}
