//! The binary interface seen from outside: what the shared library exports, its SONAME, and that
//! the header's error values are the ones the Rust side returns.

use std::collections::BTreeSet;
use std::process::Command;

use rocm_kpack::ErrorKind;

use crate::support::cc;

fn header(name: &str) -> String {
    std::fs::read_to_string(cc::manifest_dir().join("include/rocm_kpack").join(name)).unwrap()
}

/// The function names declared with `KPACK_API` in the headers of `include/rocm_kpack/` (all
/// in kpack.h; kpack_export.h defines the macro, which the preprocessor lines and comments
/// skipped here mention).
pub(crate) fn header_functions() -> BTreeSet<String> {
    let dir = cc::manifest_dir().join("include/rocm_kpack");
    let mut text = String::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "h") {
            text += &declarations(&std::fs::read_to_string(&path).unwrap());
        }
    }
    text.split("KPACK_API")
        .skip(1)
        .map(|decl| {
            let before_paren = &decl[..decl.find('(').expect("declaration has a parameter list")];
            before_paren
                .rsplit(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .find(|w| !w.is_empty())
                .unwrap()
                .to_owned()
        })
        .collect()
}

#[test]
fn header_declares_the_fourteen_functions() {
    let want: BTreeSet<String> = [
        "kpack_open",
        "kpack_close",
        "kpack_get_architecture_count",
        "kpack_get_architecture",
        "kpack_get_binary_count",
        "kpack_get_binary",
        "kpack_get_kernel",
        "kpack_free_kernel",
        "kpack_cache_create",
        "kpack_cache_destroy",
        "kpack_discover_binary_path",
        "kpack_load_code_object",
        "kpack_free_code_object",
        "kpack_enumerate_architectures",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    assert_eq!(header_functions(), want);
}

/// A header's text without its comments and preprocessor lines.
fn declarations(header: &str) -> String {
    let mut out = String::new();
    let mut rest = header;
    while let Some(start) = rest.find("/*") {
        out += &rest[..start];
        let end = rest[start..].find("*/").expect("comment is closed");
        rest = &rest[start + end + 2..];
    }
    out += rest;
    out.lines()
        .map(|l| l.split("//").next().unwrap())
        .filter(|l| !l.trim_start().starts_with('#'))
        .map(|l| format!("{l}\n"))
        .collect()
}

/// The symbols the built `librocm_kpack.so` defines in its dynamic symbol table.
pub(crate) fn shared_library_exports() -> BTreeSet<String> {
    let out = Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(cc::built_library())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2))
        .map(str::to_owned)
        .collect()
}

#[test]
fn shared_library_exports_exactly_the_header_functions() {
    assert_eq!(shared_library_exports(), header_functions());
}

#[test]
fn shared_library_has_the_soname_and_its_link() {
    let so = cc::built_library();
    let out = Command::new("readelf").arg("-d").arg(&so).output().unwrap();
    let dynamic = String::from_utf8_lossy(&out.stdout);
    assert!(
        dynamic.contains("Library soname: [librocm_kpack.so.0]"),
        "{dynamic}"
    );
    // build.rs leaves the SONAME link in the profile directory (target/<profile>/).
    let profile_dir = std::env::current_exe()
        .unwrap()
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf();
    let link = profile_dir.join("librocm_kpack.so.0");
    assert_eq!(
        std::fs::read_link(&link).unwrap(),
        std::path::Path::new("librocm_kpack.so")
    );
    assert!(link.exists(), "{} dangles", link.display());
    assert!(profile_dir.join("librocm_kpack.a").exists());
}

/// `(name, value)` of every enumerator in the `kpack_error_t` enum of kpack_types.h.
fn header_error_values() -> Vec<(String, i32)> {
    let text = header("kpack_types.h");
    let start = text.find("typedef enum {").unwrap();
    let end = start + text[start..].find("} kpack_error_t;").unwrap();
    text[start..end]
        .lines()
        .filter_map(|l| {
            let l = l.split("/*").next().unwrap().split("//").next().unwrap();
            let (name, value) = l.split_once('=')?;
            Some((
                name.trim().to_owned(),
                value.trim().trim_end_matches(',').trim().parse().unwrap(),
            ))
        })
        .collect()
}

#[test]
fn header_error_values_match_the_rust_kinds() {
    let kinds = [
        ErrorKind::InvalidArgument,
        ErrorKind::FileNotFound,
        ErrorKind::InvalidFormat,
        ErrorKind::UnsupportedVersion,
        ErrorKind::KernelNotFound,
        ErrorKind::DecompressionFailed,
        ErrorKind::OutOfMemory,
        ErrorKind::NotImplemented,
        ErrorKind::IoError,
        ErrorKind::MsgpackParseFailed,
        ErrorKind::PathDiscoveryFailed,
        ErrorKind::InvalidMetadata,
        ErrorKind::ArchiveNotFound,
        ErrorKind::ArchNotFound,
    ];
    let mut want = vec![("KPACK_SUCCESS".to_owned(), 0)];
    want.extend(kinds.iter().map(|k| (k.name().to_owned(), k.code())));
    assert_eq!(header_error_values(), want);
    // The reference's fixed values, independently of both files above.
    assert_eq!(
        want.iter().map(|(_, v)| *v).collect::<Vec<_>>(),
        (0..=14).collect::<Vec<_>>()
    );
}

#[test]
fn header_constants_match_the_format() {
    let text = header("kpack_types.h");
    assert!(text.contains("#define KPACK_MAGIC \"KPAK\""));
    assert!(text.contains("#define KPACK_MAGIC_SIZE 4"));
    assert!(text.contains(&format!(
        "#define KPACK_CURRENT_VERSION {}",
        rocm_kpack::archive::format::VERSION
    )));
    assert!(text.contains("KPACK_COMPRESSION_NOOP = 0"));
    assert!(text.contains("KPACK_COMPRESSION_ZSTD_PER_KERNEL = 1"));
    let export = header("kpack_export.h");
    for needle in [
        "__declspec(dllexport)",
        "__declspec(dllimport)",
        "ROCM_KPACK_STATIC",
        "ROCM_KPACK_EXPORTS",
        "visibility(\"default\")",
    ] {
        assert!(export.contains(needle), "{needle}");
    }
}

/// `kpack_types.h` is self-contained like the ROCm header: a C and a C++ file that include only
/// it can use `size_t` and `uint32_t` (and compile with -Wall -Wextra -Werror).
#[test]
fn types_header_alone_brings_size_t_and_uint32_t() {
    let dir = tempfile::tempdir().unwrap();
    for lang in [cc::Lang::C, cc::Lang::Cxx] {
        let exe = cc::compile(
            "types_only.c",
            &dir.path().join(format!("types_only_{lang:?}")),
            lang,
        );
        let out = cc::run(&exe, Vec::<&str>::new(), &[]);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{lang:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
