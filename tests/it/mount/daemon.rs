//! The daemon: background start that returns only once the mount is live, failures reported by
//! the waiting command with nothing left mounted, SIGTERM with a file held open, `unmount
//! --lazy` on a busy mount, `-o` lists end to end, and `/dev/fd/N` mount points
//! (`--auto-unmount` through fusermount3 is `tests/auto_unmount.rs`).

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use rocm_kpack::fs::setup::mountinfo;

use super::tmp;
use crate::support::fixture;
use crate::support::mount::{Mount, fuse_available};

/// Waits (bounded) for `path` to stop being a mount point.
fn wait_unmounted(path: &Path, what: &str) {
    crate::support::mount_env::wait_unmounted(path, what, Duration::from_secs(30));
}

/// Holds `file` open in a watched child until told to read it; returns once it is open.
fn hold_open(m: &Mount, file: &str, scratch: &Path) -> crate::support::mount::RunningChild {
    let child = m.spawn_child("hold", &format!("{file}|{}", scratch.display()));
    let deadline = Instant::now() + Duration::from_secs(60);
    while !scratch.join("ready").exists() {
        if Instant::now() > deadline {
            let out = m.finish(child);
            panic!("the holder never got ready:\n{}", out.output);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    child
}

#[test]
fn background_start_returns_once_live_and_sigterm_waits_for_open_files() {
    if !fuse_available() {
        return;
    }
    // start_background checks the mount table once, right after the command returned 0.
    let mut m = Mount::start_background(&fixture("test_noop.kpack"), &["-v"]);
    m.check("walk", "");
    assert!(
        m.daemon_log().contains("mounted archive"),
        "logged to --log-file:\n{}",
        m.daemon_log()
    );
    let scratch = tmp();
    let child = hold_open(&m, "lib/libtest.so#0/gfx906.hsaco", scratch.path());
    m.signal(libc::SIGTERM);
    wait_unmounted(&m.mountpoint, "after SIGTERM");
    assert!(
        m.daemon_running(),
        "the daemon serves the open file until it is closed"
    );
    std::fs::write(scratch.path().join("go"), b"").unwrap();
    let out = m.finish(child);
    assert!(
        out.success,
        "{}\ndaemon log:\n{}",
        out.output,
        m.daemon_log()
    );
    let log = m.log_path().to_path_buf();
    let status = m.wait_exit();
    assert_eq!(
        status.code(),
        Some(0),
        "{}",
        std::fs::read_to_string(log).unwrap_or_default()
    );
}

#[test]
fn background_directory_mount_stops_on_sigint() {
    if !fuse_available() {
        return;
    }
    let d = tmp();
    std::fs::copy(fixture("test_zstd.kpack"), d.path().join("z.kpack")).unwrap();
    let m = Mount::start_background(d.path(), &[]);
    let status = m.stop_with(libc::SIGINT);
    assert_eq!(status.code(), Some(0));
}

/// Runs `kpack-fuse mount` (background unless `-f` is in `extra`) and returns its exit code and
/// standard error, bounded in time, checking that nothing is left mounted.
fn failing_mount(source: &Path, extra: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String) {
    let mp = tmp();
    let err_path = mp.path().join("stderr");
    let mnt = mp.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_kpack-fuse"))
        .arg("mount")
        .arg(source)
        .arg(&mnt)
        .args(extra)
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&err_path).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("kpack-fuse mount did not return");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let canonical = mnt.canonicalize().unwrap();
    let left = mountinfo::mount_at(&canonical).unwrap();
    if left.is_some() {
        crate::support::mount::umount_lazy(&canonical);
    }
    assert_eq!(left, None, "nothing may be left mounted");
    (status.code(), std::fs::read_to_string(err_path).unwrap())
}

#[test]
fn background_failures_exit_non_zero_with_the_message_and_nothing_mounted() {
    let d = tmp();
    // A corrupt source (4, found by the daemon after the fork and reported through the pipe),
    // and, refused before forking, a bad option (2) and an unwritable log (7).
    let bad = d.path().join("bad.kpack");
    std::fs::write(&bad, b"KPAK\x01\0\0\0xx").unwrap();
    let (code, err) = failing_mount(&bad, &[], &[]);
    assert_eq!(code, Some(4), "{err}");
    let (code, err) = failing_mount(&fixture("test_noop.kpack"), &["-o", "rw"], &[]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("read-only"), "{err}");
    let (code, err) = failing_mount(&fixture("test_noop.kpack"), &["-o", "ro,bogus"], &[]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("unknown mount option \"bogus\""), "{err}");
    let (code, err) = failing_mount(
        &fixture("test_noop.kpack"),
        &["--log-file", "/nonexistent-dir/x.log"],
        &[],
    );
    assert_eq!(code, Some(7), "{err}");
    let (code, err) = failing_mount(
        &fixture("test_noop.kpack"),
        &["--allow-other", "-o", "allow_root"],
        &[],
    );
    assert_eq!(code, Some(2), "{err}");
    if !fuse_available() {
        return;
    }
    // Failing inside the daemon, after the fork: the mount helper exits without mounting.
    // The waiting command reports the daemon's message with exit 9.
    let (code, err) = failing_mount(
        &fixture("test_noop.kpack"),
        &["--auto-unmount"],
        &[("FUSERMOUNT_PATH", "/bin/false")],
    );
    assert_eq!(code, Some(9), "{err}");
    assert!(err.contains("cannot mount on"), "{err}");
    // A daemon stuck in mounting (a helper that never answers): the command gives up after
    // the readiness timeout, stops it, and exits 9.
    let stuck = d.path().join("stuck-fusermount");
    std::fs::write(&stuck, "#!/bin/sh\nexec sleep 15\n").unwrap();
    std::fs::set_permissions(&stuck, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let started = Instant::now();
    let (code, err) = failing_mount(
        &fixture("test_noop.kpack"),
        &["--auto-unmount"],
        &[
            ("FUSERMOUNT_PATH", stuck.to_str().unwrap()),
            ("KPACK_FUSE_READY_TIMEOUT", "2"),
        ],
    );
    assert_eq!(code, Some(9), "{err}");
    assert!(err.contains("the mount did not start within 2 s"), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(12),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn unmount_lazy_with_a_file_open() {
    if !fuse_available() {
        return;
    }
    let m = Mount::start(&fixture("test_noop.kpack"), &[]);
    let scratch = tmp();
    let child = hold_open(&m, "lib/libtest.so#0/gfx900.hsaco", scratch.path());
    let bin = env!("CARGO_BIN_EXE_kpack-fuse");
    let busy = Command::new(bin)
        .arg("unmount")
        .arg(&m.mountpoint)
        .output()
        .unwrap();
    assert_eq!(
        busy.status.code(),
        Some(9),
        "{}",
        String::from_utf8_lossy(&busy.stderr)
    );
    assert!(String::from_utf8_lossy(&busy.stderr).contains("use --lazy"));
    let lazy = Command::new(bin)
        .arg("unmount")
        .arg("--lazy")
        .arg(&m.mountpoint)
        .output()
        .unwrap();
    assert!(
        lazy.status.success(),
        "{}",
        String::from_utf8_lossy(&lazy.stderr)
    );
    assert_eq!(
        mountinfo::mount_at(&m.mountpoint).unwrap(),
        None,
        "detached at once"
    );
    std::fs::write(scratch.path().join("go"), b"").unwrap();
    let out = m.finish(child);
    assert!(
        out.success,
        "the open file is still served:\n{}",
        out.output
    );
    assert_eq!(m.wait_exit().code(), Some(0));
}

#[test]
fn option_lists_apply_end_to_end() {
    if !fuse_available() {
        return;
    }
    let m = Mount::start(
        &fixture("test_noop.kpack"),
        &[
            "-o",
            "ro,nodev,nosuid,dev,suid,exec,noexec,allow_other,default_permissions,defaults,auto,noauto,user,nouser,users,_netdev,nofail,x-systemd.automount",
            "-o",
            "disk_cache_size=1M,threads=2",
        ],
    );
    let line = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let mp = m.mountpoint.display().to_string();
    let entry = line
        .lines()
        .find(|l| l.split(' ').nth(4) == Some(mp.as_str()))
        .unwrap()
        .to_owned();
    for want in ["ro", "nosuid", "nodev", "noexec", "allow_other"] {
        assert!(
            entry.split([' ', ',']).any(|w| w == want),
            "{want} in {entry}"
        );
    }
    m.check("walk", "");
    m.stop();
}

// `--auto-unmount` after a crash is tested alone, in `tests/auto_unmount.rs`.

#[test]
fn dev_fd_mount_point_from_a_launcher() {
    if !fuse_available() {
        return;
    }
    let m = Mount::start_fd(&fixture("test_zstd.kpack"), &[]);
    m.check("walk", "");
    // The launcher owns the mount: unmounting it ends the daemon, which exits 0.
    crate::support::mount::umount_lazy(&m.mountpoint);
    assert_eq!(m.wait_exit().code(), Some(0));

    // SIGTERM stops serving; the launcher then unmounts.
    let m = Mount::start_fd(&fixture("test_noop.kpack"), &["--threads", "2"]);
    m.check("walk", "");
    let mp = m.mountpoint.clone();
    m.signal(libc::SIGTERM);
    let status = m.wait_exit();
    crate::support::mount::umount_lazy(&mp);
    assert_eq!(status.code(), Some(0));

    // A descriptor that is not /dev/fuse is a mount point problem (8).
    let out = Command::new(env!("CARGO_BIN_EXE_kpack-fuse"))
        .args(["mount"])
        .arg(fixture("test_noop.kpack"))
        .args(["/dev/fd/0", "-f"])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(8),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new(env!("CARGO_BIN_EXE_kpack-fuse"))
        .args(["mount"])
        .arg(fixture("test_noop.kpack"))
        .args(["/dev/fd/99", "-f"])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(8),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
