//! Archives read from object storage: `kpack-fuse mount`, `list`, `verify` and `extract` on
//! `http://` URLs served by nginx and `s3://` URLs served by moto, against real servers on
//! 127.0.0.1 started here (`servers`); plus the check that the C library links no HTTP or TLS
//! code (`link`).

pub(crate) mod fault_proxy;
mod faults;
mod http;
mod link;
mod s3;
pub mod scenarios;
pub(crate) mod servers;
mod starts;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use rocm_kpack::Archive;
use rocm_kpack::fs::setup::mountinfo;

use crate::support::mount::Mount;

/// Writes every kernel of `archive` as `dir/<key>/<arch>.hsaco`: what a mount of it shows.
pub fn expected_dir(archives: &[&Path], dir: &Path) {
    for path in archives {
        let a = Archive::open(path).unwrap();
        for (key, entry) in a.entries() {
            let p = dir.join(key).join(format!("{}.hsaco", entry.arch));
            if p.exists() {
                continue; // the first archive wins, as in the mount
            }
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, a.get_kernel(key, entry.arch).unwrap()).unwrap();
        }
    }
}

/// `kpack-fuse ARGS` with `env`: exit code, stdout, stderr.
pub fn run(args: &[&str], env: &[(String, String)]) -> (Option<i32>, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kpack-fuse"))
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A foreground mount of `source` that must be refused: exit code and standard error, and
/// nothing left mounted.
pub fn refused_mount(
    source: &str,
    extra: &[&str],
    env: &[(String, String)],
) -> (Option<i32>, String) {
    let mp = tempfile::tempdir().unwrap();
    let mut args = vec!["mount", source, mp.path().to_str().unwrap(), "-f"];
    args.extend_from_slice(extra);
    let (code, _, err) = run(&args, env);
    let canonical = mp.path().canonicalize().unwrap();
    assert_eq!(
        mountinfo::mount_at(&canonical).unwrap(),
        None,
        "nothing mounted"
    );
    (code, err)
}

/// Mounts `url` in the foreground with `env`.
pub fn mount(url: &str, extra: &[&str], env: &[(String, String)]) -> Mount {
    let pairs: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    Mount::start_env(Path::new(url), extra, &pairs)
}

/// Writes a reference-layout archive (no frame positions: its open walks the frame chain) of
/// `frames` incompressible kernels of `size` bytes, keyed `lib/r.so#I`.
pub fn reference_archive(path: &Path, frames: u64, size: usize) {
    let mut w = rocm_kpack::ArchiveWriter::new(
        "ref",
        "gfx9",
        vec!["gfx942".into()],
        rocm_kpack::Compression::Zstd { level: 1 },
    )
    .unwrap();
    w.set_reference_layout(true);
    for i in 0..frames {
        w.add_kernel(
            &format!("lib/r.so#{i}"),
            "gfx942",
            crate::support::craft::incompressible(40 + i, size),
        )
        .unwrap();
    }
    w.write(path, &|_| {}).unwrap();
}

/// The numeric lines of the mount's `user.kpack.stats`.
pub fn stats(m: &Mount) -> BTreeMap<String, u64> {
    let out = m.child("remote_stats", "");
    assert!(out.success, "{}", out.output);
    out.output
        .lines()
        .filter_map(|l| l.strip_prefix("STAT "))
        .filter_map(|l| {
            let (k, v) = l.split_once(' ')?;
            Some((k.to_owned(), v.parse().ok()?))
        })
        .collect()
}
