//! `scripts/install.sh` into a temporary prefix (with the mount helper link in a temporary sbin
//! directory), then: the program and its man pages, C consumers built the documented ways
//! (`pkg-config --cflags --libs rocm_kpack` against the shared library, `pkg-config --static`
//! against the static one, CMake's `find_package(rocm-kpack)` with `rocm::rocm_kpack` and
//! `rocm::rocm_kpack_static`). Finally `--uninstall` must leave nothing behind, except the
//! directories that were there before the install. Installed binaries carry no debug information;
//! it is kept next to the build output. (The size limits of a release install are checked by
//! scripts/test.sh, which builds one; this crate's tests run from a debug build.)

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::support::{cc, fixture};

fn sh(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The profile directory holding the program and both libraries.
fn build_dir() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_kpack-fuse"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Installs into `prefix`, with the helper link into `prefix/../sbin`.
fn install(prefix: &Path, extra: &[&str]) -> String {
    sh(Command::new(cc::manifest_dir().join("scripts/install.sh"))
        .arg("--prefix")
        .arg(prefix)
        .arg("--from")
        .arg(build_dir())
        .arg("--sbindir")
        .arg(prefix.parent().unwrap().join("sbin"))
        .args(extra))
}

const EXPECTED_RUN: &str = "arches: gfx900 gfx906\nkernel: 119 bytes, starts with KERNEL1_\n";

fn run_consumer(exe: &Path) {
    let out = sh(Command::new(exe)
        .arg(fixture("test_noop.kpack"))
        .args(["lib/libtest.so#0", "gfx900"]));
    assert_eq!(out, EXPECTED_RUN);
}

fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let p = entry.unwrap().path();
        if p.is_dir() && !p.is_symlink() {
            out.extend(files_under(&p));
        }
        out.push(p);
    }
    out.sort();
    out
}

#[test]
fn install_then_build_with_pkg_config_and_cmake_then_uninstall() {
    let tmp = tempfile::tempdir().unwrap();
    let prefix = tmp.path().join("prefix");
    install(&prefix, &[]);
    let lib = prefix.join("lib");
    assert_eq!(
        std::fs::read_link(lib.join("librocm_kpack.so.0")).unwrap(),
        Path::new("librocm_kpack.so.0.1.0")
    );
    assert_eq!(
        std::fs::read_link(lib.join("librocm_kpack.so")).unwrap(),
        Path::new("librocm_kpack.so.0")
    );
    for f in [
        "lib/librocm_kpack.a",
        "include/rocm_kpack/kpack.h",
        "include/rocm_kpack/kpack_types.h",
        "include/rocm_kpack/kpack_export.h",
    ] {
        assert!(prefix.join(f).is_file(), "{f}");
    }

    // The program, its version, the helper link outside the prefix, and one man page per command.
    let version = sh(Command::new(prefix.join("bin/kpack-fuse")).arg("--version"));
    assert_eq!(
        version,
        concat!("kpack-fuse ", env!("CARGO_PKG_VERSION"), "\n")
    );
    let sbin = tmp.path().join("sbin");
    assert_eq!(
        std::fs::read_link(sbin.join("mount.kpack-fuse")).unwrap(),
        prefix.join("bin/kpack-fuse")
    );
    let man1 = prefix.join("share/man/man1");
    let mut pages: Vec<String> = std::fs::read_dir(&man1)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    pages.sort();
    let mut want: Vec<String> = [
        "cat", "extract", "list", "load", "mount", "pack", "push", "resolve", "split", "stats",
        "unmount", "verify",
    ]
    .iter()
    .map(|c| format!("kpack-fuse-{c}.1"))
    .collect();
    want.push("kpack-fuse.1".into());
    want.sort();
    assert_eq!(pages, want);
    let page = std::fs::read_to_string(man1.join("kpack-fuse-mount.1")).unwrap();
    assert!(page.contains(".TH kpack-fuse-mount 1 "), "{page}");
    if Path::new("/usr/bin/man").exists() {
        // man(1) renders the page.
        let out = Command::new("man")
            .arg(man1.join("kpack-fuse-mount.1"))
            .env("MANWIDTH", "100")
            .output()
            .unwrap();
        assert!(out.status.success());
        assert!(String::from_utf8_lossy(&out.stdout).contains("--disk-cache-size"));
    }

    // pkg-config
    let flags = sh(Command::new("pkg-config")
        .env("PKG_CONFIG_PATH", lib.join("pkgconfig"))
        .args(["--cflags", "--libs", "rocm_kpack"]));
    assert_eq!(
        flags.trim(),
        format!(
            "-I{}/include -L{}/lib -lrocm_kpack",
            prefix.display(),
            prefix.display()
        )
    );
    let version = sh(Command::new("pkg-config")
        .env("PKG_CONFIG_PATH", lib.join("pkgconfig"))
        .args(["--modversion", "rocm_kpack"]));
    assert_eq!(version.trim(), env!("CARGO_PKG_VERSION"));
    let exe = tmp.path().join("consumer_pc");
    sh(Command::new("cc")
        .args(["-std=c99", "-Wall", "-Wextra", "-Werror"])
        .arg(cc::manifest_dir().join("tests/c/consumer.c"))
        .arg("-o")
        .arg(&exe)
        .args(flags.split_whitespace())
        .arg(format!("-Wl,-rpath,{}", lib.display())));
    run_consumer(&exe);
    // The program found the library through its SONAME in the prefix.
    let needed = sh(Command::new("readelf").arg("-d").arg(&exe));
    assert!(
        needed.contains("Shared library: [librocm_kpack.so.0]"),
        "{needed}"
    );

    // pkg-config --static: Libs.private adds what the static archive needs; -Bstatic picks the .a
    // for librocm_kpack only (the prefix has both).
    let static_flags = sh(Command::new("pkg-config")
        .env("PKG_CONFIG_PATH", lib.join("pkgconfig"))
        .args(["--static", "--libs", "rocm_kpack"]));
    assert_eq!(
        static_flags.trim(),
        format!(
            "-L{}/lib -lrocm_kpack -lgcc_s -lutil -lrt -lpthread -lm -ldl -lc",
            prefix.display()
        )
    );
    let cflags = sh(Command::new("pkg-config")
        .env("PKG_CONFIG_PATH", lib.join("pkgconfig"))
        .args(["--cflags", "rocm_kpack"]));
    let exe = tmp.path().join("consumer_pc_static");
    sh(Command::new("cc")
        .args(["-std=c99", "-Wall", "-Wextra", "-Werror"])
        .args(cflags.split_whitespace())
        .arg(cc::manifest_dir().join("tests/c/consumer.c"))
        .arg("-o")
        .arg(&exe)
        .args(
            static_flags
                .split_whitespace()
                .map(|f| {
                    if f == "-lrocm_kpack" {
                        "-Wl,-Bstatic -lrocm_kpack -Wl,-Bdynamic".to_owned()
                    } else {
                        f.to_owned()
                    }
                })
                .collect::<Vec<_>>()
                .join(" ")
                .split_whitespace(),
        ));
    run_consumer(&exe);
    let needed = sh(Command::new("readelf").arg("-d").arg(&exe));
    assert!(
        !needed.contains("librocm_kpack"),
        "static consumer still needs the shared library:\n{needed}"
    );

    // CMake
    let project = tmp.path().join("cmake-project");
    std::fs::create_dir_all(&project).unwrap();
    std::fs::copy(
        cc::manifest_dir().join("tests/c/consumer.c"),
        project.join("consumer.c"),
    )
    .unwrap();
    std::fs::write(
        project.join("CMakeLists.txt"),
        "cmake_minimum_required(VERSION 3.16)\n\
         project(consumer C)\n\
         find_package(rocm-kpack 0.1 REQUIRED)\n\
         add_executable(consumer_shared consumer.c)\n\
         target_link_libraries(consumer_shared PRIVATE rocm::rocm_kpack)\n\
         add_executable(consumer_static consumer.c)\n\
         target_link_libraries(consumer_static PRIVATE rocm::rocm_kpack_static)\n",
    )
    .unwrap();
    let build = tmp.path().join("cmake-build");
    sh(Command::new("cmake")
        .arg("-S")
        .arg(&project)
        .arg("-B")
        .arg(&build)
        .arg(format!("-DCMAKE_PREFIX_PATH={}", prefix.display())));
    sh(Command::new("cmake").arg("--build").arg(&build));
    run_consumer(&build.join("consumer_shared"));
    run_consumer(&build.join("consumer_static"));
    let needed = sh(Command::new("readelf")
        .arg("-d")
        .arg(build.join("consumer_static")));
    assert!(
        !needed.contains("librocm_kpack"),
        "static consumer still needs the shared library:\n{needed}"
    );

    // A version the package cannot satisfy is refused.
    std::fs::write(project.join("CMakeLists.txt"), "cmake_minimum_required(VERSION 3.16)\nproject(c C)\nfind_package(rocm-kpack 0.2 REQUIRED)\n").unwrap();
    let refused = Command::new("cmake")
        .arg("-S")
        .arg(&project)
        .arg("-B")
        .arg(tmp.path().join("cmake-build-2"))
        .arg(format!("-DCMAKE_PREFIX_PATH={}", prefix.display()))
        .output()
        .unwrap();
    assert!(!refused.status.success());

    // Re-installing is idempotent; uninstalling removes every file and the directories it made,
    // but not files it did not install (nor the directory holding them).
    std::fs::create_dir_all(prefix.join("lib/other")).unwrap();
    std::fs::write(prefix.join("lib/other/keep.txt"), b"not ours").unwrap();
    install(&prefix, &[]);
    install(&prefix, &["--uninstall"]);
    assert_eq!(
        files_under(&prefix),
        [
            prefix.join("lib"),
            prefix.join("lib/other"),
            prefix.join("lib/other/keep.txt")
        ]
    );
    // The helper link is gone, and so is its directory, which the install created.
    assert!(!sbin.exists());
}

/// Section names of an ELF file, from `readelf -SW`.
fn sections(path: &Path) -> Vec<String> {
    let out = sh(Command::new("readelf").arg("-SW").arg(path));
    out.lines()
        .filter_map(|l| {
            let l = l.trim_start();
            let rest = l.strip_prefix('[')?;
            let (_, rest) = rest.split_once(']')?;
            rest.split_whitespace().next().map(str::to_owned)
        })
        .collect()
}

#[test]
fn installed_binaries_have_no_debug_info_which_stays_next_to_the_build() {
    let tmp = tempfile::tempdir().unwrap();
    let prefix = tmp.path().join("prefix");
    install(&prefix, &["--sbindir", "none"]);
    for (installed, built) in [
        ("bin/kpack-fuse", "kpack-fuse"),
        ("lib/librocm_kpack.so.0.1.0", "librocm_kpack.so"),
    ] {
        let names = sections(&prefix.join(installed));
        // (.debug_gdb_scripts is loaded data, gdb's pretty-printer list, not debug info.)
        assert!(
            !names
                .iter()
                .any(|n| n.starts_with(".debug_") && n != ".debug_gdb_scripts"),
            "{installed}: {names:?}"
        );
        assert!(
            !names.iter().any(|n| n == ".symtab"),
            "{installed}: {names:?}"
        );
        // The installed file names its debug file, which holds what was removed.
        let link = sh(Command::new("readelf")
            .args(["-p", ".gnu_debuglink"])
            .arg(prefix.join(installed)));
        assert!(link.contains(&format!("  {built}.debug\n")), "{link}");
        let debug = build_dir().join(format!("{built}.debug"));
        assert!(
            sections(&debug).iter().any(|n| n == ".debug_info"),
            "{}",
            debug.display()
        );
    }
    // The static archive keeps its symbols (consumers link against them) but not debug info.
    let ar = sh(Command::new("readelf")
        .arg("-SW")
        .arg(prefix.join("lib/librocm_kpack.a")));
    assert!(!ar.contains(".debug_info"));
    assert!(ar.contains(".symtab"));
    // Still a working program.
    let version = sh(Command::new(prefix.join("bin/kpack-fuse")).arg("--version"));
    assert_eq!(
        version,
        concat!("kpack-fuse ", env!("CARGO_PKG_VERSION"), "\n")
    );
}

/// Debian's base-files ships /usr/local/include and /usr/local/share/man empty: the install uses
/// them, and the uninstall must leave them (and only them) as they were.
#[test]
fn uninstall_keeps_directories_that_were_there_before() {
    let tmp = tempfile::tempdir().unwrap();
    let prefix = tmp.path().join("usr/local");
    for d in ["include", "share/man", "lib/x86_64-linux-gnu"] {
        std::fs::create_dir_all(prefix.join(d)).unwrap();
    }
    let before = files_under(&prefix);
    install(&prefix, &["--sbindir", "none"]);
    let manifest =
        std::fs::read_to_string(prefix.join("share/rocm-kpack/install-manifest.txt")).unwrap();
    let dirs: Vec<&str> = manifest.lines().filter(|l| l.ends_with('/')).collect();
    assert_eq!(
        dirs,
        [
            "bin/",
            "include/rocm_kpack/",
            "lib/cmake/",
            "lib/cmake/rocm-kpack/",
            "lib/pkgconfig/",
            "share/man/man1/",
            "share/rocm-kpack/",
        ]
    );
    install(&prefix, &["--uninstall"]);
    assert_eq!(files_under(&prefix), before);
    assert_eq!(
        before,
        [
            prefix.join("include"),
            prefix.join("lib"),
            prefix.join("lib/x86_64-linux-gnu"),
            prefix.join("share"),
            prefix.join("share/man"),
        ]
    );
}

#[test]
fn help_prints_the_header_comment_only() {
    let out = sh(Command::new(cc::manifest_dir().join("scripts/install.sh")).arg("--help"));
    assert!(
        out.starts_with("Installs kpack-fuse into a prefix: the kpack-fuse program"),
        "{out}"
    );
    assert!(out.contains("\nOptions:\n"), "{out}");
    assert!(!out.contains("set -euo"), "{out}");
    assert!(out.ends_with("the\nmanifest covers them all.\n"), "{out}");
}

#[test]
fn uninstall_without_manifest_fails() {
    let tmp = tempfile::tempdir().unwrap();
    let out = Command::new(cc::manifest_dir().join("scripts/install.sh"))
        .arg("--prefix")
        .arg(tmp.path())
        .arg("--uninstall")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no manifest"));
}

/// The defaults (prefix /usr/local, helper in /sbin), seen through DESTDIR: files land under
/// DESTDIR but refer to the real paths, and an uninstall with the same DESTDIR removes them all.
#[test]
fn default_prefix_and_sbindir_under_destdir() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    let script = cc::manifest_dir().join("scripts/install.sh");
    let said = sh(Command::new(&script)
        .arg("--from")
        .arg(build_dir())
        .env("DESTDIR", &root));
    let r = root.display();
    assert_eq!(
        said,
        format!(
            "installed kpack-fuse and librocm_kpack {} into {r}/usr/local (staged under \
             DESTDIR={r} for /usr/local) (helper: {r}/sbin/mount.kpack-fuse; manifest: \
             {r}/usr/local/share/rocm-kpack/install-manifest.txt)\n",
            env!("CARGO_PKG_VERSION")
        )
    );
    // The staged .pc file works in place once pkg-config takes the prefix from its location.
    let flags = sh(Command::new("pkg-config")
        .args(["--define-prefix", "--cflags", "--libs", "rocm_kpack"])
        .env("PKG_CONFIG_PATH", root.join("usr/local/lib/pkgconfig")));
    // (pkg-config ends its line with a space before the newline.)
    assert_eq!(
        flags.trim_end(),
        format!("-I{r}/usr/local/include -L{r}/usr/local/lib -lrocm_kpack")
    );
    assert_eq!(
        std::fs::read_link(root.join("sbin/mount.kpack-fuse")).unwrap(),
        Path::new("/usr/local/bin/kpack-fuse")
    );
    assert!(root.join("usr/local/bin/kpack-fuse").is_file());
    assert!(root.join("usr/local/share/man/man1/kpack-fuse.1").is_file());
    let pc = std::fs::read_to_string(root.join("usr/local/lib/pkgconfig/rocm_kpack.pc")).unwrap();
    assert!(pc.starts_with("# pkg-config file for librocm_kpack (filled in by scripts/install.sh).\nprefix=/usr/local\n"), "{pc}");
    assert!(
        pc.contains("\nLibs.private: -lgcc_s -lutil -lrt -lpthread -lm -ldl -lc\n"),
        "{pc}"
    );
    let manifest =
        std::fs::read_to_string(root.join("usr/local/share/rocm-kpack/install-manifest.txt"))
            .unwrap();
    assert!(
        manifest.lines().any(|l| l == "/sbin/mount.kpack-fuse"),
        "{manifest}"
    );
    assert!(
        manifest.lines().any(|l| l == "bin/kpack-fuse"),
        "{manifest}"
    );
    sh(Command::new(&script)
        .arg("--uninstall")
        .env("DESTDIR", &root));
    // Only the prefix (never removed) and what is above it stay; the sbin directory, which the
    // install created under DESTDIR, is gone.
    assert_eq!(
        files_under(&root),
        [root.join("usr"), root.join("usr/local")]
    );
}
