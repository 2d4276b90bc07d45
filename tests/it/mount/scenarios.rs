//! The child side of the mount tests: file operations on a live mount, run in a separate
//! process (see `support::mount`). Each scenario panics on the first wrong byte, size or errno;
//! the parent sees a failed child and prints this output.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Barrier};
use std::time::UNIX_EPOCH;

use rocm_kpack::Archive;

pub fn run(name: &str, mnt: &Path, archive: &Path, arg: &str) {
    match name {
        "walk" => walk(mnt, archive),
        "stat" => stat(mnt, archive),
        "pread" => pread(mnt, archive),
        "mmap" => mmap(mnt, archive),
        "concurrent" => concurrent(mnt, archive),
        "errno" => errno(mnt, arg),
        "quiet_calls" => quiet_calls(mnt, archive, arg),
        "fallback" => fallback(mnt, archive, arg == "native"),
        "corrupt" => corrupt(mnt, archive, arg),
        "cold_concurrent" => cold_concurrent(mnt, archive, arg),
        "small_chunks" => small_chunks(mnt, archive, arg),
        "keep_cache" => keep_cache(mnt, archive),
        "changed" => changed(mnt, arg),
        "hold" => hold(mnt, archive, arg),
        "elf" => elf(mnt, archive),
        "sample_links" => sample_links(mnt),
        "tree" => tree(mnt, Path::new(arg)),
        "pack" => {
            let out = Command::new(env!("CARGO_BIN_EXE_kpack-fuse"))
                .arg("pack")
                .arg(mnt)
                .arg("-o")
                .arg(arg)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        "link" => {
            let (path, target) = arg.split_once('=').unwrap();
            assert_eq!(
                fs::read_link(mnt.join(path)).unwrap(),
                Path::new(target),
                "{path}"
            );
            assert!(
                fs::read(mnt.join(path)).unwrap()
                    == fs::read(mnt.join(path).with_file_name(target)).unwrap()
            );
        }
        "eio" => {
            let e = fs::read(mnt.join(arg)).unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::EIO), "{arg}: {e}");
        }
        "same_as" => {
            let (path, file) = arg.split_once('=').unwrap();
            assert!(
                fs::read(mnt.join(path)).unwrap() == fs::read(file).unwrap(),
                "{path}"
            );
        }
        "walk_one" => {
            let (key, arch) = arg.rsplit_once('/').unwrap();
            let want = Archive::open(archive)
                .unwrap()
                .get_kernel(key, arch.strip_suffix(".hsaco").unwrap())
                .unwrap();
            assert!(fs::read(mnt.join(arg)).unwrap() == want);
        }
        other if other.starts_with("rp_") => super::read_path::run(other, mnt, archive, arg),
        other if other.starts_with("cold_") => super::cold::run(other, mnt, archive, arg),
        other if other.starts_with("ahead_") => super::ahead::run(other, mnt, archive, arg),
        other if other.starts_with("om_") => super::open_mode::run(other, mnt, archive, arg),
        "crash_reads" => super::crash_cache::run(name, mnt, arg),
        "full_reads" => super::crash_cache::run_full(mnt, arg),
        other if other.starts_with("remote_") => crate::remote::scenarios::run(other, mnt, arg),
        other => super::fault_io::run(other, mnt, archive, arg),
    }
}

fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

pub fn errno_of<T: std::fmt::Debug>(r: io::Result<T>, what: &str) -> i32 {
    match r {
        Ok(v) => panic!("{what}: expected an error, got {v:?}"),
        Err(e) => e
            .raw_os_error()
            .unwrap_or_else(|| panic!("{what}: {e} has no errno")),
    }
}

pub fn getxattr(path: &Path, name: &str) -> io::Result<Vec<u8>> {
    let (p, n) = (cpath(path), CString::new(name).unwrap());
    let mut buf = vec![0u8; 4096];
    // SAFETY: valid strings; the buffer is as large as we say.
    let got = unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if got < 0 {
        return Err(io::Error::last_os_error());
    }
    buf.truncate(got as usize);
    Ok(buf)
}

/// `user.kpack.stats` of the mount, as a map.
pub fn stats(mnt: &Path) -> BTreeMap<String, u64> {
    let text = String::from_utf8(getxattr(mnt, "user.kpack.stats").unwrap()).unwrap();
    text.lines()
        .map(|l| {
            let (k, v) = l.split_once(' ').unwrap();
            (k.to_owned(), v.parse().unwrap())
        })
        .collect()
}

/// Every (key, arch, bytes) of the archive, via the archive API.
pub fn expected(archive: &Path) -> Vec<(String, String, Vec<u8>)> {
    let a = Archive::open(archive).unwrap();
    a.entries()
        .map(|(key, e)| {
            (
                key.to_owned(),
                e.arch.to_owned(),
                a.get_kernel(key, e.arch).unwrap(),
            )
        })
        .collect()
}

pub fn kernel_path(mnt: &Path, key: &str, arch: &str) -> PathBuf {
    mnt.join(key).join(format!("{arch}.hsaco"))
}

pub fn fnv(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf29ce484222325u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x100000001b3)
    })
}

/// Walks the whole tree: exactly the archive's files, each byte for byte.
fn walk(mnt: &Path, archive: &Path) {
    let mut found = Vec::new();
    let mut dirs = vec![mnt.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let ft = e.file_type().unwrap();
            if ft.is_dir() {
                dirs.push(e.path());
            } else if ft.is_file() {
                found.push(e.path());
            } else {
                assert!(
                    ft.is_symlink() && e.file_name() == "native.hsaco",
                    "unexpected entry {:?}",
                    e.path()
                );
            }
        }
    }
    found.sort();
    let want = expected(archive);
    let mut want_paths: Vec<PathBuf> = want
        .iter()
        .map(|(k, a, _)| kernel_path(mnt, k, a))
        .collect();
    want_paths.sort();
    assert_eq!(found, want_paths);
    for (key, arch, data) in &want {
        let got = fs::read(kernel_path(mnt, key, arch)).unwrap();
        assert!(
            got == *data,
            "{key} [{arch}]: {} bytes differ from the archive's {}",
            got.len(),
            data.len()
        );
    }
    println!("walked {} files", found.len());
}

/// Modes, sizes, owners, times, link counts and statfs.
fn stat(mnt: &Path, archive: &Path) {
    let archive_mtime = fs::metadata(archive)
        .unwrap()
        .modified()
        .unwrap()
        .duration_since(UNIX_EPOCH)
        .unwrap();
    let check_times = |m: &fs::Metadata, what: &Path| {
        assert_eq!(
            (m.mtime() as u64, m.mtime_nsec() as u32),
            (archive_mtime.as_secs(), archive_mtime.subsec_nanos()),
            "{what:?} mtime"
        );
        assert_eq!(
            (m.ctime() as u64, m.ctime_nsec() as u32),
            (archive_mtime.as_secs(), archive_mtime.subsec_nanos()),
            "{what:?} ctime"
        );
        assert_eq!((m.uid(), m.gid()), (0, 0), "{what:?} owner");
    };
    let root = fs::metadata(mnt).unwrap();
    assert_eq!(root.mode(), libc::S_IFDIR | 0o555);
    check_times(&root, mnt);
    let mut total_blocks = 0;
    let mut inodes = BTreeMap::new();
    for (key, arch, data) in expected(archive) {
        let p = kernel_path(mnt, &key, &arch);
        let m = fs::symlink_metadata(&p).unwrap();
        assert_eq!(m.mode(), libc::S_IFREG | 0o444, "{p:?}");
        assert_eq!(m.len(), data.len() as u64, "{p:?} size");
        assert_eq!(m.nlink(), 1);
        assert_eq!(m.blocks(), (data.len() as u64).div_ceil(512));
        assert_eq!(m.blksize(), 128 * 1024);
        check_times(&m, &p);
        total_blocks += (data.len() as u64).div_ceil(4096);
        assert!(
            inodes.insert(m.ino(), p.clone()).is_none(),
            "inode {} reused",
            m.ino()
        );
        // Stable: asking again gives the same number.
        assert_eq!(fs::metadata(&p).unwrap().ino(), m.ino());
        let d = fs::metadata(p.parent().unwrap()).unwrap();
        assert_eq!(d.mode(), libc::S_IFDIR | 0o555);
        check_times(&d, p.parent().unwrap());
    }
    let c = cpath(mnt);
    // SAFETY: valid path; statvfs fills the zeroed struct.
    let mut sv: libc::statvfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut sv) }, 0);
    assert_eq!(sv.f_bsize, 4096);
    assert_eq!(sv.f_frsize, 4096);
    assert_eq!(sv.f_namemax, 255);
    assert_eq!(sv.f_blocks, total_blocks);
    assert_eq!(sv.f_bfree, 0);
    assert_ne!(sv.f_flag & libc::ST_RDONLY, 0, "mounted read-only");
    assert_eq!(
        stats(mnt)["decodes"],
        0,
        "sizes and attributes come from the TOC, not a decode"
    );
    println!("stat ok: {} files, {total_blocks} blocks", inodes.len());
}

/// Positioned reads at random offsets, the first and last byte, EOF and past EOF.
fn pread(mnt: &Path, archive: &Path) {
    let mut seed = 0x9e3779b97f4a7c15u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for (key, arch, data) in expected(archive) {
        let f = File::open(kernel_path(mnt, &key, &arch)).unwrap();
        let len = data.len() as u64;
        let mut offsets = vec![
            0,
            len.saturating_sub(1),
            len,
            len + 1,
            len + 4096,
            u64::MAX / 4,
        ];
        offsets.extend((0..40).map(|_| next() % (len + 1)));
        for off in offsets {
            let want_n = (next() % 9000) as usize + 1;
            let mut buf = vec![0u8; want_n];
            let n = f.read_at(&mut buf, off).unwrap();
            let start = off.min(len) as usize;
            let end = (start + want_n).min(data.len());
            assert_eq!(n, end - start, "{key} [{arch}] pread({want_n}) at {off}");
            assert!(
                buf[..n] == data[start..end],
                "{key} [{arch}] bytes at {off}"
            );
        }
    }
}

/// `mmap` (shared and private) of every file, compared with the archive.
fn mmap(mnt: &Path, archive: &Path) {
    use std::os::fd::AsRawFd;
    for (key, arch, data) in expected(archive) {
        if data.is_empty() {
            continue;
        }
        let f = File::open(kernel_path(mnt, &key, &arch)).unwrap();
        for flags in [libc::MAP_SHARED, libc::MAP_PRIVATE] {
            // SAFETY: mapping a file we hold open, read-only, for exactly its length; unmapped
            // below before the file is closed.
            unsafe {
                let p = libc::mmap(
                    std::ptr::null_mut(),
                    data.len(),
                    libc::PROT_READ,
                    flags,
                    f.as_raw_fd(),
                    0,
                );
                assert_ne!(
                    p,
                    libc::MAP_FAILED,
                    "mmap {key} [{arch}]: {}",
                    io::Error::last_os_error()
                );
                let mapped = std::slice::from_raw_parts(p.cast::<u8>(), data.len());
                assert!(mapped == &data[..], "{key} [{arch}] mapped bytes differ");
                libc::munmap(p, data.len());
            }
        }
    }
}

/// 8 threads reading every file in different orders, comparing checksums.
fn concurrent(mnt: &Path, archive: &Path) {
    let want: Arc<Vec<(PathBuf, u64)>> = Arc::new(
        expected(archive)
            .into_iter()
            .map(|(k, a, d)| (kernel_path(mnt, &k, &a), fnv(&d)))
            .collect(),
    );
    let start = Arc::new(Barrier::new(8));
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let (want, start) = (want.clone(), start.clone());
            std::thread::spawn(move || {
                start.wait();
                for round in 0..3 {
                    for i in 0..want.len() {
                        let (path, sum) = &want[(i + t * 3 + round) % want.len()];
                        let mut data = Vec::new();
                        File::open(path).unwrap().read_to_end(&mut data).unwrap();
                        assert_eq!(fnv(&data), *sum, "thread {t} {path:?}");
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

/// The errno matrix. `arg` is a kernel file path relative to the mount.
fn errno(mnt: &Path, arg: &str) {
    let file = mnt.join(arg);
    let dir = file.parent().unwrap().to_path_buf();
    fs::metadata(&file).unwrap();
    let before = stats(mnt);
    for _ in 0..3 {
        let missing = fs::metadata(mnt.join("no-such-name"));
        assert_eq!(errno_of(missing, "stat missing"), libc::ENOENT);
        let missing = fs::metadata(dir.join("gfx000.hsaco"));
        assert_eq!(errno_of(missing, "stat missing kernel"), libc::ENOENT);
    }
    // Negative entries are cached by the kernel: each missing name reached the daemon once.
    let after = stats(mnt);
    let asked = after["lookups_missing"] - before["lookups_missing"];
    assert_eq!(asked, 2, "{before:?} -> {after:?}");
    assert_eq!(
        errno_of(fs::metadata(file.join("x")), "stat under a file"),
        libc::ENOTDIR
    );
    assert_eq!(
        errno_of(fs::read_dir(&file), "opendir on a file"),
        libc::ENOTDIR
    );
    let mut d = File::open(&dir).unwrap();
    assert_eq!(
        errno_of(d.read(&mut [0u8; 16]), "read a directory"),
        libc::EISDIR
    );
    assert_eq!(
        errno_of(
            OpenOptions::new().write(true).open(&dir),
            "open a directory for write"
        ),
        libc::EISDIR
    );
    assert_eq!(
        errno_of(OpenOptions::new().write(true).open(&file), "open for write"),
        libc::EROFS
    );
    assert_eq!(
        errno_of(
            OpenOptions::new().read(true).write(true).open(&file),
            "open rw"
        ),
        libc::EROFS
    );
    assert_eq!(
        errno_of(OpenOptions::new().append(true).open(&file), "open append"),
        libc::EROFS
    );
    assert_eq!(
        errno_of(File::create(dir.join("new.hsaco")), "create"),
        libc::EROFS
    );
    assert_eq!(
        errno_of(fs::create_dir(dir.join("newdir")), "mkdir"),
        libc::EROFS
    );
    assert_eq!(errno_of(fs::remove_file(&file), "unlink"), libc::EROFS);
    assert_eq!(errno_of(fs::remove_dir(&dir), "rmdir"), libc::EROFS);
    assert_eq!(
        errno_of(fs::rename(&file, dir.join("renamed")), "rename"),
        libc::EROFS
    );
    assert_eq!(
        errno_of(std::os::unix::fs::symlink("x", dir.join("link")), "symlink"),
        libc::EROFS
    );
    assert_eq!(
        errno_of(fs::hard_link(&file, dir.join("hard")), "link"),
        libc::EROFS
    );
    // The mount has no `default_permissions`: `access` is answered by the daemon from the
    // modes, exec by the kernel from the execute bits.
    let access = |path: &Path, mode: i32| {
        let c = cpath(path);
        // SAFETY: a valid C string.
        match unsafe { libc::access(c.as_ptr(), mode) } {
            0 => 0,
            _ => io::Error::last_os_error().raw_os_error().unwrap(),
        }
    };
    assert_eq!(access(&file, libc::R_OK), 0);
    assert_eq!(access(&file, libc::F_OK), 0);
    assert_eq!(access(&file, libc::X_OK), libc::EACCES);
    assert_eq!(access(&file, libc::R_OK | libc::W_OK), libc::EROFS);
    assert_eq!(access(&dir, libc::R_OK | libc::X_OK), 0);
    assert_eq!(access(&dir, libc::W_OK), libc::EROFS);
    assert_eq!(access(mnt, libc::X_OK), 0);
    assert_eq!(errno_of(Command::new(&file).status(), "exec"), libc::EACCES);
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        errno_of(
            fs::set_permissions(&file, fs::Permissions::from_mode(0o644)),
            "chmod"
        ),
        libc::EROFS
    );
    let c = cpath(&file);
    let n = CString::new("user.kpack.arch").unwrap();
    // SAFETY: valid strings and buffer.
    let rc = unsafe { libc::setxattr(c.as_ptr(), n.as_ptr(), b"x".as_ptr().cast(), 1, 0) };
    assert_eq!(
        (rc, io::Error::last_os_error().raw_os_error()),
        (-1, Some(libc::EROFS)),
        "setxattr"
    );
    // SAFETY: valid path.
    let rc = unsafe { libc::truncate(c.as_ptr(), 0) };
    assert_eq!(
        (rc, io::Error::last_os_error().raw_os_error()),
        (-1, Some(libc::EROFS)),
        "truncate"
    );
    assert_eq!(
        errno_of(getxattr(&file, "user.kpack.nope"), "missing xattr"),
        libc::ENODATA
    );
    assert_eq!(
        errno_of(
            getxattr(&dir, "user.kpack.stats"),
            "stats on a non-root dir"
        ),
        libc::ENODATA
    );
    assert_eq!(
        errno_of(getxattr(mnt, "user.kpack.arch"), "file xattr on the root"),
        libc::ENODATA
    );
    // And the real ones are there.
    assert!(!getxattr(&file, "user.kpack.key").unwrap().is_empty());
    assert!(
        getxattr(mnt, "user.kpack.stats")
            .unwrap()
            .starts_with(b"hits ")
    );
}

/// Calls a program makes on files it only reads, beyond open and read: a terminal check (what
/// Python's `open` does), a flags ioctl (`lsattr`), fsync of the file and its directory,
/// `SEEK_DATA`/`SEEK_HOLE` and poll. Each gets a regular read-only file's answer, and the bytes
/// read after them are the archive's.
fn quiet_calls(mnt: &Path, archive: &Path, arg: &str) {
    use std::os::fd::AsRawFd;
    let file = mnt.join(arg);
    let (key, arch) = arg.rsplit_once('/').unwrap();
    let want = Archive::open(archive)
        .unwrap()
        .get_kernel(key, arch.strip_suffix(".hsaco").unwrap())
        .unwrap();
    for round in 0..2 {
        let f = File::open(&file).unwrap();
        let fd = f.as_raw_fd();
        // SAFETY: `fd` is open for the whole block; the buffers outlive the calls.
        unsafe {
            assert_eq!(libc::isatty(fd), 0, "isatty, round {round}");
            assert_eq!(
                *libc::__errno_location(),
                libc::ENOTTY,
                "isatty, round {round}"
            );
            let mut flags: libc::c_long = 0;
            const FS_IOC_GETFLAGS: libc::c_ulong = 0x8008_6601;
            assert_eq!(libc::ioctl(fd, FS_IOC_GETFLAGS, &mut flags), -1);
            assert_eq!(*libc::__errno_location(), libc::ENOTTY, "FS_IOC_GETFLAGS");
            assert_eq!(libc::lseek(fd, 0, libc::SEEK_DATA), 0, "SEEK_DATA");
            assert_eq!(
                libc::lseek(fd, 0, libc::SEEK_HOLE),
                want.len() as libc::off_t,
                "SEEK_HOLE"
            );
            let mut p = libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            assert_eq!(libc::poll(&mut p, 1, 0), 1, "poll");
            assert_ne!(p.revents & libc::POLLIN, 0, "poll: {:#x}", p.revents);
        }
        f.sync_all().unwrap();
        f.sync_data().unwrap();
        File::open(file.parent().unwrap())
            .unwrap()
            .sync_all()
            .unwrap();
        assert!(fs::read(&file).unwrap() == want, "bytes, round {round}");
    }
}

fn link_target(p: &Path) -> Option<String> {
    match fs::read_link(p) {
        Ok(t) => Some(t.to_str().unwrap().to_owned()),
        Err(e) => {
            assert_eq!(e.raw_os_error(), Some(libc::ENOENT), "{p:?}: {e}");
            None
        }
    }
}

/// Fallback names resolve to symlinks to siblings; unresolvable names are ENOENT; fallback
/// names never appear in listings; `native.hsaco` (with `--gpu gfx1101 --gpu gfx900`).
fn fallback(mnt: &Path, archive: &Path, native: bool) {
    let rich = mnt.join("lib/librich.so#0");
    let cases = [
        ("gfx900:xnack+.hsaco", Some("gfx900.hsaco")),
        ("gfx900:sramecc-:xnack+.hsaco", Some("gfx900.hsaco")),
        ("gfx90a:xnack+:sramecc+.hsaco", Some("gfx90a:xnack+.hsaco")),
        ("gfx942:sramecc+:xnack-.hsaco", None), // present as a file, not a link
        ("gfx1151.hsaco", Some("gfx11-generic.hsaco")),
        ("gfx1100:xnack-.hsaco", Some("gfx11-generic.hsaco")),
        (
            "gfx950:sramecc+:xnack-.hsaco",
            Some("gfx9-4-generic:sramecc+.hsaco"),
        ),
    ];
    for (name, target) in cases {
        let p = rich.join(name);
        let meta = fs::symlink_metadata(&p).unwrap_or_else(|e| panic!("{name}: {e}"));
        match target {
            Some(t) => {
                assert!(meta.file_type().is_symlink(), "{name} is a link");
                assert_eq!(link_target(&p).as_deref(), Some(t), "{name}");
                assert_eq!(
                    fs::read(&p).unwrap(),
                    fs::read(rich.join(t)).unwrap(),
                    "{name} reads as {t}"
                );
            }
            None => assert!(meta.file_type().is_file(), "{name} is the file itself"),
        }
    }
    for name in [
        "gfx1030.hsaco",
        "gfx90a:xnack-.hsaco",
        "gfx90a.hsaco",
        "gfx942.hsaco",
        "gfx906.hsaco",
        "nonsense",
        "gfx900",
    ] {
        for _ in 0..2 {
            assert_eq!(
                errno_of(fs::symlink_metadata(rich.join(name)), name),
                libc::ENOENT,
                "{name}"
            );
        }
    }
    // Directories without kernels resolve nothing.
    assert_eq!(
        errno_of(
            fs::symlink_metadata(mnt.join("lib/gfx900.hsaco")),
            "lib/gfx900"
        ),
        libc::ENOENT
    );
    let a = Archive::open(archive).unwrap();
    let mut want: Vec<String> = a
        .entries()
        .filter(|(k, _)| *k == "lib/librich.so#0")
        .map(|(_, e)| format!("{}.hsaco", e.arch))
        .collect();
    if native {
        want.push("native.hsaco".into());
    }
    want.sort();
    let mut listed: Vec<String> = fs::read_dir(&rich)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    listed.sort();
    assert_eq!(listed, want, "fallback names must not be listed");
    let native_of = |dir: &str| link_target(&mnt.join(dir).join("native.hsaco"));
    if native {
        // gfx1101 (first --gpu) resolves through its generic target here ...
        assert_eq!(
            native_of("lib/librich.so#0").as_deref(),
            Some("gfx11-generic.hsaco")
        );
        // ... not here, where gfx900 (second --gpu) does ...
        assert_eq!(native_of("bin/tool#0").as_deref(), Some("gfx900.hsaco"));
        assert_eq!(
            fs::read(mnt.join("bin/tool#0/native.hsaco")).unwrap(),
            fs::read(mnt.join("bin/tool#0/gfx900.hsaco")).unwrap()
        );
        // ... and neither runs gfx1100-only code.
        assert_eq!(native_of("lib/librich.so#1"), None);
    } else {
        assert_eq!(native_of("lib/librich.so#0"), None);
    }
}

/// `arg`: the corrupt kernel's path; reading it is EIO, its size is still right, and every
/// other file reads correctly, before and after.
fn corrupt(mnt: &Path, archive: &Path, arg: &str) {
    let bad = mnt.join(arg);
    let a = Archive::open(archive).unwrap();
    // Every kernel but the corrupt one, via the archive API (which fails on that one too).
    let want: Vec<(String, String, Vec<u8>)> = a
        .entries()
        .filter(|(key, e)| kernel_path(mnt, key, e.arch) != bad)
        .map(|(key, e)| {
            (
                key.to_owned(),
                e.arch.to_owned(),
                a.get_kernel(key, e.arch).unwrap(),
            )
        })
        .collect();
    assert!(want.len() >= 2, "there are neighbours to check");
    let check_others = || {
        for (key, arch, data) in &want {
            let p = kernel_path(mnt, key, arch);
            if p != bad {
                assert!(fs::read(&p).unwrap() == *data, "{p:?}");
            }
        }
    };
    check_others();
    let (key, arch) = arg.rsplit_once('/').unwrap();
    let size = a
        .locate(key, arch.strip_suffix(".hsaco").unwrap())
        .unwrap()
        .size;
    assert_eq!(fs::metadata(&bad).unwrap().len(), size);
    for _ in 0..2 {
        assert_eq!(errno_of(fs::read(&bad), "read corrupt kernel"), libc::EIO);
    }
    check_others();
}

/// `arg`: a cold file read by 8 threads at once, at different offsets: one decode.
fn cold_concurrent(mnt: &Path, archive: &Path, arg: &str) {
    let path = mnt.join(arg);
    let (key, arch) = arg.rsplit_once('/').unwrap();
    let data = Arc::new(
        Archive::open(archive)
            .unwrap()
            .get_kernel(key, arch.strip_suffix(".hsaco").unwrap())
            .unwrap(),
    );
    let before = stats(mnt);
    assert_eq!(before["decodes"], 0, "the file must be cold");
    let start = Arc::new(Barrier::new(8));
    let threads: Vec<_> = (0..8u64)
        .map(|t| {
            let (path, data, start) = (path.clone(), data.clone(), start.clone());
            std::thread::spawn(move || {
                let f = File::open(&path).unwrap();
                let off = t * (data.len() as u64 / 8);
                let mut buf = vec![0u8; 64 * 1024];
                start.wait();
                let n = f.read_at(&mut buf, off).unwrap();
                assert_eq!(n, buf.len());
                assert!(
                    buf[..] == data[off as usize..off as usize + n],
                    "thread {t}"
                );
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let after = stats(mnt);
    println!("stats after 8 cold readers: {after:?}");
    assert_eq!(after["decodes"], 1);
    assert!(
        after["hits"] + after["misses"] >= 8,
        "every reader's request went through the cache"
    );
    // The file is complete now. Once every handle is released, eight opens race for it: with
    // passthrough each registers a backing id for the inode and all but one of them are
    // dropped; without, each gets a daemon handle. Every one reads the whole kernel, and
    // nothing is decoded again.
    wait_released(mnt);
    let start = Arc::new(Barrier::new(8));
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let (path, data, start) = (path.clone(), data.clone(), start.clone());
            std::thread::spawn(move || {
                start.wait();
                assert!(fs::read(&path).unwrap() == data[..], "thread {t}");
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(stats(mnt)["decodes"], 1, "decoded again");
}

/// Waits (at most 10 s) until the daemon has seen every handle of the mount released: RELEASE
/// reaches it after `close` returns.
pub fn wait_released(mnt: &Path) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while stats(mnt)["open_handles"] != 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "handles never released"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// `arg`: a kernel larger than the cache, read in 4 KiB steps: one decode, nothing cached.
fn small_chunks(mnt: &Path, archive: &Path, arg: &str) {
    let (key, arch) = arg.rsplit_once('/').unwrap();
    let data = Archive::open(archive)
        .unwrap()
        .get_kernel(key, arch.strip_suffix(".hsaco").unwrap())
        .unwrap();
    let f = File::open(mnt.join(arg)).unwrap();
    let mut off = 0;
    let mut buf = vec![0u8; 4096];
    while off < data.len() {
        let n = f.read_at(&mut buf, off as u64).unwrap();
        assert!(n > 0 && buf[..n] == data[off..off + n], "chunk at {off}");
        off += n;
    }
    assert_eq!(f.read_at(&mut buf, off as u64).unwrap(), 0);
    let s = stats(mnt);
    println!("stats after chunked read: {s:?}");
    assert!(s["capacity"] < data.len() as u64);
    assert_eq!(s["decodes"], 1);
    assert_eq!(s["bytes_cached"], 0);
    assert!(s["misses"] >= 1);
}

/// Re-reading files (new opens) is served from the kernel's page cache: after the first full
/// read of every file, a second pass does not reach the daemon's cache at all.
fn keep_cache(mnt: &Path, archive: &Path) {
    let want = expected(archive);
    for (key, arch, data) in &want {
        assert!(fs::read(kernel_path(mnt, key, arch)).unwrap() == *data);
    }
    let first = stats(mnt);
    for _ in 0..3 {
        for (key, arch, data) in &want {
            assert!(fs::read(kernel_path(mnt, key, arch)).unwrap() == *data);
        }
    }
    let again = stats(mnt);
    println!("after first pass {first:?}, after three more {again:?}");
    // Opens still reach the daemon (and find the backing file); reads and decodes do not.
    for k in ["decodes", "misses", "daemon_reads"] {
        assert_eq!(first[k], again[k], "{k}: re-reads reached the daemon");
    }
    assert_eq!(
        again["hits"] - first["hits"],
        3 * want.len() as u64,
        "one hit per open"
    );
    assert!(first["decodes"] >= want.iter().filter(|k| !k.2.is_empty()).count() as u64);
}

/// After the archive was rewritten in place: `arg` (read before the change) still reads from
/// the page cache; every kernel not read yet gives EIO, never different bytes.
fn changed(mnt: &Path, arg: &str) {
    let mut read_before = 0;
    let mut failed = 0;
    let mut dirs = vec![mnt.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                dirs.push(p);
            } else if p == mnt.join(arg) {
                assert!(!fs::read(&p).unwrap().is_empty());
                read_before += 1;
            } else if fs::metadata(&p).unwrap().len() > 0 {
                assert_eq!(
                    errno_of(fs::read(&p), &format!("{p:?}")),
                    libc::EIO,
                    "{p:?}"
                );
                failed += 1;
            }
        }
    }
    assert_eq!(read_before, 1);
    assert!(failed >= 5, "{failed}");
}

/// `arg` = `FILE|SCRATCH`: opens FILE, announces `SCRATCH/ready`, waits for `SCRATCH/go`, then
/// reads FILE through the descriptor opened before (the mount is detached by then).
fn hold(mnt: &Path, archive: &Path, arg: &str) {
    let (file, scratch) = arg.split_once('|').unwrap();
    let scratch = Path::new(scratch);
    let (key, arch) = file.rsplit_once('/').unwrap();
    let want = Archive::open(archive)
        .unwrap()
        .get_kernel(key, arch.strip_suffix(".hsaco").unwrap())
        .unwrap();
    let mut f = File::open(mnt.join(file)).unwrap();
    fs::write(scratch.join("ready"), b"").unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !scratch.join("go").exists() {
        assert!(std::time::Instant::now() < deadline, "never told to go");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let mut got = Vec::new();
    f.read_to_end(&mut got).unwrap();
    assert!(got == want, "read after the detach");
}

/// Real code objects read by real tools: each file is an AMDGPU ELF (`EM_AMDGPU` = 224) and
/// `readelf -h` on the mounted path reads it.
fn elf(mnt: &Path, archive: &Path) {
    let readelf = Command::new("readelf").arg("--version").output().is_ok();
    if !readelf {
        println!("note: readelf not installed; checking headers only");
    }
    for (key, arch, data) in expected(archive) {
        let p = kernel_path(mnt, &key, &arch);
        let got = fs::read(&p).unwrap();
        assert!(got == data, "{p:?}");
        assert_eq!(&got[..4], b"\x7fELF", "{p:?}");
        assert_eq!(
            u16::from_le_bytes([got[18], got[19]]),
            224,
            "{p:?} e_machine"
        );
        if readelf {
            let out = Command::new("readelf").arg("-h").arg(&p).output().unwrap();
            assert!(
                out.status.success(),
                "readelf {p:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(text.contains("AMD GPU"), "{text}");
        }
    }
}

/// Fallback names and `native.hsaco` on the rocRAND sample (gfx1030, gfx90a:xnack+/-), mounted
/// with `--gpu gfx90a:xnack+:sramecc+`.
fn sample_links(mnt: &Path) {
    let dir = mnt.join("lib/x86_64-linux-gnu/librocrand.so.1.1#0");
    let cases = [
        ("native.hsaco", Some("gfx90a:xnack+.hsaco")),
        ("gfx90a:sramecc-:xnack-.hsaco", Some("gfx90a:xnack-.hsaco")),
        ("gfx1030:xnack-.hsaco", Some("gfx1030.hsaco")),
        ("amdgcn-amd-amdhsa--gfx1030.hsaco", Some("gfx1030.hsaco")),
        ("gfx90a.hsaco", None),
        ("gfx1031.hsaco", None),
        ("gfx942:xnack+.hsaco", None),
    ];
    for (name, target) in cases {
        assert_eq!(link_target(&dir.join(name)).as_deref(), target, "{name}");
    }
}

/// Every regular file under `root` (symbolic links skipped), by relative path.
fn regular_files(root: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in fs::read_dir(&dir).unwrap() {
            let e = e.unwrap();
            let t = e.file_type().unwrap();
            if t.is_dir() {
                stack.push(e.path());
            } else if t.is_file() {
                let rel = e.path().strip_prefix(root).unwrap().to_path_buf();
                out.insert(rel, fs::read(e.path()).unwrap());
            }
        }
    }
    out
}

/// The mount's regular files are exactly those of the directory `expected`, byte for byte.
fn tree(mnt: &Path, expected: &Path) {
    let want = regular_files(expected);
    let got = regular_files(mnt);
    let names = |m: &BTreeMap<PathBuf, Vec<u8>>| m.keys().cloned().collect::<Vec<_>>();
    assert_eq!(names(&got), names(&want), "the files of the mount");
    for (path, bytes) in &want {
        assert!(&got[path] == bytes, "{} differs", path.display());
    }
    println!("{} files match", want.len());
}
