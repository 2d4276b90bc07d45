//! `split`, `pack --from-fatbin` and the `verify` commands that read fat binaries
//! (`--split`, `--against`) hold a bounded window of device code, not the input: a synthetic
//! fat library with 256 MiB of device code (100 bundles of 5 arches, code objects of 20 KB to
//! 15 MB) is split, imported and verified by the CLI in a child process whose peak resident
//! memory (VmHWM, from `wait4`) must stay under 160 MiB, and the code objects come back out of
//! the archives byte for byte. `verify --split` also meets a 256 MiB binary left unsplit in
//! the tree, which it must not read.
//!
//! The CLI is not started from the test process itself but from a fresh copy of this test
//! binary (`peak_rss_child_entry`): at exec Linux folds the high-water RSS of the address space
//! being replaced into the new program's `ru_maxrss`, and a child spawned straight from the test
//! process replaces (vfork) the test process's own address space, whose peak other tests running
//! in parallel push past a gigabyte. The fresh copy's address space is a few MiB.

use std::ffi::OsString;
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};

use rocm_kpack::Archive;

use crate::support::fat_host;

const DEVICE_CODE: u64 = 256 << 20;
/// Pipeline budget on 2 cores (64 MiB) + one code object being read (<= 15 MiB) + compressed
/// frames waiting for their turn + the host part, zstd contexts and the program itself.
const RSS_BOUND: u64 = 160 << 20;

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_kpack-fuse")
}

const ARGC: &str = "KPACK_IT_PEAK_RSS_ARGC";
const ARG: &str = "KPACK_IT_PEAK_RSS_ARG";
const RESULT: &str = "KPACK_IT_PEAK_RSS ";

/// Runs the CLI with `args` (stdout discarded) from a fresh copy of this test binary and returns
/// its exit status and its own peak resident memory in bytes (see the module header for why).
fn cli_peak_rss(args: &[OsString]) -> (ExitStatus, u64) {
    use std::os::unix::process::ExitStatusExt;
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--ignored",
        "--exact",
        "split_memory::peak_rss_child_entry",
        "--nocapture",
        "--test-threads",
        "1",
    ])
    .env(ARGC, args.len().to_string())
    .stderr(Stdio::inherit());
    for (i, a) in args.iter().enumerate() {
        cmd.env(format!("{ARG}{i}"), a);
    }
    let out = cmd.output().expect("running the measuring child");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        // libtest prints `test NAME ... ` without a newline before the test's own output.
        .find_map(|l| l.split_once(RESULT).map(|(_, rest)| rest))
        .unwrap_or_else(|| {
            panic!(
                "measuring child ({}) printed no result:\n{stdout}",
                out.status
            )
        });
    let (status, peak) = line.split_once(' ').expect("status and peak");
    (
        ExitStatus::from_raw(status.parse().unwrap()),
        peak.parse().unwrap(),
    )
}

/// Entry point of the measuring child of [`cli_peak_rss`]: runs the CLI with the arguments in
/// the environment and prints its raw wait status and peak RSS. Ignored in normal runs, where it
/// has nothing to do.
#[test]
#[ignore = "entry point of the measuring child, run by cli_peak_rss"]
fn peak_rss_child_entry() {
    let Some(argc) = std::env::var_os(ARGC) else {
        return;
    };
    let argc: usize = argc.to_str().unwrap().parse().unwrap();
    let args: Vec<OsString> = (0..argc)
        .map(|i| std::env::var_os(format!("{ARG}{i}")).unwrap())
        .collect();
    let mut cmd = Command::new(bin());
    cmd.args(&args).env_remove(ARGC).stdout(Stdio::null());
    for i in 0..argc {
        cmd.env_remove(format!("{ARG}{i}"));
    }
    let (status, peak) = fat_host::peak_rss(&mut cmd);
    use std::os::unix::process::ExitStatusExt;
    println!("{RESULT}{} {peak}", status.into_raw());
}

/// Checks the first, a middle and the last code object of the library against its archives.
fn check_archives(host: &fat_host::FatHost, dir: &Path, kernel_name: &str) {
    let n = host.code_objects.len();
    for i in [0, n / 2, n - 1] {
        let (arch, _, _) = host.code_objects[i];
        let per_arch = host.code_objects[..i]
            .iter()
            .filter(|c| c.0 == arch)
            .count();
        let archive = Archive::open(dir.join(format!("fat_{arch}.kpack"))).unwrap();
        let got = archive
            .get_kernel(&format!("{kernel_name}#{per_arch}"), arch)
            .unwrap();
        assert!(got == host.code_object(i), "code object {i} ({arch})");
    }
}

#[test]
fn split_and_import_peak_memory_does_not_follow_the_input() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    std::fs::create_dir_all(root.join("lib")).unwrap();
    let host = fat_host::build(&root.join("lib"), "libfat.so", DEVICE_CODE, 100, 7);
    assert!(
        host.device_bytes > DEVICE_CODE * 9 / 10,
        "{}",
        host.device_bytes
    );
    let input_len = std::fs::metadata(&host.path).unwrap().len();

    let out = tmp.path().join("out");
    let (status, split_peak) = cli_peak_rss(&[
        "split".into(),
        host.path.clone().into(),
        "--root".into(),
        root.clone().into(),
        "--prefix".into(),
        "fat".into(),
        "-o".into(),
        out.clone().into(),
    ]);
    assert!(status.success(), "split: {status}");
    let split_len = std::fs::metadata(out.join("lib/libfat.so")).unwrap().len();
    assert!(
        split_len < input_len - host.device_bytes + (1 << 20),
        "{split_len}"
    );
    check_archives(&host, &out.join(".kpack"), "lib/libfat.so");

    let imported = tmp.path().join("imported");
    let (status, import_peak) = cli_peak_rss(&[
        "pack".into(),
        "--from-fatbin".into(),
        host.path.clone().into(),
        "--root".into(),
        root.clone().into(),
        "--prefix".into(),
        "fat".into(),
        "-o".into(),
        imported.clone().into(),
    ]);
    assert!(status.success(), "pack --from-fatbin: {status}");
    for arch in fat_host::ARCHES {
        let name = format!("fat_{arch}.kpack");
        assert!(
            std::fs::read(imported.join(&name)).unwrap()
                == std::fs::read(out.join(".kpack").join(&name)).unwrap(),
            "{name}: split and pack --from-fatbin write the same archive"
        );
    }
    // A large binary the tree holds unchanged (no device code, no marker): verify --split must
    // see that from its section tables, not read it. Here, the fat library with its device
    // code section renamed: 256 MiB of data in a plain ELF file.
    let plain = out.join("lib/libplain.so");
    let renamed = std::process::Command::new("objcopy")
        .args(["--rename-section", ".hip_fatbin=.rodata.blob"])
        .arg(&host.path)
        .arg(&plain)
        .status()
        .unwrap();
    assert!(renamed.success(), "objcopy: {renamed}");
    assert!(std::fs::metadata(&plain).unwrap().len() > DEVICE_CODE * 9 / 10);
    let (status, verify_split_peak) = cli_peak_rss(&[
        "verify".into(),
        "--split".into(),
        out.clone().into(),
        "--original".into(),
        root.clone().into(),
    ]);
    assert!(status.success(), "verify --split: {status}");
    let mut against: Vec<OsString> = vec!["verify".into()];
    against.extend(
        fat_host::ARCHES.map(|arch| imported.join(format!("fat_{arch}.kpack")).into_os_string()),
    );
    against.extend(["--against".into(), host.path.clone().into()]);
    let (status, verify_against_peak) = cli_peak_rss(&against);
    assert!(status.success(), "verify --against: {status}");
    eprintln!(
        "input {input_len} bytes ({} of device code): peak RSS of split {} MiB, pack --from-fatbin \
         {} MiB, verify --split {} MiB, verify --against {} MiB",
        host.device_bytes,
        split_peak >> 20,
        import_peak >> 20,
        verify_split_peak >> 20,
        verify_against_peak >> 20
    );
    assert!(split_peak < RSS_BOUND, "split peak RSS {split_peak}");
    assert!(
        import_peak < RSS_BOUND,
        "pack --from-fatbin peak RSS {import_peak}"
    );
    assert!(
        verify_split_peak < RSS_BOUND,
        "verify --split peak RSS {verify_split_peak}"
    );
    assert!(
        verify_against_peak < RSS_BOUND,
        "verify --against peak RSS {verify_against_peak}"
    );
}
