//! Importing device code from fat host binaries: synthetic ELF files built here with gcc (real
//! offload bundle layouts in a `.hip_fatbin` section, several arches and translation units, CCOB
//! bundles among them), and Debian's real `librocrand.so.1.1` when it can be fetched.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use crate::support::bundles::{build_ccob, build_uncompressed};
use rocm_kpack::host::elf::{ElfFile, HIP_FATBIN_SECTION};
use rocm_kpack::host::fatbin::{self, CodeObject, FatbinError};
use rocm_kpack::tools::import::{ArchiveSet, Tag};
use rocm_kpack::tools::pack_pipeline::{self, Options};
use rocm_kpack::{Archive, Compression};

const HOST: &str = "host-x86_64-unknown-linux";

/// Writes the hosts' code objects (kernel name, code objects) into archives in `dir` as
/// `pack --from-fatbin` does: through the pipeline into an [`ArchiveSet`]. Returns the archive
/// file names in the order they were opened.
fn write_archives(
    dir: &Path,
    hosts: Vec<(&str, Vec<CodeObject>)>,
    prefix: &str,
    single: bool,
    compression: Compression,
) -> Vec<String> {
    let mut set = ArchiveSet::new(dir, prefix, single, compression, false);
    pack_pipeline::run(
        Options::new(compression),
        |feed| {
            for (kernel_name, cos) in hosts {
                for co in cos {
                    let (tag, data) = Tag::split(co, kernel_name);
                    feed.submit(tag, data)?;
                }
            }
            Ok::<(), rocm_kpack::Error>(())
        },
        |tag, encoded| {
            set.append(tag, encoded, |p| {
                std::fs::File::create(p).map_err(|e| rocm_kpack::Error::io(p, "cannot create", e))
            })
        },
    )
    .unwrap();
    set.finish()
        .unwrap()
        .into_iter()
        .map(|a| a.path.file_name().unwrap().to_string_lossy().into_owned())
        .collect()
}

fn triple(arch: &str) -> String {
    format!("hipv4-amdgcn-amd-amdhsa--{arch}")
}

/// A stand-in code object: an ELF-looking header naming its origin, then pseudo-random bytes
/// (so compression and byte comparison are both exercised).
fn fake_code_object(tu: usize, arch: &str, len: usize) -> Vec<u8> {
    let mut out = format!("\x7fELF tu{tu} {arch} ").into_bytes();
    let mut state = 0x2545_f491_4f6c_dd1du64 ^ (tu as u64 * 7919) ^ arch.len() as u64;
    while out.len() < len {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        out.push(if state % 3 == 0 { 0 } else { state as u8 });
    }
    out.truncate(len);
    out
}

/// Compiles a C file that places `blob` in `.hip_fatbin` (page aligned, as clang does) and a
/// `__CudaFatBinaryWrapper` in `.hipFatBinSegment` pointing at it through a relocation.
pub(crate) fn gcc_fat_binary(dir: &Path, rel: &str, blob: &[u8], shared: bool) -> PathBuf {
    let out = dir.join(rel);
    std::fs::create_dir_all(out.parent().unwrap()).unwrap();
    let stem = rel.replace('/', "_");
    let blob_path = dir.join(format!("{stem}.blob"));
    std::fs::write(&blob_path, blob).unwrap();
    let c = format!(
        r#"
__asm__(".section .hip_fatbin,\"a\",@progbits\n"
        ".p2align 12\n"
        ".globl fatbin_start\n"
        "fatbin_start:\n"
        ".incbin \"{blob}\"\n"
        ".previous\n");
extern const unsigned char fatbin_start[];
struct wrapper {{ unsigned int magic; unsigned int version; const void *binary; unsigned long long reserved1; }};
__attribute__((section(".hipFatBinSegment"), used, aligned(8)))
struct wrapper hip_wrapper = {{ 0x48495046u, 1u, fatbin_start, 0ull }};
{main}
"#,
        blob = blob_path.display(),
        main = if shared {
            ""
        } else {
            "int main(void) { return hip_wrapper.magic == 0; }"
        }
    );
    let c_path = dir.join(format!("{stem}.c"));
    std::fs::write(&c_path, c).unwrap();
    let mut cmd = Command::new("gcc");
    if shared {
        cmd.args(["-shared", "-fPIC"]);
    }
    let status = cmd
        .arg("-o")
        .arg(&out)
        .arg(&c_path)
        .status()
        .expect("gcc must be installed to build test fat binaries");
    assert!(status.success(), "gcc failed for {rel}");
    out
}

/// The section's bytes as binutils sees them (independent of our ELF reader).
fn objcopy_section(path: &Path, section: &str) -> Vec<u8> {
    let out = path.with_extension("section");
    let status = Command::new("objcopy")
        .args(["-O", "binary", "--only-section", section])
        .arg(path)
        .arg(&out)
        .status()
        .expect("objcopy (binutils) must be installed");
    assert!(status.success());
    std::fs::read(out).unwrap()
}

/// (tu, arch, bytes) of the synthetic library, in bundle order.
pub(crate) type Expected = Vec<(usize, &'static str, Vec<u8>)>;

/// Four translation units: uncompressed, uncompressed, CCOB v3, CCOB v2. gfx90a:xnack- is
/// missing from TU 1 and gfx1030 only appears from TU 2 on, so per-arch counters differ from
/// bundle numbers.
pub(crate) fn synthetic_section() -> (Vec<u8>, Expected) {
    let tus: [&[(&str, usize)]; 4] = [
        &[("gfx900", 3000), ("gfx90a:xnack-", 5000)],
        &[("gfx900", 100)],
        &[("gfx1030", 7000), ("gfx90a:xnack-", 20), ("gfx900", 4096)],
        &[("gfx90a:xnack-", 9000), ("gfx1030", 1)],
    ];
    let mut section = Vec::new();
    let mut expected = Vec::new();
    for (tu, entries) in tus.iter().enumerate() {
        let objects: Vec<(String, Vec<u8>)> = entries
            .iter()
            .map(|(a, n)| (triple(a), fake_code_object(tu, a, *n)))
            .collect();
        let mut table: Vec<(&str, &[u8])> = vec![(HOST, &[])];
        table.extend(objects.iter().map(|(t, d)| (t.as_str(), d.as_slice())));
        let bundle = build_uncompressed(&table, 4096);
        let stored = match tu {
            2 => build_ccob(3, &bundle, 3).unwrap(),
            3 => build_ccob(2, &bundle, 9).unwrap(),
            _ => bundle,
        };
        section.resize(section.len().next_multiple_of(4096), 0);
        section.extend_from_slice(&stored);
        for ((a, _), (_, d)) in entries.iter().zip(objects) {
            expected.push((tu, *a, d));
        }
    }
    (section, expected)
}

/// Expected (key, arch, bytes) for `kernel_name`, in bundle order.
pub(crate) fn expected_keys(
    kernel_name: &str,
    expected: &Expected,
) -> Vec<(String, String, Vec<u8>)> {
    let mut seen: Vec<&str> = Vec::new();
    expected
        .iter()
        .map(|(_, a, d)| {
            let i = seen.iter().filter(|s| *s == a).count();
            seen.push(a);
            (format!("{kernel_name}#{i}"), a.to_string(), d.clone())
        })
        .collect()
}

#[test]
fn fatbin_synthetic_keys_and_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let (section, expected) = synthetic_section();
    let lib = gcc_fat_binary(dir.path(), "lib/libsynth.so", &section, true);
    let bytes = std::fs::read(&lib).unwrap();

    // Our ELF reader sees exactly what binutils sees.
    let elf = ElfFile::parse(&bytes).unwrap();
    assert_eq!(
        elf.section(HIP_FATBIN_SECTION).unwrap().data,
        objcopy_section(&lib, HIP_FATBIN_SECTION).as_slice()
    );
    assert_eq!(
        &elf.section(HIP_FATBIN_SECTION).unwrap().data[..section.len()],
        section.as_slice()
    );

    let cos = fatbin::host_code_objects("lib/libsynth.so", &bytes).unwrap();
    let got: Vec<(String, String, Vec<u8>)> = cos
        .iter()
        .map(|c| (c.key.clone(), c.arch.clone(), c.data.clone()))
        .collect();
    assert_eq!(got, expected_keys("lib/libsynth.so", &expected));
    let keys: Vec<(&str, &str)> = cos
        .iter()
        .map(|c| (c.key.as_str(), c.arch.as_str()))
        .collect();
    assert_eq!(
        keys,
        vec![
            ("lib/libsynth.so#0", "gfx900"),
            ("lib/libsynth.so#0", "gfx90a:xnack-"),
            ("lib/libsynth.so#1", "gfx900"),
            ("lib/libsynth.so#0", "gfx1030"),
            ("lib/libsynth.so#1", "gfx90a:xnack-"),
            ("lib/libsynth.so#2", "gfx900"),
            ("lib/libsynth.so#2", "gfx90a:xnack-"),
            ("lib/libsynth.so#1", "gfx1030"),
        ]
    );
}

#[test]
fn fatbin_per_arch_archives_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let (section, expected) = synthetic_section();
    let lib = gcc_fat_binary(dir.path(), "lib/libsynth.so", &section, true);
    let cos = fatbin::host_code_objects("lib/libsynth.so", &std::fs::read(&lib).unwrap()).unwrap();
    let kpack = dir.path().join(".kpack");
    std::fs::create_dir_all(&kpack).unwrap();
    let names = write_archives(
        &kpack,
        vec![("lib/libsynth.so", cos)],
        "synth",
        false,
        Compression::Zstd { level: 3 },
    );
    assert_eq!(
        names,
        [
            "synth_gfx900.kpack",
            "synth_gfx90a:xnack-.kpack",
            "synth_gfx1030.kpack"
        ]
    );

    for arch in ["gfx900", "gfx90a:xnack-", "gfx1030"] {
        let a = Archive::open(kpack.join(format!("synth_{arch}.kpack"))).unwrap();
        assert_eq!(a.architectures(), [arch]);
        assert_eq!(a.group_name(), Some("synth"));
        assert_eq!(a.gfx_arch_family(), Some(arch));
        let want: Vec<(String, String, Vec<u8>)> = expected_keys("lib/libsynth.so", &expected)
            .into_iter()
            .filter(|(_, a, _)| a == arch)
            .collect();
        let mut want_keys: Vec<&str> = want.iter().map(|(k, _, _)| k.as_str()).collect();
        want_keys.sort();
        assert_eq!(a.binaries().map(|b| b.key).collect::<Vec<_>>(), want_keys);
        for (key, arch, data) in &want {
            assert_eq!(&a.get_kernel(key, arch).unwrap(), data, "{key} [{arch}]");
        }
    }

    // The metadata the binary will carry: one level up from lib/ to the .kpack folder.
    let meta = rocm_kpack::host::hipk::metadata::encode(
        &[fatbin::search_path("lib/libsynth.so", "synth", false)],
        "lib/libsynth.so",
    );
    let mut want = vec![0x82, 0xb2];
    want.extend_from_slice(b"kpack_search_paths");
    want.extend_from_slice(&[0x91, 0xa0 | 31]); // array of 1, fixstr of 31 bytes
    want.extend_from_slice(b"../.kpack/synth_@GFXARCH@.kpack");
    want.push(0xab);
    want.extend_from_slice(b"kernel_name");
    want.push(0xaf);
    want.extend_from_slice(b"lib/libsynth.so");
    assert_eq!(meta, want);
}

#[test]
fn fatbin_single_archive_from_library_and_executable() {
    let dir = tempfile::tempdir().unwrap();
    let (section, expected) = synthetic_section();
    let lib = gcc_fat_binary(dir.path(), "lib/libsynth.so", &section, true);
    let app_objects = [(triple("gfx1030"), fake_code_object(9, "gfx1030", 2500))];
    let app_section = build_uncompressed(
        &[(HOST, &[]), (app_objects[0].0.as_str(), &app_objects[0].1)],
        4096,
    );
    let app = gcc_fat_binary(dir.path(), "bin/app", &app_section, false);
    assert!(
        Command::new(&app).status().unwrap().success(),
        "the test executable runs"
    );

    let hosts = vec![
        (
            "lib/libsynth.so",
            fatbin::host_code_objects("lib/libsynth.so", &std::fs::read(&lib).unwrap()).unwrap(),
        ),
        (
            "bin/app",
            fatbin::host_code_objects("bin/app", &std::fs::read(&app).unwrap()).unwrap(),
        ),
    ];
    let names = write_archives(dir.path(), hosts, "synth", true, Compression::None);
    assert_eq!(names, ["synth.kpack"]);
    let path = dir.path().join("synth.kpack");
    let a = Archive::open(&path).unwrap();
    assert_eq!(a.architectures(), ["gfx900", "gfx90a:xnack-", "gfx1030"]);
    assert_eq!(
        a.binaries().map(|b| b.key).collect::<Vec<_>>(),
        [
            "bin/app#0",
            "lib/libsynth.so#0",
            "lib/libsynth.so#1",
            "lib/libsynth.so#2"
        ]
    );
    assert_eq!(
        a.get_kernel("bin/app#0", "gfx1030").unwrap(),
        app_objects[0].1
    );
    for (key, arch, data) in expected_keys("lib/libsynth.so", &expected) {
        assert_eq!(a.get_kernel(&key, &arch).unwrap(), data, "{key} [{arch}]");
    }
    assert_eq!(
        fatbin::search_path("bin/app", "synth", true),
        "../.kpack/synth.kpack"
    );
}

#[test]
fn fatbin_refuses_non_fat_and_split_binaries() {
    let dir = tempfile::tempdir().unwrap();
    let plain = dir.path().join("plain.so");
    let c = dir.path().join("plain.c");
    std::fs::write(&c, "int f(void) { return 1; }\n").unwrap();
    assert!(
        Command::new("gcc")
            .args(["-shared", "-fPIC", "-o"])
            .arg(&plain)
            .arg(&c)
            .status()
            .unwrap()
            .success()
    );
    assert_eq!(
        fatbin::host_code_objects("plain.so", &std::fs::read(&plain).unwrap()),
        Err(FatbinError::NoDeviceCode)
    );

    let split = dir.path().join("split.so");
    let c = dir.path().join("split.c");
    std::fs::write(
        &c,
        "__attribute__((section(\".rocm_kpack_ref\"), used)) const char marker[] = \"\\x82\";\n",
    )
    .unwrap();
    assert!(
        Command::new("gcc")
            .args(["-shared", "-fPIC", "-o"])
            .arg(&split)
            .arg(&c)
            .status()
            .unwrap()
            .success()
    );
    assert_eq!(
        fatbin::host_code_objects("split.so", &std::fs::read(&split).unwrap()),
        Err(FatbinError::AlreadySplit)
    );

    // A corrupt bundle inside a real ELF file is reported, not skipped.
    let mut bad = build_uncompressed(&[(triple("gfx900").as_str(), b"code")], 64);
    bad[24] = 9; // nine entries claimed, one present
    let lib = gcc_fat_binary(dir.path(), "libbad.so", &bad, true);
    match fatbin::host_code_objects("libbad.so", &std::fs::read(&lib).unwrap()) {
        Err(FatbinError::Bundle(e)) => {
            assert_eq!(e.offset, 24);
            assert!(
                e.reason
                    .contains("entry count 9 cannot fit in the 132 bytes present"),
                "{e}"
            );
        }
        other => panic!("expected a bundle error, got {other:?}"),
    }
}

/// Debian's librocrand.so.1.1, fetched by `bench/fetch-rocrand.sh`. `None` (with a message)
/// when it cannot be fetched outside CI; in CI (env `CI` set) that is a failure.
pub fn rocrand() -> Option<PathBuf> {
    static PATH: OnceLock<Option<PathBuf>> = OnceLock::new();
    PATH.get_or_init(|| {
        debian_lib(
            "librocrand1",
            "rocrand",
            "usr/lib/x86_64-linux-gnu/librocrand.so.1.1",
        )
    })
    .clone()
}

/// Debian's librocsparse.so.0.1 (1.3 GB, 777 code objects in 111 plain bundles; a 94 MB
/// download), as [`rocrand`].
pub fn rocsparse() -> Option<PathBuf> {
    static PATH: OnceLock<Option<PathBuf>> = OnceLock::new();
    PATH.get_or_init(|| {
        debian_lib(
            "librocsparse0",
            "rocsparse",
            "usr/lib/x86_64-linux-gnu/librocsparse.so.0.1",
        )
    })
    .clone()
}

/// A library of a Debian package, fetched by `bench/fetch-debian-lib.sh`; `None` (with a
/// message) when it cannot be fetched outside CI, a failure in CI.
fn debian_lib(package: &str, name: &str, rel: &str) -> Option<PathBuf> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/fetch-debian-lib.sh");
    let out = Command::new("sh")
        .arg(&script)
        .args([package, name, rel])
        .output()
        .expect("sh runs");
    if out.status.success() {
        return Some(PathBuf::from(String::from_utf8(out.stdout).unwrap().trim()));
    }
    let why = String::from_utf8_lossy(&out.stderr);
    if std::env::var_os("CI").is_some() {
        panic!("CI is set but {package} could not be fetched:\n{why}");
    }
    eprintln!("SKIPPED: {package} could not be fetched (set CI to make this a failure):\n{why}");
    None
}

/// The code objects of Debian's librocrand1 5.3.3-4, in bundle order: (arch, offset in the
/// bundle, size).
const ROCRAND_5_3_3: [(&str, u64, usize); 7] = [
    ("gfx1030", 4096, 1_642_416),
    ("gfx803", 1_646_592, 1_812_792),
    ("gfx900:xnack-", 3_461_120, 1_804_920),
    ("gfx906:xnack-", 5_267_456, 1_803_176),
    ("gfx908:xnack-", 7_073_792, 1_804_200),
    ("gfx90a:xnack+", 8_880_128, 1_716_600),
    ("gfx90a:xnack-", 10_600_448, 1_716_776),
];

#[test]
fn fatbin_real_rocrand_import_and_verify() {
    let Some(so) = rocrand() else { return };
    let bytes = std::fs::read(&so).unwrap();
    let section = objcopy_section(&so, HIP_FATBIN_SECTION);
    let cos = fatbin::host_code_objects("lib/librocrand.so.1.1", &bytes).unwrap();
    let got: Vec<(&str, &str, usize)> = cos
        .iter()
        .map(|c| (c.key.as_str(), c.arch.as_str(), c.data.len()))
        .collect();
    let want: Vec<(&str, &str, usize)> = ROCRAND_5_3_3
        .iter()
        .map(|(a, _, n)| ("lib/librocrand.so.1.1#0", *a, *n))
        .collect();
    assert_eq!(got, want);
    for (co, (arch, offset, size)) in cos.iter().zip(ROCRAND_5_3_3) {
        // Byte-identical to the range the bundle table names (read here through binutils), and
        // an AMDGPU ELF code object (e_machine 0xE0).
        assert_eq!(
            co.data,
            section[offset as usize..offset as usize + size],
            "{arch}"
        );
        assert_eq!(&co.data[..4], b"\x7fELF");
        assert_eq!(
            u16::from_le_bytes([co.data[18], co.data[19]]),
            0xE0,
            "{arch}"
        );
        assert_eq!(co.triple, triple(arch));
    }

    let dir = tempfile::tempdir().unwrap();
    let names = write_archives(
        dir.path(),
        vec![("lib/librocrand.so.1.1", cos.clone())],
        "rocrand",
        false,
        Compression::Zstd { level: 1 },
    );
    assert_eq!(
        names,
        ROCRAND_5_3_3
            .iter()
            .map(|(a, _, _)| format!("rocrand_{a}.kpack"))
            .collect::<Vec<_>>()
    );
    for co in &cos {
        let a = Archive::open(dir.path().join(format!("rocrand_{}.kpack", co.arch))).unwrap();
        assert_eq!(a.architectures(), [co.arch.as_str()]);
        assert_eq!(
            a.get_kernel(&co.key, &co.arch).unwrap(),
            co.data,
            "{}",
            co.arch
        );
    }
}

#[test]
fn fatbin_committed_sample_archive() {
    let sample = Path::new(env!("CARGO_MANIFEST_DIR")).join("samples/rocrand-sample.kpack");
    let a = Archive::open(&sample).unwrap();
    assert_eq!(
        a.architectures(),
        ["gfx1030", "gfx90a:xnack+", "gfx90a:xnack-"]
    );
    assert_eq!(a.group_name(), Some("rocrand-sample"));
    let key = "lib/x86_64-linux-gnu/librocrand.so.1.1#0";
    assert_eq!(a.binaries().map(|b| b.key).collect::<Vec<_>>(), [key]);
    let mut decoded = Vec::new();
    for (arch, size) in [
        ("gfx1030", 1_642_416),
        ("gfx90a:xnack+", 1_716_600),
        ("gfx90a:xnack-", 1_716_776),
    ] {
        let data = a.get_kernel(key, arch).unwrap();
        assert_eq!(data.len(), size, "{arch}");
        assert_eq!(&data[..4], b"\x7fELF");
        assert_eq!(
            u16::from_le_bytes([data[18], data[19]]),
            0xE0,
            "{arch} is an AMDGPU code object"
        );
        decoded.push((arch, data));
    }
    // Byte-identical to Debian's library, when it can be fetched.
    let Some(so) = rocrand() else { return };
    let cos = fatbin::host_code_objects(
        "lib/x86_64-linux-gnu/librocrand.so.1.1",
        &std::fs::read(so).unwrap(),
    )
    .unwrap();
    for (arch, data) in decoded {
        let co = cos.iter().find(|c| c.arch == arch).unwrap();
        assert_eq!(co.key, key);
        assert!(co.data == data, "{arch} differs from librocrand.so.1.1");
    }
}

#[test]
fn fatbin_cli_pack_and_verify_against() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let (section, expected) = synthetic_section();
    let lib = gcc_fat_binary(&root, "lib/libsynth.so", &section, true);
    let kpack = root.join(".kpack");
    let o = crate::cli::kpack_fuse(&[
        &"pack",
        &"--from-fatbin",
        &lib,
        &"--root",
        &root,
        &"-o",
        &kpack,
        &"--emit-metadata",
        &"--level",
        &"5",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let mut files: Vec<String> = std::fs::read_dir(&kpack)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    files.sort();
    assert_eq!(
        files,
        [
            "libsynth.so.hipk.msgpack",
            "synth_gfx1030.kpack",
            "synth_gfx900.kpack",
            "synth_gfx90a:xnack-.kpack"
        ]
    );
    // The metadata pins the three archives (in the order they were written).
    let meta = std::fs::read(kpack.join("libsynth.so.hipk.msgpack")).unwrap();
    let parsed = rocm_kpack::host::hipk::HipkMetadata::parse(&meta).unwrap();
    let pins = parsed.pins.clone().unwrap();
    let mut want: Vec<[u8; 32]> = ["gfx1030", "gfx900", "gfx90a:xnack-"]
        .iter()
        .map(|a| {
            rocm_kpack::Archive::open(kpack.join(format!("synth_{a}.kpack")))
                .unwrap()
                .toc_digest()
        })
        .collect();
    let mut got = pins.clone();
    got.sort();
    want.sort();
    assert_eq!(got, want);
    assert_eq!(
        meta,
        rocm_kpack::host::hipk::metadata::encode_pinned(
            &["../.kpack/synth_@GFXARCH@.kpack".into()],
            "lib/libsynth.so",
            Some(&pins)
        )
    );
    for (key, arch, data) in expected_keys("lib/libsynth.so", &expected) {
        let a = Archive::open(kpack.join(format!("synth_{arch}.kpack"))).unwrap();
        assert_eq!(a.get_kernel(&key, &arch).unwrap(), data, "{key} [{arch}]");
    }

    let archives: Vec<PathBuf> = files
        .iter()
        .filter(|f| f.ends_with(".kpack"))
        .map(|f| kpack.join(f))
        .collect();
    let mut args: Vec<&dyn AsRef<std::ffi::OsStr>> = vec![&"verify"];
    args.extend(archives.iter().map(|p| p as &dyn AsRef<std::ffi::OsStr>));
    args.extend([&"--against" as &dyn AsRef<std::ffi::OsStr>, &lib]);
    let o = crate::cli::kpack_fuse(&args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "ok: 8 kernels in 3 archives, each decoded to its recorded size and BLAKE3 digest\n\
         8 code objects from 1 binary match the archives byte for byte\n"
    );

    // Without the gfx1030 archive, its two code objects are named and the exit status is 6.
    let o = crate::cli::kpack_fuse(&[&"verify", &archives[1], &archives[2], &"--against", &lib]);
    assert_eq!(o.status.code(), Some(6));
    let err = String::from_utf8_lossy(&o.stderr);
    for i in 0..2 {
        assert!(
            err.contains(&format!(
                "{}: lib/libsynth.so#{i} [gfx1030]: not in any archive\n",
                lib.display()
            )),
            "{err}"
        );
    }
    assert!(
        err.ends_with("kpack-fuse: 2 of 8 code objects are missing or differ\n"),
        "{err}"
    );

    // A file that is not an ELF host binary is refused with status 4 (bad format).
    let o = crate::cli::kpack_fuse(&[
        &"pack",
        &"--from-fatbin",
        &kpack.join("libsynth.so.hipk.msgpack"),
        &"-o",
        &kpack,
    ]);
    assert_eq!(o.status.code(), Some(4));
}
