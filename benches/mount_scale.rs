//! Mount startup and memory at scale: an archive of 1,000,000 entries (and one of 100,000), the
//! time until `kpack-fuse mount` returns with the mount live, against Python's C-accelerated
//! `msgpack.unpackb` parsing the same TOC bytes in the same run, and the daemon's peak resident
//! memory (`VmHWM`) once mounted and, for 100,000 entries, after one `ls -R`-like walk of the
//! tree. A run in a fresh process splits the time and memory between opening the archive and
//! building the tree.
//!
//! The archives hold small zstd kernels in the layout of real ones (`lib/dN/libkE.so#0`, one arch
//! per key) and are written with the library's writer, which takes seconds rather than the
//! minutes a directory tree of a million files would.
//!
//! Run as root (it mounts): `cargo bench --bench mount_scale` (full) or
//! `cargo bench --bench mount_scale -- --quick` (smoke run: a small archive, no verdicts).
//! `-- --write N PATH` only writes the archive of N entries, `-- --breakdown PATH` only times
//! opening it and building the tree (for profiling by hand).

#[path = "common/mod.rs"]
mod common;
use common::{best_of, kernel_bytes};

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rocm_kpack::{ArchiveWriter, Compression};

fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_kpack-fuse"))
}

/// Writes an archive of `entries` kernels of 64 to 319 bytes, one per key, 100 keys per directory
/// level below `lib/`.
fn write_archive(path: &Path, entries: usize) {
    let mut w = ArchiveWriter::new(
        "bench",
        "gfx9-4-generic",
        vec!["gfx942".into()],
        Compression::Zstd { level: 1 },
    )
    .unwrap();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    w.set_threads(threads);
    for e in 0..entries {
        let key = format!("lib/d{}/libk{e}.so#0", e % 100);
        w.add_kernel(&key, "gfx942", kernel_bytes(e as u64, 64 + e % 256))
            .unwrap();
    }
    w.write(path, &|_| {}).unwrap();
}

/// The TOC's bytes: from the header's TOC offset to the end of the file.
fn toc_bytes(path: &Path) -> Vec<u8> {
    let bytes = fs::read(path).unwrap();
    let offset = u64::from_le_bytes(bytes[8..16].try_into().unwrap()) as usize;
    bytes[offset..].to_vec()
}

/// Best of 3 `msgpack.unpackb` of the TOC in python3 (wall and CPU time), or `None` (with a note) when python3 or
/// its compiled msgpack extension is missing.
fn python_unpack(toc: &Path) -> Option<(Duration, Duration)> {
    let script = r#"
import sys, time
import msgpack
from msgpack import _cmsgpack
assert msgpack.unpackb is _cmsgpack.unpackb, "msgpack is not C-accelerated"
data = open(sys.argv[1], "rb").read()
best, best_cpu = None, None
for _ in range(3):
    t, c = time.perf_counter(), time.process_time()
    msgpack.unpackb(data, raw=False, strict_map_key=False)
    d, dc = time.perf_counter() - t, time.process_time() - c
    best = d if best is None else min(best, d)
    best_cpu = dc if best_cpu is None else min(best_cpu, dc)
print(best, best_cpu)
"#;
    let out = Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(toc)
        .stderr(Stdio::piped())
        .output()
        .ok()?;
    if !out.status.success() {
        eprintln!(
            "note: no C-accelerated python3 msgpack ({}); the Python baseline is skipped",
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .last()
                .unwrap_or("")
        );
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let mut secs = text.split_whitespace().map(|v| v.parse::<f64>().ok());
    let (wall, cpu) = (secs.next()??, secs.next()??);
    Some((Duration::from_secs_f64(wall), Duration::from_secs_f64(cpu)))
}

fn mounted(mnt: &Path) -> bool {
    let want = fs::canonicalize(mnt).unwrap_or(mnt.to_path_buf());
    fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split(' ').nth(4).is_some_and(|p| Path::new(p) == want))
}

/// The pid of the kpack-fuse daemon serving `mnt`: the process running our binary with the
/// mount point among its arguments.
fn daemon_pid(mnt: &Path) -> Option<u32> {
    let exe = fs::canonicalize(bin()).ok()?;
    let want = mnt.as_os_str().as_encoded_bytes();
    fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let running = fs::read_link(e.path().join("exe")).ok()?;
        let args = fs::read(e.path().join("cmdline")).ok()?;
        (running == exe && args.split(|&b| b == 0).any(|a| a == want)).then_some(pid)
    })
}

/// `VmHWM` of a process, in bytes.
fn peak_rss(pid: u32) -> u64 {
    fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// Entries and directories seen by a recursive walk of the mount.
fn walk(dir: &Path) -> usize {
    fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            1 + if e.file_type().unwrap().is_dir() {
                walk(&e.path())
            } else {
                0
            }
        })
        .sum()
}

struct Mounted {
    took: Duration,
    took_cpu: Duration,
    rss_live: u64,
    rss_walked: u64,
    seen: usize,
}

/// Mounts in the background, timing until `kpack-fuse mount` returns, then walks the tree and
/// unmounts.
fn mount_once(archive: &Path, mnt: &Path, walk_tree: bool) -> Mounted {
    let t = Instant::now();
    let cpu_before = cpu(libc::RUSAGE_CHILDREN);
    let out = Command::new(bin())
        .arg("mount")
        .arg(archive)
        .arg(mnt)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let took = t.elapsed();
    // The command builds the tree and forks the daemon, which only mounts: the command's own CPU
    // time is nearly all of the work.
    let took_cpu = cpu(libc::RUSAGE_CHILDREN) - cpu_before;
    assert!(
        out.status.success(),
        "mount failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        mounted(mnt),
        "mount returned but {} is not mounted",
        mnt.display()
    );
    let pid = daemon_pid(mnt).expect("the daemon's process");
    let rss_live = peak_rss(pid);
    let seen = if walk_tree { walk(mnt) } else { 0 };
    let rss_walked = peak_rss(pid);
    let un = Command::new(bin())
        .arg("unmount")
        .arg(mnt)
        .stderr(Stdio::inherit())
        .status()
        .unwrap();
    assert!(un.success(), "unmount failed");
    // The daemon exits once unmounted; wait so that the next run starts clean.
    let t = Instant::now();
    while fs::metadata(format!("/proc/{pid}")).is_ok() && t.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(10));
    }
    Mounted {
        took,
        took_cpu,
        rss_live,
        rss_walked,
        seen,
    }
}

/// CPU time (user + system) used so far by this process (`RUSAGE_SELF`) or by its waited-for
/// children (`RUSAGE_CHILDREN`). On a machine shared with other work, CPU time is the figure
/// that other work disturbs least.
fn cpu(who: i32) -> Duration {
    // SAFETY: getrusage only writes the struct it is given.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(who, &mut u) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(u.ru_utime) + tv(u.ru_stime)
}

/// A field of `/proc/self/status`, in bytes.
fn own_status(field: &str) -> u64 {
    fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// Run in a fresh process (`--breakdown ARCHIVE`): where the daemon's time and memory go,
/// opening the archive (TOC read and parse, frame index) and then building the tree.
fn breakdown(archive: &Path) {
    use rocm_kpack::fs::{FsOptions, KpackFs};
    use std::sync::Arc;
    let base = own_status("VmRSS:");
    let (t, c) = (Instant::now(), cpu(libc::RUSAGE_SELF));
    let a = Arc::new(rocm_kpack::Archive::open(archive).unwrap());
    let (open, open_cpu) = (t.elapsed(), cpu(libc::RUSAGE_SELF) - c);
    let (open_rss, open_peak) = (own_status("VmRSS:"), own_status("VmHWM:"));
    let entries = a.entries().count() as f64;
    let opts = FsOptions {
        cache_size: 1 << 20,
        backing: rocm_kpack::fs::store::Placement::Memory,
        files_max: 1024,
        gpus: Vec::new(),
        uid: 0,
        gid: 0,
    };
    let (t, c) = (Instant::now(), cpu(libc::RUSAGE_SELF));
    let (fs, _) = KpackFs::new(vec![a], &opts).unwrap();
    let (tree, tree_cpu) = (t.elapsed(), cpu(libc::RUSAGE_SELF) - c);
    let (tree_rss, tree_peak) = (own_status("VmRSS:"), own_status("VmHWM:"));
    std::hint::black_box(&fs);
    let row = |what: &str, d: Duration, c: Duration, bytes: u64, peak: u64| {
        println!(
            "  {:<44} {:>12}  (CPU {:.1} ms; {:.0} bytes per entry kept, peak {:.1} MiB)",
            what,
            format!("{:.1} ms", d.as_secs_f64() * 1e3),
            c.as_secs_f64() * 1e3,
            bytes as f64 / entries,
            mib(peak)
        )
    };
    row(
        "  Archive::open (in process)",
        open,
        open_cpu,
        open_rss - base,
        open_peak,
    );
    let kept = tree_rss.saturating_sub(open_rss);
    row("  tree build (in process)", tree, tree_cpu, kept, tree_peak);
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / 1048576.0
}

fn bench(work: &Path, entries: usize, quick: bool, verdicts: bool) {
    println!("== {entries} entries");
    let archive = work.join(format!("scale-{entries}.kpack"));
    let t = Instant::now();
    write_archive(&archive, entries);
    let toc = toc_bytes(&archive);
    let toc_path = work.join(format!("scale-{entries}.toc"));
    fs::write(&toc_path, &toc).unwrap();
    println!(
        "  {:<44} {:>12}",
        "archive written (not measured)",
        format!(
            "{:.1} s, TOC {:.1} MiB",
            t.elapsed().as_secs_f64(),
            mib(toc.len() as u64)
        )
    );
    let mnt = work.join("mnt");
    fs::create_dir_all(&mnt).unwrap();
    // Warm the page cache: the figure is the mount's own work, not the disk's.
    let _ = fs::read(&archive);
    let runs = if quick { 1 } else { 3 };
    let mut best: Option<Mounted> = None;
    for i in 0..runs {
        // Walking a million entries through FUSE takes minutes; the smaller archives show what
        // a walk adds to the daemon's memory.
        let walk_tree = i == 0 && entries <= 100_000;
        let m = mount_once(&archive, &mnt, walk_tree);
        if walk_tree {
            // Every key is a directory holding one file, below 100 directories and lib/.
            assert_eq!(m.seen, 1 + 100 + 2 * entries, "entries seen by the walk");
        }
        if best.as_ref().is_none_or(|b| m.took < b.took) {
            let walked = best
                .as_ref()
                .map_or(m.rss_walked, |b| b.rss_walked.max(m.rss_walked));
            best = Some(Mounted {
                rss_walked: walked,
                ..m
            });
        }
    }
    let m = best.unwrap();
    let per = |b: u64| b as f64 / entries as f64;
    println!(
        "  {:<44} {:>12}  (CPU {:.1} ms)",
        "mount until live (kpack-fuse mount returns)",
        format!("{:.1} ms", m.took.as_secs_f64() * 1e3),
        m.took_cpu.as_secs_f64() * 1e3
    );
    println!(
        "  {:<44} {:>12}  ({:.0} bytes per entry)",
        "daemon VmHWM once live",
        format!("{:.1} MiB", mib(m.rss_live)),
        per(m.rss_live)
    );
    if entries <= 100_000 {
        println!(
            "  {:<44} {:>12}",
            "daemon VmHWM after walking the whole tree",
            format!("{:.1} MiB", mib(m.rss_walked))
        );
    }
    let out = Command::new(std::env::current_exe().unwrap())
        .arg("--breakdown")
        .arg(&archive)
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    assert!(out.status.success(), "the breakdown run failed");
    print!("{}", String::from_utf8_lossy(&out.stdout));
    let py = python_unpack(&toc_path);
    if let Some((py, py_cpu)) = py {
        println!(
            "  {:<44} {:>12}  (CPU {:.1} ms)",
            "python3 msgpack.unpackb of the TOC (best of 3)",
            format!("{:.1} ms", py.as_secs_f64() * 1e3),
            py_cpu.as_secs_f64() * 1e3
        );
        let target = if verdicts { "  (target <= 0.5)" } else { "" };
        let wall = m.took.as_secs_f64() / py.as_secs_f64();
        let cpu = m.took_cpu.as_secs_f64() / py_cpu.as_secs_f64();
        println!(
            "  {:<44} {wall:>11.2}x{target}",
            "mount until live / msgpack.unpackb, wall"
        );
        println!(
            "  {:<44} {cpu:>11.2}x{target}",
            "mount until live / msgpack.unpackb, CPU"
        );
    }
    if verdicts {
        println!(
            "  {:<44} {:>12}  (target <= 160 MiB at 1,000,000 entries)",
            "daemon VmHWM",
            format!("{:.1} MiB", mib(m.rss_live.max(m.rss_walked)))
        );
    }
    let _ = fs::remove_file(&archive);
    let _ = fs::remove_file(&toc_path);
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--breakdown") {
        return breakdown(Path::new(&args[i + 1]));
    }
    // `--write N PATH`: only write the archive of N entries (for profiling a mount by hand).
    if let Some(i) = args.iter().position(|a| a == "--write") {
        return write_archive(Path::new(&args[i + 2]), args[i + 1].parse().unwrap());
    }
    let quick = args.iter().any(|a| a == "--quick");
    let work = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/bench-mount-scale");
    let _ = fs::remove_dir_all(&work);
    fs::create_dir_all(&work).unwrap();
    println!(
        "kpack-fuse mount-scale benchmark{} on {} CPUs",
        if quick {
            " (quick smoke run: no verdicts)"
        } else {
            ""
        },
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    // What every mount pays before any work of its own: starting the program.
    let start = best_of(3, || {
        let t = Instant::now();
        let s = Command::new(bin())
            .arg("--version")
            .stdout(Stdio::null())
            .status()
            .unwrap();
        assert!(s.success());
        t.elapsed()
    });
    println!(
        "  {:<44} {:>12}",
        "kpack-fuse --version (process start)",
        format!("{:.1} ms", start.as_secs_f64() * 1e3)
    );
    if quick {
        bench(&work, 2_000, true, false);
    } else {
        bench(&work, 100_000, false, false);
        bench(&work, 1_000_000, false, true);
    }
    let _ = fs::remove_dir_all(&work);
}
