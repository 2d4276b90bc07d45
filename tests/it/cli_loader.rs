//! `kpack-fuse resolve` and `kpack-fuse load` against the HIPK host program of the C tests.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::c_api::build_host;
use crate::support::cc::Lang;
use crate::support::layout::padded;

fn kpack_fuse(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kpack-fuse"));
    cmd.args(args);
    for var in [
        "ROCM_KPACK_PATH",
        "ROCM_KPACK_PATH_PREFIX",
        "ROCM_KPACK_DISABLE",
        "ROCM_KPACK_DEBUG",
    ] {
        cmd.env_remove(var);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

fn host() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let prefix = std::fs::canonicalize(tmp.path()).unwrap();
    let exe = build_host(&prefix, Lang::C);
    (tmp, prefix, exe)
}

fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn archive(prefix: &Path, target: &str) -> String {
    prefix
        .join(format!(".kpack/hostapp_{target}.kpack"))
        .display()
        .to_string()
}

#[test]
fn resolve_shows_every_step_and_the_pick() {
    let (_tmp, prefix, exe) = host();
    let out = kpack_fuse(
        &[
            "resolve",
            exe.to_str().unwrap(),
            "--gpu",
            "amdgcn-amd-amdhsa--gfx90a:xnack+",
        ],
        &[],
    );
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    for line in [
        "kernel_name:  bin/hostapp".to_string(),
        "search path:  ../.kpack/hostapp_@GFXARCH@.kpack".into(),
        "wrapper 0:    HIPK version 1 co 0".into(),
        "wrapper 1:    HIPK version 1 co 1".into(),
        "arch list:    amdgcn-amd-amdhsa--gfx90a:xnack+".into(),
        "code object 0 (key bin/hostapp#0):".into(),
        format!(
            "  path    {}   (from {})",
            archive(&prefix, "gfx90a:xnack+"),
            archive(&prefix, "@GFXARCH@")
        ),
        format!(
            "  open    {}   gfx_arches [gfx90a:xnack+]",
            archive(&prefix, "gfx90a:xnack+")
        ),
        "  arch    amdgcn-amd-amdhsa--gfx90a:xnack+: targets gfx90a:xnack+, gfx90a".into(),
        format!(
            "  => gfx90a:xnack+ from {} (32 bytes)",
            archive(&prefix, "gfx90a:xnack+")
        ),
        "code object 1 (key bin/hostapp#1):".into(),
        format!(
            "    try   gfx90a:xnack+ in {}",
            archive(&prefix, "gfx90a:xnack+")
        ),
        format!("  => gfx90a from {} (32 bytes)", archive(&prefix, "gfx90a")),
    ] {
        assert!(
            stdout.lines().any(|l| l == line),
            "missing line {line:?} in:\n{stdout}"
        );
    }
    // The second code object misses in the xnack+ archive first, then falls through.
    let co1 = stdout.split("code object 1").nth(1).unwrap();
    let miss = co1.find("  miss  ").expect(co1);
    let found = co1
        .find(&format!("try   gfx90a in {}", archive(&prefix, "gfx90a")))
        .unwrap();
    assert!(miss < found, "{co1}");
}

#[test]
fn resolve_json_and_generic_fallback() {
    let (_tmp, prefix, exe) = host();
    let out = kpack_fuse(
        &[
            "resolve",
            exe.to_str().unwrap(),
            "--gpu",
            "gfx906:xnack-",
            "--json",
        ],
        &[],
    );
    let (stdout, stderr) = text(&out);
    // co 1 exists only for gfx90a, so this device cannot load it: the exit says "not found".
    assert_eq!(out.status.code(), Some(5), "{stdout}{stderr}");
    let doc: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(
        doc["arch_list"],
        serde_json::json!(["gfx906:xnack-", "gfx9-generic:xnack-"])
    );
    assert_eq!(doc["kernel_name"], "bin/hostapp");
    assert_eq!(doc["wrappers"][1]["co_index"], 1);
    let co0 = &doc["code_objects"][0];
    assert_eq!(co0["lookup_key"], "bin/hostapp#0");
    assert_eq!(co0["result"]["ok"], true);
    assert_eq!(co0["result"]["target"], "gfx9-generic");
    assert_eq!(co0["result"]["archive"], archive(&prefix, "gfx9-generic"));
    assert_eq!(co0["result"]["size"], 32);
    let steps: Vec<&str> = co0["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["event"].as_str().unwrap())
        .collect();
    assert_eq!(steps.first(), Some(&"metadata_parsed"));
    assert_eq!(steps.last(), Some(&"loaded"));
    let missing = co0["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["event"] == "archive_missing")
        .expect("an archive_missing step");
    assert_eq!(missing["reason"], "no such file", "{missing}");
    let co1 = &doc["code_objects"][1];
    assert_eq!(co1["result"]["ok"], false);
    assert_eq!(co1["result"]["code"], 5);
    assert_eq!(co1["result"]["error"], "KPACK_ERROR_KERNEL_NOT_FOUND");
}

/// A search path that names nothing is skipped as "no such file", one that names a directory as
/// "not a regular file".
#[test]
fn resolve_says_why_a_search_path_is_skipped() {
    let (_tmp, prefix, exe) = host();
    std::fs::create_dir(archive(&prefix, "gfx9-generic:xnack-")).unwrap();
    let out = kpack_fuse(
        &["resolve", exe.to_str().unwrap(), "--gpu", "gfx906:xnack-"],
        &[],
    );
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(5), "{stdout}{stderr}");
    for line in [
        format!(
            "  skip    {}: no such file",
            archive(&prefix, "gfx906:xnack-")
        ),
        format!(
            "  skip    {}: not a regular file",
            archive(&prefix, "gfx9-generic:xnack-")
        ),
    ] {
        assert!(
            stdout.lines().any(|l| l == line),
            "missing line {line:?} in:\n{stdout}"
        );
    }
}

/// `--arch`, the older spelling of `--gpu`, still adds to the same list.
#[test]
fn resolve_with_exact_list_and_one_code_object() {
    let (_tmp, prefix, exe) = host();
    let out = kpack_fuse(
        &[
            "resolve",
            exe.to_str().unwrap(),
            "--gpu",
            "gfx1100",
            "--arch",
            "gfx90a:xnack-",
            "--co",
            "1",
            "--json",
        ],
        &[],
    );
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    let doc: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(
        doc["arch_list"],
        serde_json::json!(["gfx1100", "gfx90a:xnack-"])
    );
    assert_eq!(doc["code_objects"].as_array().unwrap().len(), 1);
    assert_eq!(doc["code_objects"][0]["result"]["target"], "gfx90a:xnack-");
    assert_eq!(
        doc["code_objects"][0]["result"]["archive"],
        archive(&prefix, "gfx90a:xnack-")
    );
}

#[test]
fn resolve_rejects_non_hipk_files() {
    let out = kpack_fuse(
        &[
            "resolve",
            env!("CARGO_BIN_EXE_kpack-fuse"),
            "--gpu",
            "gfx900",
        ],
        &[],
    );
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(4), "{stderr}");
    assert!(stderr.contains("no .rocm_kpack_ref section"), "{stderr}");
    let out = kpack_fuse(&["resolve", "/nonexistent/binary", "--gpu", "gfx900"], &[]);
    assert_eq!(out.status.code(), Some(3));
}

#[test]
fn load_writes_the_code_object_the_library_would_return() {
    let (tmp, _prefix, exe) = host();
    let dest = tmp.path().join("co1.hsaco");
    let out = kpack_fuse(
        &[
            "load",
            exe.to_str().unwrap(),
            "--gpu",
            "amdgcn-amd-amdhsa--gfx90a:xnack+",
            "--co",
            "1",
            "-o",
            dest.to_str().unwrap(),
        ],
        &[("ROCM_KPACK_DEBUG", "1")],
    );
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert_eq!(std::fs::read(&dest).unwrap(), padded("HOST_CO1_GFX90A"));
    assert!(
        stderr
            .lines()
            .any(|l| l == "kpack: loaded code object: 32 bytes"),
        "{stderr}"
    );
    assert!(
        stderr
            .lines()
            .any(|l| l
                == "kpack: cache created: disabled=0, debug=1, override_paths=0, prefix_paths=0"),
        "{stderr}"
    );

    let missing = tmp.path().join("none.hsaco");
    let out = kpack_fuse(
        &[
            "load",
            exe.to_str().unwrap(),
            "--gpu",
            "gfx1100",
            "--co",
            "0",
            "-o",
            missing.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(5));
    assert!(!missing.exists());
    let out = kpack_fuse(
        &[
            "load",
            exe.to_str().unwrap(),
            "--gpu",
            "gfx90a",
            "--co",
            "0",
            "-o",
            missing.to_str().unwrap(),
        ],
        &[("ROCM_KPACK_DISABLE", "1")],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out).1.contains("disabled"));
}
