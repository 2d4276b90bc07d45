//! Mount sources other than one archive: a directory of archives (merge, conflicts, a corrupt
//! member, `--strict`) and HIPK host binaries (a gcc-built one with a `.rocm_kpack_ref` section
//! beside `../.kpack/<name>_<arch>.kpack`, and one rewritten by `split`), with and without
//! `--gpu`. Each mounted tree is compared with a directory of the expected files.

use std::path::{Path, PathBuf};
use std::process::Command;

use rocm_kpack::Compression;
use rocm_kpack::fs::setup::mountinfo;

use super::{pattern, tmp, write_archive};
use crate::support::mount::{Mount, fuse_available};

/// Writes `files` (relative path, bytes) below a fresh `dir`, the mount's expected content.
fn expect_dir(dir: &Path, files: &[(&str, &[u8])]) -> PathBuf {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).unwrap();
    for (rel, bytes) in files {
        let p = dir.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, bytes).unwrap();
    }
    dir.to_path_buf()
}

/// `kpack-fuse mount` in the foreground for a source that must be refused before mounting:
/// exit code, standard error, and a check that nothing was mounted.
fn refused(source: &Path, extra: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String) {
    let mp = tmp();
    let out = Command::new(env!("CARGO_BIN_EXE_kpack-fuse"))
        .arg("mount")
        .arg(source)
        .arg(mp.path())
        .arg("-f")
        .args(extra)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let canonical = mp.path().canonicalize().unwrap();
    assert_eq!(
        mountinfo::mount_at(&canonical).unwrap(),
        None,
        "nothing mounted"
    );
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `b.kpack` and `a.kpack` both have `lib/x.so#0` for gfx900; `a` sorts first and wins.
fn conflicting_dir(dir: &Path) -> (Vec<u8>, Vec<u8>, Vec<u8>, Vec<u8>) {
    let (a900, b900, b90a, ay) = (
        pattern(5000, 1),
        pattern(6000, 2),
        pattern(7000, 3),
        pattern(3000, 4),
    );
    std::fs::create_dir_all(dir).unwrap();
    write_archive(
        &dir.join("b.kpack"),
        Compression::Zstd { level: 3 },
        &[
            ("lib/x.so#0", "gfx900", b900.clone()),
            ("lib/x.so#0", "gfx90a:xnack+", b90a.clone()),
        ],
    );
    write_archive(
        &dir.join("a.kpack"),
        Compression::None,
        &[
            ("lib/x.so#0", "gfx900", a900.clone()),
            ("lib/y.so#0", "gfx1100", ay.clone()),
        ],
    );
    (a900, b900, b90a, ay)
}

#[test]
fn directory_source_merges_in_name_order_skipping_a_corrupt_member() {
    if !fuse_available() {
        return;
    }
    let d = tmp();
    let src = d.path().join("kp");
    let (a900, _b900, b90a, ay) = conflicting_dir(&src);
    // A corrupt member (right magic, broken header), a nested archive (the tree is walked, so
    // it is shown) and a file that is not *.kpack.
    std::fs::write(src.join("c.kpack"), b"KPAK\x01\0\0\0garbage").unwrap();
    std::fs::create_dir(src.join("nested")).unwrap();
    write_archive(
        &src.join("nested/n.kpack"),
        Compression::None,
        &[("n#0", "gfx900", vec![1])],
    );
    write_archive(
        &src.join("z.kpack.bak"),
        Compression::None,
        &[("bak#0", "gfx900", vec![1])],
    );
    let want = expect_dir(
        &d.path().join("want"),
        &[
            ("lib/x.so#0/gfx900.hsaco", &a900),
            ("lib/x.so#0/gfx90a:xnack+.hsaco", &b90a),
            ("lib/y.so#0/gfx1100.hsaco", &ay),
            ("n#0/gfx900.hsaco", &[1]),
        ],
    );
    let m = Mount::start(&src, &["--gpu", "gfx1030"]);
    m.check("tree", want.to_str().unwrap());
    let src = src.canonicalize().unwrap();
    let log = m.daemon_log();
    let conflict = format!(
        "lib/x.so#0 [gfx900] is in both {} and {}; showing the one from {}\n",
        src.join("a.kpack").display(),
        src.join("b.kpack").display(),
        src.join("a.kpack").display()
    );
    assert!(
        log.contains(&conflict),
        "conflict warning naming both files:\n{log}"
    );
    let skipped = format!("skipping {}: ", src.join("c.kpack").display());
    assert!(
        log.contains(&skipped),
        "corrupt member named with the reason:\n{log}"
    );
    assert_eq!(
        mountinfo::mount_at(&m.mountpoint).unwrap().unwrap().source,
        src.display().to_string()
    );
    m.stop();
}

#[test]
fn directory_of_many_archives_raises_the_open_file_limit() {
    if !fuse_available() {
        return;
    }
    let d = tmp();
    let src = d.path().join("many");
    let files = many_archives(&src, 150);
    let refs: Vec<(&str, &[u8])> = files
        .iter()
        .map(|(p, b)| (p.as_str(), b.as_slice()))
        .collect();
    let want = expect_dir(&d.path().join("want"), &refs);
    // A soft limit of 64 descriptors cannot hold 150 archives; the daemon raises it.
    let m = Mount::start_configured(&src, &["--threads", "2"], &|cmd| {
        use std::os::unix::process::CommandExt;
        // SAFETY: only getrlimit/setrlimit between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                let mut lim = libc::rlimit {
                    rlim_cur: 0,
                    rlim_max: 0,
                };
                libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
                lim.rlim_cur = 64;
                if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    });
    m.check("tree", want.to_str().unwrap());
    m.stop();
}

/// `n` archives of one kernel each in `dir`; returns each kernel's path in the mount and bytes.
fn many_archives(dir: &Path, n: u32) -> Vec<(String, Vec<u8>)> {
    std::fs::create_dir(dir).unwrap();
    (0..n)
        .map(|i| {
            let data = pattern(100 + i as usize, i);
            write_archive(
                &dir.join(format!("m{i:03}.kpack")),
                Compression::None,
                &[(&format!("lib/m{i:03}.so#0"), "gfx900", data.clone())],
            );
            (format!("lib/m{i:03}.so#0/gfx900.hsaco"), data)
        })
        .collect()
}

#[test]
fn directory_of_more_archives_than_the_hard_limit_is_refused() {
    let d = tmp();
    let src = d.path().join("many");
    many_archives(&src, 150);
    let mp = tmp();
    // Root may raise its hard limit; without CAP_SYS_RESOURCE (dropped from every set, so that
    // the exec'ed daemon does not regain it) 64 descriptors is all there is.
    let mut cmd = if unsafe { libc::geteuid() } == 0 {
        let mut c = Command::new("setpriv");
        c.args([
            "--inh-caps=-sys_resource",
            "--ambient-caps=-sys_resource",
            "--bounding-set=-sys_resource",
            "--",
        ]);
        c.arg(env!("CARGO_BIN_EXE_kpack-fuse"));
        c
    } else {
        Command::new(env!("CARGO_BIN_EXE_kpack-fuse"))
    };
    cmd.arg("mount")
        .arg(&src)
        .arg(mp.path())
        .args(["-f", "--threads", "2"]);
    {
        use std::os::unix::process::CommandExt;
        // SAFETY: only setrlimit between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                let lim = libc::rlimit {
                    rlim_cur: 64,
                    rlim_max: 64,
                };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    cmd.stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    let mut child = cmd
        .spawn()
        .expect("setpriv (util-linux) runs the daemon without CAP_SYS_RESOURCE");
    // A daemon that mounted after all (`-f`: it stays) is stopped rather than waited for.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = Command::new("umount").arg("-l").arg(mp.path()).status();
            panic!("the mount of 150 archives under a hard limit of 64 was not refused");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    // 150 archives, the daemon's 2 request threads + 16, and 16 for stdio and the like.
    assert!(
        err.ends_with(
            "184 open files are needed but the open-file limit is 64 (raise the hard limit, ulimit -Hn)\n"
        ),
        "{err}"
    );
    assert_eq!(
        mountinfo::mount_at(&mp.path().canonicalize().unwrap()).unwrap(),
        None,
        "nothing mounted"
    );
}

#[test]
fn strict_directory_source_refuses_conflicts_and_corrupt_members() {
    let d = tmp();
    let src = d.path().join("kp");
    conflicting_dir(&src);
    let src = src.canonicalize().unwrap();
    let (code, err) = refused(&src, &["--strict"], &[]);
    assert_eq!(code, Some(4), "{err}");
    // Nothing is mounted, so nothing is "shown": the error names the two archives only.
    assert!(
        err.ends_with(&format!(
            "conflict (--strict): lib/x.so#0 [gfx900] is in both {} and {}\n",
            src.join("a.kpack").display(),
            src.join("b.kpack").display()
        )),
        "{err}"
    );
    // The same through -o.
    let (code, err) = refused(&src, &["-o", "ro,strict"], &[]);
    assert_eq!(code, Some(4), "{err}");

    let lone = d.path().join("lone");
    std::fs::create_dir(&lone).unwrap();
    write_archive(
        &lone.join("a.kpack"),
        Compression::None,
        &[("k#0", "gfx900", vec![1])],
    );
    std::fs::write(lone.join("b.kpack"), b"KPAK\x01\0\0\0garbage").unwrap();
    let (code, err) = refused(&lone, &["--strict"], &[]);
    assert_eq!(code, Some(4), "{err}");
    assert!(
        err.contains(
            &lone
                .canonicalize()
                .unwrap()
                .join("b.kpack")
                .display()
                .to_string()
        ),
        "{err}"
    );

    // Nothing to show at all.
    let empty = d.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let (code, err) = refused(&empty, &[], &[]);
    assert_eq!(code, Some(5), "{err}");
    assert!(err.contains("no *.kpack archive"), "{err}");
}

/// Compiles a shared library whose `.rocm_kpack_ref` section holds `metadata` (when given).
pub(crate) fn hipk_library(path: &Path, metadata: Option<&[u8]>) -> PathBuf {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let body = match metadata {
        Some(bytes) => {
            let list: Vec<String> = bytes.iter().map(|b| format!("{b:#04x}")).collect();
            format!(
                "__attribute__((section(\".rocm_kpack_ref\"), used))\nconst unsigned char kpack_ref[{}] = {{ {} }};\n",
                bytes.len(),
                list.join(", ")
            )
        }
        None => "const unsigned char nothing_here[4] = { 1, 2, 3, 4 };\n".into(),
    };
    let c = path.with_extension("c");
    std::fs::write(&c, format!("{body}int hipk_probe(void) {{ return 42; }}\n")).unwrap();
    let out = Command::new("gcc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(path)
        .arg(&c)
        .output()
        .expect("gcc must be installed");
    assert!(
        out.status.success(),
        "gcc: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    path.to_path_buf()
}

/// `root/lib/libhk.so` with metadata `../.kpack/hk_@GFXARCH@.kpack`, and archives for four
/// targets (xnack variants included). Another binary's keys share the archives; a file that
/// does not fit the pattern sits beside them. Returns (binary, kernels by (key, arch)).
fn hipk_layout(root: &Path) -> (PathBuf, Vec<(String, String, Vec<u8>)>) {
    let meta = rocm_kpack::host::hipk::metadata::encode(
        &["../.kpack/hk_@GFXARCH@.kpack".into()],
        "lib/libhk.so",
    );
    let binary = hipk_library(&root.join("lib/libhk.so"), Some(&meta));
    let kp = root.join(".kpack");
    std::fs::create_dir_all(&kp).unwrap();
    let mut kernels = Vec::new();
    for (i, arch) in ["gfx900", "gfx90a:xnack+", "gfx90a:xnack-", "gfx942"]
        .iter()
        .enumerate()
    {
        let mut entries = Vec::new();
        for co in 0..2u32 {
            let data = pattern(2000 + 1000 * i + co as usize, 10 * i as u32 + co);
            entries.push((format!("lib/libhk.so#{co}"), arch.to_string(), data.clone()));
            kernels.push((format!("lib/libhk.so#{co}"), arch.to_string(), data));
        }
        entries.push(("lib/other.so#0".into(), arch.to_string(), vec![9; 10]));
        entries.push(("lib/libhk.so".into(), arch.to_string(), vec![8; 10]));
        let refs: Vec<(&str, &str, Vec<u8>)> = entries
            .iter()
            .map(|(k, a, d)| (k.as_str(), a.as_str(), d.clone()))
            .collect();
        write_archive(
            &kp.join(format!("hk_{arch}.kpack")),
            Compression::Zstd { level: 3 },
            &refs,
        );
    }
    write_archive(
        &kp.join("other_gfx900.kpack"),
        Compression::None,
        &[("lib/libhk.so#5", "gfx900", vec![7; 10])],
    );
    (binary, kernels)
}

fn expected_for(dir: &Path, kernels: &[(String, String, Vec<u8>)], arches: &[&str]) -> PathBuf {
    let files: Vec<(String, &[u8])> = kernels
        .iter()
        .filter(|(_, a, _)| arches.contains(&a.as_str()))
        .map(|(k, a, d)| (format!("{k}/{a}.hsaco"), d.as_slice()))
        .collect();
    let refs: Vec<(&str, &[u8])> = files.iter().map(|(p, d)| (p.as_str(), *d)).collect();
    expect_dir(dir, &refs)
}

#[test]
fn hipk_binary_source_with_and_without_gpu() {
    if !fuse_available() {
        return;
    }
    let d = tmp();
    let (binary, kernels) = hipk_layout(&d.path().join("root"));
    let all = ["gfx900", "gfx90a:xnack+", "gfx90a:xnack-", "gfx942"];

    // No --gpu: every archive fitting the pattern; only this binary's `#N` keys.
    let want = expected_for(&d.path().join("want-all"), &kernels, &all);
    let m = Mount::start(&binary, &[]);
    m.check("tree", want.to_str().unwrap());
    m.stop();

    // --gpu gfx90a:xnack+: the loader tries hk_gfx90a:xnack+.kpack then hk_gfx90a.kpack.
    let want = expected_for(&d.path().join("want-xnack"), &kernels, &["gfx90a:xnack+"]);
    let m = Mount::start(&binary, &["--gpu", "gfx90a:xnack+"]);
    m.check("tree", want.to_str().unwrap());
    m.check("link", "lib/libhk.so#0/native.hsaco=gfx90a:xnack+.hsaco");
    m.stop();

    // Two GPUs through -o: gfx942:xnack- finds the bare hk_gfx942.kpack; gfx900 its own.
    let want = expected_for(&d.path().join("want-two"), &kernels, &["gfx942", "gfx900"]);
    let m = Mount::start(&binary, &["-o", "gpu=gfx942:xnack-,gpu=gfx900"]);
    m.check("tree", want.to_str().unwrap());
    m.check("link", "lib/libhk.so#1/native.hsaco=gfx942.hsaco");
    m.stop();
}

#[test]
fn hipk_binary_search_paths_honour_the_environment_and_refusals() {
    let d = tmp();
    let (binary, _) = hipk_layout(&d.path().join("root"));
    // ROCM_KPACK_PATH replaces the embedded paths entirely.
    let (code, err) = refused(&binary, &[], &[("ROCM_KPACK_PATH", "/nonexistent/a.kpack")]);
    assert_eq!(code, Some(5), "{err}");
    assert!(
        err.contains("no archive found for kernel \"lib/libhk.so\""),
        "{err}"
    );
    // A GPU no archive exists for.
    let (code, err) = refused(&binary, &["--gpu", "gfx1201"], &[]);
    assert_eq!(code, Some(5), "{err}");
    // An ELF file without the section.
    let plain = hipk_library(&d.path().join("plain/libplain.so"), None);
    let (code, err) = refused(&plain, &[], &[]);
    assert_eq!(code, Some(4), "{err}");
    assert!(
        err.contains("no .rocm_kpack_ref section: not a HIPK binary"),
        "{err}"
    );
    // Neither archive, ELF nor directory; and missing.
    let text = d.path().join("notes.txt");
    std::fs::write(&text, "hello").unwrap();
    let (code, err) = refused(&text, &[], &[]);
    assert_eq!(code, Some(4), "{err}");
    assert!(
        err.contains("not a kpack archive (magic KPAK), an ELF host binary or a directory"),
        "{err}"
    );
    let (code, _) = refused(&d.path().join("missing"), &[], &[]);
    assert_eq!(code, Some(3));
}

#[test]
fn hipk_binary_source_honours_rocm_kpack_path_prefix() {
    if !fuse_available() {
        return;
    }
    let d = tmp();
    let (binary, kernels) = hipk_layout(&d.path().join("root"));
    // An archive named by the prefix comes first, so its entry wins over the pattern's.
    let first = d.path().join("first.kpack");
    let override_bytes = pattern(999, 77);
    write_archive(
        &first,
        Compression::None,
        &[("lib/libhk.so#0", "gfx900", override_bytes.clone())],
    );
    let mut files: Vec<(String, Vec<u8>)> = kernels
        .iter()
        .filter(|(_, a, _)| a == "gfx900")
        .map(|(k, a, data)| (format!("{k}/{a}.hsaco"), data.clone()))
        .collect();
    files[0].1 = override_bytes;
    let refs: Vec<(&str, &[u8])> = files
        .iter()
        .map(|(p, b)| (p.as_str(), b.as_slice()))
        .collect();
    let want = expect_dir(&d.path().join("want"), &refs);
    let prefix = first.display().to_string();
    let m = Mount::start_env(
        &binary,
        &["--gpu", "gfx900"],
        &[("ROCM_KPACK_PATH_PREFIX", &prefix)],
    );
    m.check("tree", want.to_str().unwrap());
    assert!(
        m.daemon_log()
            .contains("lib/libhk.so#0 [gfx900] is in both"),
        "{}",
        m.daemon_log()
    );
    m.stop();
}

/// The split round trip: a fat library rewritten by `kpack-fuse split`, mounted through the
/// rewritten binary, shows every code object of the original, byte for byte.
#[test]
fn split_binary_mounts_with_the_original_code_objects() {
    if !fuse_available() {
        return;
    }
    let d = tmp();
    let blobs = crate::split::tu_blobs();
    let lib = crate::split::build(
        &d.path().join("in"),
        "lib/libsplit.so",
        &blobs,
        crate::split::HIPF,
        crate::split::Kind::Library,
        "",
    );
    let out_root = d.path().join("out");
    let out = Command::new(env!("CARGO_BIN_EXE_kpack-fuse"))
        .arg("split")
        .arg(&lib)
        .arg("--root")
        .arg(d.path().join("in"))
        .arg("-o")
        .arg(&out_root)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "split: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The original device code, as the test built it (see split::tu_blobs).
    let mut files: Vec<(String, Vec<u8>)> = Vec::new();
    for tu in 0..3u8 {
        files.push((
            format!("lib/libsplit.so#{tu}/gfx900.hsaco"),
            vec![b'a' + tu; 65536],
        ));
        files.push((
            format!("lib/libsplit.so#{tu}/gfx90a:xnack-.hsaco"),
            vec![b'x' + tu; 70000],
        ));
    }
    let refs: Vec<(&str, &[u8])> = files
        .iter()
        .map(|(p, b)| (p.as_str(), b.as_slice()))
        .collect();
    let want = expect_dir(&d.path().join("want"), &refs);
    let m = Mount::start(&out_root.join("lib/libsplit.so"), &[]);
    m.check("tree", want.to_str().unwrap());
    m.stop();
    let m = Mount::start(
        &out_root.join("lib/libsplit.so"),
        &["--gpu", "gfx90a:xnack-"],
    );
    let only: Vec<(&str, &[u8])> = refs
        .iter()
        .filter(|(p, _)| p.contains("gfx90a"))
        .copied()
        .collect();
    let want = expect_dir(&d.path().join("want-gpu"), &only);
    m.check("tree", want.to_str().unwrap());
    m.stop();
}

/// The mount opens a HIPK binary's archives through the loader's own step: a corrupt archive on
/// the search path is skipped with a warning naming it (refused with `--strict`), a file reached
/// twice is shown once, and what remains is exactly what the loader would search.
#[test]
fn hipk_binary_source_uses_the_loaders_open_step() {
    use rocm_kpack::fs::setup::source::{self, SourceErrorKind, SourceOptions};
    let d = tmp();
    let root = d.path().join("root");
    let (binary, _) = hipk_layout(&root);
    let corrupt = root.join(".kpack/hk_gfx1100.kpack");
    std::fs::write(&corrupt, b"KPAK\x01\x00\x00\x00garbage").unwrap();
    // The gfx900 archive again under a second name that also fits the pattern.
    std::os::unix::fs::symlink("hk_gfx900.kpack", root.join(".kpack/hk_gfx900x.kpack")).unwrap();
    let canonical = std::fs::canonicalize(&corrupt).unwrap();

    let opened = source::open(&binary, &SourceOptions::default()).unwrap();
    assert_eq!(opened.archives.len(), 4, "{:?}", opened.archives);
    assert_eq!(opened.warnings.len(), 1, "{:?}", opened.warnings);
    assert!(
        opened.warnings[0].starts_with(&format!("skipping {}: ", canonical.display())),
        "{:?}",
        opened.warnings
    );

    let strict = SourceOptions {
        strict: true,
        ..Default::default()
    };
    let err = source::open(&binary, &strict).unwrap_err();
    // The core's own kind, classified by the caller (exit 4 for the CLI).
    assert_eq!(
        err.kind,
        SourceErrorKind::Core(rocm_kpack::ErrorKind::InvalidFormat)
    );
    assert!(
        err.message
            .starts_with(&format!("{}: ", canonical.display())),
        "{err}"
    );

    // With a GPU, only that device's candidates are opened: the corrupt gfx1100 file is not one.
    let gfx900 = SourceOptions {
        gpus: vec!["gfx900".into()],
        strict: true,
        ..Default::default()
    };
    let opened = source::open(&binary, &gfx900).unwrap();
    assert_eq!(opened.archives.len(), 1);
    assert!(opened.warnings.is_empty());
}

/// `kpack-fuse extract SOURCE DEST ARGS...`, which must succeed: the files a mount of a host
/// binary must show.
fn extracted(source: &Path, dest: &Path, args: &[&std::ffi::OsStr]) -> PathBuf {
    let out = Command::new(env!("CARGO_BIN_EXE_kpack-fuse"))
        .arg("extract")
        .arg(source)
        .arg(dest)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    dest.to_path_buf()
}

/// The synthetic fat library of `fatbin::synthetic_section` built below `dir`, its section and
/// what `extract` writes of it.
fn synthetic_fat(dir: &Path) -> (Vec<u8>, PathBuf, PathBuf) {
    let (section, _) = crate::fatbin::synthetic_section();
    let lib = crate::fatbin::gcc_fat_binary(&dir.join("in"), "libsynth.so", &section, true);
    let want = extracted(&lib, &dir.join("want"), &[]);
    (section, lib, want)
}

/// A fat binary mounts as its code objects, keyed as `pack --from-fatbin` keys them (plain,
/// CCOB v3 and v2 bundles): the same files, byte for byte, as `extract` of the binary.
#[test]
fn fat_binary_mounts_its_code_objects() {
    if !fuse_available() {
        return;
    }
    let d = tmp();
    let (_, lib, want) = synthetic_fat(d.path());
    assert_eq!(crate::support::files_below(&want).len(), 8);
    let m = Mount::start(&lib, &[]);
    m.check("tree", want.to_str().unwrap());
    m.stop();
}

/// A CCOB bundle whose header lies about its decoded size: the mount still opens (only tables
/// are read to list the code objects), that bundle's files read as EIO, and the other bundles'
/// files read as extracted from the intact binary.
#[test]
fn fat_binary_with_a_corrupt_bundle_serves_the_rest() {
    use rocm_kpack::host::bundle::{Layout, parse_fatbin};
    if !fuse_available() {
        return;
    }
    let d = tmp();
    let (section, lib, want) = synthetic_fat(d.path());
    let host = rocm_kpack::host::fatbin::HostFile::open_tables(&lib).unwrap();
    let at = host.fatbin().unwrap().offset;
    let v3 = parse_fatbin(&section)
        .unwrap()
        .into_iter()
        .find(|b| b.layout == Layout::Compressed { version: 3 })
        .unwrap();
    let mut bytes = std::fs::read(&lib).unwrap();
    let field = (at + v3.offset + 16) as usize;
    let declared = u64::from_le_bytes(bytes[field..field + 8].try_into().unwrap());
    bytes[field..field + 8].copy_from_slice(&(declared + 1).to_le_bytes());
    let bad = d.path().join("bad/libsynth.so");
    std::fs::create_dir_all(bad.parent().unwrap()).unwrap();
    std::fs::write(&bad, &bytes).unwrap();

    let m = Mount::start(&bad, &[]);
    // The v3 bundle is the third translation unit (see fatbin::synthetic_section).
    for f in [
        "libsynth.so#0/gfx1030.hsaco",
        "libsynth.so#1/gfx90a:xnack-.hsaco",
        "libsynth.so#2/gfx900.hsaco",
    ] {
        m.check("eio", f);
    }
    for f in [
        "libsynth.so#0/gfx900.hsaco",
        "libsynth.so#0/gfx90a:xnack-.hsaco",
        "libsynth.so#1/gfx900.hsaco",
        "libsynth.so#2/gfx90a:xnack-.hsaco",
        "libsynth.so#1/gfx1030.hsaco",
    ] {
        m.check("same_as", &format!("{f}={}", want.join(f).display()));
    }
    let log = m.daemon_log();
    assert!(
        log.contains(&format!(
            "{}: .hip_fatbin: bad offload bundle at byte {}: CCOB bundle: payload decodes to",
            bad.canonicalize().unwrap().display(),
            // The error is in the payload, after the 32-byte v3 header.
            v3.offset + 32
        )),
        "{log}"
    );
    m.stop();
}

/// Debian's librocrand mounted as it ships: its seven code objects, byte for byte as `extract`
/// of the binary writes them, and the fallback links of `--gpu` as for an archive.
#[test]
fn fat_binary_mount_of_real_rocrand() {
    if !fuse_available() {
        return;
    }
    let Some(so) = crate::fatbin::rocrand() else {
        return;
    };
    let d = tmp();
    let want = extracted(&so, &d.path().join("want"), &[]);
    assert_eq!(crate::support::files_below(&want).len(), 7);
    let m = Mount::start(&so, &["--gpu", "gfx90a:xnack-"]);
    m.check("tree", want.to_str().unwrap());
    m.check(
        "same_as",
        &format!(
            "librocrand.so.1.1#0/native.hsaco={}",
            want.join("librocrand.so.1.1#0/gfx90a:xnack-.hsaco")
                .display()
        ),
    );
    m.stop();
}

/// An install tree mounts the same whether its libraries are fat or split: Debian's rocRAND
/// tree (with a separated debug file, a symlink and documentation, which show nothing) and
/// rocSPARSE's (1.3 GB, 777 code objects; split without compression to keep the test short),
/// and what `split` makes of each, all show exactly what `extract` of the library with `--root`
/// writes.
#[test]
fn install_tree_mounts_the_same_fat_or_split() {
    if !fuse_available() {
        return;
    }
    let d = tmp();
    let Some(rocrand) = crate::split_tree::rocrand_tree(&d.path().join("rocrand")) else {
        return;
    };
    let Some(rocsparse) = crate::fatbin::rocsparse() else {
        return;
    };
    let rocsparse = crate::split_tree::debian_tree(
        &d.path().join("rocsparse"),
        &rocsparse,
        "librocsparse.so.0",
    );
    for (root, lib, count, compression) in [
        (&rocrand, "librocrand.so.1.1", 7, "zstd"),
        (&rocsparse, "librocsparse.so.0.1", 777, "none"),
    ] {
        let so = root.join("lib/x86_64-linux-gnu").join(lib);
        let want = extracted(
            &so,
            &root.with_file_name("want"),
            &["--root".as_ref(), root.as_os_str()],
        );
        let out = root.with_file_name("out");
        let o = Command::new(env!("CARGO_BIN_EXE_kpack-fuse"))
            .arg("split")
            .arg(root)
            .arg("--root")
            .arg(root)
            .arg("-o")
            .arg(&out)
            .args(["--compression", compression])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        assert_eq!(crate::support::files_below(&want).len(), count, "{lib}");
        for source in [root, &out] {
            let m = Mount::start(source, &[]);
            m.check("tree", want.to_str().unwrap());
            m.stop();
        }
    }
}
