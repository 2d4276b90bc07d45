//! What mount tests need of the machine, and waiting for a mount to go. Shared by the `it`
//! binary (`support::mount`, the daemon tests) and `tests/auto_unmount.rs`, which includes this
//! file by path.

use std::path::Path;
use std::time::{Duration, Instant};

use rocm_kpack::fs::setup::mountinfo;

/// Whether this process is root, and whether `/dev/fuse` opens for reading and writing.
pub fn root_and_dev_fuse() -> (bool, bool) {
    // SAFETY: no arguments, cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    let dev = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
        .is_ok();
    (root, dev)
}

/// True when every check holds. Otherwise `what` is skipped with a line saying why, or, where
/// it must run (`CI` or `KPACK_REQUIRE_FUSE` set), fails with that line.
pub fn required(what: &str, checks: &[(&str, bool)]) -> bool {
    if checks.iter().all(|&(_, ok)| ok) {
        return true;
    }
    let names: Vec<&str> = checks.iter().map(|&(name, _)| name).collect();
    let found: Vec<String> = checks
        .iter()
        .map(|&(name, ok)| format!("{name}: {ok}"))
        .collect();
    let why = format!("{what} need {} ({})", names.join(", "), found.join(", "));
    if std::env::var_os("CI").is_some() || std::env::var_os("KPACK_REQUIRE_FUSE").is_some() {
        panic!("{why}");
    }
    eprintln!("SKIPPED: {why}");
    false
}

/// Waits, at most `limit`, for `path` to stop being a mount point; fails naming `what`.
pub fn wait_unmounted(path: &Path, what: &str, limit: Duration) {
    let deadline = Instant::now() + limit;
    while mountinfo::mount_at(path).unwrap().is_some() {
        assert!(
            Instant::now() < deadline,
            "{what}: {} still mounted",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}
