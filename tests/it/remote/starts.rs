//! Starting mounts of remote sources: a background start succeeds every time (the fork comes
//! before any network thread), one limit bounds the whole start however slow the link, a slow
//! link gets its bytes in smaller requests instead of timing out, and a network timeout exits 3
//! saying so.

use std::path::Path;
use std::time::{Duration, Instant};

use rocm_kpack::fs::setup::mountinfo;

use super::servers::Nginx;
use super::{reference_archive, run};
use crate::support::mount::{UnmountOnDrop, fuse_available};

#[test]
fn background_mounts_of_a_remote_source_start_every_time() {
    if !fuse_available() {
        return;
    }
    let www = tempfile::tempdir().unwrap();
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("samples/rocrand-sample.kpack"),
        www.path().join("sample.kpack"),
    )
    .unwrap();
    let nginx = Nginx::start(www.path());
    let url = nginx.url("sample.kpack");
    let dir = tempfile::tempdir().unwrap();
    let mp = dir.path().canonicalize().unwrap();
    let _cleanup = UnmountOnDrop(&mp);
    let mp_arg = mp.to_str().unwrap();
    for start in 0..200 {
        let (code, _, err) = run(&["mount", &url, mp_arg], &[]);
        assert_eq!(code, Some(0), "start {start}: {err}");
        assert!(err.is_empty(), "start {start}: {err}");
        let (code, _, err) = run(&["unmount", mp_arg], &[]);
        assert_eq!(code, Some(0), "start {start}: unmount: {err}");
    }
    assert_eq!(mountinfo::mount_at(&mp).unwrap(), None);
}

/// Opening a reference-layout archive over a link this slow takes minutes; the start limit
/// (`KPACK_FUSE_READY_TIMEOUT`) covers it, and the command stops the daemon and says so.
#[test]
fn one_limit_bounds_the_whole_start_of_a_remote_mount() {
    if !fuse_available() {
        return;
    }
    let www = tempfile::tempdir().unwrap();
    reference_archive(&www.path().join("ref.kpack"), 32, 100_000);
    let nginx = Nginx::start_rate_limited(www.path(), 20_000);
    let dir = tempfile::tempdir().unwrap();
    let mp = dir.path().canonicalize().unwrap();
    let _cleanup = UnmountOnDrop(&mp);
    let started = Instant::now();
    let (code, _, err) = run(
        &["mount", &nginx.url("ref.kpack"), mp.to_str().unwrap()],
        &[("KPACK_FUSE_READY_TIMEOUT".into(), "3".into())],
    );
    let took = started.elapsed();
    assert_eq!(code, Some(9), "{err}");
    assert!(
        err.contains("the mount did not start within 3 s")
            && err.contains("KPACK_FUSE_READY_TIMEOUT"),
        "{err}"
    );
    assert!(took < Duration::from_secs(20), "took {took:?}");
    assert_eq!(
        mountinfo::mount_at(&mp).unwrap(),
        None,
        "nothing left mounted"
    );
}

/// `list URL` with a 1 s request timeout and `retries` retries.
fn list_with_short_timeout(url: &str, retries: &str) -> (Option<i32>, String, String) {
    run(
        &[
            "list",
            url,
            "--remote-timeout",
            "1",
            "--remote-retries",
            retries,
        ],
        &[],
    )
}

/// Windows of the frame chain grow past what the link carries within the timeout; the requests
/// that time out are asked for again in smaller pieces, and the archive opens.
#[test]
fn a_slow_link_gets_smaller_requests_instead_of_timeouts() {
    let www = tempfile::tempdir().unwrap();
    reference_archive(&www.path().join("ref.kpack"), 16, 100_000);
    let nginx = Nginx::start_rate_limited(www.path(), 300_000);
    // Retries only for a 64 KiB piece that a busy machine delays past the second.
    let (code, out, err) = list_with_short_timeout(&nginx.url("ref.kpack"), "2");
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(out.matches("lib/r.so#").count(), 16, "{out}");
}

/// A link too slow for even the smallest request: exit 3, and the message says it timed out.
#[test]
fn a_network_timeout_exits_3_saying_so() {
    let www = tempfile::tempdir().unwrap();
    reference_archive(&www.path().join("ref.kpack"), 4, 100_000);
    let nginx = Nginx::start_rate_limited(www.path(), 8_000);
    let (code, _, err) = list_with_short_timeout(&nginx.url("ref.kpack"), "0");
    assert_eq!(code, Some(3), "{err}");
    assert!(err.contains("timed out"), "{err}");
    assert!(!err.contains("bad zstd blob"), "{err}");
}
