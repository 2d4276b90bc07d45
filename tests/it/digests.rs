//! The metadata our writer adds to TOC entries (frame positions, BLAKE3 digests), the archive's
//! TOC digest, and the reference layout that leaves them out.

use rocm_kpack::archive::msgpack::{Value, decode_slice};
use rocm_kpack::{Archive, ArchiveWriter, Compression, ErrorKind};

use crate::cli::kpack_fuse;
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
            assert_eq!(keys, ["frame", "blake3", "frame_blake3"]);
        } else {
            assert_eq!(keys, ["target", "frame", "blake3", "frame_blake3"]);
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
        assert_eq!(
            meta.get("frame_blake3"),
            Some(&Value::Bin(
                blake3::hash(&bytes[offset + 4..offset + 4 + size]).as_bytes()
            )),
            "{key} [{arch}]"
        );
    }
    // The reader sees the same digests.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.kpack");
    std::fs::write(&path, &bytes).unwrap();
    let a = Archive::open(&path).unwrap();
    for (k, arch, d) in &kernels {
        assert_eq!(
            a.kernel_digest(k, arch).unwrap(),
            Some(*blake3::hash(d).as_bytes())
        );
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
        assert_eq!(a.kernel_digest("lib/libhip.so#0", "gfx1100").unwrap(), None);
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

/// Two kernels, the first (incompressible, so zstd stores it raw) altered after packing.
fn tampered_kernels() -> Vec<(&'static str, &'static str, Vec<u8>)> {
    vec![
        ("lib/a.so#0", "gfx1100", craft::incompressible(3, 5000)),
        ("lib/b.so#0", "gfx1100", b"intact kernel".repeat(40)),
    ]
}

fn tampered(compression: Compression) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.kpack");
    std::fs::write(
        &path,
        craft::flipped_archive(compression, &tampered_kernels(), 0),
    )
    .unwrap();
    (dir, path)
}

const SCHEMES: [Compression; 2] = [Compression::None, Compression::Zstd { level: 3 }];

#[test]
fn a_flipped_byte_that_still_decodes_is_refused() {
    for compression in SCHEMES {
        let (_dir, path) = tampered(compression);
        let a = Archive::open(&path).unwrap();
        let e = a.get_kernel("lib/a.so#0", "gfx1100").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::DecompressionFailed, "{e}");
        let msg = e.to_string();
        // zstd entries carry a frame digest, checked before decoding; `none` ones only `blake3`.
        let kref = a.locate("lib/a.so#0", "gfx1100").unwrap();
        let (what, recorded) = match compression {
            Compression::None => ("decoded bytes", kref.digest),
            Compression::Zstd { .. } => ("compressed frame's bytes", kref.frame_digest),
        };
        assert!(
            msg.starts_with(&format!(
                "{}: kernel lib/a.so#0 [gfx1100]: BLAKE3 digest mismatch: the {what} hash to ",
                path.display()
            )),
            "{msg}"
        );
        let recorded = rocm_kpack::error::hex(&recorded.unwrap());
        assert!(
            msg.contains(&format!("the archive records {recorded}")),
            "{msg}"
        );
        // A caller's buffer never keeps the altered bytes: zeroed after a failed check of the
        // decoded bytes, never written when the frame was refused before decoding.
        let mut buf = vec![0xaau8; kref.size as usize];
        assert!(a.read_into(&kref, &mut buf).is_err());
        let left = match compression {
            Compression::None => 0,
            Compression::Zstd { .. } => 0xaa,
        };
        assert!(buf.iter().all(|b| *b == left));
        // Its sibling is unaffected.
        assert_eq!(
            a.get_kernel("lib/b.so#0", "gfx1100").unwrap(),
            tampered_kernels()[1].2
        );
    }
}

#[test]
fn verify_cat_and_extract_fail_on_a_flipped_byte() {
    for compression in SCHEMES {
        let (dir, path) = tampered(compression);
        let o = kpack_fuse(&[&"verify", &path]);
        assert_eq!(o.status.code(), Some(6));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.starts_with(&format!(
                "BAD {}: lib/a.so#0 [gfx1100]: BLAKE3 digest mismatch: ",
                path.display()
            )),
            "{err}"
        );
        assert_eq!(err.matches("BAD ").count(), 1, "{err}");

        let o = kpack_fuse(&[&"cat", &path, &"lib/a.so#0", &"gfx1100"]);
        assert_eq!(o.status.code(), Some(6));
        assert!(o.stdout.is_empty());
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains(&format!(
                "{}: kernel lib/a.so#0 [gfx1100]: BLAKE3 digest mismatch",
                path.display()
            )),
            "{err}"
        );
        let o = kpack_fuse(&[&"cat", &path, &"lib/b.so#0", &"gfx1100"]);
        assert_eq!(o.status.code(), Some(0));
        assert_eq!(o.stdout, tampered_kernels()[1].2);

        let dest = dir.path().join("out");
        let o = kpack_fuse(&[&"extract", &path, &dest]);
        assert_eq!(
            o.status.code(),
            Some(6),
            "{}",
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(!dest.join("lib/a.so#0/gfx1100.hsaco").exists());
    }
}

#[test]
fn zero_byte_kernels_have_digests() {
    let bytes = write(Compression::Zstd { level: 3 }, false, false);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("z.kpack");
    std::fs::write(&path, &bytes).unwrap();
    let a = Archive::open(&path).unwrap();
    assert_eq!(
        a.kernel_digest("empty#0", "gfx1100").unwrap(),
        Some(*blake3::hash(b"").as_bytes())
    );
    // An empty kernel still has a (non-empty) frame, and a digest of it.
    let kref = a.locate("empty#0", "gfx1100").unwrap();
    let frame =
        &bytes[kref.stored.offset as usize..(kref.stored.offset + kref.stored.size) as usize];
    assert!(!frame.is_empty());
    assert_eq!(kref.frame_digest, Some(*blake3::hash(frame).as_bytes()));
    let mut got = Vec::new();
    let start = a.read_verified_frame(&kref, &mut got).unwrap();
    assert_eq!(&got[start..], frame);
    assert_eq!(a.get_kernel("empty#0", "gfx1100").unwrap(), b"");
    let o = kpack_fuse(&[&"verify", &path]);
    assert_eq!(o.status.code(), Some(0));
    assert_eq!(String::from_utf8_lossy(&o.stderr), "");
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "ok: 4 kernels in 1 archive, each decoded to its recorded size and BLAKE3 digest\n"
    );
}

#[test]
fn verify_says_when_an_archive_has_no_digests() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ref.kpack");
    std::fs::write(&path, write(Compression::Zstd { level: 3 }, true, false)).unwrap();
    let o = kpack_fuse(&[&"verify", &path]);
    assert_eq!(o.status.code(), Some(0));
    assert_eq!(String::from_utf8_lossy(&o.stderr), "");
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        format!(
            "{}: has no BLAKE3 digests (written by the reference tooling or with \
             --reference-layout); checked by sizes only\n\
             ok: 4 kernels in 1 archive, each decoded to its recorded size (no digests to check)\n",
            path.display()
        )
    );
}

/// Entries with a frame digest but no digest of the kernel (the `blake3` key renamed in place)
/// are digested: verify checks their frames and says so, instead of "has no BLAKE3 digests".
#[test]
fn verify_counts_entries_with_only_a_frame_digest() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = write(Compression::Zstd { level: 3 }, false, false);
    let (needle, renamed) = (b"\xa6blake3", b"\xa6blakeX");
    let all: Vec<usize> = bytes
        .windows(needle.len())
        .enumerate()
        .filter(|(_, w)| w == needle)
        .map(|(i, _)| i)
        .collect();
    assert_eq!(all.len(), 4, "one blake3 key per kernel");
    for (name, renaming, closing) in [
        ("frame.kpack", &all[..], "its frame to its BLAKE3 digest"),
        (
            "mixed.kpack",
            &all[..1],
            "3 of them also to their BLAKE3 digest, 1 only their frame to its BLAKE3 digest",
        ),
    ] {
        let mut b = bytes.clone();
        for &at in renaming {
            b[at..at + renamed.len()].copy_from_slice(renamed);
        }
        let path = dir.path().join(name);
        std::fs::write(&path, &b).unwrap();
        let o = kpack_fuse(&[&"verify", &path]);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!((o.status.code(), stderr.as_ref()), (Some(0), ""));
        assert_eq!(
            String::from_utf8_lossy(&o.stdout),
            format!("ok: 4 kernels in 1 archive, each decoded to its recorded size, {closing}\n")
        );
    }
}

#[test]
fn list_json_shows_digests_in_hex() {
    let dir = tempfile::tempdir().unwrap();
    for (name, reference) in [("ours.kpack", false), ("ref.kpack", true)] {
        let path = dir.path().join(name);
        std::fs::write(&path, write(Compression::None, reference, false)).unwrap();
        let o = kpack_fuse(&[&"list", &"--json", &path]);
        assert_eq!(o.status.code(), Some(0));
        let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let kernels = doc["kernels"].as_array().unwrap();
        assert_eq!(kernels.len(), 4);
        for k in kernels {
            let key = k["key"].as_str().unwrap();
            let arch = k["arch"].as_str().unwrap();
            let data = golden_zstd_kernels()
                .into_iter()
                .find(|g| g.0 == key && g.1 == arch)
                .map_or(Vec::new(), |g| g.2);
            let want = if reference {
                serde_json::Value::Null
            } else {
                serde_json::Value::String(blake3::hash(&data).to_hex().to_string())
            };
            assert_eq!(k["blake3"], want, "{name} {key} {arch}");
        }
    }
}

#[test]
fn mount_gives_eio_for_a_flipped_byte_and_logs_it() {
    use crate::support::mount::{Mount, fuse_available};
    if !fuse_available() {
        return;
    }
    for compression in SCHEMES {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.kpack");
        let mut kernels = tampered_kernels();
        kernels.push(("lib/c.so#0", "gfx1100", b"third".repeat(300)));
        std::fs::write(&path, craft::flipped_archive(compression, &kernels, 0)).unwrap();
        let m = Mount::start(&path, &[]);
        // Exactly EIO (twice: never cached), the neighbours byte-exact.
        m.check("corrupt", "lib/a.so#0/gfx1100.hsaco");
        let log = m.daemon_log();
        // zstd: the frame digest caught it before decoding.
        let what = match compression {
            Compression::None => "decoded bytes",
            Compression::Zstd { .. } => "compressed frame's bytes",
        };
        assert!(
            log.contains(&format!(
                "{}: kernel lib/a.so#0 [gfx1100]: BLAKE3 digest mismatch: the {what} hash to",
                path.display()
            )),
            "the mismatch is logged with archive, key and arch:\n{log}"
        );
        m.stop();
    }
}
