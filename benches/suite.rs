//! The benchmark suite: kpack-fuse against the tools people would use instead, on the same files,
//! in one run, printing ratios against baselines measured in that run.
//!
//! For each data set (real rocRAND code objects when `bench/fetch-rocrand.sh` has fetched them,
//! and a synthetic set): archive sizes (kpack zstd-3/19, squashfs zstd-3/19, tar.zst), pack time
//! with 1 and 2 threads, reading every file cold (1 and 2 readers) and warm through
//! `kpack-fuse mount` (passthrough with backing files on disk, which is the default; memory
//! backing; the daemon read path), `squashfuse_ll`, the in-kernel EROFS (`mkfs.erofs -zlz4hc`,
//! loop mount) and local disk, the direct API and plain zstd decoding as the ceiling, random
//! 4 KiB reads over a set 4x the memory cache (kpack-fuse with `--cache-dir`, after one pass),
//! daemon peak RSS, and mount/open time and warm reads of small files for 100,000 entries.
//!
//! Cold reads of all the mounts are taken in rounds, one pass of each per round (see
//! [`measure_reads`]); each pass is printed on stderr with the CPU ticks it took.
//!
//! Run as root (it mounts and drops the page cache):
//!   cargo bench --bench suite                 # full run: >= 1 GiB synthetic set, minutes
//!   cargo bench --bench suite -- --quick      # smoke run for CI: small sets, seconds
//! Options: --synthetic-mib N, --keep (leave the work directory), --no-rocrand.

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::Rounds;
use rocm_kpack::Archive;

struct Opts {
    quick: bool,
    synthetic_mib: u64,
    rocrand: bool,
    keep: bool,
    /// Only the re-read passes of the synthetic set ([`bench_rereads`]).
    rereads_only: bool,
}

fn opts() -> Opts {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let value = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse().ok())
    };
    Opts {
        quick,
        synthetic_mib: value("--synthetic-mib").unwrap_or(if quick { 24 } else { 1100 }),
        rocrand: !args.iter().any(|a| a == "--no-rocrand"),
        keep: args.iter().any(|a| a == "--keep"),
        rereads_only: args.iter().any(|a| a == "--rereads"),
    }
}

/// One printed line: a measurement, and optionally its ratio against a baseline.
struct Line {
    what: String,
    value: String,
    ratio: Option<(f64, String, common::Sense)>,
}

struct Report {
    lines: Vec<Line>,
}

impl Report {
    fn section(&mut self, title: &str) {
        self.lines.push(Line {
            what: format!("== {title}"),
            value: String::new(),
            ratio: None,
        });
    }
    fn value(&mut self, what: impl Into<String>, value: impl Into<String>) {
        self.lines.push(Line {
            what: what.into(),
            value: value.into(),
            ratio: None,
        });
    }
    fn ratio(
        &mut self,
        what: impl Into<String>,
        value: impl Into<String>,
        ratio: f64,
        against: impl Into<String>,
        sense: common::Sense,
    ) {
        self.lines.push(Line {
            what: what.into(),
            value: value.into(),
            ratio: Some((ratio, against.into(), sense)),
        });
    }
    /// Prints the table; a smoke run (`quick`) shows no targets (it is not a measurement).
    fn print(&self, quick: bool) {
        for l in &self.lines {
            match &l.ratio {
                _ if l.value.is_empty() => println!("{}", l.what),
                Some((r, against, sense)) => println!(
                    "  {:<52} {:>14} {:>8.2}x  vs {}: {}",
                    l.what,
                    l.value,
                    r,
                    common::against_for_print(against, quick),
                    common::plainly(*r, *sense)
                ),
                None => println!("  {:<52} {:>14}", l.what, l.value),
            }
        }
    }
}

fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_kpack-fuse"))
}

fn run(cmd: &mut Command) -> Duration {
    let t = Instant::now();
    let out = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .expect("spawn");
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    t.elapsed()
}

fn have(tool: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Drops the page cache, then waits for the freed memory to settle (see [`settle_freed_memory`]),
/// so every cold pass starts from the same state of the machine.
fn drop_caches() {
    unsafe { libc::sync() };
    if fs::write("/proc/sys/vm/drop_caches", "3").is_err() {
        eprintln!("warning: cannot drop the page cache (not root?): cold numbers are warm");
    }
    if SETTLE.load(std::sync::atomic::Ordering::Relaxed) {
        settle_freed_memory();
    }
}

/// Whether [`drop_caches`] waits for freed memory to settle: not in the `--quick` smoke run,
/// whose figures nobody reads and which CI runs.
static SETTLE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Where a guest kernel with free page reporting counts the memory it has handed back to its
/// host (VMs with free page reporting expose it; most machines have no such file, and nothing
/// waits).
const REPORTED: &str = "/sys/module/page_reporting/parameters/reported_kib";

/// Waits until the guest has stopped handing freed memory back to its host: the count at
/// [`REPORTED`] unchanged for three seconds (at most 20 s in all; reporting runs in rounds about
/// two seconds apart, the first about a second after the page cache is dropped).
///
/// A page frame handed back costs a host fault at its next first touch, several times what a
/// recycled frame costs, and a cold pass writes a gigabyte of decoded pages. Reporting runs in
/// the seconds after the page cache is dropped, so a pass that started at once would meet
/// some mix of both kinds of frames, set by whatever ran before it, and its system time would
/// follow that mix. Once reporting is done, every pass meets the same frames.
fn settle_freed_memory() {
    let read = || fs::read_to_string(REPORTED).ok();
    let Some(mut last) = read() else { return };
    let start = Instant::now();
    let mut quiet_since = Instant::now();
    while quiet_since.elapsed() < Duration::from_secs(3)
        && start.elapsed() < Duration::from_secs(20)
    {
        std::thread::sleep(Duration::from_millis(100));
        let now = read();
        if now.as_ref() != Some(&last) {
            last = now.unwrap_or_default();
            quiet_since = Instant::now();
        }
    }
}

fn mb_s(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / d.as_secs_f64() / 1e6
}

/// Every regular file under `root`, relative, sorted.
fn files_under(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let ft = e.file_type().unwrap();
            if ft.is_dir() {
                stack.push(e.path());
            } else if ft.is_file() {
                out.push(e.path().strip_prefix(root).unwrap().to_path_buf());
            }
        }
    }
    out.sort();
    out
}

/// Reads every file whole with `readers` threads; returns (bytes, time).
fn read_all(root: &Path, files: &[PathBuf], readers: usize) -> (u64, Duration) {
    let t = Instant::now();
    let total: u64 = std::thread::scope(|s| {
        let handles: Vec<_> = (0..readers)
            .map(|r| {
                s.spawn(move || {
                    files
                        .iter()
                        .skip(r)
                        .step_by(readers)
                        .map(|f| fs::read(root.join(f)).unwrap().len() as u64)
                        .sum::<u64>()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).sum()
    });
    (total, t.elapsed())
}

/// Warm reads of the same files under each root: every root read once, then five rounds of one
/// timed pass per root in turn; returns each root's (bytes, fastest pass). A pass takes well under
/// a second, so one pass is at the mercy of any hiccup, and taking the roots in turn keeps a
/// drift of the machine out of their ratios.
fn warm_passes(roots: &[&Path], files: &[PathBuf]) -> Vec<(u64, Duration)> {
    let mut best = vec![(0, Duration::MAX); roots.len()];
    for root in roots {
        read_all(root, files, 2);
    }
    for round in 0..5 {
        for (root, best) in roots.iter().zip(&mut best) {
            let (b, t) = read_all(root, files, 2);
            eprintln!(
                "  warm pass: round {round}, {}: {:.0} MB/s",
                root.display(),
                mb_s(b, t)
            );
            if t < best.1 {
                *best = (b, t);
            }
        }
    }
    best
}

/// `count` random 4 KiB preads across all files, 2 threads; returns operations per second.
fn random_reads(root: &Path, files: &[PathBuf], sizes: &[u64], count: usize) -> f64 {
    use std::os::unix::fs::FileExt;
    let t = Instant::now();
    std::thread::scope(|s| {
        for r in 0..2u64 {
            s.spawn(move || {
                let mut x = 0x1234_5678_9abc_def0u64 ^ r;
                let mut buf = vec![0u8; 4096];
                let handles: Vec<fs::File> = files
                    .iter()
                    .map(|f| fs::File::open(root.join(f)).unwrap())
                    .collect();
                for _ in 0..count / 2 {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let i = (x % files.len() as u64) as usize;
                    let off = if sizes[i] > 4096 {
                        (x >> 20) % (sizes[i] - 4096)
                    } else {
                        0
                    };
                    handles[i].read_at(&mut buf, off).unwrap();
                }
            });
        }
    });
    count as f64 / t.elapsed().as_secs_f64()
}

fn mounted(mnt: &Path) -> bool {
    let want = fs::canonicalize(mnt).unwrap_or(mnt.to_path_buf());
    fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split(' ').nth(4).is_some_and(|p| Path::new(p) == want))
}

/// A FUSE daemon started in the foreground for the duration of a measurement.
struct Daemon {
    child: Child,
    mnt: PathBuf,
    mount_time: Duration,
}

impl Daemon {
    fn start(mut cmd: Command, mnt: &Path) -> Daemon {
        fs::create_dir_all(mnt).unwrap();
        let t = Instant::now();
        let child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn daemon");
        let mut d = Daemon {
            child,
            mnt: mnt.to_path_buf(),
            mount_time: Duration::ZERO,
        };
        while !mounted(mnt) {
            if t.elapsed() > Duration::from_secs(60) {
                panic!("{cmd:?} did not mount within 60 s");
            }
            if let Ok(Some(status)) = d.child.try_wait() {
                panic!("{cmd:?} exited with {status} before mounting");
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        d.mount_time = t.elapsed();
        d
    }

    /// Peak resident memory of the daemon so far, in bytes.
    fn peak_rss(&self) -> u64 {
        let status =
            fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap_or_default();
        status
            .lines()
            .find(|l| l.starts_with("VmHWM:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kb| kb.parse::<u64>().ok())
            .map_or(0, |kb| kb * 1024)
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(10) {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        if mounted(&self.mnt) {
            let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn kpack_mount(archive: &Path, mnt: &Path, extra: &[&str]) -> Daemon {
    let mut cmd = Command::new(bin());
    cmd.arg("mount").arg(archive).arg(mnt).arg("-f").args(extra);
    Daemon::start(cmd, mnt)
}

/// One `name value` line of the mount's `user.kpack.stats`.
fn kpack_stat(mnt: &Path, name: &str) -> u64 {
    let path = std::ffi::CString::new(mnt.as_os_str().as_encoded_bytes()).unwrap();
    let mut buf = vec![0u8; 4096];
    // SAFETY: valid NUL-terminated strings and a buffer of the length given.
    let n = unsafe {
        libc::getxattr(
            path.as_ptr(),
            c"user.kpack.stats".as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    let text = String::from_utf8_lossy(&buf[..n.max(0) as usize]).into_owned();
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0)
}

/// The in-kernel EROFS, loop-mounted read-only (root only).
struct Erofs {
    mnt: PathBuf,
}

impl Erofs {
    fn mount(image: &Path, mnt: &Path) -> Option<Erofs> {
        fs::create_dir_all(mnt).unwrap();
        let ok = Command::new("mount")
            .args(["-t", "erofs", "-o", "loop,ro"])
            .arg(image)
            .arg(mnt)
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        ok.then(|| Erofs {
            mnt: mnt.to_path_buf(),
        })
    }
}

impl Drop for Erofs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.mnt).status();
    }
}

/// Cold (2 and 1 readers) and warm (2 readers) reads of every file through every contender:
/// cold passes in [`Rounds`], each on a fresh mount after the page cache was dropped; warm
/// passes with every contender mounted at once, taken in turn with local disk (see
/// [`warm_passes`]), in MB/s; local disk's warm speed last.
struct Reads {
    cold2: Rounds,
    cold1: Rounds,
    warm2: Vec<f64>,
}

/// Rounds of cold passes per figure (odd: the median is one of them).
const COLD_PASSES: usize = 5;

/// One contender of the read measurements: its name (in the per-pass log) and how to mount it
/// at a directory (the guard it returns unmounts it when dropped).
type Contender<'a> = (
    &'static str,
    Box<dyn FnMut(&Path) -> Box<dyn std::any::Any> + 'a>,
);

/// [`Reads`] of every contender, measured in rounds: each round gives every contender one cold
/// pass, in the order [`Rounds::order`] gives (rotated, every other round reversed), and ratios
/// are taken within a round.
///
/// On a VM a cold pass mostly costs filling page frames, and what that costs swings within
/// minutes (frames the host has taken back cost several times recycled ones; see
/// [`settle_freed_memory`] and docs/benchmarks.md). Measured one contender after another, every
/// ratio would carry that swing; within a round both sides see the same machine. Each pass is
/// also printed on stderr with the CPU time it took, so a run can be read for that.
///
/// Warm passes come after: one pass fills every contender's caches, then [`warm_passes`] takes
/// local disk (`tree`) and every contender in turn. A warm pass of 1 GB takes a tenth of a
/// second, too short for a single pass against a single pass of local disk to mean much.
fn measure_reads(
    files: &[PathBuf],
    total: u64,
    tree: &Path,
    work: &Path,
    contenders: &mut [Contender],
) -> Reads {
    let n = contenders.len();
    let mnt = work.join("mnt");
    let mnt = mnt.as_path();
    let mut reads = Reads {
        cold2: Rounds::new(n),
        cold1: Rounds::new(n),
        warm2: Vec::new(),
    };
    for readers in [2, 1] {
        for round in 0..COLD_PASSES {
            for c in reads.cold2.order(round) {
                let (name, mount) = &mut contenders[c];
                drop_caches();
                let m = mount(mnt);
                let cpu = CpuTicks::now();
                let (b, t) = read_all(mnt, files, readers);
                let cpu = cpu.since();
                assert_eq!(b, total);
                eprintln!(
                    "  pass: round {round}, {readers} reader(s), {name}: {:.0} MB/s, \
                     {} user + {} system ticks, {} idle",
                    mb_s(b, t),
                    cpu.user,
                    cpu.system,
                    cpu.idle
                );
                drop(m);
                if readers == 2 {
                    &mut reads.cold2
                } else {
                    &mut reads.cold1
                }
                .push(c, t);
            }
        }
    }
    drop_caches();
    let mnts: Vec<PathBuf> = (0..n).map(|c| work.join(format!("mnt-warm-{c}"))).collect();
    let mounted: Vec<_> = contenders
        .iter_mut()
        .zip(&mnts)
        .map(|((_, mount), at)| mount(at))
        .collect();
    let mut roots: Vec<&Path> = mnts.iter().map(PathBuf::as_path).collect();
    roots.push(tree);
    reads.warm2 = warm_passes(&roots, files)
        .into_iter()
        .map(|(b, t)| {
            assert_eq!(b, total);
            mb_s(b, t)
        })
        .collect();
    drop(mounted);
    reads
}

/// The machine's CPU time so far, from `/proc/stat`, in clock ticks.
struct CpuTicks {
    user: u64,
    system: u64,
    idle: u64,
}

impl CpuTicks {
    fn now() -> CpuTicks {
        let stat = fs::read_to_string("/proc/stat").unwrap_or_default();
        let f: Vec<u64> = stat
            .lines()
            .next()
            .unwrap_or_default()
            .split_whitespace()
            .skip(1)
            .map(|v| v.parse().unwrap_or(0))
            .collect();
        let at = |i: usize| f.get(i).copied().unwrap_or(0);
        CpuTicks {
            user: at(0) + at(1),
            system: at(2) + at(5) + at(6),
            idle: at(3) + at(4),
        }
    }

    /// The ticks spent since `self` was taken.
    fn since(&self) -> CpuTicks {
        let now = CpuTicks::now();
        CpuTicks {
            user: now.user - self.user,
            system: now.system - self.system,
            idle: now.idle - self.idle,
        }
    }
}

fn squash_mount(image: &Path, mnt: &Path) -> Daemon {
    let mut cmd = Command::new("squashfuse_ll");
    cmd.arg("-f").arg(image).arg(mnt);
    Daemon::start(cmd, mnt)
}

/// The plain-zstd ceiling: every frame of the archive, already in memory, decoded by 2 threads.
fn zstd_ceiling(archive: &Archive) -> (u64, Duration) {
    let frames = common::frames_in_memory(archive);
    let frames = &frames;
    let t = Instant::now();
    let total: u64 = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|r| {
                s.spawn(move || {
                    let mut dctx = zstd::zstd_safe::DCtx::create();
                    let mut out = Vec::new();
                    let mut n = 0u64;
                    for (f, size) in frames.iter().skip(r).step_by(2) {
                        out.resize(*size, 0);
                        n += dctx.decompress(&mut out[..], f).unwrap() as u64;
                    }
                    n
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).sum()
    });
    (total, t.elapsed())
}

/// The direct API: open, then every kernel by get_kernel, 2 threads.
fn direct_api(path: &Path) -> (u64, Duration) {
    let t = Instant::now();
    let archive = Archive::open(path).unwrap();
    let entries: Vec<(String, String)> = archive
        .entries()
        .map(|(k, e)| (k.to_owned(), e.arch.to_owned()))
        .collect();
    let (archive, entries) = (&archive, &entries);
    let total: u64 = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|r| {
                s.spawn(move || {
                    entries
                        .iter()
                        .skip(r)
                        .step_by(2)
                        .map(|(k, a)| archive.get_kernel(k, a).unwrap().len() as u64)
                        .sum::<u64>()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).sum()
    });
    (total, t.elapsed())
}

/// Kernels from [`common::CodeLike`] (compressing and decoding like real code objects), four
/// arches per library, sizes spread from 20 KB to 15 MB.
fn write_synthetic(tree: &Path, total_mib: u64) {
    let mut g = common::CodeLike::new(0x0123_4567_89ab_cdef);
    let arches = ["gfx90a:xnack-", "gfx942", "gfx1100", "gfx1201"];
    let mut written = 0u64;
    let mut i = 0;
    while written < total_mib << 20 {
        if i % arches.len() == 0 && i > 0 {
            g.new_library();
        }
        // Mostly small and medium files, some large ones, as in real libraries.
        let size = match g.next() % 10 {
            0 => 4_000_000 + g.next() % 11_000_000,
            1..=3 => 500_000 + g.next() % 3_500_000,
            _ => 20_000 + g.next() % 480_000,
        } as usize;
        let data = g.kernel(size);
        let dir = tree.join(format!("lib/libsynth{}.so#{}", i / arches.len(), 0));
        fs::create_dir_all(&dir).unwrap();
        fs::write(
            dir.join(format!("{}.hsaco", arches[i % arches.len()])),
            &data,
        )
        .unwrap();
        written += size as u64;
        i += 1;
    }
}

fn bench_set(report: &mut Report, name: &str, tree: &Path, work: &Path, o: &Opts) {
    let files = files_under(tree);
    let sizes: Vec<u64> = files
        .iter()
        .map(|f| fs::metadata(tree.join(f)).unwrap().len())
        .collect();
    let total: u64 = sizes.iter().sum();
    report.section(&format!(
        "{name}: {} files, {:.1} MB",
        files.len(),
        total as f64 / 1e6
    ));

    // Sizes and pack time.
    let k3 = work.join(format!("{name}-3.kpack"));
    let k19 = work.join(format!("{name}-19.kpack"));
    let pack = |out: &Path, level: &str, threads: &str| {
        run(Command::new(bin())
            .arg("pack")
            .arg(tree)
            .arg("-o")
            .arg(out)
            .args(["--level", level, "--threads", threads]))
    };
    let p1 = pack(&k3, "3", "1");
    let p2 = pack(&k3, "3", "2");
    report.ratio(
        "pack zstd-3, 2 threads",
        format!("{:.0} MB/s", mb_s(total, p2)),
        p1.as_secs_f64() / p2.as_secs_f64(),
        "1 thread",
        common::Sense::Faster,
    );
    pack(&k19, "19", "2");
    let size = |p: &Path| fs::metadata(p).unwrap().len();
    let squash = have("mksquashfs") && have("squashfuse_ll");
    let (s3, s19) = (
        work.join(format!("{name}-3.sqfs")),
        work.join(format!("{name}-19.sqfs")),
    );
    if squash {
        for (img, level) in [(&s3, "3"), (&s19, "19")] {
            run(Command::new("mksquashfs").arg(tree).arg(img).args([
                "-noappend",
                "-quiet",
                "-comp",
                "zstd",
                "-Xcompression-level",
                level,
            ]));
        }
        report.ratio(
            "archive: kpack zstd-3",
            format!("{} B", size(&k3)),
            size(&k3) as f64 / size(&s3) as f64,
            "squashfs zstd-3",
            common::Sense::Size,
        );
        report.ratio(
            "archive: kpack zstd-19",
            format!("{} B", size(&k19)),
            size(&k19) as f64 / size(&s19) as f64,
            "squashfs zstd-19",
            common::Sense::Size,
        );
    } else {
        eprintln!(
            "warning: mksquashfs/squashfuse_ll missing (scripts/setup-deps.sh installs them)"
        );
    }
    let tarball = work.join(format!("{name}.tar.zst"));
    run(Command::new("tar")
        .arg("--zstd")
        .arg("-cf")
        .arg(&tarball)
        .arg("-C")
        .arg(tree)
        .arg("."));
    report.ratio(
        "archive: kpack zstd-3",
        format!("{} B", size(&k3)),
        size(&k3) as f64 / size(&tarball) as f64,
        "tar --zstd",
        common::Sense::Size,
    );

    report.value(
        "data set: decoded / kpack zstd-3 (real code objects: ~6)",
        format!("{:.2}", total as f64 / size(&k3) as f64),
    );
    let erofs_img = work.join(format!("{name}.erofs"));
    // SAFETY: no arguments.
    let erofs = have("mkfs.erofs")
        && unsafe { libc::geteuid() } == 0
        && Command::new("mkfs.erofs")
            .arg("-zlz4hc")
            .arg(&erofs_img)
            .arg(tree)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
    if !erofs {
        eprintln!("warning: no EROFS comparison (needs root and mkfs.erofs from erofs-utils)");
    }

    // Baselines.
    let archive = Archive::open(&k3).unwrap();
    let (zb, zt) = zstd_ceiling(&archive);
    let ceiling = mb_s(zb, zt);
    report.value(
        "plain zstd decode of the frames, 2 threads",
        format!("{ceiling:.0} MB/s"),
    );
    drop_caches();
    let (db, dt) = direct_api(&k3);
    let direct_cold = mb_s(db, dt);
    report.ratio(
        "direct API cold, 2 threads",
        format!("{direct_cold:.0} MB/s"),
        direct_cold / ceiling,
        "plain zstd",
        common::Sense::Faster,
    );
    drop_caches();
    let (nb, nt) = read_all(tree, &files, 2);
    let native_cold = mb_s(nb, nt);
    report.value(
        "local disk cold, 2 readers",
        format!("{native_cold:.0} MB/s"),
    );

    // The same kernels written in the reference layout: no digests, so nothing is hashed when a
    // kernel is decoded. The ratio is what checking every kernel's BLAKE3 costs a cold mount.
    let k3_reference = work.join(format!("{name}-3-reference.kpack"));
    run(Command::new(bin())
        .arg("pack")
        .arg(tree)
        .arg("-o")
        .arg(&k3_reference)
        .args(["--level", "3", "--threads", "2", "--reference-layout"]));
    let mnt = work.join("mnt");
    // A loop mount may be impossible here (no loop devices in a container): then say so.
    let erofs = erofs && {
        let ok = Erofs::mount(&erofs_img, &mnt).is_some();
        if !ok {
            eprintln!("warning: no EROFS comparison (mount -t erofs -o loop failed)");
        }
        ok
    };

    // Every contender's reads, in rounds: kpack-fuse by default (passthrough, backing files on
    // disk), with memory backing, on the daemon read path (what non-root users get) and on the
    // reference layout; then EROFS and squashfuse_ll where they are there.
    let kp = |name, archive: &Path, extra: &'static [&'static str]| -> Contender {
        let archive = archive.to_path_buf();
        (
            name,
            Box::new(move |at: &Path| Box::new(kpack_mount(&archive, at, extra))),
        )
    };
    let mut contenders = vec![
        kp("kpack-fuse", &k3, &[]),
        kp(
            "kpack-fuse --backing memory",
            &k3,
            &["--backing", "memory", "--memory-cache-size", "8G"],
        ),
        kp("kpack-fuse --no-passthrough", &k3, &["--no-passthrough"]),
        kp("kpack-fuse, reference layout", &k3_reference, &[]),
    ];
    let (kp_default, kp_memory, kp_daemon, kp_reference) = (0, 1, 2, 3);
    let er = erofs.then(|| {
        let image = erofs_img.clone();
        contenders.push((
            "EROFS",
            Box::new(move |at: &Path| {
                Box::new(Erofs::mount(&image, at).expect("mount -t erofs -o loop"))
            }),
        ));
        contenders.len() - 1
    });
    let sq = squash.then(|| {
        let image = s3.clone();
        contenders.push((
            "squashfuse_ll",
            Box::new(move |at: &Path| Box::new(squash_mount(&image, at))),
        ));
        contenders.len() - 1
    });
    let reads = measure_reads(&files, total, tree, work, &mut contenders);
    drop(contenders);
    let native_warm = *reads.warm2.last().unwrap();
    report.value(
        "local disk warm, 2 readers (best of 5, in turn)",
        format!("{native_warm:.0} MB/s"),
    );
    // A contender's speed in its median round, and its speed against another's (the median
    // of the two's ratios within each round).
    let speed = |r: &Rounds, c: usize| format!("{:.0} MB/s", mb_s(total, r.median(c)));
    let (cold2, cold1, warm2) = (&reads.cold2, &reads.cold1, &reads.warm2);

    let rand_ops = if o.quick { 2_000 } else { 20_000 };
    let cache_size = format!("{}K", (total / 4 / 1024).max(64));
    // Peak RSS of the default mount after reading everything, and the backing memory of a
    // memory-backed mount bounded to a quarter of the set (reported separately: memfd pages).
    let (kp_rss, memory_backing) = {
        drop_caches();
        let d = kpack_mount(&k3, &mnt, &[]);
        read_all(&mnt, &files, 2);
        let rss = d.peak_rss();
        drop(d);
        let d = kpack_mount(
            &k3,
            &mnt,
            &["--backing", "memory", "--memory-cache-size", &cache_size],
        );
        read_all(&mnt, &files, 2);
        let held = kpack_stat(&mnt, "backing_bytes");
        (rss, (held, d.peak_rss()))
    };
    report.ratio(
        "kpack-fuse cold, 2 readers",
        speed(cold2, kp_default),
        mb_s(total, cold2.median(kp_default)) / direct_cold,
        "direct API cold",
        common::Sense::Faster,
    );
    report.ratio(
        "kpack-fuse cold, 2 readers, digests checked",
        speed(cold2, kp_default),
        cold2.median_ratio(kp_default, kp_reference),
        "same kernels, --reference-layout (target >= 0.85)",
        common::Sense::Faster,
    );
    report.value("kpack-fuse cold, 1 reader", speed(cold1, kp_default));
    report.ratio(
        "kpack-fuse warm, 2 readers",
        format!("{:.0} MB/s", warm2[kp_default]),
        warm2[kp_default] / native_warm,
        "local disk warm (target >= 0.95)",
        common::Sense::Faster,
    );
    for (what, r) in [
        ("memory backing", kp_memory),
        ("daemon read path", kp_daemon),
    ] {
        report.ratio(
            format!("kpack-fuse {what} cold, 2 readers"),
            speed(cold2, r),
            cold2.median_ratio(r, kp_default),
            "kpack-fuse default",
            common::Sense::Faster,
        );
        report.ratio(
            format!("kpack-fuse {what} warm, 2 readers"),
            format!("{:.0} MB/s", warm2[r]),
            warm2[r] / native_warm,
            "local disk warm",
            common::Sense::Faster,
        );
    }
    report.ratio(
        "kpack-fuse daemon peak RSS (default options)",
        format!("{:.0} MiB", kp_rss as f64 / 1048576.0),
        kp_rss as f64 / ((256u64 << 20) + (64 << 20)) as f64,
        "cache size + 64 MiB (target <= 1)",
        common::Sense::Size,
    );
    report.value(
        format!("kpack-fuse --backing memory --memory-cache-size {cache_size}: backing held"),
        format!("{:.0} MiB", memory_backing.0 as f64 / 1048576.0),
    );
    report.value(
        "  and daemon peak RSS",
        format!("{:.0} MiB", memory_backing.1 as f64 / 1048576.0),
    );

    // Random 4 KiB reads over the set, after one pass (the cache directory's default bound holds
    // it all), page cache dropped.
    let cache_dir = work.join("cache-dir");
    let kp_rand = {
        let d = kpack_mount(&k3, &mnt, &["--cache-dir", cache_dir.to_str().unwrap()]);
        read_all(&mnt, &files, 2);
        drop_caches();
        let ops = random_reads(&mnt, &files, &sizes, rand_ops);
        drop(d);
        ops
    };
    let _ = fs::remove_dir_all(&cache_dir);
    drop_caches();
    let native_rand = random_reads(tree, &files, &sizes, rand_ops);
    report.ratio(
        "random 4 KiB reads, kpack-fuse --cache-dir",
        format!("{kp_rand:.0} op/s"),
        kp_rand / native_rand,
        "local disk cold",
        common::Sense::Faster,
    );

    if let Some(er) = er {
        report.ratio(
            "EROFS lz4hc cold, 2 readers",
            speed(cold2, er),
            cold2.median_ratio(kp_default, er),
            "kpack-fuse is this much faster (target >= 1)",
            common::Sense::KpackFaster,
        );
        report.ratio(
            "EROFS lz4hc cold, 1 reader",
            speed(cold1, er),
            cold1.median_ratio(kp_default, er),
            "kpack-fuse is this much faster",
            common::Sense::KpackFaster,
        );
        report.value("EROFS image (lz4hc)", format!("{} B", size(&erofs_img)));
    }

    if let Some(sq) = sq {
        let sq_rand = {
            let d = squash_mount(&s3, &mnt);
            read_all(&mnt, &files, 2);
            drop_caches();
            let ops = random_reads(&mnt, &files, &sizes, rand_ops);
            let rss = d.peak_rss();
            drop(d);
            report.value(
                "squashfuse_ll peak RSS",
                format!("{:.0} MiB", rss as f64 / 1048576.0),
            );
            ops
        };
        report.ratio(
            "squashfuse_ll cold, 2 readers",
            speed(cold2, sq),
            cold2.median_ratio(kp_default, sq),
            "kpack-fuse cold is this much faster (target >= 2)",
            common::Sense::KpackFaster,
        );
        report.ratio(
            "squashfuse_ll cold, 1 reader",
            speed(cold1, sq),
            cold1.median_ratio(kp_default, sq),
            "kpack-fuse cold is this much faster (target >= 1.5)",
            common::Sense::KpackFaster,
        );
        report.ratio(
            "squashfuse_ll cold, 2 readers, vs the daemon read path",
            speed(cold2, sq),
            cold2.median_ratio(kp_daemon, sq),
            "kpack-fuse --no-passthrough is this much faster",
            common::Sense::KpackFaster,
        );
        report.ratio(
            "squashfuse_ll warm, 2 readers",
            format!("{:.0} MB/s", warm2[sq]),
            warm2[kp_default] / warm2[sq],
            "kpack-fuse warm is this much faster",
            common::Sense::KpackFaster,
        );
        report.ratio(
            "random 4 KiB reads after one pass, squashfuse_ll",
            format!("{sq_rand:.0} op/s"),
            kp_rand / sq_rand,
            "kpack-fuse --cache-dir is this much faster (target >= 1)",
            common::Sense::KpackFaster,
        );
    }
}

/// Re-reads: trials of one cold pass through a fresh mount with default options, then
/// [`REREADS`] passes of the same files, each after a pass of local disk (warm), 2 readers.
/// Each re-read is set against the local-disk pass just before it and the first against the
/// cold pass too; the median over the trials is reported. Then the same on the daemon read
/// path (`--no-passthrough`). This is what a user reading their kernels again and again sees,
/// pass by pass, where the suite's warm figure is the best of several.
fn bench_rereads(report: &mut Report, name: &str, tree: &Path, work: &Path, o: &Opts) {
    let files = files_under(tree);
    let archive = work.join(format!("{name}-rereads.kpack"));
    if !archive.exists() {
        run(Command::new(bin())
            .arg("pack")
            .arg(tree)
            .arg("-o")
            .arg(&archive)
            .args(["--level", "3", "--threads", "2"]));
    }
    report.section(&format!("{name}: re-reads, pass by pass"));
    let trials = if o.quick { 1 } else { 3 };
    let mnt = work.join("mnt-rereads");
    // Each contender with its targets: the first re-read against local disk, and the later
    // ones (none for a mode shown for comparison).
    for (what, extra, first, later) in [
        (
            "kpack-fuse",
            &[][..],
            " (target >= 0.6)",
            " (target >= 0.95)",
        ),
        (
            "kpack-fuse --open-mode daemon",
            &["--open-mode", "daemon"][..],
            "",
            "",
        ),
        (
            "kpack-fuse --no-passthrough",
            &["--no-passthrough"][..],
            "",
            " (target >= 0.9)",
        ),
    ] {
        // Per trial: the first re-read against cold, then each re-read against local disk.
        let mut over_cold = Vec::new();
        let mut over_disk = vec![Vec::new(); REREADS];
        let mut speed = vec![Vec::new(); REREADS];
        for trial in 0..trials {
            drop_caches();
            let m = kpack_mount(&archive, &mnt, extra);
            let (_, cold) = read_all(&mnt, &files, 2);
            // Local disk warm before its first timed pass (a pass after dropping the page
            // cache runs at disk speed, and the next one still fills folios).
            for _ in 0..2 {
                read_all(tree, &files, 2);
            }
            for (pass, ratios) in over_disk.iter_mut().enumerate() {
                let (_, disk) = read_all(tree, &files, 2);
                let (b, t) = read_all(&mnt, &files, 2);
                eprintln!(
                    "  re-read: trial {trial}, {what}, pass {}: {:.0} MB/s (local disk {:.0})",
                    pass + 1,
                    mb_s(b, t),
                    mb_s(b, disk)
                );
                ratios.push(disk.as_secs_f64() / t.as_secs_f64());
                speed[pass].push(mb_s(b, t));
                if pass == 0 {
                    over_cold.push(cold.as_secs_f64() / t.as_secs_f64());
                }
            }
            drop(m);
        }
        report.ratio(
            format!("{what} first re-read, 2 readers"),
            format!("{:.0} MB/s", median(&mut speed[0].clone())),
            median(&mut over_cold),
            "its cold pass (target >= 1)",
            common::Sense::Faster,
        );
        for (pass, ratios) in over_disk.iter_mut().enumerate() {
            let target = if pass == 0 { first } else { later };
            report.ratio(
                format!("{what} re-read {}, 2 readers", pass + 1),
                format!("{:.0} MB/s", median(&mut speed[pass])),
                median(ratios),
                format!("local disk warm{target}"),
                common::Sense::Faster,
            );
        }
    }
}

/// Re-read passes per trial of [`bench_rereads`].
const REREADS: usize = 4;

/// The middle value (the upper one of the middle two).
fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn bench_many_entries(report: &mut Report, work: &Path, entries: usize) {
    report.section(&format!("{entries} entries of 1 KiB"));
    let tree = work.join("many");
    for e in 0..entries {
        let dir = tree.join(format!("lib/d{}/libk{e}.so#0", e % 100));
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("gfx942.hsaco"), vec![(e % 251) as u8; 1024]).unwrap();
    }
    let archive = work.join("many.kpack");
    run(Command::new(bin())
        .arg("pack")
        .arg(&tree)
        .arg("-o")
        .arg(&archive));
    let _ = fs::read(&archive);
    let open = (0..3)
        .map(|_| {
            let t = Instant::now();
            std::hint::black_box(Archive::open(&archive).unwrap());
            t.elapsed()
        })
        .min()
        .unwrap();
    report.value(
        "Archive::open (page cache warm)",
        format!("{:.1} ms", open.as_secs_f64() * 1e3),
    );
    let mnt = work.join("mnt");
    let d = kpack_mount(&archive, &mnt, &[]);
    report.ratio(
        "kpack-fuse mount until live",
        format!("{:.1} ms", d.mount_time.as_secs_f64() * 1e3),
        d.mount_time.as_secs_f64() / open.as_secs_f64(),
        "Archive::open",
        common::Sense::Time,
    );
    // The same files through another FUSE filesystem beside it: what FUSE itself costs.
    let squash_mnt = work.join("mnt-squash");
    let squash = (have("mksquashfs") && have("squashfuse_ll")).then(|| {
        let img = work.join("many.sqfs");
        run(Command::new("mksquashfs").arg(&tree).arg(&img).args([
            "-noappend",
            "-quiet",
            "-comp",
            "zstd",
        ]));
        let _ = fs::read(&img);
        let d = squash_mount(&img, &squash_mnt);
        report.value(
            "squashfuse_ll mount until live",
            format!("{:.1} ms", d.mount_time.as_secs_f64() * 1e3),
        );
        d
    });
    // Warm reads of small files: local disk, kpack-fuse and squashfuse_ll in turn.
    let files = files_under(&tree);
    let mut roots = vec![tree.as_path(), mnt.as_path()];
    if squash.is_some() {
        roots.push(&squash_mnt);
    }
    let warm = warm_passes(&roots, &files);
    let (nb, nt) = warm[0];
    for (i, who, against) in [
        (1, "kpack-fuse", "local disk warm (target >= 0.95)"),
        (2, "squashfuse_ll", "local disk warm"),
    ] {
        let Some(&(b, t)) = warm.get(i) else { continue };
        assert_eq!(b, nb);
        report.ratio(
            format!("{who} warm small files, 2 readers"),
            format!("{:.0} files/s", files.len() as f64 / t.as_secs_f64()),
            mb_s(b, t) / mb_s(nb, nt),
            against,
            common::Sense::Faster,
        );
    }
    drop(squash);
    drop(d);
}

fn main() {
    let o = opts();
    SETTLE.store(!o.quick, std::sync::atomic::Ordering::Relaxed);
    let base = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/bench-work");
    let _ = fs::remove_dir_all(&base);
    fs::create_dir_all(&base).unwrap();
    let mut report = Report { lines: Vec::new() };
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        "kpack-fuse benchmark suite{} on {cpus} CPUs, kernel {}",
        if o.quick { " (quick)" } else { "" },
        fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
    );

    // bench/fetch-rocrand.sh downloads Debian's librocrand1 once and prints the library's path.
    let rocrand = (o.rocrand && !o.rereads_only).then(|| {
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("bench/fetch-rocrand.sh");
        let out = Command::new(&script)
            .stderr(Stdio::inherit())
            .output()
            .ok()?;
        let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).lines().last()?.trim());
        (out.status.success() && path.exists()).then_some(path)
    });
    if let Some(Some(rocrand)) = rocrand {
        let out = base.join("rocrand-import");
        run(Command::new(bin())
            .arg("pack")
            .arg("--from-fatbin")
            .arg(&rocrand)
            .arg("--single")
            .arg("-o")
            .arg(&out));
        let single = fs::read_dir(&out)
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| p.extension().is_some_and(|x| x == "kpack"))
            .expect("import wrote an archive");
        let tree = base.join("rocrand-tree");
        run(Command::new(bin()).arg("extract").arg(&single).arg(&tree));
        bench_set(&mut report, "rocrand", &tree, &base, &o);
    } else if o.rocrand {
        eprintln!(
            "note: bench/fetch-rocrand.sh could not fetch librocrand1; the rocRAND set is skipped"
        );
    }
    let tree = base.join("synthetic-tree");
    write_synthetic(&tree, o.synthetic_mib);
    if !o.rereads_only {
        bench_set(&mut report, "synthetic", &tree, &base, &o);
    }
    bench_rereads(&mut report, "synthetic", &tree, &base, &o);
    if !o.rereads_only {
        bench_many_entries(&mut report, &base, if o.quick { 5_000 } else { 100_000 });
    }

    report.print(o.quick);
    if !o.keep {
        let _ = fs::remove_dir_all(&base);
    }
}
