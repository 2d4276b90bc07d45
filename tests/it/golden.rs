//! The reference writer's archives: ours reproduces them byte for byte, and our reader returns
//! their kernels.

use rocm_kpack::{Archive, ArchiveWriter, Compression, Scheme};

use crate::support::*;

fn write(w: &ArchiveWriter) -> Vec<u8> {
    let mut out = Vec::new();
    w.write_to(&mut out, &|_| {}).unwrap();
    out
}

#[test]
fn writer_reproduces_golden_noop() {
    let mut w = ArchiveWriter::new(
        "test",
        "gfx900X",
        vec!["gfx900".into(), "gfx906".into()],
        Compression::None,
    )
    .unwrap();
    w.set_reference_layout(true);
    for (key, arch, data) in golden_noop_kernels() {
        w.add_kernel(key, arch, data).unwrap();
    }
    assert_eq!(
        write(&w),
        std::fs::read(fixture("test_noop.kpack")).unwrap()
    );
}

#[test]
fn writer_reproduces_golden_zstd() {
    let mut w = ArchiveWriter::new(
        "test",
        "gfx110X",
        vec!["gfx1100".into(), "gfx1101".into()],
        Compression::Zstd { level: 3 },
    )
    .unwrap();
    w.set_reference_layout(true);
    for (key, arch, data) in golden_zstd_kernels() {
        w.add_kernel(key, arch, data).unwrap();
    }
    assert_eq!(
        write(&w),
        std::fs::read(fixture("test_zstd.kpack")).unwrap()
    );
}

#[test]
fn reader_returns_golden_kernels() {
    for (file, scheme, kernels, arches, bins) in [
        (
            "test_noop.kpack",
            Scheme::None,
            golden_noop_kernels(),
            ["gfx900", "gfx906"],
            ["bin/testapp#0", "lib/libtest.so#0"],
        ),
        (
            "test_zstd.kpack",
            Scheme::ZstdPerKernel,
            golden_zstd_kernels(),
            ["gfx1100", "gfx1101"],
            ["bin/hiptest#0", "lib/libhip.so#0"],
        ),
    ] {
        let a = Archive::open(fixture(file)).unwrap();
        assert_eq!(a.scheme(), scheme);
        assert_eq!(a.architectures(), arches);
        assert_eq!(a.binaries().map(|b| b.key).collect::<Vec<_>>(), bins);
        assert_eq!(a.group_name(), Some("test"));
        for (key, arch, data) in kernels {
            assert_eq!(
                a.get_kernel(key, arch).unwrap(),
                data,
                "{file} {key} {arch}"
            );
            assert_eq!(a.locate(key, arch).unwrap().size, data.len() as u64);
        }
        // Locating by index finds the same kernel as locating by name, and past the end refuses.
        for (b, binary) in a.binaries().enumerate() {
            for (e, entry) in binary.arches().enumerate() {
                assert_eq!(
                    a.locate_at(b, e).unwrap(),
                    a.locate(binary.key, entry.arch).unwrap()
                );
            }
            let past = a.locate_at(b, binary.len()).unwrap_err();
            assert_eq!(past.kind(), rocm_kpack::ErrorKind::KernelNotFound, "{past}");
        }
        let past = a.locate_at(a.binary_count(), 0).unwrap_err();
        assert_eq!(past.kind(), rocm_kpack::ErrorKind::KernelNotFound, "{past}");
    }
}

/// Writes each kernel to a file under `dir` and a manifest listing them in the given order.
fn manifest(dir: &std::path::Path, kernels: &[(&str, &str, Vec<u8>)]) -> std::path::PathBuf {
    let mut text = String::new();
    for (i, (key, arch, data)) in kernels.iter().enumerate() {
        let name = format!("k{i}.hsaco");
        std::fs::write(dir.join(&name), data).unwrap();
        text.push_str(&format!("{key}\t{arch}\t{name}\n"));
    }
    let path = dir.join("kernels.tsv");
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn pack_manifest_reproduces_the_golden_archives() {
    /// (golden file, family, arches, --compression, kernels in insertion order)
    type Case = (
        &'static str,
        &'static str,
        [&'static str; 2],
        &'static str,
        Vec<(&'static str, &'static str, Vec<u8>)>,
    );
    let cases: [Case; 2] = [
        (
            "test_noop.kpack",
            "gfx900X",
            ["gfx900", "gfx906"],
            "none",
            golden_noop_kernels(),
        ),
        (
            "test_zstd.kpack",
            "gfx110X",
            ["gfx1100", "gfx1101"],
            "zstd",
            golden_zstd_kernels(),
        ),
    ];
    for (file, family, [a0, a1], compression, kernels) in cases {
        let dir = tempfile::tempdir().unwrap();
        let list = manifest(dir.path(), &kernels);
        let out = dir.path().join("out.kpack");
        let o = crate::cli::kpack_fuse(&[
            &"pack",
            &"--manifest",
            &list,
            &"-o",
            &out,
            &"--reference-layout",
            &"--group",
            &"test",
            &"--family",
            &family,
            &"--arch",
            &a0,
            &"--arch",
            &a1,
            &"--compression",
            &compression,
            &"--level",
            &"3",
        ]);
        assert_eq!(
            o.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(
            std::fs::read(&out).unwrap() == std::fs::read(fixture(file)).unwrap(),
            "{file} differs"
        );
    }
}

#[test]
fn pack_manifest_order_gives_ordinals_and_toc_order() {
    // Unsorted on purpose: the TOC and ordinals must follow the lines, not sort them.
    let kernels = vec![
        ("z/last.so#0", "gfx906", b"one".to_vec()),
        ("a/first.so#0", "gfx900", b"two".to_vec()),
        ("z/last.so#0", "gfx900", b"three".to_vec()),
    ];
    let dir = tempfile::tempdir().unwrap();
    let list = manifest(dir.path(), &kernels);
    let out = dir.path().join("o.kpack");
    let o = crate::cli::kpack_fuse(&[&"pack", &"--manifest", &list, &"-o", &out]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let bytes = std::fs::read(&out).unwrap();
    let toc_offset = u64::from_le_bytes(bytes[8..16].try_into().unwrap()) as usize;
    let (toc, _) = rocm_kpack::archive::msgpack::decode_slice(&bytes[toc_offset..]).unwrap();
    use rocm_kpack::archive::msgpack::Value;
    let Some(Value::Map(bins)) = toc.get("toc") else {
        panic!()
    };
    let mut order = Vec::new();
    for (k, arches) in bins {
        let Value::Map(arches) = arches else { panic!() };
        for (a, e) in arches {
            order.push((
                k.as_str().unwrap().to_owned(),
                a.as_str().unwrap().to_owned(),
                e.get("ordinal").and_then(Value::as_u64).unwrap(),
            ));
        }
    }
    let s = |k: &str, a: &str, n| (k.to_owned(), a.to_owned(), n);
    assert_eq!(
        order,
        [
            s("z/last.so#0", "gfx906", 0),
            s("z/last.so#0", "gfx900", 2),
            s("a/first.so#0", "gfx900", 1)
        ]
    );
    // The default arch list is the manifest's, in order of first appearance.
    let a = Archive::open(&out).unwrap();
    assert_eq!(a.architectures(), ["gfx906", "gfx900"]);
    for (k, arch, data) in &kernels {
        assert_eq!(&a.get_kernel(k, arch).unwrap(), data);
    }
}
