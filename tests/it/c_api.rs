//! The C API tested from C: the programs in `tests/c/` are compiled against our header (as C and
//! as C++), linked to the built `librocm_kpack.so`, and run under ASan + UBSan. Their test names
//! are the reference gtest names; every one must report OK.

use std::path::{Path, PathBuf};

use crate::support::cc::{self, Lang};
use crate::support::{cmatrix, layout};

struct Dirs {
    _tmp: tempfile::TempDir,
    assets: PathBuf,
    matrix: PathBuf,
    scenarios: PathBuf,
    root: PathBuf,
}

fn dirs() -> Dirs {
    let tmp = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(tmp.path()).unwrap();
    let assets = root.join("assets");
    let matrix = root.join("matrix");
    let scenarios = root.join("scenarios");
    layout::write_assets(&assets);
    std::fs::create_dir_all(&matrix).unwrap();
    cmatrix::write_error_matrix(&matrix);
    layout::write_scenarios(&scenarios, &assets);
    Dirs {
        _tmp: tmp,
        assets,
        matrix,
        scenarios,
        root,
    }
}

const API_TESTS: &[&str] = &[
    "KpackAPITest.NullArguments",
    "KpackAPITest.FileNotFound",
    "KpackAPITest.CloseNull",
    "KpackAPITest.FreeKernel_Null",
    "KpackAPITest.GetBinary_NullArchive",
    "KpackAPITest.GetBinary_NullBinaryOut",
    "KpackAPITest.GetBinaryCount_NullCount",
    "KpackAPITest.GetArchitectureCount_NullCount",
    "KpackAPITest.GetBinary_IndexOutOfRange",
    "KpackAPITest.GetArchitecture_IndexOutOfRange",
    "KpackAPITest.InvalidArchive_EmptyFile",
    "KpackAPITest.InvalidArchive_WrongMagic",
    "KpackAPITest.InvalidArchive_UnsupportedVersion",
    "KpackAPITest.InvalidArchive_TruncatedHeader",
    "KpackAPITest.InvalidArchive_TOCOffsetBeyondFile",
    "InvalidNumericTocFieldTest.ReturnsParseError",
    "OversizedTocDeclarationTest.ReturnsParseError",
    "ArchiveIntegrationTest.NoOpArchive",
    "ArchiveIntegrationTest.ZstdArchive",
    "ArchiveIntegrationTest.GetBinaryNames",
    "ArchiveIntegrationTest.GetBinaryNames_Zstd",
    "ArchiveIntegrationTest.KernelCacheOverwrite",
    "CApi.NullArgumentsEveryFunction",
    "CApi.ZeroSizeKernel",
    "ErrorMatrix.OpenAndGet",
    "ErrorMatrix.GfxArchesLenient",
    "ErrorMatrix.EmptyArchMapNotABinary",
    "LoaderAPITest.EnumerateArchitectures_ValidArchive",
    "LoaderAPITest.EnumerateArchitectures_EarlyTermination",
    "LoaderAPITest.EnumerateArchitectures_FileNotFound",
];

fn run_api(lang: Lang) {
    let d = dirs();
    let exe = cc::compile("api.c", &d.root.join("api"), lang);
    let out = cc::run(&exe, [&d.assets, &d.matrix], &[]);
    cc::assert_all_passed(&out, API_TESTS);
}

#[test]
fn c_api_archive_suite_as_c() {
    run_api(Lang::C);
}

#[test]
fn c_api_archive_suite_as_cxx() {
    run_api(Lang::Cxx);
}

const LOADER_TESTS: &[&str] = &[
    "LoaderAPITest.DiscoverBinaryPath_NullAddress",
    "LoaderAPITest.DiscoverBinaryPath_NullPathOut",
    "LoaderAPITest.DiscoverBinaryPath_ZeroSize",
    "LoaderAPITest.DiscoverBinaryPath_ValidAddress",
    "LoaderAPITest.DiscoverBinaryPath_BufferTooSmall",
    "CApi.DiscoverBinaryPath_Unmapped",
    "LoaderAPITest.CacheCreate_Success",
    "LoaderAPITest.CacheCreate_NullPointer",
    "LoaderAPITest.CacheDestroy_Null",
    "LoaderAPITest.CacheCreate_ResolvesEnvVars",
    "LoaderAPITest.LoadCodeObject_NullCache",
    "LoaderAPITest.LoadCodeObject_NullMetadata",
    "LoaderAPITest.LoadCodeObject_NullBinaryPath",
    "LoaderAPITest.LoadCodeObject_NullArchList",
    "LoaderAPITest.LoadCodeObject_ZeroArchCount",
    "LoaderAPITest.LoadCodeObject_NullCodeObjectOut",
    "LoaderAPITest.LoadCodeObject_NullSizeOut",
    "LoaderAPITest.LoadCodeObject_InvalidMetadata",
    "LoaderAPITest.FreeCodeObject_Null",
    "LoaderAPITest.EnumerateArchitectures_NullPath",
    "LoaderAPITest.EnumerateArchitectures_NullCallback",
    "LoaderAPITest.LoadCodeObject_DisabledViaEnv",
    "LoaderAPITest.LoadCodeObject_FromNoopArchive",
    "LoaderAPITest.LoadCodeObject_FromZstdArchive",
    "LoaderAPITest.LoadCodeObject_ArchitecturePriority",
    "LoaderAPITest.LoadCodeObject_ArchNotFound",
    "LoaderAPITest.LoadCodeObject_ArchiveNotFound",
    "LoaderAPITest.LoadCodeObject_EnvPathOverride",
    "LoaderAPITest.LoadCodeObject_TargetTripleStripping",
    "LoaderAPITest.LoadCodeObject_ArchNotInArchive",
    "LoaderAPITest.LoadCodeObject_KernelNotFound",
    "LoaderAPITest.LoadCodeObject_FallsThroughToNextArchiveOnKernelNotFound",
    "LoaderAPITest.LoadCodeObject_ArchiveFileNotFound",
    "LoaderAPITest.LoadCodeObject_MissingKernelName",
    "LoaderAPITest.LoadCodeObject_MissingSearchPaths",
    "LoaderAPITest.LoadCodeObject_EmptySearchPaths",
    "LoaderAPITest.LoadCodeObject_WrongTypeKernelName",
    "LoaderAPITest.LoadCodeObject_WrongTypeSearchPaths",
    "LoaderAPITest.LoadCodeObject_NotAMap",
    "LoaderAPITest.EnvPath_EmptyComponents",
    "LoaderAPITest.EnvPath_TrailingColon",
    "LoaderAPITest.EnvDisable_WithZero",
    "LoaderAPITest.EnvDisable_WithEmpty",
    "LoaderAPITest.EnvPathPrefix_WithOverride",
    "LoaderMatrix.BareArchive",
    "LoaderMatrix.XnackArchiveWins",
    "LoaderMatrix.FallsThroughToBareArchive",
    "LoaderMatrix.FallsThroughToGenericArch",
    "LoaderMatrix.CodeObjectNowhere",
    "LoaderMatrix.NoFileForArch",
    "LoaderMatrix.XnackMinusUsesBare",
    "LoaderMatrix.ArchOnlyInToc",
    "LoaderMatrix.KeyMissingForListedArch",
    "LoaderMatrix.CorruptArchiveSkipped",
    "LoaderMatrix.ArchListOrder",
    "LoaderMatrix.NullArchEntries",
    "LoaderMatrix.AbsoluteAndSymlinkedPaths",
    "LoaderMatrix.EnvPathVariants",
    "LoaderMatrix.DisableValues",
    "LoaderMatrix.MetadataVariants",
    "LoaderMatrix.OnlyFirstTokenReplaced",
    "LoaderMatrix.EmptyAndBarePrefixArch",
    "CApi.BinaryPathEndingInSlash",
    "CApi.MetadataRepeatedKeysFirstWins",
    "CApi.PinsRefuseUnpinnedArchive",
];

fn run_loader(lang: Lang) {
    let d = dirs();
    let exe = cc::compile("loader.c", &d.root.join("loader"), lang);
    let out = cc::run(&exe, [&d.assets, &d.scenarios], &[]);
    cc::assert_all_passed(&out, LOADER_TESTS);
    // CacheCreate_ResolvesEnvVars turns on ROCM_KPACK_DEBUG for one cache: the creation line
    // shows the split counts, and the override's two paths are the only ones tried.
    let stderr = String::from_utf8_lossy(&out.stderr);
    let section = stderr.split("== end of ResolvesEnvVars ==").next().unwrap();
    let lines: Vec<&str> = section
        .lines()
        .filter(|l| l.starts_with("kpack: "))
        .collect();
    assert_eq!(
        lines,
        [
            "kpack: cache created: disabled=0, debug=1, override_paths=2, prefix_paths=1",
            "kpack: parsed HIPK metadata: kernel_name='lib/libtest.so', co_index=0, lookup_key='lib/libtest.so#0', 1 search paths",
            "kpack: using ROCM_KPACK_PATH override: 2 paths",
            "kpack: archive not found: /test/path1",
            "kpack: archive not found: /test/path2",
            "kpack: no valid archives found in 2 kpack paths",
        ],
        "{stderr}"
    );
    // No other test enabled debug output.
    assert_eq!(stderr.matches("kpack: ").count(), lines.len(), "{stderr}");
}

#[test]
fn c_api_loader_suite_as_c() {
    run_loader(Lang::C);
}

#[test]
fn c_api_loader_suite_as_cxx() {
    run_loader(Lang::Cxx);
}

/// Splits the debug log at the `== phase NAME ==` markers and counts archive opens per phase.
fn opens_per_phase(stderr: &str) -> Vec<(String, Vec<String>)> {
    let mut phases: Vec<(String, Vec<String>)> = Vec::new();
    for line in stderr.lines() {
        if let Some(name) = line
            .strip_prefix("== phase ")
            .and_then(|l| l.strip_suffix(" =="))
        {
            phases.push((name.to_owned(), Vec::new()));
        } else if let Some(path) = line.strip_prefix("kpack: opened and cached archive: ") {
            phases
                .last_mut()
                .expect("open before any phase")
                .1
                .push(path.to_owned());
        }
    }
    phases
}

#[test]
fn c_api_threads_open_each_archive_once() {
    let d = dirs();
    let exe = cc::compile("threads.c", &d.root.join("threads"), Lang::C);
    let out = cc::run(
        &exe,
        [&d.assets, &d.scenarios],
        &[("ROCM_KPACK_DEBUG", "1")],
    );
    cc::assert_all_passed(
        &out,
        &[
            "LoaderAPITest.CacheReusesArchives",
            "LoaderAPITest.LoadCodeObject_CacheReusesArchive",
            "LoaderAPITest.ThreadSafety_ConcurrentLoadCodeObject",
            "LoaderAPITest.ThreadSafety_ConcurrentArchiveCaching",
            "ThreadSafety.ConcurrentLoadsAcrossArchives",
            "ArchiveIntegrationTest.ThreadSafety_ConcurrentGetKernel",
        ],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    let noop = d.assets.join("test_noop.kpack").display().to_string();
    let multi = d.scenarios.join("multi/.kpack");
    let mut want_multi: Vec<String> = [
        "foo_gfx942:xnack+.kpack",
        "foo_gfx942.kpack",
        "foo_gfx9-4-generic.kpack",
    ]
    .iter()
    .map(|f| multi.join(f).display().to_string())
    .collect();
    want_multi.sort();
    let phases = opens_per_phase(&stderr);
    let names: Vec<&str> = phases.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "fresh",
            "two_loads",
            "concurrent_loads",
            "concurrent_caching",
            "concurrent_multi",
            "concurrent_gets",
            "end"
        ]
    );
    for (name, mut opened) in phases {
        opened.sort();
        let want: Vec<String> = match name.as_str() {
            "two_loads" | "concurrent_loads" | "concurrent_caching" => vec![noop.clone()],
            "concurrent_multi" => want_multi.clone(),
            _ => Vec::new(),
        };
        assert_eq!(opened, want, "phase {name}");
    }
}

#[test]
fn c_api_threads_as_cxx() {
    let d = dirs();
    let exe = cc::compile("threads.c", &d.root.join("threads"), Lang::Cxx);
    let out = cc::run(&exe, [&d.assets, &d.scenarios], &[]);
    cc::assert_all_passed(
        &out,
        &["LoaderAPITest.ThreadSafety_ConcurrentLoadCodeObject"],
    );
}

/// Builds the HIPK host program into `prefix/bin/hostapp` beside its archives.
pub fn build_host(prefix: &Path, lang: Lang) -> PathBuf {
    layout::write_host_archives(prefix);
    std::fs::create_dir_all(prefix.join("bin")).unwrap();
    cc::compile("hipk_host.c", &prefix.join("bin/hostapp"), lang)
}

#[test]
fn c_api_hipk_host_end_to_end() {
    for lang in [Lang::C, Lang::Cxx] {
        let tmp = tempfile::tempdir().unwrap();
        let prefix = std::fs::canonicalize(tmp.path()).unwrap();
        let exe = build_host(&prefix, lang);
        let out = cc::run(&exe, std::iter::empty::<&str>(), &[]);
        cc::assert_all_passed(
            &out,
            &[
                "HipkHost.DiscoversOwnPath",
                "HipkHost.XnackArchiveFirst",
                "HipkHost.FallsBackToBareArchive",
                "HipkHost.GenericArchive",
                "HipkHost.Misses",
            ],
        );
    }
}

/// The header on its own: it must compile first in a translation unit, strictly, in C99, C11 and
/// C++ (the reference header needs `<stdbool.h>` included before it).
#[test]
fn c_api_header_is_self_contained() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("only_header.c");
    std::fs::write(
        &src,
        "#include <rocm_kpack/kpack.h>\n\
         static bool cb(const char* a, void* u) { (void)a; (void)u; return false; }\n\
         int main(void) { kpack_arch_callback_t f = cb; kpack_error_t e = KPACK_ERROR_ARCH_NOT_FOUND;\n\
         kpack_compression_scheme_t s = KPACK_COMPRESSION_ZSTD_PER_KERNEL;\n\
         return (f != 0 && e == 14 && s == 1 && KPACK_CURRENT_VERSION == 1 && KPACK_MAGIC_SIZE == 4 &&\n\
                 KPACK_MAGIC[0] == 'K') ? 0 : 1; }\n",
    )
    .unwrap();
    for (compiler, std) in [
        ("cc", "-std=c99"),
        ("cc", "-std=c11"),
        ("c++", "-std=c++11"),
        ("c++", "-std=c++17"),
    ] {
        let mut cmd = std::process::Command::new(compiler);
        if compiler == "c++" {
            cmd.args(["-x", "c++"]);
        }
        let out = cmd
            .args([
                std,
                "-Wall",
                "-Wextra",
                "-Werror",
                "-pedantic-errors",
                "-fsyntax-only",
                "-I",
            ])
            .arg(cc::manifest_dir().join("include"))
            .arg(&src)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{compiler} {std}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// The archive and loader suites once more under valgrind's memcheck, which also sees the
/// library's own (uninstrumented) reads and writes: any error or definite leak fails the run.
#[test]
fn c_api_suites_under_valgrind() {
    let d = dirs();
    for (source, args, names) in [
        ("api.c", [&d.assets, &d.matrix], API_TESTS),
        ("loader.c", [&d.assets, &d.scenarios], LOADER_TESTS),
    ] {
        let exe = cc::compile_plain(source, &d.root.join(format!("{source}.plain")));
        let mut full: Vec<std::ffi::OsString> = vec![
            "--quiet".into(),
            "--error-exitcode=99".into(),
            "--leak-check=full".into(),
            "--errors-for-leak-kinds=definite".into(),
            exe.into_os_string(),
        ];
        full.extend(args.iter().map(|p| p.as_os_str().to_owned()));
        let out = cc::run(Path::new("valgrind"), &full, &[]);
        cc::assert_all_passed(&out, names);
    }
}
