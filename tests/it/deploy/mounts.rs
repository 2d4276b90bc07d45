//! Real mounts the way deployments make them. Each test installs what it needs (with
//! `scripts/install.sh` into a temporary prefix, or a link), mounts under a deadline, checks the
//! mount is live the moment the mounting command returned, reads a kernel through it, unmounts,
//! and checks that the daemon is gone. Guards clean up on failure.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use rocm_kpack::Archive;

use super::{MountGuard, mounted_type, must, repo, run_for, wait_no_process};
use crate::support::fixture;
use crate::support::mount::fuse_available;

const BIN: &str = env!("CARGO_BIN_EXE_kpack-fuse");
const KEY: &str = "lib/libtest.so#0";
const ARCH: &str = "gfx900";

fn kernel_bytes(archive: &Path) -> Vec<u8> {
    Archive::open(archive)
        .unwrap()
        .get_kernel(KEY, ARCH)
        .unwrap()
}

/// A scratch directory everyone may traverse (the unprivileged test needs that), with a mount
/// point and a copy of the test archive.
struct Scene {
    dir: tempfile::TempDir,
    archive: PathBuf,
    mnt: PathBuf,
}

impl Scene {
    fn new() -> Scene {
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let root = dir.path().canonicalize().unwrap();
        let archive = root.join("kernels.kpack");
        std::fs::copy(fixture("test_noop.kpack"), &archive).unwrap();
        std::fs::set_permissions(&archive, std::fs::Permissions::from_mode(0o644)).unwrap();
        let mnt = root.join("mnt");
        std::fs::create_dir(&mnt).unwrap();
        Scene { dir, archive, mnt }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().canonicalize().unwrap().join(rel)
    }

    /// Reads the test kernel through the mount in a child process (`prefix` runs it as another
    /// user), and compares it with the archive API.
    fn check_read(&self, prefix: &[&str]) {
        let file = self.mnt.join(KEY).join(format!("{ARCH}.hsaco"));
        let mut argv: Vec<String> = prefix.iter().map(|s| s.to_string()).collect();
        argv.extend([
            "od".into(),
            "-An".into(),
            "-v".into(),
            "-tx1".into(),
            file.display().to_string(),
        ]);
        let got = must(Command::new(&argv[0]).args(&argv[1..]));
        let want: Vec<u8> = got
            .split_whitespace()
            .map(|h| u8::from_str_radix(h, 16).unwrap())
            .collect();
        assert_eq!(want, kernel_bytes(&self.archive));
    }

    /// Unmounts with umount(8), then the mount and the daemon must be gone.
    fn umount(&self) {
        must(Command::new("umount").arg(&self.mnt));
        assert_eq!(mounted_type(&self.mnt), None);
        assert!(
            wait_no_process(&self.mnt.display().to_string(), 30),
            "the daemon did not exit after umount"
        );
    }
}

/// Installs the built program into a temporary prefix; `sbindir` gets the helper link.
fn install(prefix: &Path, sbindir: &str) {
    let from = Path::new(BIN).parent().unwrap();
    must(
        Command::new(repo().join("scripts/install.sh"))
            .arg("--prefix")
            .arg(prefix)
            .arg("--from")
            .arg(from)
            .args(["--sbindir", sbindir]),
    );
}

#[test]
fn version_and_native_helper_fake_and_usage() {
    let r = run_for(Command::new(BIN).arg("--version"), 30);
    assert_eq!(
        (r.code, r.stdout.as_str()),
        (
            Some(0),
            concat!("kpack-fuse ", env!("CARGO_PKG_VERSION"), "\n")
        )
    );
    let s = Scene::new();
    let helper = s.path("mount.kpack-fuse");
    std::os::unix::fs::symlink(BIN, &helper).unwrap();
    // -f (fake): nothing happens, success.
    let r = run_for(
        Command::new(&helper)
            .arg(&s.archive)
            .arg(&s.mnt)
            .args(["-f", "-o", "ro"]),
        30,
    );
    assert_eq!((r.code, r.stderr.as_str()), (Some(0), ""));
    assert_eq!(mounted_type(&s.mnt), None);
    // Usage errors exit 2 with the helper's usage line.
    let r = run_for(Command::new(&helper).arg(&s.archive).arg("-x"), 30);
    assert_eq!(r.code, Some(2));
    assert_eq!(
        r.stderr,
        "mount.kpack-fuse: unknown option -x\nusage: mount.kpack-fuse SOURCE MOUNTPOINT [-sfnv] [-o OPTIONS]\n"
    );
    // -v shows the translated command; a missing source fails like `mount` would (exit 3).
    let r = run_for(
        Command::new(&helper)
            .arg(s.path("missing.kpack"))
            .arg(&s.mnt)
            .args(["-v", "-s", "-n"]),
        30,
    );
    assert_eq!(r.code, Some(3), "{}", r.stderr);
    assert!(
        r.stderr.starts_with(&format!(
            "mount.kpack-fuse: kpack-fuse mount {} {} -v\n",
            s.path("missing.kpack").display(),
            s.mnt.display()
        )),
        "{}",
        r.stderr
    );
    // The mount.fuse3 form of the same: no subcommand.
    let r = run_for(
        Command::new(BIN).arg(s.path("missing.kpack")).arg(&s.mnt),
        30,
    );
    assert_eq!(r.code, Some(3), "{}", r.stderr);
    assert_eq!(mounted_type(&s.mnt), None);
}

/// Serialises the tests that put links into system directories (/sbin, /usr/local/bin) or
/// change /dev/fuse, so they never see each other's links.
static SYSTEM: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn system_lock() -> std::sync::MutexGuard<'static, ()> {
    SYSTEM.lock().unwrap_or_else(|e| e.into_inner())
}

/// A link in a system directory for one test: whatever was at `path` is moved aside and put
/// back on drop, even when the test fails. `None` target: the test creates the link itself
/// (install.sh does, for the /sbin helper).
struct SystemLink {
    path: PathBuf,
    backup: Option<PathBuf>,
}

impl SystemLink {
    fn new(path: &str, target: Option<&Path>) -> SystemLink {
        let path = PathBuf::from(path);
        let backup = path.with_file_name(format!(
            ".{}.kpack-test-{}",
            path.file_name().unwrap().to_str().unwrap(),
            std::process::id()
        ));
        let backup = std::fs::rename(&path, &backup).is_ok().then_some(backup);
        if let Some(t) = target {
            std::os::unix::fs::symlink(t, &path).unwrap();
        }
        SystemLink { path, backup }
    }
}

impl Drop for SystemLink {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
        if let Some(b) = &self.backup {
            let _ = std::fs::rename(b, &self.path);
        }
    }
}

/// mount(8) runs mount.fuse3 with a clean environment: /bin/sh then finds `kpack-fuse` on its
/// default PATH only, where `scripts/install.sh`'s default prefix puts it (/usr/local/bin).
const PATH_LINK: &str = "/usr/local/bin/kpack-fuse";

#[test]
fn mount_t_fuse_kpack_fuse_runs_the_program_from_path_through_mount_fuse3() {
    if !fuse_available() {
        return;
    }
    let _lock = system_lock();
    let s = Scene::new();
    let prefix = s.path("prefix");
    install(&prefix, "none");
    let _link = SystemLink::new(PATH_LINK, Some(&prefix.join("bin/kpack-fuse")));
    let _guard = MountGuard::new(&s.mnt);
    let r = run_for(
        Command::new("mount")
            .args(["-t", "fuse.kpack-fuse", "-o", "ro,nodev,nosuid"])
            .arg(&s.archive)
            .arg(&s.mnt),
        60,
    );
    assert!(r.ok(), "mount exited {:?}: {}", r.code, r.stderr);
    // Live the moment mount(8) returned.
    assert_eq!(mounted_type(&s.mnt).as_deref(), Some("fuse.kpack-fuse"));
    s.check_read(&[]);
    let daemon = super::processes_mentioning(&s.mnt.display().to_string());
    assert_eq!(daemon.len(), 1, "{daemon:?}");
    let exe = std::fs::read_link(format!("/proc/{}/exe", daemon[0])).unwrap();
    assert_eq!(
        exe,
        prefix.join("bin/kpack-fuse"),
        "the installed program serves the mount"
    );
    s.umount();

    // The legacy spelling: type fuse, source TYPE#SOURCE; mount.fuse3 runs the same command.
    let r = run_for(
        Command::new("mount")
            .args(["-t", "fuse", "-o", "ro,nodev,nosuid"])
            .arg(format!("kpack-fuse#{}", s.archive.display()))
            .arg(&s.mnt),
        60,
    );
    assert!(r.ok(), "mount exited {:?}: {}", r.code, r.stderr);
    assert_eq!(mounted_type(&s.mnt).as_deref(), Some("fuse.kpack-fuse"));
    s.check_read(&[]);
    s.umount();
}

const SBIN_HELPER: &str = "/sbin/mount.kpack-fuse";

#[test]
fn native_helper_in_sbin_for_mount_t_kpack_fuse_and_fstab_lines_via_mount_capital_t() {
    if !fuse_available() {
        return;
    }
    let _lock = system_lock();
    let s = Scene::new();
    let prefix = s.path("prefix");
    let helper = SystemLink::new(SBIN_HELPER, None);
    install(&prefix, "/sbin");
    assert_eq!(
        std::fs::read_link(SBIN_HELPER).unwrap(),
        prefix.join("bin/kpack-fuse")
    );
    let _path_link = SystemLink::new(PATH_LINK, Some(&prefix.join("bin/kpack-fuse")));
    let _guard = MountGuard::new(&s.mnt);

    // Without options, mount(8) passes `rw`; the helper drops it and the mount is read-only.
    let r = run_for(
        Command::new("mount")
            .args(["-t", "kpack-fuse"])
            .arg(&s.archive)
            .arg(&s.mnt),
        60,
    );
    assert!(r.ok(), "mount exited {:?}: {}", r.code, r.stderr);
    assert_eq!(mounted_type(&s.mnt).as_deref(), Some("fuse.kpack-fuse"));
    let opts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let line = opts
        .lines()
        .find(|l| l.contains(&*s.mnt.to_string_lossy()))
        .unwrap()
        .to_owned();
    assert!(
        line.split(' ')
            .nth(5)
            .unwrap()
            .split(',')
            .any(|o| o == "ro"),
        "{line}"
    );
    s.check_read(&[]);
    s.umount();

    // mount -t kpack-fuse: mount(8) runs /sbin/mount.kpack-fuse SRC DIR -o OPTS; no PATH needed.
    let r = run_for(
        Command::new("mount")
            .args(["-t", "kpack-fuse", "-o", "ro,nodev,nosuid"])
            .arg(&s.archive)
            .arg(&s.mnt),
        60,
    );
    assert!(r.ok(), "mount exited {:?}: {}", r.code, r.stderr);
    assert_eq!(mounted_type(&s.mnt).as_deref(), Some("fuse.kpack-fuse"));
    s.check_read(&[]);
    s.umount();

    // fstab lines of both types, as in mount-helpers/fstab.example, through mount -T.
    for ty in ["kpack-fuse", "fuse.kpack-fuse"] {
        let fstab = s.path("fstab");
        std::fs::write(
            &fstab,
            format!(
                "# test\n{}  {}  {ty}  ro,nodev,nosuid,nofail  0 0\n",
                s.archive.display(),
                s.mnt.display()
            ),
        )
        .unwrap();
        let r = run_for(Command::new("mount").arg("-T").arg(&fstab).arg(&s.mnt), 60);
        assert!(r.ok(), "{ty}: mount -T exited {:?}: {}", r.code, r.stderr);
        assert_eq!(
            mounted_type(&s.mnt).as_deref(),
            Some("fuse.kpack-fuse"),
            "{ty}"
        );
        s.check_read(&[]);
        s.umount();
    }

    // Uninstall takes the link out of /sbin again.
    must(
        Command::new(repo().join("scripts/install.sh"))
            .arg("--prefix")
            .arg(&prefix)
            .arg("--uninstall"),
    );
    assert!(
        std::fs::symlink_metadata(SBIN_HELPER).is_err(),
        "{SBIN_HELPER} left behind"
    );
    drop(helper);
}

/// Distributions make /dev/fuse 0666 (so fusermount3 is needed only for mount(2) itself); some
/// containers, this machine's included, leave it 0600. The unprivileged test sets the usual mode
/// for its duration and restores the old one on drop.
struct FuseDeviceMode {
    old: Option<u32>,
}

impl FuseDeviceMode {
    fn world_rw() -> FuseDeviceMode {
        let mode = std::fs::metadata("/dev/fuse").unwrap().permissions().mode() & 0o7777;
        if mode & 0o666 == 0o666 {
            return FuseDeviceMode { old: None };
        }
        std::fs::set_permissions("/dev/fuse", std::fs::Permissions::from_mode(mode | 0o666))
            .unwrap();
        FuseDeviceMode { old: Some(mode) }
    }
}

impl Drop for FuseDeviceMode {
    fn drop(&mut self) {
        if let Some(m) = self.old {
            let _ = std::fs::set_permissions("/dev/fuse", std::fs::Permissions::from_mode(m));
        }
    }
}

#[test]
fn unprivileged_user_mounts_and_unmounts_through_fusermount3() {
    if !fuse_available() {
        return;
    }
    let _lock = system_lock();
    let _mode = FuseDeviceMode::world_rw();
    let s = Scene::new();
    // A mount point owned by the user, who must also reach the binary.
    let nobody = 65534;
    std::os::unix::fs::chown(&s.mnt, Some(nobody), Some(nobody)).unwrap();
    let bin = s.path("kpack-fuse");
    std::fs::copy(BIN, &bin).unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    let as_nobody = [
        "setpriv",
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        "--",
    ];
    let _guard = MountGuard::new(&s.mnt);
    let r = run_for(
        Command::new(as_nobody[0])
            .args(&as_nobody[1..])
            .arg(&bin)
            .arg("mount")
            .arg(&s.archive)
            .arg(&s.mnt)
            .env("HOME", "/"),
        60,
    );
    assert!(r.ok(), "mount as nobody exited {:?}: {}", r.code, r.stderr);
    assert_eq!(mounted_type(&s.mnt).as_deref(), Some("fuse.kpack-fuse"));
    // Without CAP_SYS_ADMIN the kernel would refuse every backing file: the daemon read path
    // is in force from the start, before any open.
    let stats = run_for(
        Command::new(as_nobody[0])
            .args(&as_nobody[1..])
            .arg(&bin)
            .args(["stats", "--json"])
            .arg(&s.mnt),
        30,
    );
    assert!(stats.ok(), "stats as nobody: {}", stats.stderr);
    let stats: serde_json::Value = serde_json::from_str(&stats.stdout).unwrap();
    assert_eq!(stats["passthrough"], 0, "{stats}");
    assert_eq!(stats["daemon_opens"], 0, "{stats}");
    s.check_read(&as_nobody);
    // The daemon runs as the user.
    let pids = super::processes_mentioning(&s.mnt.display().to_string());
    assert_eq!(pids.len(), 1, "{pids:?}");
    let status = std::fs::read_to_string(format!("/proc/{}/status", pids[0])).unwrap();
    assert!(
        status
            .lines()
            .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(2) == Some("65534")),
        "{status}"
    );
    // unmount as the user: umount2 is refused (EPERM), fusermount3 -u does it.
    must(
        Command::new(as_nobody[0])
            .args(&as_nobody[1..])
            .arg(&bin)
            .arg("unmount")
            .arg(&s.mnt),
    );
    assert_eq!(mounted_type(&s.mnt), None);
    assert!(
        wait_no_process(&s.mnt.display().to_string(), 30),
        "the daemon did not exit"
    );
}

fn entrypoint() -> PathBuf {
    repo().join("mount-helpers/container-entrypoint.sh")
}

fn entry_cmd(s: &Scene) -> Command {
    let mut c = Command::new(entrypoint());
    c.env("KPACK_SOURCE", &s.archive)
        .env("KPACK_MOUNTPOINT", &s.mnt)
        .env("KPACK_FUSE", BIN)
        .env("KPACK_READY_TIMEOUT", "30");
    c
}

#[test]
fn container_entrypoint_mounts_runs_the_command_and_unmounts() {
    if !fuse_available() {
        return;
    }
    let s = Scene::new();
    let _guard = MountGuard::new(&s.mnt);
    // The command sees the mount, and its exit status is the script's.
    let script = format!(
        "grep -q ' {} fuse.kpack-fuse ' /proc/mounts && od -An -v -tx1 \"$KPACK_MOUNTPOINT/{KEY}/{ARCH}.hsaco\"; exit 7",
        s.mnt.display()
    );
    let r = run_for(entry_cmd(&s).args(["sh", "-c", &script]), 90);
    assert_eq!(r.code, Some(7), "{}", r.stderr);
    let bytes: Vec<u8> = r
        .stdout
        .split_whitespace()
        .map(|h| u8::from_str_radix(h, 16).unwrap())
        .collect();
    assert_eq!(bytes, kernel_bytes(&s.archive));
    assert!(
        r.stderr.contains(&format!(
            "kpack-entrypoint: mounted {} on {}\n",
            s.archive.display(),
            s.mnt.display()
        )),
        "{}",
        r.stderr
    );
    assert_eq!(mounted_type(&s.mnt), None, "unmounted after the command");
    assert!(wait_no_process(&s.mnt.display().to_string(), 30));

    // docker stop: SIGTERM to the script ends the command, then the mount.
    let mut child = entry_cmd(&s)
        .args(["sleep", "600"])
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while mounted_type(&s.mnt).is_none() {
        assert!(Instant::now() < deadline, "never mounted");
        assert!(
            child.try_wait().unwrap().is_none(),
            "entrypoint exited early"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // SAFETY: signalling the child we started.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("entrypoint did not stop after SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(143), "sleep killed by SIGTERM");
    assert_eq!(mounted_type(&s.mnt), None);
    assert!(wait_no_process(&s.mnt.display().to_string(), 30));
}

/// Failures of the entrypoint need no FUSE: nothing gets mounted.
#[test]
fn container_entrypoint_refusals() {
    let s = Scene::new();
    let r = run_for(entry_cmd(&s).env_remove("KPACK_SOURCE").arg("true"), 30);
    assert_eq!(
        (r.code, r.stderr.as_str()),
        (Some(2), "kpack-entrypoint: KPACK_SOURCE is not set\n")
    );
    let r = run_for(&mut entry_cmd(&s), 30);
    assert_eq!(
        (r.code, r.stderr.as_str()),
        (Some(2), "kpack-entrypoint: no command given\n")
    );
    let r = run_for(
        entry_cmd(&s).env("KPACK_READY_TIMEOUT", "soon").arg("true"),
        30,
    );
    assert_eq!(r.code, Some(2));
    // A source that is not there: kpack-fuse refuses it, the command never runs.
    let marker = s.path("ran");
    let r = run_for(
        entry_cmd(&s)
            .env("KPACK_SOURCE", s.path("missing.kpack"))
            .args(["touch"])
            .arg(&marker),
        60,
    );
    assert_eq!(r.code, Some(3), "{}", r.stderr);
    assert!(
        r.stderr
            .contains("kpack-entrypoint: kpack-fuse exited with status 3 before"),
        "{}",
        r.stderr
    );
    assert!(!marker.exists());
    assert_eq!(mounted_type(&s.mnt), None);
}
