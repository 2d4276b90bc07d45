//! What a user sees when a mount goes wrong in a common way: a user who may not open /dev/fuse, a
//! machine or container without /dev/fuse, a mount point left behind by a killed daemon or still
//! in use, a mount over a directory that has files in it, and warnings on the terminal.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use super::lazy_unmount_then_remount;
use crate::support::fixture;
use crate::support::mount::{Mount, fuse_available, in_private_mount_namespace};

const BIN: &str = env!("CARGO_BIN_EXE_kpack-fuse");

/// Runs `kpack-fuse mount ARCHIVE MNT -f` as user nobody in a private mount namespace whose
/// /dev/fuse is a copy of the device node with `mode` (so the machine's /dev/fuse is untouched),
/// after `hide`, shell commands run as root in that namespace. Returns the output and the
/// mount point.
fn mount_as_nobody(mode: &str, hide: &str) -> (std::process::Output, std::path::PathBuf) {
    let d = tempfile::tempdir().unwrap();
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    // The binary and the archive where user nobody can reach them.
    let bin = d.path().join("kpack-fuse");
    std::fs::copy(BIN, &bin).unwrap();
    let archive = d.path().join("a.kpack");
    std::fs::copy(fixture("test_noop.kpack"), &archive).unwrap();
    std::fs::set_permissions(&archive, std::fs::Permissions::from_mode(0o644)).unwrap();
    let mnt = d.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    std::os::unix::fs::chown(&mnt, Some(65534), Some(65534)).unwrap();
    let node = d.path().join("fuse");
    let script = format!(
        "mknod {node} c 10 229 && chmod {mode} {node} && mount --bind {node} /dev/fuse && {hide} \
         exec setpriv --reuid=65534 --regid=65534 --clear-groups -- {bin} mount {archive} {mnt} -f",
        node = node.display(),
        bin = bin.display(),
        archive = archive.display(),
        mnt = mnt.display(),
    );
    let out = in_private_mount_namespace(30, &script).output().unwrap();
    (out, mnt)
}

/// A non-root user for whom /dev/fuse is root-only: the refusal names /dev/fuse and the fixes.
#[test]
fn non_root_without_dev_fuse_access_is_told_so() {
    // SAFETY: geteuid has no arguments and cannot fail.
    if !fuse_available() || unsafe { libc::geteuid() } != 0 {
        return;
    }
    let (out, mnt) = mount_as_nobody("600", "");
    // In the foreground the log is standard error too: the message is printed once, by the
    // command, not also logged.
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        err,
        format!(
            "kpack-fuse: cannot mount on {}: permission denied (this user cannot open /dev/fuse \
             for reading and writing: mount as root, or make /dev/fuse usable by all (mode 0666, \
             as the fuse3 package sets it), or, in a container, pass --device /dev/fuse)\n",
            mnt.display()
        )
    );
    assert_eq!(out.status.code(), Some(9));
}

/// A non-root user on a machine without fusermount3 (hidden in the namespace by binding
/// /dev/null over it, so it cannot be run): the refusal says that such mounts need it and that
/// root mounts do not.
#[test]
fn non_root_without_fusermount_is_told_so() {
    // SAFETY: geteuid has no arguments and cannot fail.
    if !fuse_available() || unsafe { libc::geteuid() } != 0 {
        return;
    }
    let hide = "for f in /usr/bin/fusermount3 /usr/bin/fusermount /bin/fusermount3 \
                /bin/fusermount /sbin/fusermount3 /sbin/fusermount; do \
                if [ -e $f ]; then mount --bind /dev/null $f || exit 99; fi; done &&";
    let (out, mnt) = mount_as_nobody("666", hide);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.starts_with(&format!("kpack-fuse: cannot mount on {}: ", mnt.display())),
        "{err}"
    );
    assert!(
        err.ends_with(
            " (a user other than root mounts through fusermount3, which is not installed: \
             install it (Debian and Ubuntu: apt install fuse3), or mount as root, which does not \
             need it)\n"
        ),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
    assert_eq!(out.status.code(), Some(9));
}

/// After SIGKILL the mount point answers ENOTCONN: mounting there again says what is wrong and
/// which command clears it, and that command works on the dead connection.
#[test]
fn dead_mount_point_suggests_unmount_lazy_which_clears_it() {
    if !fuse_available() {
        return;
    }
    let mut m = Mount::start(&fixture("test_noop.kpack"), &[]);
    m.kill_daemon();
    let mp = m.mountpoint.clone();
    let out = Command::new(BIN)
        .arg("mount")
        .arg(fixture("test_noop.kpack"))
        .arg(&mp)
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        format!(
            "kpack-fuse: {mp}: a mount whose daemon is gone is still there (transport endpoint \
             is not connected); remove it with `kpack-fuse unmount --lazy {mp}`\n",
            mp = mp.display()
        )
    );
    assert_eq!(out.status.code(), Some(8));
    lazy_unmount_then_remount(&mp, &fixture("test_noop.kpack"));
}

/// A mount over a directory with files in it works (as mount(8) allows) but warns that they are
/// hidden; they are back after the unmount.
#[test]
fn mount_over_a_non_empty_directory_warns() {
    if !fuse_available() {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let mp = d.path().join("mnt");
    std::fs::create_dir(&mp).unwrap();
    std::fs::write(mp.join("mine.txt"), b"still here").unwrap();
    let m = Mount::start_on(&mp, &fixture("test_noop.kpack"), &[]);
    // The mount shows the archive only.
    m.check("walk", "");
    let log = m.daemon_log();
    let canonical = mp.canonicalize().unwrap();
    assert!(
        log.contains(&format!(
            "{} is not empty: its contents are hidden while kpack-fuse is mounted there\n",
            canonical.display()
        )),
        "{log}"
    );
    m.stop();
    assert_eq!(
        std::fs::read(Path::new(&mp).join("mine.txt")).unwrap(),
        b"still here"
    );
}

/// Without /dev/fuse (a container started without `--device /dev/fuse`) the refusal names the
/// device and the fix, not "no such file", which reads as if the mount point were missing. The
/// device is hidden in a private mount namespace, so the machine's stays untouched.
#[test]
fn without_dev_fuse_the_refusal_names_it() {
    // SAFETY: geteuid has no arguments and cannot fail.
    if !fuse_available() || unsafe { libc::geteuid() } != 0 {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let mnt = d.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let script = format!(
        "mount -t tmpfs none /dev && exec {BIN} mount {} {} -f",
        fixture("test_noop.kpack").display(),
        mnt.display()
    );
    let out = in_private_mount_namespace(30, &script)
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        format!(
            "kpack-fuse: cannot mount on {}: /dev/fuse does not exist (in a container, pass \
             --device /dev/fuse; on a host, load the fuse module: modprobe fuse)\n",
            mnt.display()
        )
    );
    assert_eq!(out.status.code(), Some(9));
}

/// A second mount on a live one is refused with the command that unmounts the first.
#[test]
fn mounting_over_a_mount_says_how_to_unmount_it() {
    if !fuse_available() {
        return;
    }
    let m = Mount::start(&fixture("test_noop.kpack"), &[]);
    let mp = m.mountpoint.clone();
    let out = Command::new(BIN)
        .arg("mount")
        .arg(fixture("test_noop.kpack"))
        .arg(&mp)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stderr).into_owned();
    let code = out.status.code();
    m.stop();
    assert_eq!(
        text,
        format!(
            "kpack-fuse: {mp}: something is already mounted there (fuse.kpack-fuse); unmount it \
             first with `kpack-fuse unmount {mp}`, or choose another mount point\n",
            mp = mp.display()
        )
    );
    assert_eq!(code, Some(8));
}

/// A warning on the terminal reads like an error (`kpack-fuse: warning: ...`); `-v` and the log
/// file keep the time, level and module.
#[test]
fn terminal_warnings_read_like_errors_unless_verbose() {
    if !fuse_available() {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("kp");
    std::fs::create_dir(&src).unwrap();
    std::fs::copy(fixture("test_noop.kpack"), src.join("a.kpack")).unwrap();
    std::fs::write(src.join("c.kpack"), b"KPAK\x01\0\0\0garbage").unwrap();
    let bad = src.canonicalize().unwrap().join("c.kpack");
    let quiet_env = |c: &mut Command| {
        c.env_remove("RUST_LOG");
    };
    let m = Mount::start_background_configured(&src, &[], &quiet_env);
    let shown = m.command_output();
    m.stop();
    let prefix = format!("kpack-fuse: warning: skipping {}: ", bad.display());
    assert!(shown.starts_with(&prefix), "{shown}");
    assert_eq!(shown.lines().count(), 1, "{shown}");
    let m = Mount::start_background_configured(&src, &["-v"], &quiet_env);
    let shown = m.command_output();
    let log = m.daemon_log();
    m.stop();
    let detailed = format!(
        " WARN  rocm_kpack::fs::setup::source] skipping {}: ",
        bad.display()
    );
    assert!(
        shown
            .lines()
            .any(|l| l.starts_with("[20") && l.contains(&detailed)),
        "{shown}"
    );
    assert!(!shown.contains("kpack-fuse: warning:"), "{shown}");
    // After the fork the daemon logs to the file, in the detailed form.
    assert!(
        log.lines()
            .next()
            .is_some_and(|l| l.starts_with("[20") && l.contains(" INFO ")),
        "{log}"
    );
}
