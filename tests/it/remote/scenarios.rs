//! The child side of the remote mount tests (run under `support::mount`'s watchdog).

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

pub fn run(name: &str, mnt: &Path, arg: &str) {
    match name {
        // `REL|EXPECTED`: the file reads exactly as the local file EXPECTED.
        "remote_same" => {
            let (rel, expected) = arg.split_once('|').unwrap();
            let got = std::fs::read(mnt.join(rel)).unwrap();
            assert!(got == std::fs::read(expected).unwrap(), "{rel} differs");
        }
        // `REL`: reading the file fails with EIO (and returns no bytes).
        "remote_eio" => {
            let e = std::fs::read(mnt.join(arg)).unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::EIO), "{arg}: {e}");
        }
        // `REL|NAME|VALUE`: the extended attribute NAME of REL is VALUE.
        "remote_mtime" => {
            // `REL|SECONDS`: the mount's root and REL show the object's Last-Modified time.
            use std::os::unix::fs::MetadataExt;
            let (rel, secs) = arg.split_once('|').unwrap();
            let secs: i64 = secs.parse().unwrap();
            assert_eq!(std::fs::metadata(mnt).unwrap().mtime(), secs, "root");
            assert_eq!(
                std::fs::metadata(mnt.join(rel)).unwrap().mtime(),
                secs,
                "{rel}"
            );
        }
        "remote_xattr" => {
            let mut parts = arg.splitn(3, '|');
            let (rel, name, value) = (
                parts.next().unwrap(),
                parts.next().unwrap(),
                parts.next().unwrap(),
            );
            assert_eq!(
                xattr(&mnt.join(rel), name),
                value.as_bytes(),
                "{rel} {name}"
            );
        }
        // `N|EXPECTED_DIR`: N threads read every file of EXPECTED_DIR through the mount at once.
        "remote_parallel" => {
            let (n, dir) = arg.split_once('|').unwrap();
            let mut files = Vec::new();
            let mut stack = vec![std::path::PathBuf::from(dir)];
            while let Some(d) = stack.pop() {
                for e in std::fs::read_dir(&d).unwrap() {
                    let p = e.unwrap().path();
                    if p.is_dir() {
                        stack.push(p);
                    } else {
                        files.push(p.strip_prefix(dir).unwrap().to_path_buf());
                    }
                }
            }
            let n: usize = n.parse().unwrap();
            std::thread::scope(|s| {
                for t in 0..n {
                    let files = &files;
                    s.spawn(move || {
                        for rel in files.iter().skip(t).step_by(n) {
                            let got = std::fs::read(mnt.join(rel)).unwrap();
                            let want = std::fs::read(Path::new(dir).join(rel)).unwrap();
                            assert!(got == want, "{} differs", rel.display());
                        }
                    });
                }
            });
        }
        // `PASSES|THREADS|EXPECTED_DIR`: every file of EXPECTED_DIR is read PASSES times through
        // the mount, by THREADS threads at once, each read with the page cache dropped first.
        // A read must return exactly the file or fail with EIO; prints the counts and the slowest.
        "remote_faulty_reads" => {
            let mut parts = arg.splitn(3, '|');
            let passes: usize = parts.next().unwrap().parse().unwrap();
            let threads: usize = parts.next().unwrap().parse().unwrap();
            let dir = Path::new(parts.next().unwrap());
            let files = crate::support::files_below(dir);
            let ok = std::sync::atomic::AtomicU64::new(0);
            let eio = std::sync::atomic::AtomicU64::new(0);
            let slowest = std::sync::Mutex::new(std::time::Duration::ZERO);
            std::thread::scope(|s| {
                for t in 0..threads {
                    let (files, ok, eio, slowest) = (&files, &ok, &eio, &slowest);
                    s.spawn(move || {
                        for pass in 0..passes {
                            for rel in files.iter().skip((t + pass) % threads).step_by(threads) {
                                let started = std::time::Instant::now();
                                let got = read_uncached(&mnt.join(rel));
                                let took = started.elapsed();
                                let mut worst = slowest.lock().unwrap();
                                *worst = (*worst).max(took);
                                drop(worst);
                                match got {
                                    Ok(bytes) => {
                                        let want = std::fs::read(dir.join(rel)).unwrap();
                                        assert!(
                                            bytes == want,
                                            "WRONG BYTES: {} ({} bytes read, {} expected)",
                                            rel.display(),
                                            bytes.len(),
                                            want.len()
                                        );
                                        ok.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                                    }
                                    Err(e) => {
                                        assert_eq!(
                                            e.raw_os_error(),
                                            Some(libc::EIO),
                                            "{}: {e}",
                                            rel.display()
                                        );
                                        eio.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                                    }
                                }
                            }
                        }
                    });
                }
            });
            println!(
                "READS ok {} eio {} slowest_ms {}",
                ok.into_inner(),
                eio.into_inner(),
                slowest.into_inner().unwrap().as_millis()
            );
        }
        "remote_stats" => {
            let text = String::from_utf8(xattr(mnt, "user.kpack.stats")).unwrap();
            for line in text.lines() {
                println!("STAT {line}");
            }
        }
        other => panic!("unknown remote scenario {other}"),
    }
}

/// Reads a whole file with its page cache dropped first, so the daemon answers.
fn read_uncached(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    use std::os::unix::io::AsRawFd;
    let mut f = std::fs::File::open(path)?;
    // SAFETY: fadvise on a descriptor we hold; no memory is passed.
    unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    let mut out = Vec::new();
    f.read_to_end(&mut out)?;
    Ok(out)
}

fn xattr(path: &Path, name: &str) -> Vec<u8> {
    let p = CString::new(path.as_os_str().as_bytes()).unwrap();
    let n = CString::new(name).unwrap();
    let mut buf = vec![0u8; 64 << 10];
    // SAFETY: valid NUL-terminated strings and a buffer of the given length.
    let len = unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    assert!(
        len >= 0,
        "getxattr {name}: {}",
        std::io::Error::last_os_error()
    );
    buf.truncate(len as usize);
    buf
}
