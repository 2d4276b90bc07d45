//! Building and running the C test programs: compile `tests/c/*.c` (as C or as C++) against our
//! header and the freshly built `librocm_kpack.so`, under AddressSanitizer and
//! UndefinedBehaviorSanitizer, then run them.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

/// Which language the C sources are compiled as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lang {
    C,
    Cxx,
}

pub fn manifest_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The built shared library: cargo leaves the cdylib beside the test binary (`deps/`) and in
/// the profile directory.
pub fn built_library() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    for dir in [deps, deps.parent().unwrap()] {
        let so = dir.join("librocm_kpack.so");
        if so.exists() {
            return so;
        }
    }
    panic!("librocm_kpack.so not found near {}", exe.display());
}

/// A directory with `librocm_kpack.so` and the `librocm_kpack.so.0` name its SONAME asks for,
/// both links to the built library, to link the C programs against and to put in their rpath.
/// It lives at a fixed place under the target directory, and the links are replaced atomically,
/// so concurrent test runs can share it and nothing piles up.
pub fn lib_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("clib");
        std::fs::create_dir_all(&dir).unwrap();
        let target = built_library();
        for name in ["librocm_kpack.so", "librocm_kpack.so.0"] {
            let tmp = dir.join(format!(".{name}.{}", std::process::id()));
            let _ = std::fs::remove_file(&tmp);
            std::os::unix::fs::symlink(&target, &tmp).unwrap();
            std::fs::rename(&tmp, dir.join(name)).unwrap();
        }
        dir
    })
}

/// Compiles `tests/c/<source>` into `out` with warnings as errors and both sanitizers.
pub fn compile(source: &str, out: &Path, lang: Lang) -> PathBuf {
    compile_with(
        source,
        out,
        lang,
        &["-fsanitize=address,undefined", "-fno-sanitize-recover=all"],
    )
}

/// Compiles without sanitizers, for running under valgrind (which cannot run ASan binaries).
pub fn compile_plain(source: &str, out: &Path) -> PathBuf {
    compile_with(source, out, Lang::C, &[])
}

fn compile_with(source: &str, out: &Path, lang: Lang, sanitize: &[&str]) -> PathBuf {
    let lib = lib_dir();
    let src = manifest_dir().join("tests/c").join(source);
    let mut cmd = match lang {
        Lang::C => {
            let mut c = Command::new("cc");
            c.arg("-std=c99");
            c
        }
        Lang::Cxx => {
            let mut c = Command::new("c++");
            c.args(["-x", "c++", "-std=c++17"]);
            c
        }
    };
    cmd.args([
        "-Wall",
        "-Wextra",
        "-Werror",
        "-g",
        "-O1",
        "-fno-omit-frame-pointer",
    ])
    .args(sanitize)
    .arg("-I")
    .arg(manifest_dir().join("include"))
    .arg(&src)
    .arg("-o")
    .arg(out);
    if lang == Lang::Cxx {
        // Sources come after `-x c++`; reset it so the library is not read as C++ source.
        cmd.args(["-x", "none"]);
    }
    cmd.arg(format!("-L{}", lib.display()))
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .args(["-lrocm_kpack", "-pthread"]);
    let output = cmd.output().expect("running the C compiler");
    assert!(
        output.status.success(),
        "compiling {source} as {lang:?} failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    out.to_path_buf()
}

/// Runs a test program with the sanitizers set to fail hard and no `ROCM_KPACK_*` variables
/// inherited from the test harness.
pub fn run<I, S>(exe: &Path, args: I, env: &[(&str, &str)]) -> Output
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let mut cmd = Command::new(exe);
    // `cargo test` puts the profile directory on LD_LIBRARY_PATH, which the dynamic loader
    // searches before the programs' RUNPATH. Its `librocm_kpack.so.0` link names the library
    // `cargo build` last copied there, which `cargo test` does not refresh, so without this the
    // programs could run against a stale library. The freshly built one comes first.
    let mut search = std::ffi::OsString::from(lib_dir());
    if let Some(inherited) = std::env::var_os("LD_LIBRARY_PATH") {
        search.push(":");
        search.push(inherited);
    }
    cmd.args(args)
        .env("LD_LIBRARY_PATH", search)
        .env(
            "ASAN_OPTIONS",
            "detect_leaks=1:halt_on_error=1:abort_on_error=0",
        )
        .env("UBSAN_OPTIONS", "halt_on_error=1:print_stacktrace=1");
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
    cmd.output().expect("running a C test program")
}

/// Asserts the program passed, every test it started reported OK, and every name in `expected`
/// was among them. Returns stdout.
pub fn assert_all_passed(output: &Output, expected: &[&str]) -> String {
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "C tests failed ({}):\n{stdout}\n--- stderr ---\n{stderr}",
        output.status
    );
    let started = stdout
        .lines()
        .filter(|l| l.starts_with("[ RUN      ]"))
        .count();
    let passed: Vec<&str> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("[       OK ] "))
        .collect();
    assert_eq!(started, passed.len(), "{stdout}");
    for name in expected {
        assert!(passed.contains(name), "{name} did not pass:\n{stdout}");
    }
    stdout
}
