//! `frame_blake3`: the digest of each kernel's compressed frame, checked before decoding instead
//! of hashing the decoded bytes; `verify` checks it and `blake3` both; archives without it keep
//! the decoded-bytes check.

use std::path::{Path, PathBuf};

use rocm_kpack::error::hex;
use rocm_kpack::{Archive, ArchiveWriter, Compression, Error, ErrorKind};

use crate::cli::kpack_fuse;
use crate::support::craft::*;

/// Incompressible (zstd stores it raw, so a flipped byte still decodes), then a compressible one.
fn kernels() -> Vec<(&'static str, &'static str, Vec<u8>)> {
    vec![
        ("lib/a.so#0", "gfx1100", incompressible(11, 6000)),
        ("lib/b.so#0", "gfx1100", b"another kernel".repeat(50)),
    ]
}

fn write_zstd(dir: &Path) -> (PathBuf, Vec<u8>) {
    let mut w = ArchiveWriter::new(
        "g",
        "f",
        vec!["gfx1100".into()],
        Compression::Zstd { level: 3 },
    )
    .unwrap();
    for (k, a, d) in kernels() {
        w.add_kernel(k, a, d).unwrap();
    }
    let mut bytes = Vec::new();
    w.write_to(&mut bytes, &|_| {}).unwrap();
    let path = dir.join("a.kpack");
    std::fs::write(&path, &bytes).unwrap();
    (path, bytes)
}

/// The byte range of a kernel's frame (after its size word).
fn frame_range(path: &Path, key: &str) -> std::ops::Range<usize> {
    let a = Archive::open(path).unwrap();
    let k = a.locate(key, "gfx1100").unwrap();
    k.stored.offset as usize..(k.stored.offset + k.stored.size) as usize
}

/// Flips the first byte of the only occurrence of `digest` in `bytes`; returns the new digest.
fn alter_digest(bytes: &mut [u8], digest: &[u8; 32]) -> [u8; 32] {
    let hits: Vec<usize> = bytes
        .windows(32)
        .enumerate()
        .filter(|(_, w)| w == digest)
        .map(|(i, _)| i)
        .collect();
    assert_eq!(hits.len(), 1, "the TOC records the digest once");
    bytes[hits[0]] ^= 0x01;
    bytes[hits[0]..hits[0] + 32].try_into().unwrap()
}

#[test]
fn the_frame_digest_is_exposed_and_reads_skip_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let (path, bytes) = write_zstd(dir.path());
    let a = Archive::open(&path).unwrap();
    for (key, arch, data) in kernels() {
        let k = a.locate(key, arch).unwrap();
        let range = frame_range(&path, key);
        assert_eq!(
            k.frame_digest,
            Some(*blake3::hash(&bytes[range.clone()]).as_bytes())
        );
        assert_eq!(k.digest, Some(*blake3::hash(&data).as_bytes()));
        let mut frame = vec![7u8; 3];
        let start = a.read_verified_frame(&k, &mut frame).unwrap();
        let frame = &frame[start..];
        assert_eq!(frame, &bytes[range]);
        assert_eq!(zstd::bulk::decompress(frame, 1 << 20).unwrap(), data);
        assert_eq!(a.get_kernel(key, arch).unwrap(), data);
    }
}

#[test]
fn a_flipped_frame_byte_is_refused_before_decoding() {
    let dir = tempfile::tempdir().unwrap();
    let (path, mut bytes) = write_zstd(dir.path());
    let range = frame_range(&path, "lib/a.so#0");
    let recorded = *blake3::hash(&bytes[range.clone()]).as_bytes();
    bytes[range.start + range.len() / 2] ^= 0x20;
    let actual = *blake3::hash(&bytes[range.clone()]).as_bytes();
    // Still a valid frame of the right size: only a digest can tell.
    let decoded = zstd::bulk::decompress(&bytes[range], 1 << 20).unwrap();
    assert_eq!(decoded.len(), 6000);
    std::fs::write(&path, &bytes).unwrap();

    let a = Archive::open(&path).unwrap();
    let e = a.get_kernel("lib/a.so#0", "gfx1100").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::DecompressionFailed);
    assert!(
        matches!(e, Error::DigestMismatch { of_frame: true, .. }),
        "{e:?}"
    );
    assert_eq!(
        e.to_string(),
        format!(
            "{}: kernel lib/a.so#0 [gfx1100]: BLAKE3 digest mismatch: the compressed frame's \
             bytes hash to {}, the archive records {} (the archive was modified after it was \
             written)",
            path.display(),
            hex(&actual),
            hex(&recorded)
        )
    );
    // The caller's buffer is never written: the frame is refused before decoding.
    let k = a.locate("lib/a.so#0", "gfx1100").unwrap();
    let mut buf = vec![0xaau8; 6000];
    assert!(a.read_into(&k, &mut buf).is_err());
    assert!(buf.iter().all(|b| *b == 0xaa));
    let mut frame = Vec::new();
    let e = a.read_verified_frame(&k, &mut frame).unwrap_err();
    assert!(
        matches!(e, Error::DigestMismatch { of_frame: true, .. }),
        "{e:?}"
    );
    assert!(frame.is_empty());
    assert_eq!(
        a.get_kernel("lib/b.so#0", "gfx1100").unwrap(),
        kernels()[1].2
    );

    let o = kpack_fuse(&[&"cat", &path, &"lib/a.so#0", &"gfx1100"]);
    assert_eq!(o.status.code(), Some(6));
    assert!(o.stdout.is_empty());
    let o = kpack_fuse(&[&"verify", &path]);
    assert_eq!(o.status.code(), Some(6));
    assert!(
        String::from_utf8_lossy(&o.stderr).starts_with(&format!(
            "BAD {}: lib/a.so#0 [gfx1100]: BLAKE3 digest mismatch: the compressed frame's bytes \
             hash to {}",
            path.display(),
            hex(&actual)
        )),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn an_altered_frame_digest_in_the_toc_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (path, mut bytes) = write_zstd(dir.path());
    let range = frame_range(&path, "lib/b.so#0");
    let actual = *blake3::hash(&bytes[range]).as_bytes();
    let altered = alter_digest(&mut bytes, &actual);
    std::fs::write(&path, &bytes).unwrap();
    let a = Archive::open(&path).unwrap();
    assert_eq!(
        a.locate("lib/b.so#0", "gfx1100").unwrap().frame_digest,
        Some(altered)
    );
    let e = a.get_kernel("lib/b.so#0", "gfx1100").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::DecompressionFailed);
    assert_eq!(
        e.reason(),
        format!(
            "BLAKE3 digest mismatch: the compressed frame's bytes hash to {}, the archive \
             records {} (the archive was modified after it was written)",
            hex(&actual),
            hex(&altered)
        )
    );
    assert_eq!(
        a.get_kernel("lib/a.so#0", "gfx1100").unwrap(),
        kernels()[0].2
    );
    let o = kpack_fuse(&[&"cat", &path, &"lib/b.so#0", &"gfx1100"]);
    assert_eq!(o.status.code(), Some(6));
    assert!(o.stdout.is_empty());
}

#[test]
fn verify_reports_a_blake3_that_disagrees_with_a_correct_frame_digest() {
    let dir = tempfile::tempdir().unwrap();
    let (path, mut bytes) = write_zstd(dir.path());
    let data = &kernels()[1].2;
    let altered = alter_digest(&mut bytes, blake3::hash(data).as_bytes());
    std::fs::write(&path, &bytes).unwrap();
    // Reads trust the frame digest, which is right.
    let a = Archive::open(&path).unwrap();
    assert_eq!(&a.get_kernel("lib/b.so#0", "gfx1100").unwrap(), data);
    let k = a.locate("lib/b.so#0", "gfx1100").unwrap();
    let e = a.verify_kernel(&k).unwrap_err();
    assert!(
        matches!(
            e,
            Error::DigestMismatch {
                of_frame: false,
                ..
            }
        ),
        "{e:?}"
    );
    let o = kpack_fuse(&[&"verify", &path]);
    assert_eq!(o.status.code(), Some(6));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(
        err.lines().next().unwrap(),
        format!(
            "BAD {}: lib/b.so#0 [gfx1100]: BLAKE3 digest mismatch: the decoded bytes hash to {}, \
             the archive records {} (the archive was modified after it was written)",
            path.display(),
            blake3::hash(data).to_hex(),
            hex(&altered)
        )
    );
    assert_eq!(err.matches("BAD ").count(), 1, "{err}");
}

/// A one-kernel zstd archive of incompressible bytes whose entry's metadata is `meta` plus its
/// `frame`, with a byte of the frame flipped when `flip` (it still decodes to the right size).
fn crafted(meta: Vec<(&str, V)>, flip: bool) -> (Vec<u8>, Vec<u8>) {
    let data = incompressible(5, 3000);
    let (mut blob, mut toc) = zstd_parts(&data);
    let frame_len = blob.len() as u64 - 8;
    let mut pairs = vec![("frame", V::A(vec![V::U(68), V::U(frame_len)]))];
    pairs.extend(meta);
    toc.at("toc")
        .at("k#0")
        .at("gfx900")
        .set("metadata", m(pairs));
    if flip {
        let mid = blob.len() / 2;
        blob[mid] ^= 0x20;
    }
    (archive_bytes(&blob, &toc.encode()), data)
}

#[test]
fn without_a_frame_digest_the_decoded_bytes_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.kpack");
    let data = incompressible(5, 3000);
    let digest = V::B(blake3::hash(&data).as_bytes().to_vec());
    // Only `blake3` (as written before frame digests), or a `frame_blake3` of the wrong shape,
    // which reads as absent.
    for extra in [
        vec![],
        vec![("frame_blake3", V::B(vec![0; 31]))],
        vec![("frame_blake3", s(&"0".repeat(32)))],
    ] {
        let mut meta = vec![("blake3", digest.clone())];
        meta.extend(extra);
        let (good, _) = crafted(meta.clone(), false);
        std::fs::write(&path, &good).unwrap();
        let a = Archive::open(&path).unwrap();
        assert!(a.frames_positioned());
        let k = a.locate("k#0", "gfx900").unwrap();
        assert_eq!(k.frame_digest, None);
        assert_eq!(a.get_kernel("k#0", "gfx900").unwrap(), data);
        // No frame digest vouches for the frame: read_verified_frame hands it out unchecked
        // (its caller checks the decoded bytes), with its size word and header checked.
        let mut frame = Vec::new();
        let start = a.read_verified_frame(&k, &mut frame).unwrap();
        let frame = &frame[start..];
        assert_eq!(frame, &good[72..72 + frame.len()]);

        let (bad, _) = crafted(meta, true);
        std::fs::write(&path, &bad).unwrap();
        let a = Archive::open(&path).unwrap();
        let e = a.get_kernel("k#0", "gfx900").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::DecompressionFailed);
        assert!(
            matches!(
                e,
                Error::DigestMismatch {
                    of_frame: false,
                    ..
                }
            ),
            "{e:?}"
        );
        assert!(
            e.reason()
                .starts_with("BLAKE3 digest mismatch: the decoded bytes hash to "),
            "{e}"
        );
        let o = kpack_fuse(&[&"verify", &path]);
        assert_eq!(o.status.code(), Some(6));
    }
}

#[test]
fn a_frame_digest_alone_is_checked_and_none_archives_have_no_frames() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.kpack");
    // The frame digest of the untouched frame, recorded without `blake3`.
    let (probe, data) = crafted(vec![], false);
    std::fs::write(&path, &probe).unwrap();
    let k_range = {
        let a = Archive::open(&path).unwrap();
        let k = a.locate("k#0", "gfx900").unwrap();
        k.stored.offset as usize..(k.stored.offset + k.stored.size) as usize
    };
    let fd = V::B(blake3::hash(&probe[k_range]).as_bytes().to_vec());
    for (flip, ok) in [(false, true), (true, false)] {
        let (bytes, _) = crafted(vec![("frame_blake3", fd.clone())], flip);
        std::fs::write(&path, &bytes).unwrap();
        let a = Archive::open(&path).unwrap();
        let k = a.locate("k#0", "gfx900").unwrap();
        assert_eq!(k.digest, None);
        assert!(k.frame_digest.is_some());
        match a.get_kernel("k#0", "gfx900") {
            Ok(got) => assert!(ok && got == data),
            Err(e) => {
                assert!(!ok);
                assert!(
                    matches!(e, Error::DigestMismatch { of_frame: true, .. }),
                    "{e:?}"
                );
            }
        }
    }

    // `none` archives store no frames: a frame digest there is ignored, and there is no frame to
    // hand out.
    let (blob, mut toc) = noop_parts(&data);
    toc.at("toc")
        .at("k#0")
        .at("gfx900")
        .set("metadata", m(vec![("frame_blake3", V::B(vec![1; 32]))]));
    std::fs::write(&path, archive_bytes(&blob, &toc.encode())).unwrap();
    let a = Archive::open(&path).unwrap();
    let k = a.locate("k#0", "gfx900").unwrap();
    assert_eq!(k.frame_digest, None);
    assert_eq!(a.get_kernel("k#0", "gfx900").unwrap(), data);
    let mut frame = vec![1];
    let e = a.read_verified_frame(&k, &mut frame).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    assert!(frame.is_empty());
}
