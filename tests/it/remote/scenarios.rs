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
        "remote_stats" => {
            let text = String::from_utf8(xattr(mnt, "user.kpack.stats")).unwrap();
            for line in text.lines() {
                println!("STAT {line}");
            }
        }
        other => panic!("unknown remote scenario {other}"),
    }
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
