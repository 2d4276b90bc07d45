//! Mounts racing for one mount point: of any number started at once, exactly one mounts and the
//! others exit 8 with the reason; the mount table lists the path once, and after the unmount
//! nothing is left there (no mount stacked under another).

use std::path::Path;
use std::process::{Command, Stdio};

use crate::support::mount::{UnmountOnDrop, fuse_available};

/// Mounts at `mp` on the table now.
fn mounts_at(mp: &Path) -> usize {
    let want = mp.to_str().unwrap();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter(|l| l.split(' ').nth(4) == Some(want))
        .count()
}

/// Starts `n` background mounts of `source` at `mp` at once; returns each one's exit code and
/// standard error.
fn race(n: usize, source: &Path, mp: &Path) -> Vec<(Option<i32>, String)> {
    let children: Vec<_> = (0..n)
        .map(|_| {
            Command::new(env!("CARGO_BIN_EXE_kpack-fuse"))
                .arg("mount")
                .arg(source)
                .arg(mp)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    children
        .into_iter()
        .map(|c| {
            let out = c.wait_with_output().unwrap();
            (
                out.status.code(),
                String::from_utf8_lossy(&out.stderr).into_owned(),
            )
        })
        .collect()
}

fn races(n: usize, rounds: usize) {
    if !fuse_available() {
        return;
    }
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("samples/rocrand-sample.kpack");
    let dir = tempfile::tempdir().unwrap();
    let mp = dir.path().canonicalize().unwrap();
    let _cleanup = UnmountOnDrop(&mp);
    for round in 0..rounds {
        let outcomes = race(n, &source, &mp);
        let won = outcomes.iter().filter(|(c, _)| *c == Some(0)).count();
        assert_eq!(won, 1, "round {round}: {outcomes:?}");
        for (code, err) in outcomes.iter().filter(|(c, _)| *c != Some(0)) {
            assert_eq!(*code, Some(8), "round {round}: {err}");
            assert!(
                err.contains("something is already mounted there (fuse.kpack-fuse)"),
                "round {round}: {err}"
            );
        }
        assert_eq!(mounts_at(&mp), 1, "round {round}: one mount on the table");
        let status = Command::new(env!("CARGO_BIN_EXE_kpack-fuse"))
            .arg("unmount")
            .arg(&mp)
            .status()
            .unwrap();
        assert!(status.success(), "round {round}: unmount");
        assert_eq!(mounts_at(&mp), 0, "round {round}: nothing stacked under it");
    }
}

#[test]
fn of_two_mounts_racing_for_one_mount_point_one_mounts() {
    races(2, 50);
}

#[test]
fn of_four_mounts_racing_for_one_mount_point_one_mounts() {
    races(4, 10);
}
