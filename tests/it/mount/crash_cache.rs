//! The persistent cache directory (`--cache-dir`) under crashes and a full disk.
//!
//! Crashes: two daemons share one directory, bounded below the archive's decoded size so files
//! keep being written and evicted. One reads cold files the whole time; the other is started,
//! set reading, and killed with SIGKILL at a random moment, again and again. Every byte either
//! serves is checked; afterwards a new mount's listing removes every temporary the killed ones
//! left, the directory is within its bound, and every file reads exactly.
//!
//! Full disk: the cache directory on a small loop-mounted ext4 file system. Opens that cannot
//! get space fail with ENOSPC and a log line naming the cause, other files go on being served, and
//! nothing partly written is ever served later.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use rocm_kpack::{Archive, Compression};

use super::write_archive;
use crate::support::craft::incompressible;
use crate::support::mount::{Mount, fuse_available};

/// Files of the cache directory: (data files with their sizes, temporary files).
fn listing(cache: &Path) -> (Vec<(PathBuf, u64)>, Vec<PathBuf>) {
    let (mut data, mut tmp) = (Vec::new(), Vec::new());
    let Ok(subs) = std::fs::read_dir(cache.join("kpack-v1")) else {
        return (data, tmp);
    };
    for sub in subs {
        for e in std::fs::read_dir(sub.unwrap().path()).unwrap() {
            let e = e.unwrap();
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with(".tmp.") {
                tmp.push(e.path());
            } else if !name.ends_with(".b3") {
                data.push((e.path(), e.metadata().unwrap().len()));
            }
        }
    }
    (data, tmp)
}

/// 24 kernels of 100-400 KB (6.0 MB decoded); zstd, so each decode takes a moment.
fn crash_archive(dir: &Path) -> PathBuf {
    let kernels: Vec<(String, Vec<u8>)> = (0..24u64)
        .map(|i| {
            let len = 100_000 + (i as usize * 37_000) % 300_000;
            let mut bytes = incompressible(500 + i, len / 2);
            bytes.extend(std::iter::repeat_n(i as u8, len - len / 2));
            (format!("lib/libc{}.so#0", i / 3), bytes)
        })
        .collect();
    let arches = ["gfx942", "gfx90a", "gfx1100"];
    let list: Vec<(&str, &str, Vec<u8>)> = kernels
        .iter()
        .enumerate()
        .map(|(i, (k, b))| (k.as_str(), arches[i % 3], b.clone()))
        .collect();
    write_archive(
        &dir.join("crash.kpack"),
        Compression::Zstd { level: 3 },
        &list,
    )
}

/// The expected tree of `archive` under `dir`.
pub fn expected_tree(archive: &Path, dir: &Path) {
    let a = Archive::open(archive).unwrap();
    for (key, e) in a.entries() {
        let p = dir.join(key).join(format!("{}.hsaco", e.arch));
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, a.get_kernel(key, e.arch).unwrap()).unwrap();
    }
}

const KILLS: usize = 50;
const BOUND: u64 = 2 << 20;

#[test]
fn sigkilled_daemons_sharing_a_cache_dir_never_serve_wrong_bytes() {
    if !fuse_available() {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let archive = crash_archive(d.path());
    let want = d.path().join("want");
    expected_tree(&archive, &want);
    let cache = d.path().join("cache");
    let args = [
        "--cache-dir",
        cache.to_str().unwrap(),
        "--disk-cache-size",
        "2M",
        "--open-mode",
        "passthrough",
    ];
    let want_arg = want.to_str().unwrap();
    let steady = Mount::start(&archive, &args);
    let stop = d.path().join("stop");
    let mut rng = 0x5eed_cafe_u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let (mut served, mut interrupted, mut tmp_seen) = (0u64, 0u64, 0usize);
    let mut steady_served = 0u64;
    let started = Instant::now();
    // In blocks of 10 kills, so that each steady reader stays well within its watchdog.
    for block in 0..KILLS / 10 {
        let steady_reader =
            steady.spawn_child("crash_reads", &format!("1000000|{want_arg}|{block}|strict"));
        for kill in block * 10..block * 10 + 10 {
            let mut victim = Mount::start(&archive, &args);
            let reader = victim.spawn_child(
                "crash_reads",
                &format!("1000000|{want_arg}|{}|may-fail", kill + 100),
            );
            std::thread::sleep(Duration::from_millis(30 + next() % 400));
            victim.kill_daemon();
            tmp_seen += listing(&cache).1.len();
            let out = victim.finish(reader);
            // The reader fails once the daemon is gone; what it read before must be exact.
            assert!(
                !out.output.contains("WRONG BYTES"),
                "kill {kill}:\n{}",
                out.output
            );
            let counts = crash_counts(&out.output);
            served += counts.0;
            interrupted += counts.1;
            drop(victim);
        }
        // The steady daemon was reading all along: nothing it served may be wrong, and none of
        // its reads may fail.
        std::fs::write(&stop, b"").unwrap();
        let out = steady.finish(steady_reader);
        std::fs::remove_file(&stop).unwrap();
        assert!(
            out.success && !out.output.contains("WRONG BYTES"),
            "steady reader:\n{}\ndaemon log:\n{}",
            out.output,
            steady.daemon_log()
        );
        let counts = crash_counts(&out.output);
        assert!(counts.0 > 0 && counts.1 == 0, "{}", out.output);
        steady_served += counts.0;
        // Nor may it have failed to keep a kernel: the others' listings leave its temporaries
        // alone.
        let log = steady.daemon_log();
        assert!(!log.contains(" ERROR "), "steady daemon log:\n{log}");
    }
    let killed_in = started.elapsed();
    steady.stop();

    let left = listing(&cache).1.len();
    // A new mount lists the directory when it opens it: the killed daemons' temporaries go.
    let again = Mount::start(&archive, &args);
    let (data, tmp) = listing(&cache);
    assert!(
        tmp.is_empty(),
        "temporaries left after the listing: {tmp:?}"
    );
    let total: u64 = data.iter().map(|(_, n)| n).sum();
    assert!(
        total <= BOUND,
        "{total} bytes in the cache directory, bound {BOUND}"
    );
    again.check("crash_reads", &format!("1|{want_arg}|99|strict"));
    again.stop();
    eprintln!(
        "{KILLS} SIGKILLs in {killed_in:.1?}: killed daemons served {served} exact reads before \
         dying ({interrupted} reads cut off), the steady one {} exact reads; {tmp_seen} \
         temporaries seen right after the kills, {left} left at the end, 0 after the next \
         listing; {} files, {total} bytes kept (bound {BOUND}); 0 wrong bytes",
        steady_served,
        data.len()
    );
}

/// (exact reads, reads that failed) from a `crash_reads` child's output.
fn crash_counts(out: &str) -> (u64, u64) {
    let Some(line) = out
        .lines()
        .find_map(|l| l.split_once("CRASH_READS ").map(|(_, c)| c))
    else {
        return (0, 0);
    };
    let w: Vec<&str> = line.split_whitespace().collect();
    (w[1].parse().unwrap(), w[3].parse().unwrap())
}

/// The child side: `PASSES|EXPECTED_DIR|SEED|MODE`: reads every file of EXPECTED_DIR through
/// the mount in a shuffled order, PASSES times or until a file `stop` appears next to
/// EXPECTED_DIR; a read that returns bytes must return exactly the file. With MODE `may-fail`
/// (the daemon is killed under it) the first failed read ends the child, counted; with `strict`
/// it fails the scenario.
pub fn run(name: &str, mnt: &Path, arg: &str) {
    assert_eq!(name, "crash_reads");
    let mut parts = arg.split('|');
    let passes: u64 = parts.next().unwrap().parse().unwrap();
    let dir = Path::new(parts.next().unwrap());
    let mut seed: u64 = parts.next().unwrap().parse::<u64>().unwrap() * 2654435761 + 1;
    let may_fail = parts.next() == Some("may-fail");
    let stop = dir.parent().unwrap().join("stop");
    let mut files = crate::support::files_below(dir);
    let (mut ok, mut failed) = (0u64, 0u64);
    'passes: for _ in 0..passes {
        for i in (1..files.len()).rev() {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            files.swap(i, (seed % (i as u64 + 1)) as usize);
        }
        for rel in &files {
            if stop.exists() {
                break 'passes;
            }
            match std::fs::read(mnt.join(rel)) {
                Ok(got) => {
                    let want = std::fs::read(dir.join(rel)).unwrap();
                    if got != want {
                        println!("WRONG BYTES: {}", rel.display());
                        panic!("wrong bytes from {}", rel.display());
                    }
                    ok += 1;
                }
                Err(e) => {
                    println!("read {} failed: {e}", rel.display());
                    assert!(may_fail, "{}: {e}", rel.display());
                    failed += 1;
                    break 'passes;
                }
            }
        }
    }
    println!("CRASH_READS ok {ok} failed {failed}");
}

/// A loop-mounted ext4 file system of `mib` MiB at `dir`, unmounted (and its image removed)
/// on drop.
struct LoopFs {
    dir: PathBuf,
    image: PathBuf,
}

impl LoopFs {
    fn new(work: &Path, mib: u64) -> LoopFs {
        let image = work.join("fs.img");
        let dir = work.join("fs");
        std::fs::create_dir_all(&dir).unwrap();
        let f = std::fs::File::create(&image).unwrap();
        f.set_len(mib << 20).unwrap();
        drop(f);
        let run = |cmd: &mut Command| {
            let o = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
            assert!(
                o.status.success(),
                "{cmd:?}: {}",
                String::from_utf8_lossy(&o.stderr)
            );
        };
        run(Command::new("mkfs.ext4")
            .args(["-q", "-F", "-m", "0"])
            .arg(&image));
        run(Command::new("mount")
            .args(["-o", "loop"])
            .arg(&image)
            .arg(&dir));
        LoopFs { dir, image }
    }
}

impl Drop for LoopFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.dir).status();
        let _ = std::fs::remove_file(&self.image);
    }
}

#[test]
fn a_full_cache_dir_fails_opens_with_enospc_and_serves_the_rest() {
    if !fuse_available() {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    // Kernels of 1.5 MB and 20 KB on an 8 MiB file system filled up to its last MiB, with a bound
    // of 2 MiB on the cache (so once there is space again, older files make room for new ones).
    let big: Vec<Vec<u8>> = (0..4).map(|i| incompressible(900 + i, 1_500_000)).collect();
    let small: Vec<Vec<u8>> = (0..4).map(|i| incompressible(950 + i, 20_000)).collect();
    let mut list: Vec<(&str, &str, Vec<u8>)> = Vec::new();
    for (i, b) in big.iter().enumerate() {
        list.push((
            [
                "lib/big0.so#0",
                "lib/big1.so#0",
                "lib/big2.so#0",
                "lib/big3.so#0",
            ][i],
            "gfx942",
            b.clone(),
        ));
    }
    for (i, s) in small.iter().enumerate() {
        list.push((
            ["lib/s0.so#0", "lib/s1.so#0", "lib/s2.so#0", "lib/s3.so#0"][i],
            "gfx942",
            s.clone(),
        ));
    }
    let archive = write_archive(&d.path().join("full.kpack"), Compression::None, &list);
    let want = d.path().join("want");
    expected_tree(&archive, &want);
    let fs = LoopFs::new(d.path(), 8);
    let cache = fs.dir.join("cache");
    std::fs::create_dir_all(&cache).unwrap();
    // Fill the file system but for about 1 MiB: big kernels cannot get space, small ones can.
    let free = {
        let st = nix_statvfs(&fs.dir);
        st.0 * st.1
    };
    let filler = fs.dir.join("filler");
    std::fs::write(&filler, vec![0xa5u8; (free - (1 << 20)) as usize]).unwrap();
    let args = [
        "--cache-dir",
        cache.to_str().unwrap(),
        "--disk-cache-size",
        "2M",
        "--open-mode",
        "passthrough",
    ];
    let m = Mount::start(&archive, &args);
    let want_arg = want.to_str().unwrap();
    let out = m.child("full_reads", want_arg);
    assert!(
        out.success,
        "{}\ndaemon log:\n{}",
        out.output,
        m.daemon_log()
    );
    let log = m.daemon_log();
    assert!(
        log.contains(&format!(
            "no room for its 1500000-byte backing file in {}",
            cache.join("kpack-v1").display()
        )) && log.contains("No space left on device"),
        "the log names the cause:\n{log}"
    );
    // Space again: the files that failed now decode and read exactly, the others too.
    std::fs::remove_file(&filler).unwrap();
    m.check("crash_reads", &format!("2|{want_arg}|7|strict"));
    m.stop();
    let (data, tmp) = listing(&cache);
    assert!(tmp.is_empty(), "{tmp:?}");
    // Whatever is in the directory is whole: a new mount validates every file it finds.
    let again = Mount::start(&archive, &args);
    again.check("crash_reads", &format!("1|{want_arg}|8|strict"));
    again.check("rp_stats", "cache_dir_rejected=0");
    again.stop();
    let counts = out
        .output
        .lines()
        .find_map(|l| l.split_once("FULL ").map(|(_, c)| c));
    eprintln!(
        "full disk: first reads {}; all exact once there was space; {} files kept afterwards",
        counts.unwrap_or("?"),
        data.len()
    );
}

/// (fragment size, available fragments) of the file system holding `p`.
fn nix_statvfs(p: &Path) -> (u64, u64) {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(p.as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid path string and a zeroed struct for the kernel to fill.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut st) }, 0);
    (st.f_frsize, st.f_bavail)
}

/// The child side of the full-disk test: `EXPECTED_DIR`: every file is read; the 1.5 MB ones
/// must fail with ENOSPC (no space for them), the small ones must read exactly, twice in a row.
pub fn run_full(mnt: &Path, arg: &str) {
    let dir = Path::new(arg);
    let (mut enospc, mut ok) = (0, 0);
    for round in 0..2 {
        for key in ["big0", "s0", "big1", "s1", "big2", "s2", "big3", "s3"] {
            let rel = format!("lib/{key}.so#0/gfx942.hsaco");
            let want = std::fs::read(dir.join(&rel)).unwrap();
            match std::fs::read(mnt.join(&rel)) {
                Ok(got) => {
                    assert!(got == want, "WRONG BYTES: {rel}");
                    assert!(key.starts_with('s'), "{rel} read although it has no space");
                    ok += 1;
                }
                Err(e) => {
                    assert_eq!(
                        e.raw_os_error(),
                        Some(libc::ENOSPC),
                        "{rel} (round {round}): {e}"
                    );
                    assert!(key.starts_with("big"), "{rel}: {e}");
                    enospc += 1;
                }
            }
        }
    }
    println!("FULL ok {ok} enospc {enospc}");
}
