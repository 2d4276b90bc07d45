//! The C thread and HIPK host programs under valgrind's memcheck, built
//! without ASan (valgrind cannot run ASan binaries). `#[ignore]`d because `scripts/sanitizers.sh`
//! runs them (about 7 s); `api.c` and `loader.c` under memcheck are part of the normal run
//! (`c_api::c_api_suites_under_valgrind`).
//!
//! Thread errors are ThreadSanitizer's job (`scripts/sanitizers.sh`): helgrind and drd do not see
//! the futex-based locks of the Rust standard library, and reported 156 race contexts on
//! `threads.c`, every one on data a std `Mutex` protects (see `docs/reliability.md`).

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use crate::support::cc;
use crate::support::layout;

const THREAD_TESTS: &[&str] = &[
    "LoaderAPITest.CacheReusesArchives",
    "LoaderAPITest.LoadCodeObject_CacheReusesArchive",
    "LoaderAPITest.ThreadSafety_ConcurrentLoadCodeObject",
    "LoaderAPITest.ThreadSafety_ConcurrentArchiveCaching",
    "ThreadSafety.ConcurrentLoadsAcrossArchives",
    "ArchiveIntegrationTest.ThreadSafety_ConcurrentGetKernel",
];

/// Runs `program ARGS` under `valgrind --tool=TOOL`, any reported error failing the run, and
/// checks that every expected C test passed. Returns valgrind's own report (its stderr lines).
/// `KPACK_VALGRIND_GEN=1` adds `--gen-suppressions=all` (to study a report, not to hide it).
fn valgrind(tool: &str, exe: &Path, args: &[&Path], expected: &[&str]) -> String {
    let mut full: Vec<OsString> = vec![
        format!("--tool={tool}").into(),
        "--error-exitcode=99".into(),
    ];
    if tool == "memcheck" {
        full.extend([
            "--leak-check=full".into(),
            "--errors-for-leak-kinds=definite".into(),
        ]);
    }
    if std::env::var_os("KPACK_VALGRIND_GEN").is_some() {
        full.push("--gen-suppressions=all".into());
    }
    full.push(exe.as_os_str().to_owned());
    full.extend(args.iter().map(|p| p.as_os_str().to_owned()));
    let started = std::time::Instant::now();
    let out = cc::run(Path::new("valgrind"), &full, &[]);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let report: Vec<&str> = stderr.lines().filter(|l| l.starts_with("==")).collect();
    let summary = report
        .iter()
        .rfind(|l| l.contains("ERROR SUMMARY"))
        .copied()
        .unwrap_or("no summary");
    eprintln!(
        "{tool} {}: {:.1?}, {summary}",
        exe.file_name().unwrap().to_string_lossy(),
        started.elapsed()
    );
    assert!(
        out.status.code() != Some(99),
        "{tool} reported errors:\n{stderr}\n--- stdout ---\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
    cc::assert_all_passed(&out, expected);
    report.join("\n")
}

struct Programs {
    _tmp: tempfile::TempDir,
    assets: PathBuf,
    scenarios: PathBuf,
    threads: PathBuf,
}

fn programs() -> Programs {
    let tmp = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(tmp.path()).unwrap();
    let (assets, scenarios) = (root.join("assets"), root.join("scenarios"));
    layout::write_assets(&assets);
    layout::write_scenarios(&scenarios, &assets);
    let threads = cc::compile_plain("threads.c", &root.join("threads.plain"));
    Programs {
        _tmp: tmp,
        assets,
        scenarios,
        threads,
    }
}

#[test]
#[ignore = "valgrind, run by scripts/sanitizers.sh"]
fn memcheck_threads_and_hipk_host() {
    let p = programs();
    valgrind(
        "memcheck",
        &p.threads,
        &[&p.assets, &p.scenarios],
        THREAD_TESTS,
    );
    let tmp = tempfile::tempdir().unwrap();
    let prefix = std::fs::canonicalize(tmp.path()).unwrap();
    layout::write_host_archives(&prefix);
    std::fs::create_dir_all(prefix.join("bin")).unwrap();
    let host = cc::compile_plain("hipk_host.c", &prefix.join("bin/hostapp"));
    valgrind(
        "memcheck",
        &host,
        &[],
        &["HipkHost.XnackArchiveFirst", "HipkHost.GenericArchive"],
    );
}
