//! `hipk_host`: arbitrary bytes as a HIPK host binary, read as the mount and `resolve` read one
//! (`HipkHost`, through the `object` ELF reader), and as `split --verify` lists its sections
//! (`HostFile::open_tables`: only the headers and the section-name table are read).
//!
//! Invariants: a refusal is `InvalidMetadata`; an accepted binary's metadata is exactly what its
//! `.rocm_kpack_ref` section decodes to, with at least one search path, and its wrappers are the
//! `.hipFatBinSegment` records in order; the tables-only image shows the same sections as the
//! whole file; `split`'s own ELF reader agrees on whether the binary is split.

use rocm_kpack::ErrorKind;
use rocm_kpack::host::elf::{
    ElfFile, FATBIN_SEGMENT_SECTION, HIP_FATBIN_SECTION, KPACK_REF_SECTION,
};
use rocm_kpack::host::fatbin::HostFile;
use rocm_kpack::host::hipk::wrapper::parse_wrappers;
use rocm_kpack::host::hipk::{HipkHost, HipkMetadata};
use rocm_kpack::tools::split;

use super::archive::memfd_with;
use super::split_elf::fd_path;

pub fn run(data: &[u8]) {
    let elf = ElfFile::parse(data);
    match HipkHost::read(data) {
        Ok(host) => {
            let elf = elf.as_ref().expect("accepted, so it parses");
            let section = elf.section(KPACK_REF_SECTION).expect("marker section");
            assert_eq!(
                host.metadata,
                HipkMetadata::parse(section.data).expect("its metadata")
            );
            assert!(!host.metadata.search_paths.is_empty());
            let wrappers = elf
                .section(FATBIN_SEGMENT_SECTION)
                .map(|s| parse_wrappers(s.data, elf.is_little_endian()))
                .unwrap_or_default();
            assert_eq!(host.wrappers, wrappers);
            for (i, w) in host.wrappers.iter().enumerate() {
                assert_eq!(w.index, i);
            }
            let hipk = host.hipk_code_objects();
            assert_eq!(
                hipk.len(),
                host.wrappers.iter().filter(|w| w.is_hipk()).count()
            );
        }
        Err(e) => assert_eq!(e.kind(), ErrorKind::InvalidMetadata, "{e}"),
    }

    let file = memfd_with(data);
    let tables = HostFile::open_tables(fd_path(&file).as_ref()).expect("a memfd reads");
    assert_eq!(tables.len(), data.len() as u64);
    if let Ok(full) = &elf {
        let listed = ElfFile::parse(tables.image()).expect("the tables parse where the file does");
        for name in [
            KPACK_REF_SECTION,
            FATBIN_SEGMENT_SECTION,
            HIP_FATBIN_SECTION,
        ] {
            assert_eq!(
                full.section(name).is_some(),
                listed.section(name).is_some(),
                "{name}"
            );
        }
        if let Ok(is_split) = split::is_split(data) {
            assert_eq!(is_split, full.section(KPACK_REF_SECTION).is_some());
        }
    }
}
