//! The read path: passthrough and the daemon path serve the same bytes; backing files on disk,
//! in memory and in a persistent cache directory; the cache directory's reuse, validation,
//! bound and sharing. Scenarios named `rp_*` run in the I/O child (see `run`).

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use rocm_kpack::Compression;

use super::scenarios::{expected, kernel_path, stats};
use super::{pattern, rich_archive, start_passthrough, write_archive};
use crate::support::mount::fuse_available;

/// I/O child scenarios.
pub fn run(name: &str, mnt: &Path, archive: &Path, arg: &str) {
    match name {
        // `arg`: `name=value`, `name<value` or `name>value` checks of `user.kpack.stats`, comma-separated
        // (`value`: a number or another counter's name).
        "rp_stats" => {
            let s = stats(mnt);
            println!("stats {s:?}");
            for check in arg.split(',').filter(|c| !c.is_empty()) {
                let at = check.find(['=', '<', '>']).unwrap();
                let (k, op, v) = (&check[..at], &check[at..at + 1], &check[at + 1..]);
                // A value is a number or the name of another counter.
                let (got, want) = (s[k], v.parse::<u64>().unwrap_or_else(|_| s[v]));
                match op {
                    "=" => assert_eq!(got, want, "{k}"),
                    "<" => assert!(got < want, "{k} = {got}, expected < {want}"),
                    _ => assert!(got > want, "{k} = {got}, expected > {want}"),
                }
            }
        }
        // `arg`: scenarios, comma-separated, run here in turn: none of their reads reaches the
        // daemon (every kernel was decoded before, and passthrough serves complete ones).
        "rp_no_daemon_reads" => {
            let before = stats(mnt)["daemon_reads"];
            for scenario in arg.split(',') {
                super::scenarios::run(scenario, mnt, archive, "");
            }
            assert_eq!(
                stats(mnt)["daemon_reads"],
                before,
                "reads reached the daemon"
            );
        }
        // Opens every kernel first, holding all of them, then reads each through its handle.
        "rp_hold_all" => {
            let want = expected(archive);
            let files: Vec<File> = want
                .iter()
                .map(|(k, a, _)| File::open(kernel_path(mnt, k, a)).unwrap())
                .collect();
            for (f, (key, arch, data)) in files.iter().zip(&want) {
                let mut got = Vec::new();
                (&*f).read_to_end(&mut got).unwrap();
                assert!(got == *data, "{key} [{arch}] read through a held handle");
                let mut last = [0u8; 1];
                if !data.is_empty() {
                    assert_eq!(f.read_at(&mut last, data.len() as u64 - 1).unwrap(), 1);
                    assert_eq!(last[0], data[data.len() - 1]);
                }
            }
        }
        // Opens the largest kernel and holds the handle, reads every other kernel (which evicts
        // the first from a small cache), then opens the first again while the old handle is
        // open: both handles read its bytes, before and after the old one is closed, and so
        // does an open after both are closed.
        "rp_reopen_evicted" => {
            let want = expected(archive);
            let (key, arch, data) = want.iter().max_by_key(|k| k.2.len()).unwrap();
            let path = kernel_path(mnt, key, arch);
            let whole = |f: &File| {
                let mut got = vec![0u8; data.len()];
                f.read_exact_at(&mut got, 0).unwrap();
                assert!(got == *data, "{key} [{arch}]");
            };
            let old = File::open(&path).unwrap();
            whole(&old);
            for (k, a, d) in want.iter().filter(|k| (&k.0, &k.1) != (key, arch)) {
                assert!(fs::read(kernel_path(mnt, k, a)).unwrap() == *d, "{k} [{a}]");
            }
            let new = File::open(&path).unwrap();
            whole(&new);
            whole(&old);
            drop(old);
            whole(&new);
            drop(new);
            whole(&File::open(&path).unwrap());
        }
        // 4 threads open, read and close the kernels over and over, each holding a few of
        // its handles open across rounds, so that with a cache too small for any of them the
        // opens of one kernel race its eviction, its decode again and the registration of its
        // backing file by the other threads. Every read gets exactly the kernel's bytes.
        "rp_churn" => {
            let want = expected(archive);
            std::thread::scope(|s| {
                for t in 0..4u64 {
                    let want = &want;
                    s.spawn(move || churn(mnt, want, t));
                }
            });
        }
        // `arg`: a kernel path; reads it sequentially in 64 KiB steps and compares.
        "rp_chunked" => {
            let (key, arch) = arg.rsplit_once('/').unwrap();
            let want = rocm_kpack::Archive::open(archive)
                .unwrap()
                .get_kernel(key, arch.strip_suffix(".hsaco").unwrap())
                .unwrap();
            let mut f = File::open(mnt.join(arg)).unwrap();
            let (mut got, mut buf) = (Vec::new(), vec![0u8; 64 << 10]);
            loop {
                let n = f.read(&mut buf).unwrap();
                if n == 0 {
                    break;
                }
                got.extend_from_slice(&buf[..n]);
            }
            assert!(got == want, "{arg}: {} bytes read", got.len());
        }
        // `arg` = `PATH=ERRNO`: opening PATH fails with ERRNO, twice.
        "rp_open_errno" => {
            let (p, e) = arg.split_once('=').unwrap();
            for _ in 0..2 {
                let got = File::open(mnt.join(p)).map(|_| ()).unwrap_err();
                assert_eq!(got.raw_os_error(), Some(e.parse().unwrap()), "open {p}");
            }
        }
        other => panic!("unknown scenario {other}"),
    }
}

/// One thread of `rp_churn`: 150 rounds of opening a kernel chosen by a per-thread sequence,
/// reading all of it or a range of it through the new handle and through one held from an
/// earlier round, keeping up to 3 handles open.
fn churn(mnt: &Path, want: &[(String, String, Vec<u8>)], thread: u64) {
    let mut x = 0x2545_f491_4f6c_dd1d ^ (thread + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let check = |f: &File, i: usize, r: u64| {
        let (key, arch, data) = &want[i];
        let len = data.len() as u64;
        // Whole, or a range that may run past the end.
        let (at, n) = if r % 2 == 0 || len == 0 {
            (0, len)
        } else {
            let at = r % len;
            (at, (r >> 32) % (len - at + 64))
        };
        let mut got = vec![0u8; n as usize];
        let mut filled = 0;
        while filled < got.len() {
            match f.read_at(&mut got[filled..], at + filled as u64).unwrap() {
                0 => break,
                m => filled += m,
            }
        }
        let end = (at + n).min(len) as usize;
        assert!(
            got[..filled] == data[at as usize..end],
            "{key} [{arch}]: {n} bytes at {at}, thread {thread}"
        );
    };
    let mut held: Vec<(usize, File)> = Vec::new();
    for _ in 0..150 {
        let r = next();
        let i = (r % want.len() as u64) as usize;
        let f = File::open(kernel_path(mnt, &want[i].0, &want[i].1)).unwrap();
        check(&f, i, next());
        if let Some((j, old)) = held.get((r >> 8) as usize % 4) {
            check(old, *j, next());
        }
        if (r >> 16) % 3 == 0 {
            if held.len() == 3 {
                held.remove((r >> 20) as usize % 3);
            }
            held.push((i, f));
        }
    }
}

fn tmp() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

/// Kernels of `archive` with a non-empty decoded size, and all of them.
fn counts(archive: &Path) -> (usize, usize) {
    let all = expected(archive);
    (all.iter().filter(|k| !k.2.is_empty()).count(), all.len())
}

/// Data files in a cache directory (not records, not temporary files), with their sizes.
fn cache_files(dir: &Path) -> BTreeMap<PathBuf, u64> {
    let mut out = BTreeMap::new();
    let root = dir.join("kpack-v1");
    for sub in fs::read_dir(&root).unwrap() {
        for e in fs::read_dir(sub.unwrap().path()).unwrap() {
            let e = e.unwrap();
            let name = e.file_name().to_string_lossy().into_owned();
            assert!(!name.starts_with(".tmp."), "temporary file left: {name}");
            if !name.ends_with(".b3") {
                out.insert(e.path(), e.metadata().unwrap().len());
            }
        }
    }
    out
}

#[test]
fn passthrough_and_daemon_paths_serve_exact_bytes() {
    if !fuse_available() {
        return;
    }
    let d = tmp();
    let archive = rich_archive(&d.path().join("r.kpack"), Compression::Zstd { level: 3 });
    let cases: &[(&[&str], &str)] = &[
        // The default: backing files on disk, read by the kernel itself once complete.
        (&[], "passthrough=1,backing_in_memory=0"),
        (
            &["--backing", "memory"],
            "passthrough=1,backing_in_memory=1",
        ),
        (
            &["--no-passthrough"],
            "passthrough=0,daemon_reads>0,backing_in_memory=0",
        ),
        (
            &["-o", "no_passthrough,backing=memory"],
            "passthrough=0,daemon_reads>0,backing_in_memory=1",
        ),
    ];
    for (extra, want) in cases {
        let m = start_passthrough(&archive, extra);
        m.check("walk", "");
        if want.starts_with("passthrough=1") {
            // Cold kernels were read through the daemon while they decoded; now they are
            // complete, and no read reaches it.
            m.check("rp_no_daemon_reads", "pread,mmap,concurrent");
        } else {
            m.check("pread", "");
            m.check("mmap", "");
            m.check("concurrent", "");
        }
        m.check("rp_stats", want);
        m.stop();
    }
}

#[test]
fn many_readers_of_one_cold_kernel_decode_it_once_on_both_paths() {
    if !fuse_available() {
        return;
    }
    let d = tmp();
    let path = write_archive(
        &d.path().join("one.kpack"),
        Compression::Zstd { level: 3 },
        &[("lib/big.so#0", "gfx942", pattern(3 << 20, 9))],
    );
    for extra in [&[][..], &["--no-passthrough", "-s"][..]] {
        let m = start_passthrough(&path, extra);
        m.check("cold_concurrent", "lib/big.so#0/gfx942.hsaco");
        m.check("rp_stats", "decodes=1");
        m.stop();
    }
}

#[test]
fn evicted_kernels_keep_reading_through_open_handles() {
    if !fuse_available() {
        return;
    }
    let d = tmp();
    let archive = rich_archive(&d.path().join("r.kpack"), Compression::Zstd { level: 3 });
    let (_, all) = counts(&archive);
    for extra in [&[][..], &["--no-passthrough"][..]] {
        // 8 KiB of memory: every kernel but the smallest is evicted (or never kept) while the
        // others are opened, yet each handle still reads its own bytes.
        let mut args = vec!["--backing", "memory", "--memory-cache-size", "8K"];
        args.extend_from_slice(extra);
        let m = start_passthrough(&archive, &args);
        m.check("rp_hold_all", "");
        m.check(
            "rp_stats",
            &format!("decodes={all},evictions>0,bytes_cached<8193,backing_bytes<8193"),
        );
        m.stop();
    }
}

/// A kernel evicted while a handle (with passthrough: a registered backing file) is still open
/// is opened again: old and new handles read the right bytes, on memory and disk backing, with
/// and without passthrough.
#[test]
fn an_evicted_kernel_reopened_beside_its_old_handle_reads_right() {
    if !fuse_available() {
        return;
    }
    let d = tmp();
    let archive = rich_archive(&d.path().join("r.kpack"), Compression::Zstd { level: 3 });
    on_each_backing_bounded_to_8k(&archive, "rp_reopen_evicted", "evictions>0");
}

/// Opens, reads and closes of the same kernels from 4 threads at once, some handles held across
/// rounds, with a bound that keeps none of them: evictions race new decodes and backing-file
/// registrations of the same kernels, and every read still gets the kernel's exact bytes, on
/// memory and disk backing, with and without passthrough.
#[test]
fn opens_racing_evictions_from_four_threads_read_right() {
    if !fuse_available() {
        return;
    }
    let d = tmp();
    let archive = rich_archive(&d.path().join("r.kpack"), Compression::Zstd { level: 3 });
    on_each_backing_bounded_to_8k(&archive, "rp_churn", "evictions>10,decodes>20");
}

/// Mounts `archive` on memory and on disk backing, each bounded to 8 KiB (which holds none of
/// `rich_archive`'s larger kernels), with and without passthrough; runs `scenario` on each
/// mount and checks `user.kpack.stats` against `stats` (as `rp_stats` does).
fn on_each_backing_bounded_to_8k(archive: &Path, scenario: &str, stats: &str) {
    for (backing, bound) in [
        ("memory", "--memory-cache-size"),
        ("disk", "--disk-cache-size"),
    ] {
        for extra in [&[][..], &["--no-passthrough"][..]] {
            let mut args = vec!["--backing", backing, bound, "8K"];
            args.extend_from_slice(extra);
            let m = start_passthrough(archive, &args);
            m.check(scenario, "");
            m.check("rp_stats", stats);
            m.stop();
        }
    }
}

#[test]
fn memory_backing_stays_within_the_cache_size_over_a_set_four_times_larger() {
    if !fuse_available() {
        return;
    }
    let d = tmp();
    let kernels: Vec<(String, Vec<u8>)> = (0..16)
        .map(|i| (format!("gfx90{i:x}"), pattern(64 << 10, i)))
        .collect();
    let refs: Vec<(&str, &str, Vec<u8>)> = kernels
        .iter()
        .map(|(a, data)| ("lib/set.so#0", a.as_str(), data.clone()))
        .collect();
    // 1 MiB of kernels over a 256 KiB bound.
    let path = write_archive(
        &d.path().join("s.kpack"),
        Compression::Zstd { level: 3 },
        &refs,
    );
    let m = start_passthrough(
        &path,
        &["--backing", "memory", "--memory-cache-size", "256K"],
    );
    for _ in 0..2 {
        m.check("walk", "");
    }
    m.check(
        "rp_stats",
        "capacity=262144,bytes_cached=262144,backing_bytes=262144,decodes>16",
    );
    m.stop();
}

#[test]
fn scratch_directory_is_made_per_mount_and_removed_at_unmount() {
    if !fuse_available() {
        return;
    }
    let d = tmp();
    let archive = rich_archive(&d.path().join("r.kpack"), Compression::None);
    let scratch = d.path().join("scratch");
    fs::create_dir(&scratch).unwrap();
    let m = start_passthrough(&archive, &["--scratch-dir", scratch.to_str().unwrap()]);
    m.check("walk", "");
    let made: Vec<_> = fs::read_dir(&scratch)
        .unwrap()
        .map(|e| e.unwrap())
        .collect();
    assert_eq!(made.len(), 1, "one directory for this mount");
    assert!(
        made[0]
            .file_name()
            .to_string_lossy()
            .starts_with("kpack-fuse."),
        "{:?}",
        made[0].file_name()
    );
    // Backing files are unlinked as soon as they are made: nothing to leave behind.
    assert_eq!(fs::read_dir(made[0].path()).unwrap().count(), 0);
    m.stop();
    assert_eq!(
        fs::read_dir(&scratch).unwrap().count(),
        0,
        "removed at unmount"
    );
}

#[test]
fn cache_dir_is_reused_across_remounts_without_decoding() {
    if !fuse_available() {
        return;
    }
    let d = tmp();
    let archive = rich_archive(&d.path().join("r.kpack"), Compression::Zstd { level: 3 });
    let (_, all) = counts(&archive);
    let cache = d.path().join("cache");
    let c = cache.to_str().unwrap();
    let m = start_passthrough(&archive, &["--cache-dir", c]);
    m.check("walk", "");
    m.check(
        "rp_stats",
        &format!("decodes={all},cache_dir_misses={all},cache_dir_hits=0"),
    );
    m.stop();
    assert_eq!(cache_files(&cache).len(), all);
    for extra in [
        &["--cache-dir", c][..],
        &["-o", &format!("cache_dir={c}")][..],
    ] {
        let m = start_passthrough(&archive, extra);
        m.check("walk", "");
        m.check("pread", "");
        m.check(
            "rp_stats",
            &format!("decodes=0,cache_dir_hits={all},cache_dir_misses=0,cache_dir_rejected=0"),
        );
        m.stop();
    }
}

/// The rich set of kernels in the reference writer's layout: no per-kernel digests, so cached
/// files are checked against the `.b3` records.
fn reference_layout_archive(path: &Path) -> PathBuf {
    let a = rocm_kpack::Archive::open(rich_archive(path, Compression::Zstd { level: 3 })).unwrap();
    let arches: Vec<String> = a.architectures().to_vec();
    let mut w =
        rocm_kpack::ArchiveWriter::new("it", "mixed", arches, Compression::Zstd { level: 3 })
            .unwrap();
    w.set_reference_layout(true);
    for (key, e) in a.entries() {
        w.add_kernel(key, e.arch, a.get_kernel(key, e.arch).unwrap())
            .unwrap();
    }
    drop(a);
    w.write(path, &|_| {}).unwrap();
    assert!(
        rocm_kpack::Archive::open(path)
            .unwrap()
            .entries()
            .all(|(_, e)| e.blake3_at.is_none())
    );
    path.to_path_buf()
}

#[test]
fn truncated_and_altered_cache_files_are_decoded_again() {
    if !fuse_available() {
        return;
    }
    let d = tmp();
    let with_digests = rich_archive(&d.path().join("r.kpack"), Compression::Zstd { level: 3 });
    let without = reference_layout_archive(&d.path().join("ref.kpack"));
    for archive in [with_digests, without] {
        truncated_and_altered(
            &archive,
            &d.path().join(format!(
                "cache-{}",
                archive.file_stem().unwrap().to_string_lossy()
            )),
        );
    }
}

fn truncated_and_altered(archive: &Path, cache: &Path) {
    let (archive, cache) = (archive.to_path_buf(), cache.to_path_buf());
    let (_, all) = counts(&archive);
    let c = cache.to_str().unwrap();
    let m = start_passthrough(&archive, &["--cache-dir", c]);
    m.check("walk", "");
    m.stop();
    let files = cache_files(&cache);
    let mut big = files.iter().filter(|(_, len)| **len > 1000).map(|(p, _)| p);
    let (truncated, altered) = (big.next().unwrap(), big.next().unwrap());
    File::options()
        .write(true)
        .open(truncated)
        .unwrap()
        .set_len(100)
        .unwrap();
    // Same length, one byte different: only the digest tells.
    let f = File::options()
        .read(true)
        .write(true)
        .open(altered)
        .unwrap();
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, 500).unwrap();
    f.write_all_at(&[b[0] ^ 0x40], 500).unwrap();
    drop(f);
    let m = start_passthrough(&archive, &["--cache-dir", c]);
    m.check("walk", "");
    m.check(
        "rp_stats",
        &format!(
            "decodes=2,cache_dir_rejected=2,cache_dir_misses=2,cache_dir_hits={}",
            all - 2
        ),
    );
    m.stop();
    // Both were rewritten whole.
    assert_eq!(cache_files(&cache), files, "{archive:?}");
}

#[test]
fn cache_dir_of_a_replaced_archive_never_serves_the_old_bytes() {
    if !fuse_available() {
        return;
    }
    let d = tmp();
    let path = d.path().join("r.kpack");
    let kernels = |seed: u32| -> Vec<(&'static str, &'static str, Vec<u8>)> {
        vec![
            ("lib/a.so#0", "gfx900", pattern(9000, seed)),
            ("lib/a.so#0", "gfx942", pattern(70_000, seed + 1)),
        ]
    };
    write_archive(&path, Compression::Zstd { level: 3 }, &kernels(1));
    let cache = d.path().join("cache");
    let c = cache.to_str().unwrap();
    let m = start_passthrough(&path, &["--cache-dir", c]);
    m.check("walk", "");
    m.stop();
    // Same names and sizes, other bytes, written over the same path.
    let tmp_path = d.path().join("new.kpack");
    write_archive(&tmp_path, Compression::Zstd { level: 3 }, &kernels(50));
    fs::rename(&tmp_path, &path).unwrap();
    let m = start_passthrough(&path, &["--cache-dir", c]);
    // walk compares with the archive as it is now.
    m.check("walk", "");
    m.check("rp_stats", "decodes=2,cache_dir_hits=0,cache_dir_misses=2");
    m.stop();
}

#[test]
fn two_daemons_share_one_cache_dir() {
    if !fuse_available() {
        return;
    }
    let d = tmp();
    let archive = rich_archive(&d.path().join("r.kpack"), Compression::Zstd { level: 3 });
    let (_, all) = counts(&archive);
    let cache = d.path().join("cache");
    let c = cache.to_str().unwrap();
    let a = start_passthrough(&archive, &["--cache-dir", c]);
    let b = start_passthrough(&archive, &["--cache-dir", c, "--no-passthrough"]);
    for _ in 0..3 {
        let (ra, rb) = (a.spawn_child("walk", ""), b.spawn_child("concurrent", ""));
        let (oa, ob) = (a.finish(ra), b.finish(rb));
        assert!(oa.success, "{}\n{}", oa.output, a.daemon_log());
        assert!(ob.success, "{}\n{}", ob.output, b.daemon_log());
    }
    a.stop();
    b.stop();
    assert_eq!(cache_files(&cache).len(), all);
    // A third mount finds every kernel there, valid.
    let m = start_passthrough(&archive, &["--cache-dir", c]);
    m.check("walk", "");
    m.check("rp_stats", &format!("decodes=0,cache_dir_hits={all}"));
    m.stop();
}

#[test]
fn cache_dir_stays_within_its_size() {
    if !fuse_available() {
        return;
    }
    let d = tmp();
    let archive = rich_archive(&d.path().join("r.kpack"), Compression::Zstd { level: 3 });
    let cache = d.path().join("cache");
    let c = cache.to_str().unwrap();
    let m = start_passthrough(
        &archive,
        &["-o", &format!("cache_dir={c},cache_dir_size=100K")],
    );
    m.check("walk", "");
    m.check("rp_stats", "cache_dir_evictions>0");
    m.stop();
    let total: u64 = cache_files(&cache).values().sum();
    assert!(total <= 100 << 10, "{total} bytes in the cache directory");
}

#[test]
fn daemon_path_reads_in_large_requests() {
    if !fuse_available() {
        return;
    }
    let d = tmp();
    let path = write_archive(
        &d.path().join("big.kpack"),
        Compression::Zstd { level: 3 },
        &[("lib/big.so#0", "gfx942", pattern(4 << 20, 3))],
    );
    let m = start_passthrough(&path, &["--no-passthrough"]);
    let entry = rocm_kpack::fs::setup::mountinfo::mount_at(&m.mountpoint)
        .unwrap()
        .unwrap();
    let knob = format!(
        "/sys/class/bdi/{}:{}/read_ahead_kb",
        entry.major, entry.minor
    );
    assert_eq!(fs::read_to_string(&knob).unwrap().trim(), "1024", "{knob}");
    // 4 MiB read 64 KiB at a time: readahead turns that into a few 1 MiB READs (with the
    // kernel's default 128 KiB readahead it would be 32).
    m.check("rp_chunked", "lib/big.so#0/gfx942.hsaco");
    m.check("rp_stats", "passthrough=0,daemon_reads<10,decodes=1");
    m.stop();
}

#[test]
fn kernel_failing_its_digest_is_eio_and_never_cached() {
    if !fuse_available() {
        return;
    }
    let d = tmp();
    let path = d.path().join("d.kpack");
    let bad = pattern(50_000, 7);
    write_archive(
        &path,
        Compression::Zstd { level: 3 },
        &[
            ("lib/a.so#0", "gfx900", pattern(9000, 1)),
            ("lib/a.so#0", "gfx942", bad.clone()),
        ],
    );
    // Change the frame digest the TOC records for gfx942 (frames and sizes stay valid): what
    // reads check for archives we write.
    let mut bytes = fs::read(&path).unwrap();
    let kref_frame = {
        let a = rocm_kpack::Archive::open(&path).unwrap();
        let k = a.locate("lib/a.so#0", "gfx942").unwrap();
        k.stored.offset as usize..(k.stored.offset + k.stored.size) as usize
    };
    let digest = blake3::hash(&bytes[kref_frame]);
    let at = bytes
        .windows(32)
        .position(|w| w == digest.as_bytes())
        .expect("the archive records the frame's digest");
    bytes[at] ^= 0x01;
    fs::write(&path, &bytes).unwrap();
    let cache = d.path().join("cache");
    for extra in [&[][..], &["--cache-dir", cache.to_str().unwrap()][..]] {
        let m = start_passthrough(&path, extra);
        m.check("rp_open_errno", "lib/a.so#0/gfx942.hsaco=5");
        m.check("walk_one", "lib/a.so#0/gfx900.hsaco");
        // Each open of the bad kernel decoded it again: a failure is never kept.
        m.check("rp_stats", "decodes=3,cache_dir_hits=0,backing_bytes=9000");
        let log = m.daemon_log();
        assert!(
            log.contains("lib/a.so#0 [gfx942]") && log.contains("BLAKE3 digest mismatch"),
            "{log}"
        );
        m.stop();
    }
    // Only the good kernel reached the cache directory.
    assert_eq!(cache_files(&cache).len(), 1);
}

#[test]
fn memory_backing_and_a_cache_dir_are_refused_together() {
    let d = tmp();
    let archive = rich_archive(&d.path().join("r.kpack"), Compression::None);
    let mnt = d.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    let cache = d.path().join("c");
    for extra in [
        vec![
            "--backing",
            "memory",
            "--cache-dir",
            cache.to_str().unwrap(),
        ],
        vec!["-o", "backing=memory", "-o", "cache_dir=/nonexistent/never"],
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_kpack-fuse"))
            .arg("mount")
            .arg(&archive)
            .arg(&mnt)
            .arg("-f")
            .args(&extra)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {err}");
        assert!(
            err.contains("backing=memory and cache_dir are mutually exclusive"),
            "{err}"
        );
    }
    assert!(!cache.exists(), "nothing created for a refused mount");
}

/// An overlayfs mounted for a test, unmounted lazily when dropped (also when the test fails).
struct Overlay(PathBuf);

impl Overlay {
    /// Mounts an overlay of `lower` at `at`, with its upper and work directories made in `dir`;
    /// None when the kernel refuses (no overlayfs).
    fn mount(dir: &Path, lower: &Path, at: &Path) -> Option<Overlay> {
        let (upper, work) = (dir.join("upper"), dir.join("work"));
        for d in [&upper, &work, &at.to_path_buf()] {
            fs::create_dir_all(d).unwrap();
        }
        let options = format!(
            "lowerdir={},upperdir={},workdir={}",
            lower.display(),
            upper.display(),
            work.display()
        );
        let c = |p: &Path| std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
        let (kind, target, data) = (c(Path::new("overlay")), c(at), c(Path::new(&options)));
        // SAFETY: NUL-terminated strings that outlive the call.
        let rc = unsafe {
            libc::mount(
                kind.as_ptr(),
                target.as_ptr(),
                kind.as_ptr(),
                0,
                data.as_ptr().cast(),
            )
        };
        if rc != 0 {
            eprintln!(
                "overlay at {}: {}",
                at.display(),
                std::io::Error::last_os_error()
            );
            return None;
        }
        Some(Overlay(at.to_path_buf()))
    }
}

impl Drop for Overlay {
    fn drop(&mut self) {
        let target = std::ffi::CString::new(self.0.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a NUL-terminated path.
        unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
    }
}

#[test]
fn a_backing_file_the_kernel_refuses_sends_reads_through_the_daemon() {
    if !fuse_available() {
        return;
    }
    // Backing files on an overlayfs over an overlayfs: a file system stacked two deep, which the
    // kernel refuses as a passthrough backing file for a mount that allows a depth of 2 (ELOOP
    // from the backing-id registration). Passthrough was granted at init, so this is the
    // fallback in the middle of a mount's life, at its first complete kernel.
    let d = tmp();
    let base = d.path().join("base");
    fs::create_dir(&base).unwrap();
    let one = Overlay::mount(&d.path().join("one"), &base, &d.path().join("one/at"));
    let two = one
        .as_ref()
        .and_then(|one| Overlay::mount(&d.path().join("two"), &one.0, &d.path().join("two/at")));
    if !crate::support::mount_env::required(
        "the refused backing file test",
        &[("overlayfs over overlayfs", two.is_some())],
    ) {
        return;
    }
    let scratch = two.as_ref().unwrap().0.clone();
    let archive = rich_archive(&d.path().join("r.kpack"), Compression::Zstd { level: 3 });
    let m = start_passthrough(&archive, &["--scratch-dir", scratch.to_str().unwrap()]);
    // The whole tree twice, then random offsets, mappings and concurrent readers: every byte
    // exact, each kernel decoded once, and from the refusal on every read is the daemon's.
    m.check("walk", "");
    m.check("walk", "");
    m.check("pread", "");
    m.check("mmap", "");
    m.check("concurrent", "");
    let (_, all) = counts(&archive);
    m.check(
        "rp_stats",
        &format!("passthrough=0,daemon_reads>0,decodes={all}"),
    );
    let log = m.daemon_log();
    m.stop();
    let refusals = log
        .matches("the kernel refused a passthrough backing file")
        .count();
    assert_eq!(refusals, 1, "said once:\n{log}");
    drop(two);
    drop(one);
}
