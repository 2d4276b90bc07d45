//! Remote sources against a local mount, in one run: reading one architecture's kernels cold
//! through an `s3://` mount (moto's S3 server on loopback, signatures checked), through an
//! `http://` mount (nginx on loopback) and through a mount of the same archive on local disk;
//! then a remount of the `s3://` source with `--cache-dir` after a first pass, against the local
//! mount. Prints the ratios and the bytes fetched per byte read.
//!
//! Run as root (it mounts and drops the page cache):
//!   cargo bench --bench remote                # full run: 3 x 64 MiB of code-like kernels
//!   cargo bench --bench remote -- --quick     # smoke run for CI: 3 x 4 MiB, no verdicts

mod common;

use std::collections::BTreeMap;
use std::ffi::CString;
use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rocm_kpack::{ArchiveWriter, Compression};

const ARCHES: [&str; 3] = ["gfx942", "gfx90a", "gfx1100"];
const READ_ARCH: &str = "gfx942";

fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_kpack-fuse"))
}

fn drop_caches() {
    // SAFETY: no arguments.
    unsafe { libc::sync() };
    if fs::write("/proc/sys/vm/drop_caches", "3").is_err() {
        eprintln!("note: cannot drop the page cache (not root?): 'cold' reads may be warm");
    }
}

fn mounted(mnt: &Path) -> bool {
    let want = fs::canonicalize(mnt).unwrap_or(mnt.to_path_buf());
    fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split(' ').nth(4).is_some_and(|p| Path::new(p) == want))
}

/// A foreground mount for the duration of a measurement.
struct Mounted {
    child: Child,
    mnt: PathBuf,
}

impl Mounted {
    fn start(source: &str, mnt: &Path, extra: &[&str], env: &[(String, String)]) -> Mounted {
        fs::create_dir_all(mnt).unwrap();
        let child = Command::new(bin())
            .arg("mount")
            .arg(source)
            .arg(mnt)
            .arg("-f")
            .args(extra)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn kpack-fuse");
        let mut m = Mounted {
            child,
            mnt: mnt.to_path_buf(),
        };
        let t = Instant::now();
        while !mounted(mnt) {
            assert!(
                t.elapsed() < Duration::from_secs(60),
                "{source} did not mount"
            );
            if let Ok(Some(s)) = m.child.try_wait() {
                panic!("mount of {source} exited with {s}");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        m
    }

    fn stats(&self) -> BTreeMap<String, u64> {
        let p = CString::new(self.mnt.as_os_str().as_bytes()).unwrap();
        let n = CString::new("user.kpack.stats").unwrap();
        let mut buf = vec![0u8; 64 << 10];
        // SAFETY: valid strings and a buffer of the given length.
        let len =
            unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
        assert!(len >= 0, "user.kpack.stats");
        buf.truncate(len as usize);
        String::from_utf8_lossy(&buf)
            .lines()
            .filter_map(|l| {
                let (k, v) = l.split_once(' ')?;
                Some((k.to_owned(), v.parse().ok()?))
            })
            .collect()
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        // SAFETY: signalling our own child.
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

/// moto's S3 server (tests/it/remote/s3_server.py) with one bucket.
struct Moto {
    child: Child,
    /// The server stops at the end of its standard input: held open while it is needed.
    _stdin: std::process::ChildStdin,
    port: u16,
    key_id: String,
    secret: String,
}

impl Moto {
    fn start(upload: &[(&str, &Path)]) -> Moto {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/it/remote/s3_server.py");
        let mut child = Command::new("python3")
            .arg(script)
            .arg(port.to_string())
            .arg("bench")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("python3 (scripts/setup-deps.sh installs moto[server])");
        let mut stdin = child.stdin.take().unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        let w: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(w.first(), Some(&"READY"), "moto did not start: {line}");
        let (key_id, secret) = (w[1].to_owned(), w[2].to_owned());
        for (key, file) in upload {
            writeln!(stdin, "put {key} {}", file.display()).unwrap();
            line.clear();
            out.read_line(&mut line).unwrap();
            assert_eq!(line.trim(), "OK", "upload of {key}: {line}");
        }
        Moto {
            child,
            _stdin: stdin,
            port,
            key_id,
            secret,
        }
    }

    fn env(&self) -> Vec<(String, String)> {
        [
            ("AWS_ACCESS_KEY_ID", self.key_id.clone()),
            ("AWS_SECRET_ACCESS_KEY", self.secret.clone()),
            (
                "AWS_ENDPOINT_URL",
                format!("http://127.0.0.1:{}", self.port),
            ),
            ("AWS_ALLOW_HTTP", "true".into()),
            ("AWS_REGION", "us-east-1".into()),
            ("AWS_EC2_METADATA_DISABLED", "true".into()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// nginx serving `root` on a loopback port (the HTTP comparison: a server that is not the
/// bottleneck, unlike moto, which is written in Python).
struct Nginx {
    child: Child,
    port: u16,
}

impl Nginx {
    fn start(root: &Path, dir: &Path) -> Nginx {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let d = dir.display();
        fs::create_dir_all(dir).unwrap();
        fs::write(
            dir.join("nginx.conf"),
            format!(
                "daemon off;\nmaster_process off;\nworker_processes 1;\npid {d}/nginx.pid;\n\
                 error_log {d}/error.log;\nevents {{ worker_connections 256; }}\n\
                 http {{ access_log off; client_body_temp_path {d}/b; proxy_temp_path {d}/p;\n\
                 fastcgi_temp_path {d}/f; uwsgi_temp_path {d}/u; scgi_temp_path {d}/s;\n\
                 server {{ listen 127.0.0.1:{port}; root {}; }} }}\n",
                root.display()
            ),
        )
        .unwrap();
        let child = Command::new("nginx")
            .arg("-p")
            .arg(dir)
            .arg("-c")
            .arg(dir.join("nginx.conf"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("nginx (scripts/setup-deps.sh installs it)");
        let t = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "nginx did not listen"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Nginx { child, port }
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Reads every `READ_ARCH` file under `mnt`; returns the time and the bytes read.
fn read_arch(mnt: &Path, files: &[String]) -> (Duration, u64) {
    let t = Instant::now();
    let mut bytes = 0u64;
    for rel in files {
        bytes += fs::read(mnt.join(rel))
            .expect("read through the mount")
            .len() as u64;
    }
    (t.elapsed(), bytes)
}

fn mib_s(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / (1 << 20) as f64 / d.as_secs_f64()
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let per_arch: usize = if quick { 4 << 20 } else { 64 << 20 };
    let kernel = 512 << 10;
    let keys = per_arch / kernel;
    let work = tempfile::tempdir().unwrap();
    let archive = work.path().join("set.kpack");
    let mut w = ArchiveWriter::new(
        "bench",
        "gfx9",
        ARCHES.iter().map(|s| (*s).to_owned()).collect(),
        Compression::Zstd { level: 3 },
    )
    .unwrap();
    let mut files = Vec::new();
    for k in 0..keys {
        let key = format!("lib/lib{k}.so#0");
        for (a, arch) in ARCHES.iter().enumerate() {
            w.add_kernel(&key, arch, common::kernel_bytes((k * 7 + a) as u64, kernel))
                .unwrap();
        }
        files.push(format!("{key}/{READ_ARCH}.hsaco"));
    }
    w.write(&archive, &|_| {}).unwrap();
    let archive_len = fs::metadata(&archive).unwrap().len();
    println!(
        "remote sources{}: {} kernels of {} KiB x {} arches, archive {:.1} MiB; reading the {READ_ARCH} ones",
        if quick { " (quick)" } else { "" },
        keys,
        kernel >> 10,
        ARCHES.len(),
        archive_len as f64 / (1 << 20) as f64
    );
    let moto = Moto::start(&[("set.kpack", archive.as_path())]);
    let env = moto.env();
    let url = "s3://bench/set.kpack";

    drop_caches();
    let local = Mounted::start(
        archive.to_str().unwrap(),
        &work.path().join("local"),
        &[],
        &[],
    );
    let (t_local, read) = read_arch(&local.mnt, &files);
    drop(local);

    drop_caches();
    let remote = Mounted::start(url, &work.path().join("s3"), &[], &env);
    let before = remote.stats();
    let (t_s3, read_s3) = read_arch(&remote.mnt, &files);
    let after = remote.stats();
    drop(remote);
    assert_eq!(read, read_s3);
    let fetched = after["remote_bytes_fetched"] - before["remote_bytes_fetched"];
    let requests = after["remote_requests"] - before["remote_requests"];

    let nginx = Nginx::start(work.path(), &work.path().join("nginx"));
    drop_caches();
    let http = Mounted::start(
        &format!("http://127.0.0.1:{}/set.kpack", nginx.port),
        &work.path().join("http"),
        &[],
        &[],
    );
    let (t_http, _) = read_arch(&http.mnt, &files);
    drop(http);
    drop(nginx);

    let cache_dir = work.path().join("cache-dir");
    fs::create_dir_all(&cache_dir).unwrap();
    let cache_arg = ["--cache-dir", cache_dir.to_str().unwrap()];
    let first = Mounted::start(url, &work.path().join("s3-first"), &cache_arg, &env);
    read_arch(&first.mnt, &files);
    drop(first);
    drop_caches();
    let again = Mounted::start(url, &work.path().join("s3-again"), &cache_arg, &env);
    let before = again.stats();
    let (t_warm, _) = read_arch(&again.mnt, &files);
    let after = again.stats();
    drop(again);
    let refetched = after["remote_bytes_fetched"] - before["remote_bytes_fetched"];

    let against = |what: &str| common::against_for_print(what, quick);
    let plainly = |ratio: f64| common::plainly(ratio, common::Sense::Faster);
    println!(
        "  local mount, cold:          {:8.1} MiB/s",
        mib_s(read, t_local)
    );
    println!(
        "  s3:// mount, cold:          {:8.1} MiB/s  {:.2}x {}: {}",
        mib_s(read, t_s3),
        t_local.as_secs_f64() / t_s3.as_secs_f64(),
        against("the local mount"),
        plainly(t_local.as_secs_f64() / t_s3.as_secs_f64())
    );
    println!(
        "  http:// mount (nginx), cold: {:8.1} MiB/s  {:.2}x {}: {}",
        mib_s(read, t_http),
        t_local.as_secs_f64() / t_http.as_secs_f64(),
        against("the local mount"),
        plainly(t_local.as_secs_f64() / t_http.as_secs_f64())
    );
    println!(
        "  s3:// fetched per byte read: {:.3} ({fetched} bytes in {requests} requests for {read} bytes read)",
        fetched as f64 / read as f64
    );
    println!(
        "  s3:// remount, --cache-dir: {:8.1} MiB/s  {:.2}x {}: {}; {refetched} bytes fetched",
        mib_s(read, t_warm),
        t_local.as_secs_f64() / t_warm.as_secs_f64(),
        against("the local mount (target >= 0.9x)"),
        plainly(t_local.as_secs_f64() / t_warm.as_secs_f64())
    );
}
