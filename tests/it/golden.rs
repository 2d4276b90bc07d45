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
        assert_eq!(
            a.binaries()
                .iter()
                .map(|b| b.key.as_str())
                .collect::<Vec<_>>(),
            bins
        );
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
        for (b, binary) in a.binaries().iter().enumerate() {
            for (e, entry) in binary.arches.iter().enumerate() {
                assert_eq!(
                    a.locate_at(b, e).unwrap(),
                    a.locate(&binary.key, &entry.arch).unwrap()
                );
            }
            let past = a.locate_at(b, binary.arches.len()).unwrap_err();
            assert_eq!(past.kind(), rocm_kpack::ErrorKind::KernelNotFound, "{past}");
        }
        let past = a.locate_at(a.binaries().len(), 0).unwrap_err();
        assert_eq!(past.kind(), rocm_kpack::ErrorKind::KernelNotFound, "{past}");
    }
}
