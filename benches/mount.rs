//! Mount benchmark, in one run (needs root and /dev/fuse; prints a note and exits otherwise):
//!
//! * cold read of every file through a fresh mount (page cache dropped, daemon cache empty),
//!   2 readers, against the archive API reading the same kernels cold with 2 threads;
//! * warm re-read through the mount (kernel page cache kept by FOPEN_KEEP_CACHE), against
//!   reading the same files extracted to local disk, also warm;
//! * the daemon's peak RSS (VmHWM) after reading a set larger than its cache, against the cache
//!   size.
//!
//! Run: `cargo bench --bench mount` (full) or `cargo bench --bench mount -- --quick` (CI smoke).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rocm_kpack::fs::mountinfo;
use rocm_kpack::{Archive, ArchiveWriter, Compression};

/// Code-like bytes that zstd compresses about 3:1 (same generator as the core benchmark).
fn kernel_bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = move || {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    };
    let vocab: Vec<u32> = (0..64).map(|_| next() as u32).collect();
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        let r = next();
        out.extend_from_slice(&vocab[(r % 64) as usize].to_le_bytes());
        if r & 0x300 == 0 {
            out.extend_from_slice(&((r >> 32) as u32).to_le_bytes());
        }
    }
    out.truncate(len);
    out
}

fn drop_page_cache() -> bool {
    // SAFETY: plain libc call.
    unsafe { libc::sync() };
    std::fs::write("/proc/sys/vm/drop_caches", "3").is_ok()
}

struct Daemon {
    child: Child,
    mountpoint: PathBuf,
}

impl Daemon {
    fn start(archive: &Path, mountpoint: &Path, extra: &[&str]) -> Daemon {
        let child = Command::new(env!("CARGO_BIN_EXE_kpack-fuse"))
            .arg("mount")
            .arg(archive)
            .arg(mountpoint)
            .arg("-f")
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("start kpack-fuse");
        let mountpoint = mountpoint.canonicalize().unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while mountinfo::mount_at(&mountpoint).unwrap().is_none() {
            assert!(Instant::now() < deadline, "mount did not come up");
            std::thread::sleep(Duration::from_millis(10));
        }
        Daemon { child, mountpoint }
    }

    /// Peak resident set of the daemon, in bytes.
    fn peak_rss(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .unwrap_or(0)
            * 1024
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        // SAFETY: signalling the child we started.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
        if mountinfo::mount_at(&self.mountpoint)
            .ok()
            .flatten()
            .is_some()
        {
            let c = std::ffi::CString::new(self.mountpoint.to_str().unwrap()).unwrap();
            // SAFETY: valid path.
            unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
        }
    }
}

/// Reads every file with 2 threads (interleaved halves); returns the elapsed time.
fn read_files_2(paths: &[PathBuf]) -> Duration {
    let t = Instant::now();
    std::thread::scope(|s| {
        for part in 0..2 {
            s.spawn(move || {
                for p in paths.iter().skip(part).step_by(2) {
                    std::hint::black_box(std::fs::read(p).unwrap());
                }
            });
        }
    });
    t.elapsed()
}

fn mbps(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / d.as_secs_f64() / 1e6
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    // SAFETY: no arguments.
    let root = unsafe { libc::geteuid() } == 0;
    if !root
        || std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/fuse")
            .is_err()
    {
        println!("kpack mount benchmark: skipped (needs root and /dev/fuse)");
        return;
    }
    let (total, runs, cache_mib) = if quick {
        (8usize << 20, 1, 4u64)
    } else {
        (96 << 20, 3, 32)
    };
    let dir = tempfile::tempdir().unwrap();

    let mut kernels = Vec::new();
    let mut sum = 0;
    let mut i = 0u64;
    while sum < total {
        let len = 20_000 + (i as usize * 7919 * 4099) % 2_000_000;
        kernels.push((format!("lib/libbench{i}.so#0"), kernel_bytes(i, len)));
        sum += len;
        i += 1;
    }
    let bytes: u64 = kernels.iter().map(|(_, d)| d.len() as u64).sum();
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

    // The same files extracted to local disk.
    let local = dir.path().join("local");
    let local_paths: Vec<PathBuf> = kernels
        .iter()
        .map(|(k, d)| {
            let p = local.join(k).join("gfx942.hsaco");
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, d).unwrap();
            p
        })
        .collect();
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let mnt_paths: Vec<PathBuf> = kernels
        .iter()
        .map(|(k, _)| mnt.join(k).join("gfx942.hsaco"))
        .collect();

    let mut dropped = true;
    // Cold direct API, 2 threads.
    let mut api_cold = Duration::MAX;
    for _ in 0..runs {
        dropped &= drop_page_cache();
        let archive = Arc::new(Archive::open(&path).unwrap());
        let t = Instant::now();
        std::thread::scope(|s| {
            for part in 0..2 {
                let (archive, kernels) = (&archive, &kernels);
                s.spawn(move || {
                    for (k, _) in kernels.iter().skip(part).step_by(2) {
                        std::hint::black_box(archive.get_kernel(k, "gfx942").unwrap());
                    }
                });
            }
        });
        api_cold = api_cold.min(t.elapsed());
    }
    // Cold through a fresh mount each run, then warm re-reads on the last one.
    let mut mount_cold = Duration::MAX;
    let mut mount_warm = Duration::MAX;
    for run in 0..runs {
        let daemon = Daemon::start(&path, &mnt, &[]);
        dropped &= drop_page_cache();
        mount_cold = mount_cold.min(read_files_2(&mnt_paths));
        if run + 1 == runs {
            for _ in 0..runs.max(2) {
                mount_warm = mount_warm.min(read_files_2(&mnt_paths));
            }
        }
        drop(daemon);
    }
    read_files_2(&local_paths);
    let local_warm = (0..runs.max(2))
        .map(|_| read_files_2(&local_paths))
        .min()
        .unwrap();

    // Peak RSS while reading more than the cache holds.
    let cache = cache_mib << 20;
    let daemon = Daemon::start(&path, &mnt, &["--cache-size", &format!("{cache_mib}M")]);
    drop_page_cache();
    read_files_2(&mnt_paths);
    let rss = daemon.peak_rss();
    drop(daemon);

    println!(
        "kpack mount benchmark{}",
        if quick { " (quick smoke run)" } else { "" }
    );
    if !dropped {
        println!("note: could not drop the page cache; cold figures are warm");
    }
    println!("{} kernels, {:.1} MB", kernels.len(), bytes as f64 / 1e6);
    println!("{:<52} {:>12} {:>9}  against (target)", "measurement", "value", "ratio");
    let row = |name: &str, v: f64, unit: &str, ratio: Option<(f64, &str, &str)>| match ratio {
        Some((r, against, target)) => {
            println!("{name:<52} {v:>8.0} {unit:<3} {r:>8.2}x  {against} ({target})")
        }
        None => println!("{name:<52} {v:>8.0} {unit:<3} {:>9}  baseline", "1.00x"),
    };
    let (a, m) = (mbps(bytes, api_cold), mbps(bytes, mount_cold));
    row("cold: archive API, 2 threads", a, "MB/s", None);
    row(
        "cold: through the mount, 2 readers",
        m,
        "MB/s",
        Some((m / a, "archive API", ">= 0.85")),
    );
    let (l, w) = (mbps(bytes, local_warm), mbps(bytes, mount_warm));
    row(
        "warm: extracted files on local disk, 2 readers",
        l,
        "MB/s",
        None,
    );
    row(
        "warm: re-read through the mount, 2 readers",
        w,
        "MB/s",
        Some((w / l, "local disk", ">= 0.9")),
    );
    let rss_mib = rss as f64 / (1 << 20) as f64;
    println!(
        "{:<52} {:>8.1} MiB {:>8.2}x  cache {cache_mib} MiB (<= cache + 64 MiB: {})",
        "daemon peak RSS reading more than the cache",
        rss_mib,
        rss as f64 / cache as f64,
        if rss <= cache + (64 << 20) {
            "yes"
        } else {
            "NO"
        }
    );
}
