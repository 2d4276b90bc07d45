//! `bundle`: arbitrary bytes as a `.hip_fatbin` section (clang offload bundles, plain or CCOB).
//!
//! Invariants: bundles come in order without overlapping, each inside the section; every entry is
//! a device entry whose arch is its triple's target ID; an uncompressed bundle's entries are the
//! section's own bytes at their offsets; a CCOB bundle decodes to exactly the size its header
//! declares. The single-bundle readers agree with the section reader on the first bundle. The
//! index (what `list` and the mount read: tables only) finds every code object the section
//! reader finds, each where its bytes are.

use rocm_kpack::host::bundle::{self, Layout};

pub fn run(data: &[u8]) {
    let index = bundle::index_fatbin(data);
    let Ok(bundles) = bundle::parse_fatbin(data) else {
        return;
    };
    let index = index.expect("the index reads less than the parse that succeeded");
    let entries: Vec<_> = bundles.iter().flat_map(|b| &b.entries).collect();
    assert_eq!(index.len(), entries.len());
    for (l, e) in index.iter().zip(entries) {
        assert_eq!(
            (&l.triple, &l.arch, l.offset),
            (&e.triple, &e.arch, e.offset)
        );
        assert_eq!(l.size, e.data.len() as u64);
        let at = l.bundle.offset as usize + l.offset as usize;
        match l.bundle.layout {
            Layout::Uncompressed => assert_eq!(&data[at..at + l.size as usize], &*e.data),
            Layout::Compressed { .. } => {
                let b = bundle::decode_ccob_bundle(data, &l.bundle).expect("decodes again");
                assert_eq!(
                    &b[l.offset as usize..(l.offset + l.size) as usize],
                    &*e.data
                );
            }
        }
    }
    let mut end = 0u64;
    for b in &bundles {
        assert!(b.offset >= end, "bundles overlap or go backwards");
        end = b.offset.checked_add(b.len).expect("bundle end overflows");
        assert!(end <= data.len() as u64, "bundle runs past the section");
        let at = &data[b.offset as usize..];
        match b.layout {
            Layout::Uncompressed => {
                let (entries, len) = bundle::parse_uncompressed(at).expect("re-parse");
                assert_eq!(len as u64, b.len);
                assert_eq!(entries, b.entries);
                for e in &b.entries {
                    let start = e.offset as usize;
                    assert_eq!(&*e.data, &at[start..start + e.data.len()]);
                }
            }
            Layout::Compressed { version } => {
                let d = bundle::decompress_ccob(at).expect("re-decompress");
                assert_eq!((d.version, d.total_size as u64), (version, b.len));
                let (entries, _) = bundle::parse_uncompressed(&d.bundle).expect("inner bundle");
                assert_eq!(entries.len(), b.entries.len());
            }
        }
        for e in &b.entries {
            assert!(!bundle::is_host_triple(&e.triple));
            assert_eq!(bundle::arch_of_triple(&e.triple), Some(e.arch.as_str()));
        }
    }
}
