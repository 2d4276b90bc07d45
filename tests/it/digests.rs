//! The metadata our writer adds to TOC entries (frame positions, BLAKE3 digests), the archive's
//! TOC digest, and the reference layout that leaves them out.

use rocm_kpack::msgpack::{Value, decode_slice};
use rocm_kpack::{Archive, ArchiveWriter, Compression};

use crate::support::*;

fn write(compression: Compression, reference: bool, meta: bool) -> Vec<u8> {
    let mut w = ArchiveWriter::new(
        "test",
        "gfx110X",
        vec!["gfx1100".into(), "gfx1101".into()],
        compression,
    )
    .unwrap();
    w.set_reference_layout(reference);
    for (key, arch, data) in golden_zstd_kernels() {
        let extra = if meta {
            vec![(
                "target".to_owned(),
                format!("hipv4-amdgcn-amd-amdhsa--{arch}"),
            )]
        } else {
            Vec::new()
        };
        w.add_kernel_with_metadata(key, arch, data, extra).unwrap();
    }
    w.add_kernel("empty#0", "gfx1100", Vec::new()).unwrap();
    let mut out = Vec::new();
    w.write_to(&mut out, &|_| {}).unwrap();
    out
}

fn toc_of(bytes: &[u8]) -> (Value<'_>, usize) {
    let toc_offset = u64::from_le_bytes(bytes[8..16].try_into().unwrap()) as usize;
    decode_slice(&bytes[toc_offset..]).unwrap()
}

/// (key, arch, metadata keys in order, metadata) of every entry, in file order.
fn entries<'a>(toc: &Value<'a>) -> Vec<(String, String, Vec<String>, Option<Value<'a>>)> {
    let Some(Value::Map(bins)) = toc.get("toc") else {
        panic!("no toc map")
    };
    let mut out = Vec::new();
    for (k, arches) in bins {
        let Value::Map(arches) = arches else { panic!() };
        for (a, entry) in arches {
            let meta = entry.get("metadata").cloned();
            let keys = match &meta {
                Some(Value::Map(pairs)) => pairs
                    .iter()
                    .map(|(k, _)| k.as_str().unwrap().to_owned())
                    .collect(),
                _ => Vec::new(),
            };
            out.push((
                k.as_str().unwrap().to_owned(),
                a.as_str().unwrap().to_owned(),
                keys,
                meta,
            ));
        }
    }
    out
}

#[test]
fn zstd_entries_record_frame_and_digest_after_existing_keys() {
    let bytes = write(Compression::Zstd { level: 3 }, false, true);
    let (toc, _) = toc_of(&bytes);
    let mut kernels = golden_zstd_kernels()
        .into_iter()
        .map(|(k, a, d)| (k.to_owned(), a.to_owned(), d))
        .collect::<Vec<_>>();
    kernels.push(("empty#0".into(), "gfx1100".into(), Vec::new()));
    let found = entries(&toc);
    assert_eq!(found.len(), kernels.len());
    for (key, arch, keys, meta) in found {
        let meta = meta.unwrap();
        let data = &kernels
            .iter()
            .find(|k| k.0 == key && k.1 == arch)
            .unwrap()
            .2;
        if key == "empty#0" {
            assert_eq!(keys, ["frame", "blake3"]);
        } else {
            assert_eq!(keys, ["target", "frame", "blake3"]);
        }
        let Some(Value::Array(frame)) = meta.get("frame") else {
            panic!("{key}: no frame")
        };
        let [Value::Uint(offset), Value::Uint(size)] = frame.as_slice() else {
            panic!("{key}: frame {frame:?}")
        };
        let (offset, size) = (*offset as usize, *size as usize);
        assert_eq!(
            u32::from_le_bytes(bytes[offset..offset + 4].try_into().unwrap()) as usize,
            size,
            "{key} [{arch}]: size word"
        );
        let decoded =
            zstd::bulk::decompress(&bytes[offset + 4..offset + 4 + size], 1 << 20).unwrap();
        assert_eq!(&decoded, data, "{key} [{arch}]");
        assert_eq!(
            meta.get("blake3"),
            Some(&Value::Bin(blake3::hash(data).as_bytes())),
            "{key} [{arch}]"
        );
    }
    // The reader sees the same digests.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.kpack");
    std::fs::write(&path, &bytes).unwrap();
    let a = Archive::open(&path).unwrap();
    for (k, arch, d) in &kernels {
        assert_eq!(a.kernel_digest(k, arch), Some(*blake3::hash(d).as_bytes()));
        assert_eq!(&a.get_kernel(k, arch).unwrap(), d);
    }
}

#[test]
fn none_entries_record_only_the_digest() {
    let bytes = write(Compression::None, false, false);
    let (toc, _) = toc_of(&bytes);
    for (key, _, keys, _) in entries(&toc) {
        assert_eq!(keys, ["blake3"], "{key}");
    }
}

#[test]
fn reference_layout_adds_nothing() {
    for compression in [Compression::None, Compression::Zstd { level: 3 }] {
        let plain = write(compression, true, false);
        let (toc, _) = toc_of(&plain);
        for (key, _, _, meta) in entries(&toc) {
            assert_eq!(meta, None, "{key}");
        }
        // Existing metadata is kept as it is.
        let with_meta = write(compression, true, true);
        let (toc, _) = toc_of(&with_meta);
        for (key, _, keys, _) in entries(&toc) {
            let want: &[&str] = if key == "empty#0" { &[] } else { &["target"] };
            assert_eq!(keys, want, "{key}");
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.kpack");
        std::fs::write(&path, &plain).unwrap();
        let a = Archive::open(&path).unwrap();
        assert_eq!(a.kernel_digest("lib/libhip.so#0", "gfx1100"), None);
    }
}

#[test]
fn toc_digest_covers_exactly_the_toc_object() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = write(Compression::Zstd { level: 3 }, false, false);
    let toc_offset = u64::from_le_bytes(bytes[8..16].try_into().unwrap()) as usize;
    let path = dir.path().join("a.kpack");
    std::fs::write(&path, &bytes).unwrap();
    let want = *blake3::hash(&bytes[toc_offset..]).as_bytes();
    assert_eq!(Archive::open(&path).unwrap().toc_digest(), want);
    // Trailing bytes after the TOC object do not change it.
    let mut trailing = bytes.clone();
    trailing.extend_from_slice(b"trailing junk");
    std::fs::write(&path, &trailing).unwrap();
    assert_eq!(Archive::open(&path).unwrap().toc_digest(), want);
    // Another TOC (the reference layout of the same kernels) has another digest.
    std::fs::write(&path, write(Compression::Zstd { level: 3 }, true, false)).unwrap();
    assert_ne!(Archive::open(&path).unwrap().toc_digest(), want);
}
