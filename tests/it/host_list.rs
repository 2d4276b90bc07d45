//! `list` and `extract` of host binaries: a fat binary's code objects (plain and CCOB bundles)
//! named as `pack --from-fatbin` names them, a HIPK binary's as the loader finds them, and one
//! line naming what any other ELF file is.

use std::path::{Path, PathBuf};
use std::process::Command;

use rocm_kpack::host::bundle::{Layout, parse_fatbin};

use crate::cli::kpack_fuse;
use crate::fatbin::{expected_keys, gcc_fat_binary, rocrand, synthetic_section};
use crate::support::files_below;

fn ok(args: &[&dyn AsRef<std::ffi::OsStr>]) -> String {
    let o = kpack_fuse(args);
    assert!(
        o.status.success(),
        "{:?}: {}",
        args.iter().map(|a| a.as_ref()).collect::<Vec<_>>(),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

/// Every file below `dir` with its bytes, by path relative to `dir`.
fn tree(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    files_below(dir)
        .into_iter()
        .map(|p| {
            let bytes = std::fs::read(dir.join(&p)).unwrap();
            (p, bytes)
        })
        .collect()
}

/// `pack --from-fatbin` then `extract` of every archive it wrote.
fn packed_then_extracted(host: &Path, root: &Path, work: &Path) -> PathBuf {
    let kpack = work.join("packed");
    ok(&[
        &"pack",
        &"--from-fatbin",
        &host,
        &"--root",
        &root,
        &"-o",
        &kpack,
    ]);
    let out = work.join("via-pack");
    for a in std::fs::read_dir(&kpack).unwrap() {
        let a = a.unwrap().path();
        let o = kpack_fuse(&[&"extract", &a, &out]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    out
}

#[test]
fn host_list_shows_a_fat_binarys_code_objects_as_pack_names_them() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let (section, expected) = synthetic_section();
    let lib = gcc_fat_binary(&root, "lib/libsynth.so", &section, true);
    // Bundle of each code object, from the section as built.
    let bundles: Vec<String> = parse_fatbin(&section)
        .unwrap()
        .iter()
        .flat_map(|b| {
            let name = match b.layout {
                Layout::Uncompressed => format!("plain@{}", b.offset),
                Layout::Compressed { version } => format!("ccob-v{version}@{}", b.offset),
            };
            vec![name; b.entries.len()]
        })
        .collect();
    let keys = expected_keys("lib/libsynth.so", &expected);
    let mut want = format!("{:<17}  {:<13}  {:>12}  BUNDLE\n", "KEY", "ARCH", "SIZE");
    for ((key, arch, data), bundle) in keys.iter().zip(&bundles) {
        want += &format!("{key:<17}  {arch:<13}  {:>12}  {bundle}\n", data.len());
    }
    assert_eq!(ok(&[&"list", &lib, &"--root", &root]), want);
    assert!(
        bundles.iter().any(|b| b.starts_with("ccob-v3@")),
        "{bundles:?}"
    );
    assert!(
        bundles.iter().any(|b| b.starts_with("ccob-v2@")),
        "{bundles:?}"
    );

    // Without --root the kernel name is the file name, as with pack --from-fatbin.
    let json: serde_json::Value = serde_json::from_str(&ok(&[&"list", &lib, &"--json"])).unwrap();
    assert_eq!(json["kind"], "fat");
    assert_eq!(json["kernel_name"], "libsynth.so");
    assert_eq!(json["binary"], lib.display().to_string());
    let kernels = json["kernels"].as_array().unwrap();
    assert_eq!(kernels.len(), keys.len());
    for ((k, (key, arch, data)), bundle) in kernels.iter().zip(&keys).zip(&bundles) {
        let key = key.replace("lib/", "");
        assert_eq!(k["key"], key.as_str());
        assert_eq!(k["arch"], arch.as_str());
        assert_eq!(k["triple"], format!("hipv4-amdgcn-amd-amdhsa--{arch}"));
        assert_eq!(k["size"], data.len() as u64);
        assert_eq!(
            k["index"],
            key.rsplit_once('#').unwrap().1.parse::<u64>().unwrap()
        );
        assert_eq!(k["bundle"], bundle.as_str());
    }
}

#[test]
fn host_extract_of_a_fat_binary_is_pack_then_extract() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let (section, expected) = synthetic_section();
    let lib = gcc_fat_binary(&root, "lib/libsynth.so", &section, true);
    let direct = dir.path().join("direct");
    let o = kpack_fuse(&[&"extract", &lib, &direct, &"--root", &root]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        format!(
            "extracted 8 kernels ({} bytes) into {}\n",
            expected.iter().map(|(_, _, d)| d.len()).sum::<usize>(),
            direct.display()
        )
    );
    let want: Vec<(PathBuf, Vec<u8>)> = {
        let mut v: Vec<_> = expected_keys("lib/libsynth.so", &expected)
            .into_iter()
            .map(|(k, a, d)| (Path::new(&k).join(format!("{a}.hsaco")), d))
            .collect();
        v.sort();
        v
    };
    assert_eq!(tree(&direct), want);
    assert_eq!(tree(&packed_then_extracted(&lib, &root, dir.path())), want);
}

#[test]
fn host_list_of_a_hipk_binary_shows_what_the_loader_finds() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let (section, expected) = synthetic_section();
    let lib = gcc_fat_binary(&root, "lib/libsynth.so", &section, true);
    let out = dir.path().join("out");
    ok(&[&"split", &lib, &"--root", &root, &"-o", &out]);
    let hipk = out.join("lib/libsynth.so");
    let kpack = std::fs::canonicalize(out.join(".kpack")).unwrap();
    let keys = expected_keys("lib/libsynth.so", &expected);
    // One wrapper (index 0): every arch of #0, in search-path order (archives by name).
    let mut want = format!("{:<17}  {:<13}  {:>12}  ARCHIVE\n", "KEY", "ARCH", "SIZE");
    for arch in ["gfx1030", "gfx900", "gfx90a:xnack-"] {
        let (key, _, data) = keys
            .iter()
            .find(|(k, a, _)| k.ends_with("#0") && a == arch)
            .unwrap();
        want += &format!(
            "{key:<17}  {arch:<13}  {:>12}  {}\n",
            data.len(),
            kpack.join(format!("synth_{arch}.kpack")).display()
        );
    }
    assert_eq!(ok(&[&"list", &hipk]), want);

    // With --gpu: the loader's one pick.
    let (_, _, data) = keys
        .iter()
        .find(|(k, a, _)| k.ends_with("#0") && a == "gfx90a:xnack-")
        .unwrap();
    let json: serde_json::Value = serde_json::from_str(&ok(&[
        &"list",
        &hipk,
        &"--gpu",
        &"gfx90a:xnack-",
        &"--json",
    ]))
    .unwrap();
    assert_eq!(json["kind"], "hipk");
    assert_eq!(json["kernel_name"], "lib/libsynth.so");
    assert_eq!(
        json["kernels"],
        serde_json::json!([{
            "key": "lib/libsynth.so#0", "arch": "gfx90a:xnack-", "index": 0,
            "archive": kpack.join("synth_gfx90a:xnack-.kpack").display().to_string(),
            "size": data.len(), "error": null,
        }])
    );
    // A device none of the archives serves: the loader's reason, and exit 0.
    let text = ok(&[&"list", &hipk, &"--gpu", &"gfx1100"]);
    assert!(
        text.contains("lib/libsynth.so#0  -     error: no readable kpack archive found"),
        "{text}"
    );

    // extract of the HIPK binary gives what extract of the fat one gives for index 0.
    let from_hipk = dir.path().join("from-hipk");
    ok(&[&"extract", &hipk, &from_hipk]);
    let from_fat = dir.path().join("from-fat");
    ok(&[&"extract", &lib, &from_fat, &"--root", &root]);
    let fat0: Vec<_> = tree(&from_fat)
        .into_iter()
        .filter(|(p, _)| p.starts_with("lib/libsynth.so#0"))
        .collect();
    assert_eq!(tree(&from_hipk), fat0);
    let picked = dir.path().join("picked");
    ok(&[&"extract", &hipk, &picked, &"--gpu", &"gfx900"]);
    assert_eq!(
        tree(&picked),
        [(
            PathBuf::from("lib/libsynth.so#0/gfx900.hsaco"),
            keys[0].2.clone()
        )]
    );
}

#[test]
fn host_list_refuses_flags_that_do_not_apply() {
    let dir = tempfile::tempdir().unwrap();
    let (section, _) = synthetic_section();
    let lib = gcc_fat_binary(dir.path(), "libsynth.so", &section, true);
    let archive = Path::new(env!("CARGO_MANIFEST_DIR")).join("samples/rocrand-sample.kpack");
    for (file, flag, value, what, said) in [
        (
            &lib,
            "--gpu",
            "gfx900",
            "a fat binary",
            "--gpu (for HIPK binaries)",
        ),
        (
            &archive,
            "--gpu",
            "gfx900",
            "an archive",
            "--gpu (for HIPK binaries)",
        ),
        (
            &archive,
            "--root",
            "/",
            "an archive",
            "--root (for fat binaries)",
        ),
    ] {
        let o = kpack_fuse(&[&"list", file, &flag, &value]);
        assert_eq!(o.status.code(), Some(2));
        assert_eq!(
            String::from_utf8_lossy(&o.stderr),
            format!(
                "kpack-fuse: {}: is {what}; {said} does not apply\n",
                file.display()
            )
        );
    }
}

#[test]
fn host_list_names_an_elf_file_without_device_code() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let (section, _) = synthetic_section();
    let lib = gcc_fat_binary(&root, "lib/libsynth.so", &section, true);
    let debug = dir.path().join("libsynth.so.debug");
    let status = Command::new("objcopy")
        .arg("--only-keep-debug")
        .arg(&lib)
        .arg(&debug)
        .status()
        .expect("objcopy (binutils) must be installed");
    assert!(status.success());
    let plain = dir.path().join("plain");
    let c = dir.path().join("plain.c");
    std::fs::write(&c, "int main(void) { return 0; }\n").unwrap();
    assert!(
        Command::new("gcc")
            .arg("-o")
            .arg(&plain)
            .arg(&c)
            .status()
            .unwrap()
            .success()
    );
    for (file, what) in [
        (
            &debug,
            "a separated debug file: its .hip_fatbin section has no contents (SHT_NOBITS)",
        ),
        (
            &plain,
            "an ELF file without device code (no .hip_fatbin section, no .rocm_kpack_ref marker)",
        ),
    ] {
        for cmd in ["list", "extract"] {
            let dest = dir.path().join("dest");
            let o = if cmd == "list" {
                kpack_fuse(&[&cmd, file])
            } else {
                kpack_fuse(&[&cmd, file, &dest])
            };
            assert_eq!(o.status.code(), Some(4), "{cmd}");
            assert_eq!(
                String::from_utf8_lossy(&o.stderr),
                format!(
                    "kpack-fuse: {}: {what}; neither a kpack archive nor a host binary with device code\n",
                    file.display()
                )
            );
            assert!(!dest.exists());
        }
    }
}

#[test]
fn host_list_and_extract_real_rocrand() {
    let Some(so) = rocrand() else { return };
    let usr = so.ancestors().nth(3).unwrap().to_owned();
    let text = ok(&[&"list", &so, &"--root", &usr]);
    let rows: Vec<(String, String, u64)> = text
        .lines()
        .skip(1)
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f[0].to_owned(), f[1].to_owned(), f[2].parse().unwrap())
        })
        .collect();
    let want: Vec<(String, String, u64)> = [
        ("gfx1030", 1_642_416),
        ("gfx803", 1_812_792),
        ("gfx900:xnack-", 1_804_920),
        ("gfx906:xnack-", 1_803_176),
        ("gfx908:xnack-", 1_804_200),
        ("gfx90a:xnack+", 1_716_600),
        ("gfx90a:xnack-", 1_716_776),
    ]
    .iter()
    .map(|(a, n)| {
        (
            "lib/x86_64-linux-gnu/librocrand.so.1.1#0".into(),
            a.to_string(),
            *n,
        )
    })
    .collect();
    assert_eq!(rows, want);
    let dir = tempfile::tempdir().unwrap();
    let direct = dir.path().join("direct");
    ok(&[&"extract", &so, &direct, &"--root", &usr]);
    assert_eq!(
        tree(&direct),
        tree(&packed_then_extracted(&so, &usr, dir.path()))
    );
}
