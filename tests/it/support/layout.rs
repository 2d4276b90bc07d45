//! Directory layouts for the loader tests: the reference's loader assets, the loader-matrix
//! scenarios (binary `<scenario>/lib/libfoo.so`, archives `<scenario>/.kpack/foo_<arch>.kpack`)
//! and the HIPK host program's install prefix.

use std::path::Path;

use rocm_kpack::{ArchiveWriter, Compression};

use super::{cmatrix, fixture};

/// `name` followed by `.` up to 32 bytes: the matrix code objects.
pub fn padded(name: &str) -> Vec<u8> {
    let mut v = name.as_bytes().to_vec();
    v.resize(32, b'.');
    v
}

/// Writes an archive listing `arches`, holding `(key, arch, bytes)` kernels.
pub fn archive(
    path: &Path,
    arches: &[&str],
    kernels: &[(&str, &str, Vec<u8>)],
    compression: Compression,
) {
    let mut w = ArchiveWriter::new(
        "test",
        arches.first().copied().unwrap_or(""),
        arches.iter().map(|a| a.to_string()).collect(),
        compression,
    )
    .unwrap();
    for (key, arch, data) in kernels {
        w.add_kernel(key, arch, data.clone()).unwrap();
    }
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    w.write(path, &|_| {}).unwrap();
}

fn zstd() -> Compression {
    Compression::Zstd { level: 3 }
}

/// The reference loader tests' assets directory: the golden archives, the two [NEW]
/// fall-through archives, and a `test_gfx900.kpack` that only an (incorrect) `@GFXARCH@`
/// expansion of `ROCM_KPACK_PATH` would find.
pub fn write_assets(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    for name in ["test_noop.kpack", "test_zstd.kpack"] {
        std::fs::copy(fixture(name), dir.join(name)).unwrap();
    }
    std::fs::copy(fixture("test_noop.kpack"), dir.join("test_gfx900.kpack")).unwrap();
    let mut other = b"OTHER_KERNEL_XNACK_MINUS".to_vec();
    other.resize(other.len() + 50, 0);
    archive(
        &dir.join("test_fallthrough_xnack.kpack"),
        &["gfx90a:xnack-"],
        &[("lib/libother.so#0", "gfx90a:xnack-", other)],
        Compression::None,
    );
    let mut generic = b"GENERIC_GFX90A_KERNEL_DATA".to_vec();
    generic.resize(generic.len() + 50, 0);
    archive(
        &dir.join("test_fallthrough_generic.kpack"),
        &["gfx90a"],
        &[("lib/libtest.so#0", "gfx90a", generic)],
        Compression::None,
    );
}

/// The loader-matrix scenarios (see tests/c/loader.c).
pub fn write_scenarios(root: &Path, assets: &Path) {
    const FOO: &str = "lib/libfoo.so";
    for s in ["bare", "multi", "toc", "corrupt", "links", "two"] {
        std::fs::create_dir_all(root.join(s).join("lib")).unwrap();
        std::fs::create_dir_all(root.join(s).join(".kpack")).unwrap();
    }
    archive(
        &root.join("bare/.kpack/foo_gfx942.kpack"),
        &["gfx942"],
        &[("lib/libfoo.so#0", "gfx942", padded("BARE_CO0"))],
        zstd(),
    );

    let multi = root.join("multi/.kpack");
    archive(
        &multi.join("foo_gfx942:xnack+.kpack"),
        &["gfx942:xnack+"],
        &[(&format!("{FOO}#0"), "gfx942:xnack+", padded("XNACKP_CO0"))],
        zstd(),
    );
    archive(
        &multi.join("foo_gfx942.kpack"),
        &["gfx942"],
        &[
            (&format!("{FOO}#0"), "gfx942", padded("BARE_CO0")),
            (&format!("{FOO}#1"), "gfx942", padded("BARE_CO1")),
        ],
        Compression::None,
    );
    archive(
        &multi.join("foo_gfx9-4-generic.kpack"),
        &["gfx9-4-generic"],
        &[(&format!("{FOO}#2"), "gfx9-4-generic", padded("GENERIC_CO2"))],
        zstd(),
    );

    // Arch present in `toc` but not in `gfx_arches`, and a listed arch without the key.
    archive(
        &root.join("toc/.kpack/foo_gfx906.kpack"),
        &["gfx900"],
        &[(&format!("{FOO}#0"), "gfx906", padded("TOC_GFX906_CO0"))],
        Compression::None,
    );
    archive(
        &root.join("toc/.kpack/foo_gfx900.kpack"),
        &["gfx900"],
        &[(&format!("{FOO}#0"), "gfx900", padded("TOC_GFX900_CO0"))],
        Compression::None,
    );

    std::fs::write(
        root.join("corrupt/.kpack/corrupt.kpack"),
        cmatrix::header(b"KPAK", 1, 1 << 40),
    )
    .unwrap();
    archive(
        &root.join("corrupt/.kpack/good.kpack"),
        &["gfx942"],
        &[(&format!("{FOO}#0"), "gfx942", padded("GOOD_CO0"))],
        zstd(),
    );

    std::os::unix::fs::symlink(
        assets.join("test_noop.kpack"),
        root.join("links/.kpack/link.kpack"),
    )
    .unwrap();

    archive(
        &root.join("two/.kpack/foo_gfx942_gfx942.kpack"),
        &["gfx942"],
        &[(&format!("{FOO}#0"), "gfx942", padded("TWO_CO0"))],
        zstd(),
    );
}

/// The archives beside the HIPK host program (`prefix/bin/hostapp`).
pub fn write_host_archives(prefix: &Path) {
    const KEY: &str = "bin/hostapp";
    let k = prefix.join(".kpack");
    archive(
        &k.join("hostapp_gfx90a:xnack+.kpack"),
        &["gfx90a:xnack+"],
        &[(
            &format!("{KEY}#0"),
            "gfx90a:xnack+",
            padded("HOST_CO0_XNACKP"),
        )],
        zstd(),
    );
    archive(
        &k.join("hostapp_gfx90a:xnack-.kpack"),
        &["gfx90a:xnack-"],
        &[(
            &format!("{KEY}#1"),
            "gfx90a:xnack-",
            padded("HOST_CO1_XNACKM"),
        )],
        Compression::None,
    );
    archive(
        &k.join("hostapp_gfx90a.kpack"),
        &["gfx90a"],
        &[
            (&format!("{KEY}#0"), "gfx90a", padded("HOST_CO0_GFX90A")),
            (&format!("{KEY}#1"), "gfx90a", padded("HOST_CO1_GFX90A")),
        ],
        zstd(),
    );
    archive(
        &k.join("hostapp_gfx9-generic.kpack"),
        &["gfx9-generic"],
        &[(
            &format!("{KEY}#0"),
            "gfx9-generic",
            padded("HOST_CO0_GFX9GEN"),
        )],
        zstd(),
    );
}
