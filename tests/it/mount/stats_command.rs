//! `kpack-fuse stats MOUNTPOINT`: the root's counters as a table and as JSON, the same names in
//! the same order as `user.kpack.stats`, and a clear refusal for a path that is not a mount.

use std::process::{Command, Output};

use super::scenarios::{getxattr, stats};
use crate::support::fixture;
use crate::support::mount::{Mount, fuse_available};

const BIN: &str = env!("CARGO_BIN_EXE_kpack-fuse");

/// `kpack-fuse stats ARGS...`, bounded in time like any I/O on a mount.
fn run_stats(args: &[&std::ffi::OsStr]) -> Output {
    Command::new("timeout")
        .arg("30")
        .arg(BIN)
        .arg("stats")
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn stats_prints_the_counters_as_a_table_and_as_json() {
    if !fuse_available() {
        return;
    }
    let m = Mount::start(
        &fixture("test_noop.kpack"),
        &["--open-mode", "daemon", "--disk-cache-size", "10G"],
    );
    m.check("walk", "");
    let raw = String::from_utf8(getxattr(&m.mountpoint, "user.kpack.stats").unwrap()).unwrap();
    let mut names: Vec<&str> = raw.lines().map(|l| l.split(' ').next().unwrap()).collect();
    // Where the backing files are comes last, from its own attribute.
    let dir =
        String::from_utf8(getxattr(&m.mountpoint, "user.kpack.backing_dir").unwrap()).unwrap();
    assert!(dir.starts_with("/var/tmp/kpack-fuse."), "{dir}");
    names.push("backing_dir");

    let table = run_stats(&[m.mountpoint.as_os_str()]);
    assert!(table.status.success(), "{table:?}");
    let text = String::from_utf8(table.stdout).unwrap();
    let rows: Vec<(&str, &str)> = text
        .lines()
        .map(|l| l.split_once(' ').unwrap())
        .map(|(n, rest)| (n, rest.trim_start()))
        .collect();
    assert_eq!(rows.iter().map(|r| r.0).collect::<Vec<_>>(), names);
    // The walk opened each kernel once and decoded it once.
    let counted = stats(&m.mountpoint);
    let kernels = rocm_kpack::Archive::open(fixture("test_noop.kpack"))
        .unwrap()
        .entries()
        .count() as u64;
    assert_eq!(counted["decodes"], kernels);
    let decodes = rows.iter().find(|r| r.0 == "decodes").unwrap().1;
    assert_eq!(decodes, kernels.to_string());
    let capacity = rows.iter().find(|r| r.0 == "capacity").unwrap().1;
    assert_eq!(capacity, format!("{} (10.0 GiB)", 10u64 << 30));
    assert_eq!(rows.last().unwrap().1, dir);

    let json = run_stats(&[m.mountpoint.as_os_str(), "--json".as_ref()]);
    assert!(json.status.success(), "{json:?}");
    let doc: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    let object = doc.as_object().unwrap();
    assert_eq!(object.len(), names.len());
    assert_eq!(doc["decodes"], kernels);
    assert_eq!(doc["capacity"], 10u64 << 30);
    assert_eq!(doc["backing_dir"], dir.as_str());
    // Same order as the attribute (serde_json's map sorts, so look at the text itself).
    let json_text = String::from_utf8(json.stdout).unwrap();
    let positions: Vec<usize> = names
        .iter()
        .map(|n| json_text.find(&format!("\"{n}\":")).unwrap())
        .collect();
    assert!(positions.windows(2).all(|w| w[0] < w[1]), "{json_text}");
    m.stop();
}

#[test]
fn stats_of_a_plain_directory_says_it_is_not_a_mount() {
    let d = tempfile::tempdir().unwrap();
    let out = run_stats(&[d.path().as_os_str()]);
    assert_eq!(out.status.code(), Some(8));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        format!(
            "kpack-fuse: {}: not the root of a kpack-fuse mount\n",
            d.path().display()
        )
    );
    let missing = d.path().join("missing");
    let out = run_stats(&[missing.as_os_str()]);
    assert_eq!(out.status.code(), Some(3));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        format!("kpack-fuse: {}: no such file\n", missing.display())
    );
}
