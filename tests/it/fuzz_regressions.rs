//! Replays every saved fuzz input (`tests/fixtures/fuzz/<target>/`) through the fuzz targets'
//! own bodies on stable Rust: the seeds generated from the open matrix, and any input a fuzzer
//! ever crashed on. The bodies are included from `fuzz/src/checks/`, so a replay here runs
//! exactly the invariants the fuzzer checked. Archive inputs listed in `archive/expected.txt`
//! must also give that exact open and probe outcome.

#[path = "../../fuzz/src/checks/mod.rs"]
#[allow(dead_code)]
pub(crate) mod checks;
mod host_seeds;
mod seeds;

use std::collections::BTreeMap;
use std::fs;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};

use rocm_kpack::ErrorKind;

use crate::support::fixture;

const EXPECTED: &str = "expected.txt";

fn dir(target: &str) -> PathBuf {
    fixture("fuzz").join(target)
}

/// The committed inputs of one target, by file name (the expectations file excluded).
fn committed(target: &str) -> BTreeMap<String, Vec<u8>> {
    fs::read_dir(dir(target))
        .unwrap_or_else(|e| panic!("{}: {e}", dir(target).display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap() != EXPECTED)
        .map(|p| {
            (
                p.file_name().unwrap().to_string_lossy().into_owned(),
                fs::read(&p).unwrap(),
            )
        })
        .collect()
}

fn kind_name(r: &Result<(), ErrorKind>) -> String {
    match r {
        Ok(()) => "ok".into(),
        Err(k) => format!("{k:?}"),
    }
}

/// One line of `archive/expected.txt`: `<file> open=<kind|ok> get=<kind|ok|->`.
fn expectation_line(
    file: &str,
    open: &Result<(), ErrorKind>,
    probe: &Option<Result<(), ErrorKind>>,
) -> String {
    let probe = probe.as_ref().map_or("-".to_owned(), kind_name);
    format!("{file} open={} get={probe}", kind_name(open))
}

/// One generated seed: its target, file name and bytes.
type Seed = (&'static str, String, Vec<u8>);

/// The generated seeds, plus the archive expectations file.
fn generated() -> (Vec<Seed>, String) {
    let mut files = Vec::new();
    let mut expected = String::new();
    for s in seeds::archive_seeds() {
        let file = format!("{}.kpack", s.name);
        expected += &expectation_line(&file, &s.open, &s.probe);
        expected.push('\n');
        files.push(("archive", file, s.bytes));
    }
    files.extend(
        seeds::toc_seeds()
            .into_iter()
            .map(|(n, b)| ("toc", format!("{n}.toc"), b)),
    );
    files.extend(
        seeds::zstd_index_seeds()
            .into_iter()
            .map(|(n, b)| ("zstd_index", format!("{n}.blob"), b)),
    );
    files.extend(
        seeds::archive_mutate_seeds()
            .into_iter()
            .map(|(n, b)| ("archive_mutate", format!("{n}.edits"), b)),
    );
    files.extend(
        seeds::hipk_metadata_seeds()
            .into_iter()
            .map(|(n, b)| ("hipk_metadata", format!("{n}.msgpack"), b)),
    );
    files.extend(
        seeds::bundle_seeds()
            .into_iter()
            .map(|(n, b)| ("bundle", format!("{n}.fatbin"), b)),
    );
    files.extend(
        seeds::maps_seeds()
            .into_iter()
            .map(|(n, b)| ("maps", format!("{n}.maps"), b)),
    );
    (files, expected)
}

/// Lines of the committed expectations that the generator did not write: crash regressions
/// added by hand, which blessing must keep.
fn hand_written_expectations(generated: &str) -> String {
    let path = dir("archive").join(EXPECTED);
    let current = fs::read_to_string(path).unwrap_or_default();
    current
        .lines()
        .filter(|l| !generated.lines().any(|g| g == *l))
        .map(|l| format!("{l}\n"))
        .collect()
}

#[test]
fn committed_seeds_match_the_generator() {
    let (files, expected) = generated();
    if std::env::var_os("KPACK_BLESS_FUZZ_SEEDS").is_some() {
        let keep = hand_written_expectations(&expected);
        for (target, name, bytes) in &files {
            fs::create_dir_all(dir(target)).unwrap();
            fs::write(dir(target).join(name), bytes).unwrap();
        }
        fs::write(dir("archive").join(EXPECTED), expected.clone() + &keep).unwrap();
    }
    for (target, name, bytes) in &files {
        let on_disk = fs::read(dir(target).join(name))
            .unwrap_or_else(|e| panic!("{target}/{name}: {e} (bless?)"));
        assert!(
            on_disk == *bytes,
            "{target}/{name} differs from the generator (KPACK_BLESS_FUZZ_SEEDS=1)"
        );
    }
    let on_disk = fs::read_to_string(dir("archive").join(EXPECTED)).unwrap();
    assert!(
        on_disk.starts_with(&expected),
        "archive/{EXPECTED} differs from the generator"
    );
}

#[test]
fn every_committed_input_replays_cleanly() {
    let mut failures = Vec::new();
    let mut count = 0;
    for (target, body) in checks::TARGETS {
        let inputs = committed(target);
        assert!(!inputs.is_empty(), "no committed inputs for {target}");
        for (name, bytes) in inputs {
            count += 1;
            if let Err(panic) = catch_unwind(AssertUnwindSafe(|| body(&bytes))) {
                let msg = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                failures.push(format!("{target}/{name}: {msg}"));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {count} inputs failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn archive_inputs_give_their_expected_outcomes() {
    let text = fs::read_to_string(dir("archive").join(EXPECTED)).unwrap();
    let inputs = committed("archive");
    let mut checked = 0;
    for line in text
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
    {
        let file = line.split_whitespace().next().unwrap();
        let bytes = inputs
            .get(file)
            .unwrap_or_else(|| panic!("{EXPECTED} names missing {file}"));
        let outcome = checks::archive::run(bytes);
        let probe = outcome.probe.map(|p| p.map(|_| ()));
        assert_eq!(expectation_line(file, &outcome.open, &probe), line);
        checked += 1;
    }
    // Every archive input has an expectation, so none is replayed only for "no panic".
    assert_eq!(
        checked,
        inputs.len(),
        "archive inputs without a line in {EXPECTED}"
    );
}

/// The host-binary seeds are gcc's output, so they are written (when blessing) but not compared;
/// instead each must still reach the path it is there for.
#[test]
fn host_seeds_reach_the_deep_paths() {
    use rocm_kpack::host::fatbin;
    use rocm_kpack::host::hipk::HipkHost;
    use rocm_kpack::tools::split::{self, SplitError};

    if std::env::var_os("KPACK_BLESS_FUZZ_SEEDS").is_some() {
        for (target, name, bytes) in host_seeds::host_seeds() {
            fs::create_dir_all(dir(target)).unwrap();
            fs::write(dir(target).join(name), bytes).unwrap();
        }
    }
    let mut checked = 0;
    for (name, bytes) in committed("split_elf") {
        let got = split::split_elf(&bytes, &split::marker("k", "p", None));
        match name.as_str() {
            n if n.starts_with("fat-") => {
                let r = got.unwrap_or_else(|e| panic!("{n}: {e}"));
                assert_eq!(r.wrappers, 2, "{n}");
            }
            n if n.starts_with("split-") => assert_eq!(got.unwrap_err(), SplitError::AlreadySplit),
            "bad-magic-library.so" => assert!(matches!(got, Err(SplitError::BadWrapper { .. }))),
            n if n.starts_with("stray-pointer") => {
                assert!(matches!(got, Err(SplitError::DanglingReloc { .. })), "{n}")
            }
            "no-device-code.so" => assert_eq!(got.unwrap_err(), SplitError::NoDeviceCode),
            // Found by the fuzzer: a binary whose .dynsym links to a section that is not a
            // string table. split's own reader plans the rewrite (it does not read .dynsym),
            // but the command refuses it: import's reader rejects the file.
            "crash-dynsym-links-a-non-string-section" => {
                assert!(got.is_ok());
                match split::split_binary(&bytes, "k", "p") {
                    Err(SplitError::Fatbin(fatbin::FatbinError::NotElf(why))) => {
                        assert!(why.contains("Invalid ELF string section type"), "{why}")
                    }
                    other => panic!("{:?}", other.map(|b| b.result.bytes.len())),
                }
            }
            // Found by the fuzzer: a section whose offset plus size overflows 64 bits made the
            // layout's sums overflow (a panic with overflow checks, a wrapped layout without).
            "crash-section-end-overflows-u64" => match got {
                Err(SplitError::Malformed(why)) => {
                    assert!(why.contains("run past the 24576-byte file"), "{why}")
                }
                other => panic!("{:?}", other.map(|r| r.bytes.len())),
            },
            // Found by the fuzzer: a device-code section shorter than a page near the end of the
            // file put the (empty) hole past the bytes kept, and the copy plan underflowed. It
            // now splits like any binary with nothing to cut.
            "crash-empty-hole-past-the-kept-bytes" => {
                let r = got.unwrap_or_else(|e| panic!("{e}"));
                assert_eq!(r.removed, 0);
                rocm_kpack::host::hipk::HipkHost::read(&r.bytes).unwrap();
            }
            // Found by the fuzzer: a segment aligned to 1 GiB, which the output pads the new
            // segment to (in memory too): over 2 GiB allocated for a 24 KiB input.
            "oom-huge-segment-alignment" => match got {
                Err(SplitError::Unsupported(why)) => {
                    assert!(why.contains("is larger than 16777216"), "{why}")
                }
                other => panic!("{:?}", other.map(|r| r.bytes.len())),
            },
            other => panic!("split_elf seed {other} has no expectation here"),
        }
        checked += 1;
    }
    for (name, bytes) in committed("host_walk") {
        let got = fatbin::host_code_objects("k", &bytes);
        if name.starts_with("debug-") {
            // A separated debug file: the section is there, its device code is not.
            assert_eq!(got, Ok(Vec::new()), "{name}");
            assert_eq!(
                fatbin::host_kind(&bytes),
                Ok(fatbin::HostKind::SeparatedDebug),
                "{name}"
            );
        } else if name.starts_with("fat-") || name.starts_with("stray-") || name.starts_with("bad-")
        {
            let arches: Vec<String> = got.unwrap().into_iter().map(|c| c.arch).collect();
            assert_eq!(
                arches,
                ["gfx900", "gfx90a:xnack-", "gfx900", "gfx1100"],
                "{name}"
            );
        } else {
            assert!(got.is_err(), "{name}");
        }
        checked += 1;
    }
    for (name, bytes) in committed("hipk_host") {
        let got = HipkHost::read(&bytes);
        if name.starts_with("split-") {
            let host = got.unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(host.hipk_code_objects(), [0, 1], "{name}");
            assert_eq!(
                host.metadata.pins.is_some(),
                name.starts_with("split-pinned-"),
                "{name}"
            );
        } else {
            assert!(got.is_err(), "{name}");
        }
        checked += 1;
    }
    assert!(checked >= 40, "only {checked} host seeds");
}

/// Debian's librocrand (a real ROCm library: one CCOB-less bundle, seven code objects) and
/// what `split` makes of it go through the host-binary checks like any fuzz input.
#[test]
fn real_rocrand_passes_the_host_binary_checks() {
    let Some(so) = crate::fatbin::rocrand() else {
        return;
    };
    let bytes = fs::read(so).unwrap();
    checks::split_elf::run(&bytes);
    checks::host_walk::run(&bytes);
    let marker = rocm_kpack::tools::split::marker("lib/librocrand.so.1.1", "rocrand", None);
    let split = rocm_kpack::tools::split::split_elf(&bytes, &marker).unwrap();
    checks::hipk_host::run(&split.bytes);
    checks::split_elf::run(&split.bytes);
}

/// The fuzz workspace must list every target the replay knows, and the other way round.
#[test]
fn fuzz_manifest_and_replay_list_agree() {
    let manifest =
        fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/Cargo.toml")).unwrap();
    let mut bins: Vec<&str> = manifest
        .lines()
        .filter_map(|l| l.strip_prefix("name = \"")?.strip_suffix('"'))
        .filter(|n| *n != "kpack-fuzz")
        .collect();
    let mut known: Vec<&str> = checks::TARGETS.iter().map(|(n, _)| *n).collect();
    bins.sort();
    known.sort();
    assert_eq!(bins, known);
}
