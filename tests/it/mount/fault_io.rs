//! The child side of the live-mount fault tests (`faults.rs`): file operations run in a watched
//! child process, as every mount scenario is (see `support::mount`). Reads compare what the
//! mount returned with the same range of the archive API's bytes, so a single wrong byte at any
//! offset fails the scenario.

use std::fs::{self, File};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};

use rocm_kpack::Archive;

use super::scenarios::{errno_of, fnv, kernel_path, stats};

pub fn run(name: &str, mnt: &Path, archive: &Path, arg: &str) {
    match name {
        "after_fault" => after_fault(mnt, arg),
        "enotconn" => enotconn(mnt, arg),
        "random_ranges" => random_ranges(mnt, archive, arg, false),
        "pressure" => random_ranges(mnt, archive, arg, true),
        other => panic!("unknown scenario {other}"),
    }
}

/// Every non-empty kernel of `archive` as (mounted path, bytes).
fn kernels(mnt: &Path, archive: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let a = Archive::open(archive).unwrap();
    a.entries()
        .map(|(key, e)| {
            (
                kernel_path(mnt, key, e.arch),
                a.get_kernel(key, e.arch).unwrap(),
            )
        })
        .filter(|(_, d)| !d.is_empty())
        .collect()
}

/// Drops the kernel's page cache of `f`, so the next read of it reaches the daemon again.
fn drop_page_cache(f: &File) {
    // SAFETY: an advisory call on a descriptor we hold.
    let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    assert_eq!(rc, 0, "posix_fadvise(DONTNEED)");
}

fn read_all(f: &File, len: usize) -> std::io::Result<Vec<u8>> {
    let mut buf = vec![0u8; len + 1];
    let mut got = 0;
    loop {
        let n = f.read_at(&mut buf[got..], got as u64)?;
        if n == 0 {
            break;
        }
        got += n;
    }
    buf.truncate(got);
    Ok(buf)
}

/// `arg` = `ORIGINAL|READ_BEFORE|MODE`. ORIGINAL is an untouched copy of the archive as it was
/// mounted; READ_BEFORE the mount-relative path of the one kernel read before the fault (`-`
/// for none). After the fault:
/// * sizes still come from the TOC;
/// * READ_BEFORE reads its original bytes, from the page cache and again, after the page cache
///   was dropped, from the daemon's cache;
/// * every other non-empty kernel is EIO (`MODE` = `eio`) or byte-exact (`MODE` = `intact`),
///   read with the page cache dropped first so that the daemon decodes it now.
fn after_fault(mnt: &Path, arg: &str) {
    let mut parts = arg.split('|');
    let (original, read_before, mode) = (
        Path::new(parts.next().unwrap()),
        parts.next().unwrap(),
        parts.next().unwrap(),
    );
    assert!(mode == "eio" || mode == "intact", "mode {mode}");
    let before = stats(mnt);
    let (mut exact, mut eio) = (0, 0);
    for (path, data) in kernels(mnt, original) {
        assert_eq!(
            fs::metadata(&path).unwrap().len(),
            data.len() as u64,
            "{path:?} size"
        );
        // A kernel is decoded when opened, so a bad one fails the open (or, when its
        // backing file already existed, nothing fails).
        let f = match File::open(&path) {
            Ok(f) => f,
            Err(e) if mode == "eio" && e.raw_os_error() == Some(libc::EIO) => {
                eio += 1;
                continue;
            }
            Err(e) => panic!("open {path:?}: {e}"),
        };
        if read_before != "-" && path == mnt.join(read_before) {
            assert!(
                read_all(&f, data.len()).unwrap() == data,
                "{path:?} from the page cache"
            );
            drop_page_cache(&f);
            assert!(
                read_all(&f, data.len()).unwrap() == data,
                "{path:?} from the daemon's cache"
            );
            exact += 1;
            continue;
        }
        drop_page_cache(&f);
        match mode {
            "eio" => {
                assert_eq!(
                    errno_of(read_all(&f, data.len()), &format!("{path:?}")),
                    libc::EIO
                );
                eio += 1;
            }
            _ => {
                let got = read_all(&f, data.len()).unwrap();
                assert!(
                    got.len() == data.len() && fnv(&got) == fnv(&data),
                    "{path:?} differs"
                );
                exact += 1;
            }
        }
    }
    let after = stats(mnt);
    println!("after fault ({mode}): {exact} exact, {eio} EIO; stats {before:?} -> {after:?}");
    if mode == "intact" {
        assert!(
            after["decodes"] > before["decodes"],
            "nothing was decoded after the fault"
        );
    }
}

/// After the daemon was killed: every request that reaches the daemon gives ENOTCONN (statfs,
/// opendir, open). `stat` may still answer from attributes the kernel cached with their long
/// TTL, so only its errno, if any, is checked.
fn enotconn(mnt: &Path, arg: &str) {
    let c = std::ffi::CString::new(mnt.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: valid path; statvfs fills the zeroed struct.
    let mut sv: libc::statvfs = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::statvfs(c.as_ptr(), &mut sv) };
    assert_eq!(
        (rc, std::io::Error::last_os_error().raw_os_error()),
        (-1, Some(libc::ENOTCONN)),
        "statfs"
    );
    assert_eq!(
        errno_of(fs::read_dir(mnt), "readdir mount point"),
        libc::ENOTCONN
    );
    assert_eq!(
        errno_of(File::open(mnt.join(arg)), "open a kernel"),
        libc::ENOTCONN
    );
    match fs::metadata(mnt) {
        Ok(_) => println!("stat of the mount point: answered from the kernel's attribute cache"),
        Err(e) => assert_eq!(
            e.raw_os_error(),
            Some(libc::ENOTCONN),
            "stat mount point: {e}"
        ),
    }
    println!("ENOTCONN for statfs, readdir and open");
}

/// A xorshift64 step.
fn next(seed: &mut u64) -> u64 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    *seed
}

/// `arg` = `THREADS,OPS`: THREADS readers started together, each doing exactly OPS ranged reads
/// of random kernels at random offsets (up to 256 KiB, some running past the end of the file),
/// each checked by checksum. Plain mode keeps one handle per kernel per thread and drops its page
/// cache every 32 reads; `pressure` mode opens a new handle for every read and drops the page
/// cache before closing it, so every read reaches the daemon.
fn random_ranges(mnt: &Path, archive: &Path, arg: &str, pressure: bool) {
    let (threads, ops) = arg.split_once(',').unwrap();
    let (threads, ops): (usize, u64) = (threads.parse().unwrap(), ops.parse().unwrap());
    let want = Arc::new(kernels(mnt, archive));
    let before = stats(mnt);
    let done = Arc::new(AtomicU64::new(0));
    let bytes = Arc::new(AtomicU64::new(0));
    let start = Arc::new(Barrier::new(threads));
    let handles: Vec<_> = (0..threads as u64)
        .map(|t| {
            let (want, done, bytes, start) =
                (want.clone(), done.clone(), bytes.clone(), start.clone());
            std::thread::spawn(move || {
                let mut seed = 0x9e3779b97f4a7c15 ^ (t + 1).wrapping_mul(0x2545f4914f6cdd1d);
                let mut open: Vec<Option<File>> = (0..want.len()).map(|_| None).collect();
                start.wait();
                for op in 0..ops {
                    let k = (next(&mut seed) % want.len() as u64) as usize;
                    let (path, data) = &want[k];
                    let len = data.len() as u64;
                    let off = next(&mut seed) % len;
                    let n = 1 + (next(&mut seed) % (256 << 10)) as usize;
                    let fresh;
                    let f = if pressure {
                        fresh = File::open(path).unwrap();
                        &fresh
                    } else {
                        open[k].get_or_insert_with(|| File::open(path).unwrap())
                    };
                    let mut buf = vec![0u8; n];
                    let got = f.read_at(&mut buf, off).unwrap();
                    let end = (off as usize + n).min(data.len());
                    let expect = &data[off as usize..end];
                    assert_eq!(
                        got,
                        expect.len(),
                        "thread {t} op {op}: {path:?} read({n}) at {off}"
                    );
                    // A plain comparison (memcmp) rather than two checksums: exact, and cheap
                    // enough in a debug build that 16 x 2000 reads of up to 256 KiB finish well
                    // within the watchdog on a loaded machine.
                    if buf[..got] != *expect {
                        let first = buf.iter().zip(expect).position(|(a, b)| a != b).unwrap();
                        panic!(
                            "thread {t} op {op}: {path:?} at {off}: byte {} differs",
                            off as usize + first
                        );
                    }
                    if pressure || op % 32 == 31 {
                        drop_page_cache(f);
                    }
                    done.fetch_add(1, Ordering::Relaxed);
                    bytes.fetch_add(got as u64, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let after = stats(mnt);
    let done = done.load(Ordering::Relaxed);
    assert_eq!(done, threads as u64 * ops);
    println!(
        "{done} checked reads, {} bytes, {} kernels; stats {before:?} -> {after:?}",
        bytes.load(Ordering::Relaxed),
        want.len()
    );
    // For the parent: the counters this run added.
    for k in ["hits", "misses", "decodes", "evictions"] {
        println!("DELTA {k} {}", after[k] - before[k]);
    }
}
