//! Split binaries loaded from C through `librocm_kpack`, the way the HIP runtime loads them:
//! `tests/c/split_load.c` (compiled under ASan + UBSan against our header and `.so`) takes each
//! wrapper's `binary` pointer, finds the binary with `kpack_discover_binary_path` and loads
//! every code object with `kpack_load_code_object`; the expected bytes are the original fat
//! binary's code objects, written to files by this test. A gcc-built library is dlopened;
//! Debian's `librocrand.so.1.1` (whose `libamdhip64` is absent here) is checked from its file.

use std::path::{Path, PathBuf};

use rocm_kpack::Compression;
use rocm_kpack::host::fatbin::{self, CodeObject};
use rocm_kpack::tools::split::{Outcome, SplitRequest, split_tree, verify_split};

use crate::split::{HIPF, Kind, build, tu_blobs};
use crate::support::cc::{self, Lang};

/// Writes `<index>_<arch>.bin` for every code object; returns the arches in first-seen order.
fn write_expected(dir: &Path, code_objects: &[CodeObject]) -> Vec<String> {
    std::fs::create_dir_all(dir).unwrap();
    let mut arches: Vec<String> = Vec::new();
    for co in code_objects {
        std::fs::write(dir.join(format!("{}_{}.bin", co.index, co.arch)), &co.data).unwrap();
        if !arches.contains(&co.arch) {
            arches.push(co.arch.clone());
        }
    }
    arches
}

fn split_one(host: &Path, root: &Path, out_root: &Path, prefix: &str) {
    let report = split_tree(&SplitRequest {
        hosts: vec![host.to_path_buf()],
        root: root.to_path_buf(),
        out_root: out_root.to_path_buf(),
        prefix: Some(prefix.into()),
        compression: Compression::Zstd { level: 3 },
        reference_layout: false,
        pins: true,
    })
    .unwrap();
    assert!(matches!(report.binaries[0].outcome, Outcome::Split { .. }));
}

fn run_split_load(mode: &str, binary: &Path, expect: &Path, arches: &[String], names: &[&str]) {
    let exe = cc::compile(
        "split_load.c",
        &expect.with_file_name("split_load"),
        Lang::C,
    );
    let mut args: Vec<PathBuf> = vec![mode.into(), binary.to_path_buf(), expect.to_path_buf()];
    args.extend(arches.iter().map(PathBuf::from));
    let out = cc::run(&exe, &args, &[]);
    let stdout = cc::assert_all_passed(&out, names);
    assert_eq!(
        stdout
            .lines()
            .filter(|l| l.starts_with("[       OK ]"))
            .count(),
        names.len(),
        "{stdout}"
    );
}

/// Runs `split_load.c` over a split binary: `dlopen` mode for a library (its wrappers in memory
/// too), `file` mode for anything (wrappers read from the file).
pub(crate) fn run_split_load_for(binary: &Path, originals: &[CodeObject], mode: &str) {
    let expect = binary.with_file_name(format!(
        "{}.expect",
        binary.file_name().unwrap().to_string_lossy()
    ));
    let arches = write_expected(&expect, originals);
    let names: &[&str] = if mode == "dlopen" {
        &[
            "SplitFile.WrappersInFile",
            "SplitFile.LoadCodeObjects",
            "SplitLoad.WrappersInMemory",
            "SplitLoad.DiscoverBinaryPath",
            "SplitLoad.LoadCodeObjects",
            "SplitLoad.MissingArchAndIndex",
        ]
    } else {
        &["SplitFile.WrappersInFile", "SplitFile.LoadCodeObjects"]
    };
    run_split_load(mode, binary, &expect, &arches, names);
}

#[test]
fn split_c_dlopened_library_loads_original_code_objects() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = std::fs::canonicalize(tmp.path()).unwrap();
    let lib = build(
        &dir,
        "in/lib/libsplit.so",
        &tu_blobs(),
        HIPF,
        Kind::Library,
        "",
    );
    let out_root = dir.join("out");
    split_one(&lib, &dir.join("in"), &out_root, "splt");
    let originals =
        fatbin::host_code_objects("lib/libsplit.so", &std::fs::read(&lib).unwrap()).unwrap();
    assert_eq!(originals.len(), 6);
    let expect = dir.join("expect");
    let arches = write_expected(&expect, &originals);
    assert_eq!(arches, ["gfx900", "gfx90a:xnack-"]);
    run_split_load(
        "dlopen",
        &out_root.join("lib/libsplit.so"),
        &expect,
        &arches,
        &[
            "SplitFile.WrappersInFile",
            "SplitFile.LoadCodeObjects",
            "SplitLoad.WrappersInMemory",
            "SplitLoad.DiscoverBinaryPath",
            "SplitLoad.LoadCodeObjects",
            "SplitLoad.MissingArchAndIndex",
        ],
    );
}

#[test]
fn split_c_rocrand_marker_loads_original_code_objects() {
    let Some(so) = crate::fatbin::rocrand() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let dir = std::fs::canonicalize(tmp.path()).unwrap();
    // Debian's layout: <root>/lib/x86_64-linux-gnu/librocrand.so.1.1.
    let root = so
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf();
    let before = (
        std::fs::read(&so).unwrap(),
        std::fs::metadata(&so).unwrap().modified().unwrap(),
    );
    let out_root = dir.join("out");
    split_one(&so, &root, &out_root, "rocrand");
    assert_eq!(
        (
            std::fs::read(&so).unwrap(),
            std::fs::metadata(&so).unwrap().modified().unwrap()
        ),
        before,
        "the input was modified"
    );
    let kernel_name = "lib/x86_64-linux-gnu/librocrand.so.1.1";
    let originals = fatbin::host_code_objects(kernel_name, &before.0).unwrap();
    let expect = dir.join("expect");
    let arches = write_expected(&expect, &originals);
    assert_eq!(arches.len(), 7);
    assert!(originals.iter().all(|c| c.index == 0));

    run_split_load(
        "file",
        &out_root.join(kernel_name),
        &expect,
        &arches,
        &["SplitFile.WrappersInFile", "SplitFile.LoadCodeObjects"],
    );
    let check = verify_split(&out_root, &root).unwrap();
    assert_eq!(
        (check.binaries, check.code_objects, check.problems),
        (1, 7, Vec::<String>::new())
    );
}
