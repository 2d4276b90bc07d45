//! Remote sources behind a fault-injecting proxy (`fault_proxy`): nginx and moto answer, and the
//! proxy resets connections mid-body, ends bodies early, sends a `Content-Range` that is not the
//! one asked for, answers `200` with the whole object, holds answers past the timeout and flips
//! bytes, on a fixed seed. Every file is read several times with its caches dropped: each read
//! returns the exact bytes or fails with EIO, within the timeout and retries; the mount keeps
//! serving, and once the faults stop every file reads exactly again.
//!
//! The archives here are small (a few MiB); `remote_faults_200mb_archive` (ignored, run by hand)
//! does the same through nginx with the 200 MiB archive of `http.rs`.

use std::path::Path;
use std::time::{Duration, Instant};

use rocm_kpack::Compression;

use super::fault_proxy::{Fault, FaultProxy};
use super::servers::{Moto, Nginx};
use super::{expected_dir, mount, stats};
use crate::mount::{pattern, write_archive};
use crate::support::craft::incompressible;
use crate::support::mount::{Mount, fuse_available};

const SEED: u64 = 0x6b70_6163_6b34;
/// The request timeout given to the mount, and how long a delayed answer is held.
const TIMEOUT_SECS: u64 = 1;
const DELAY: Duration = Duration::from_millis(2500);
const RETRIES: u64 = 3;

/// Sixteen incompressible kernels of 70-300 KB, each one ranged GET per read (stored blob or
/// zstd frame located by the TOC), then two of 6 and 20 KB at the end of the archive, which a
/// read fetches through a window.
fn kernels() -> Vec<(String, &'static str, Vec<u8>)> {
    let mut out: Vec<(String, &'static str, Vec<u8>)> = (0..16u64)
        .map(|i| {
            let len = [70_000, 150_000, 300_000, 90_000][i as usize % 4];
            let arch = if i % 3 == 0 { "gfx90a" } else { "gfx942" };
            (
                format!("lib/libf{i}.so#0"),
                arch,
                incompressible(100 + i, len),
            )
        })
        .collect();
    out.push((
        "lib/small.so#0".into(),
        "gfx942",
        incompressible(200, 6_000),
    ));
    out.push(("lib/small.so#0".into(), "gfx90a", pattern(20_000, 7)));
    out
}

fn write(dir: &Path, name: &str, compression: Compression) -> std::path::PathBuf {
    let ks = kernels();
    let list: Vec<(&str, &str, Vec<u8>)> = ks
        .iter()
        .map(|(k, a, b)| (k.as_str(), *a, b.clone()))
        .collect();
    write_archive(&dir.join(name), compression, &list)
}

/// The largest time one read may take: every attempt of every request it makes timing out, with
/// the backoff between them, for the two requests a read can need (a window and a frame), plus
/// slack for a loaded machine.
fn read_bound() -> Duration {
    let attempts = Duration::from_secs(TIMEOUT_SECS + 1) * (RETRIES as u32 + 1);
    let backoff = Duration::from_millis(200 + 400 + 800);
    (attempts + backoff) * 2 + Duration::from_secs(10)
}

/// Reads every file `passes` times through the armed proxy, then once more with it disarmed;
/// returns the text of the faulty passes' counts.
fn read_through_faults(m: &Mount, proxy: &FaultProxy, want: &Path, passes: usize) -> String {
    proxy.arm(true);
    let started = Instant::now();
    let out = m.child(
        "remote_faulty_reads",
        &format!("{passes}|2|{}", want.display()),
    );
    let took = started.elapsed();
    proxy.arm(false);
    assert!(
        out.success,
        "faulty reads failed:\n{}\ndaemon log:\n{}",
        out.output,
        m.daemon_log()
    );
    let line = out
        .output
        .lines()
        .find_map(|l| l.split_once("READS ").map(|(_, counts)| counts))
        .unwrap_or_else(|| panic!("no counts:\n{}", out.output))
        .to_owned();
    let words: Vec<&str> = line.split_whitespace().collect();
    let (ok, eio, slowest_ms): (u64, u64, u64) = (
        words[1].parse().unwrap(),
        words[3].parse().unwrap(),
        words[5].parse().unwrap(),
    );
    assert!(ok > 0, "{line}");
    assert!(
        Duration::from_millis(slowest_ms) <= read_bound(),
        "a read took {slowest_ms} ms, over {:?}",
        read_bound()
    );
    let counts = proxy.counts();
    let s = stats(m);
    for (fault, n) in &counts {
        assert!(
            *n > 0,
            "no {fault:?} fault was injected: {counts:?}, {} passed, {s:?}",
            proxy.passed()
        );
    }
    let summary = format!(
        "{passes} passes in {took:.1?}: {ok} reads exact, {eio} EIO, 0 wrong; slowest read \
         {slowest_ms} ms; faults injected: {counts:?}; answers passed untouched: {}; \
         remote_requests {} remote_retries {} remote_failures {}",
        proxy.passed(),
        s["remote_requests"],
        s["remote_retries"],
        s["remote_failures"]
    );
    // The mount goes on serving: with the faults gone, every file reads exactly.
    let again = m.child("remote_faulty_reads", &format!("1|1|{}", want.display()));
    assert!(
        again.output.contains(" eio 0 "),
        "EIO after the faults stopped:\n{}\ndaemon log:\n{}",
        again.output,
        m.daemon_log()
    );
    summary
}

fn mount_args() -> Vec<String> {
    [
        "--remote-timeout",
        &TIMEOUT_SECS.to_string(),
        "--remote-retries",
        &RETRIES.to_string(),
        "--backing",
        "memory",
        "--memory-cache-size",
        "64K",
    ]
    .map(String::from)
    .to_vec()
}

#[test]
fn http_reads_through_injected_faults_are_exact_or_eio() {
    if !fuse_available() {
        return;
    }
    let www = tempfile::tempdir().unwrap();
    let archive = write(www.path(), "f.kpack", Compression::Zstd { level: 3 });
    let summary = read_from_nginx_through_faults(&archive, 300, 4);
    eprintln!("http (nginx), zstd archive: {summary}");
}

/// Serves `archive` with nginx from its directory, behind a fault proxy (faults on `per_mille`
/// of the requests, from [`SEED`]), mounts it through the proxy and reads every file `passes`
/// times through the faults; returns the summary of what was injected and read.
fn read_from_nginx_through_faults(archive: &Path, per_mille: u32, passes: usize) -> String {
    let want = tempfile::tempdir().unwrap();
    expected_dir(&[archive], want.path());
    let nginx = Nginx::start(archive.parent().unwrap());
    let proxy = FaultProxy::start(
        nginx.port,
        SEED,
        per_mille,
        DELAY,
        std::fs::read(archive).unwrap(),
    );
    let name = archive.file_name().unwrap().to_str().unwrap();
    let url = format!("http://127.0.0.1:{}/{name}", proxy.port);
    let args = mount_args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let m = mount(&url, &args, &[]);
    let summary = read_through_faults(&m, &proxy, want.path(), passes);
    m.stop();
    summary
}

#[test]
fn s3_reads_through_injected_faults_are_exact_or_eio() {
    if !fuse_available() {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let archive = write(work.path(), "f.kpack", Compression::None);
    let want = work.path().join("want");
    expected_dir(&[archive.as_path()], &want);
    let mut moto = Moto::start("kernels");
    moto.put("f.kpack", &archive);
    let proxy = FaultProxy::start(
        moto.port,
        SEED,
        300,
        DELAY,
        std::fs::read(&archive).unwrap(),
    );
    let args = mount_args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let m = mount("s3://kernels/f.kpack", &args, &moto.env(proxy.port, None));
    let summary = read_through_faults(&m, &proxy, &want, 4);
    eprintln!("s3 (moto), stored archive: {summary}");
    m.stop();
}

/// A body with flipped bytes fails the read with EIO; it must not stay behind in the fetched
/// windows, so once the faults stop the same kernel reads exactly (a small kernel, read through
/// a window, and a large one, read directly).
#[test]
fn flipped_bytes_are_not_kept_for_later_reads() {
    if !fuse_available() {
        return;
    }
    let www = tempfile::tempdir().unwrap();
    let archive = write(www.path(), "f.kpack", Compression::Zstd { level: 3 });
    let want = tempfile::tempdir().unwrap();
    expected_dir(&[archive.as_path()], want.path());
    let nginx = Nginx::start(www.path());
    let proxy = FaultProxy::start(nginx.port, SEED, 1000, DELAY, Vec::new());
    proxy.set_only(Some(Fault::FlipByte));
    proxy.set_flip_stride(1024);
    let url = format!("http://127.0.0.1:{}/f.kpack", proxy.port);
    let args = mount_args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let m = mount(&url, &args, &[]);
    for rel in ["lib/small.so#0/gfx942.hsaco", "lib/libf2.so#0/gfx942.hsaco"] {
        proxy.arm(true);
        m.check("remote_eio", rel);
        proxy.arm(false);
        let expected = want.path().join(rel);
        m.check("remote_same", &format!("{rel}|{}", expected.display()));
    }
    let flipped = proxy.counts()[5].1;
    assert!(flipped >= 2, "{:?}", proxy.counts());
    m.stop();
}

/// By hand (`--ignored --nocapture`): the 200 MiB archive (200 kernels of 1 MiB, stored and
/// zstd) read 3 times through the faults, figures in docs/reliability.md.
#[test]
#[ignore]
fn remote_faults_200mb_archive() {
    if !fuse_available() {
        return;
    }
    let kernels: Vec<(String, Vec<u8>)> = (0..200)
        .map(|i| (format!("lib/libbig.so#{i}"), incompressible(i, 1 << 20)))
        .collect();
    let list: Vec<(&str, &str, Vec<u8>)> = kernels
        .iter()
        .map(|(k, b)| (k.as_str(), "gfx942", b.clone()))
        .collect();
    for compression in [Compression::None, Compression::Zstd { level: 1 }] {
        let www = tempfile::tempdir().unwrap();
        let archive = write_archive(&www.path().join("big.kpack"), compression, &list);
        let summary = read_from_nginx_through_faults(&archive, 100, 3);
        eprintln!("200 MiB {compression:?} through nginx: {summary}");
    }
}
