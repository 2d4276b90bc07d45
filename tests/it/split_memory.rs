//! `split` and `pack --from-fatbin` hold a bounded window of device code, not the input: a
//! synthetic fat library with 256 MiB of device code (100 bundles of 5 arches, code objects of
//! 20 KB to 15 MB) is split and imported by the CLI in a child process whose peak resident
//! memory (VmHWM, from `wait4`) must stay under 160 MiB, and the code objects come back out of
//! the archives byte for byte.

use std::path::Path;
use std::process::{Command, Stdio};

use rocm_kpack::Archive;

use crate::support::fat_host;

const DEVICE_CODE: u64 = 256 << 20;
/// Pipeline budget on 2 cores (64 MiB) + one code object being read (<= 15 MiB) + compressed
/// frames waiting for their turn + the host part, zstd contexts and the program itself.
const RSS_BOUND: u64 = 160 << 20;

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_kpack-fuse")
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
    let (status, split_peak) = fat_host::peak_rss(
        Command::new(bin())
            .arg("split")
            .arg(&host.path)
            .arg("--root")
            .arg(&root)
            .args(["--prefix", "fat", "-o"])
            .arg(&out)
            .stdout(Stdio::null()),
    );
    assert!(status.success(), "split: {status}");
    let split_len = std::fs::metadata(out.join("lib/libfat.so")).unwrap().len();
    assert!(
        split_len < input_len - host.device_bytes + (1 << 20),
        "{split_len}"
    );
    check_archives(&host, &out.join(".kpack"), "lib/libfat.so");

    let imported = tmp.path().join("imported");
    let (status, import_peak) = fat_host::peak_rss(
        Command::new(bin())
            .args(["pack", "--from-fatbin"])
            .arg(&host.path)
            .arg("--root")
            .arg(&root)
            .args(["--prefix", "fat", "-o"])
            .arg(&imported)
            .stdout(Stdio::null()),
    );
    assert!(status.success(), "pack --from-fatbin: {status}");
    for arch in fat_host::ARCHES {
        let name = format!("fat_{arch}.kpack");
        assert!(
            std::fs::read(imported.join(&name)).unwrap()
                == std::fs::read(out.join(".kpack").join(&name)).unwrap(),
            "{name}: split and pack --from-fatbin write the same archive"
        );
    }
    eprintln!(
        "input {input_len} bytes ({} of device code): split peak {} MiB, pack --from-fatbin peak {} MiB",
        host.device_bytes,
        split_peak >> 20,
        import_peak >> 20
    );
    assert!(split_peak < RSS_BOUND, "split peak RSS {split_peak}");
    assert!(
        import_peak < RSS_BOUND,
        "pack --from-fatbin peak RSS {import_peak}"
    );
}
