//! Every row of the spec's open/get error matrix (kpack-compat §9.3), one test each, with the
//! exact reference error code.

use std::path::Path;

use rocm_kpack::{Archive, ErrorKind};

use crate::support::craft::*;

/// The outcome the reference gives: open code, then (when open succeeds) get code of `k#0`
/// for `gfx900`.
fn outcome(path: &Path) -> (i32, Option<i32>) {
    match Archive::open(path) {
        Err(e) => (e.kind().code(), None),
        Ok(a) => (
            0,
            Some(
                a.get_kernel("k#0", "gfx900")
                    .map(|_| 0)
                    .unwrap_or_else(|e| e.kind().code()),
            ),
        ),
    }
}

fn check_bytes(bytes: &[u8], open: i32, get: Option<i32>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("case.kpack");
    std::fs::write(&path, bytes).unwrap();
    assert_eq!(outcome(&path), (open, get));
}

fn check(blob: &[u8], toc: &V, open: i32, get: Option<i32>) {
    check_bytes(&archive_bytes(blob, &toc.encode()), open, get);
}

const OK: i32 = 0;
const IO: i32 = ErrorKind::IoError as i32;
const FORMAT: i32 = ErrorKind::InvalidFormat as i32;
const VERSION: i32 = ErrorKind::UnsupportedVersion as i32;
const PARSE: i32 = ErrorKind::MsgpackParseFailed as i32;
const NOT_FOUND: i32 = ErrorKind::KernelNotFound as i32;
const DECODE: i32 = ErrorKind::DecompressionFailed as i32;

#[test]
fn valid_noop_and_zstd_open_and_get() {
    let (blob, toc) = noop_parts(&sample_kernel());
    check(&blob, &toc, OK, Some(OK));
    let (blob, toc) = zstd_parts(&sample_kernel());
    check(&blob, &toc, OK, Some(OK));
}

#[test]
fn empty_file_is_io_error() {
    check_bytes(&[], IO, None);
}

#[test]
fn short_files_and_header_only_are_invalid_format() {
    check_bytes(&noop_archive()[..8], FORMAT, None);
    check_bytes(&noop_archive()[..15], FORMAT, None);
    check_bytes(&header(b"KPAK", 1, 16), FORMAT, None);
}

#[test]
fn bad_magic_is_invalid_format() {
    for magic in [b"XPAK", b"kpak"] {
        let mut bytes = noop_archive();
        bytes[..4].copy_from_slice(magic);
        check_bytes(&bytes, FORMAT, None);
    }
}

#[test]
fn versions_other_than_one_are_unsupported() {
    for v in [0u32, 2, 999] {
        let mut bytes = noop_archive();
        bytes[4..8].copy_from_slice(&v.to_le_bytes());
        check_bytes(&bytes, VERSION, None);
    }
}

#[test]
fn toc_offset_outside_the_file_is_invalid_format() {
    let mut bytes = noop_archive();
    let len = bytes.len() as u64;
    bytes[8..16].copy_from_slice(&len.to_le_bytes());
    check_bytes(&bytes, FORMAT, None);
    bytes[8..16].copy_from_slice(&(1u64 << 63).to_le_bytes());
    check_bytes(&bytes, FORMAT, None);
}

#[test]
fn toc_offset_zero_reads_the_header_as_msgpack() {
    let mut bytes = noop_archive();
    bytes[8..16].copy_from_slice(&0u64.to_le_bytes());
    check_bytes(&bytes, PARSE, None);
}

#[test]
fn toc_that_is_an_array_or_truncated_fails_to_parse() {
    let (blob, _) = noop_parts(&sample_kernel());
    check(&blob, &V::A(vec![V::U(1)]), PARSE, None);
    let (blob, toc) = noop_parts(&sample_kernel());
    let mut bytes = archive_bytes(&blob, &toc.encode());
    bytes.truncate(bytes.len() - 3);
    check_bytes(&bytes, PARSE, None);
}

#[test]
fn garbage_after_the_toc_is_ignored() {
    let mut bytes = noop_archive();
    bytes.extend_from_slice(b"\xc1\xc1garbage");
    check_bytes(&bytes, OK, Some(OK));
}

#[test]
fn missing_unknown_or_int_scheme_means_none() {
    for scheme in [None, Some(s("lz4")), Some(V::U(1))] {
        let (blob, mut toc) = noop_parts(&sample_kernel());
        match scheme {
            None => toc.remove("compression_scheme"),
            Some(v) => toc.set("compression_scheme", v),
        }
        check(&blob, &toc, OK, Some(OK));
        let a = {
            let dir = tempfile::tempdir().unwrap();
            let p = dir.path().join("a.kpack");
            std::fs::write(&p, archive_bytes(&blob, &toc.encode())).unwrap();
            Archive::open(&p).unwrap()
        };
        assert_eq!(a.scheme(), rocm_kpack::Scheme::None);
    }
}

#[test]
fn noop_without_blobs_opens_but_get_is_not_found() {
    let (blob, mut toc) = noop_parts(&sample_kernel());
    toc.remove("blobs");
    check(&blob, &toc, OK, Some(NOT_FOUND));
}

#[test]
fn noop_blob_past_eof_is_io_error_at_get() {
    let data = sample_kernel();
    for (offset, size) in [
        (1u64 << 40, data.len() as u64),
        (64, 1 << 40),
        (u64::MAX, 2),
    ] {
        let (blob, mut toc) = noop_parts(&data);
        toc.set(
            "blobs",
            V::A(vec![m(vec![
                ("offset", V::U(offset)),
                ("size", V::U(size)),
            ])]),
        );
        check(&blob, &toc, OK, Some(IO));
    }
}

#[test]
fn noop_ordinal_beyond_blobs_is_not_found() {
    let (blob, mut toc) = noop_parts(&sample_kernel());
    toc.at("toc").at("k#0").at("gfx900").set("ordinal", V::U(1));
    check(&blob, &toc, OK, Some(NOT_FOUND));
}

#[test]
fn noop_ignores_original_size() {
    let (blob, mut toc) = noop_parts(&sample_kernel());
    toc.at("toc")
        .at("k#0")
        .at("gfx900")
        .set("original_size", V::U(3));
    check(&blob, &toc, OK, Some(OK));
}

#[test]
fn wrongly_typed_numbers_fail_to_parse() {
    let data = sample_kernel();
    let cases: Vec<(&str, V)> = vec![
        ("ordinal", s("0")),
        ("ordinal", V::I(-1)),
        ("ordinal", V::U(1 << 32)),
        ("original_size", V::F(12.0)),
        ("original_size", V::I(-5)),
    ];
    for (field, value) in cases {
        let (blob, mut toc) = noop_parts(&data);
        toc.at("toc")
            .at("k#0")
            .at("gfx900")
            .set(field, value.clone());
        check(&blob, &toc, PARSE, None);
    }
    let (blob, mut toc) = noop_parts(&data);
    toc.set(
        "blobs",
        V::A(vec![m(vec![
            ("offset", s("64")),
            ("size", V::U(data.len() as u64)),
        ])]),
    );
    check(&blob, &toc, PARSE, None);
}

/// The reference's InvalidNumericTocFieldTest: each numeric field as the string
/// "not-an-integer", with the TOC written right after the 16-byte header.
#[test]
fn invalid_numeric_toc_fields_with_toc_at_16() {
    let data = sample_kernel();
    for field in [
        "offset",
        "size",
        "zstd_offset",
        "zstd_size",
        "ordinal",
        "original_size",
    ] {
        let zstd = field.starts_with("zstd");
        let (_, mut toc) = if zstd {
            zstd_parts(&data)
        } else {
            noop_parts(&data)
        };
        let bad = s("not-an-integer");
        match field {
            "offset" | "size" => {
                let V::A(items) = toc.at("blobs") else {
                    unreachable!()
                };
                items[0].set(field, bad);
            }
            "ordinal" | "original_size" => toc.at("toc").at("k#0").at("gfx900").set(field, bad),
            _ => toc.set(field, bad),
        }
        let mut bytes = header(b"KPAK", 1, 16);
        bytes.extend_from_slice(&toc.encode());
        check_bytes(&bytes, PARSE, None);
    }
}

#[test]
fn odd_gfx_arches_are_tolerated() {
    for arches in [s("gfx900"), V::A(vec![V::U(3), s("gfx900")])] {
        let (blob, mut toc) = noop_parts(&sample_kernel());
        toc.set("gfx_arches", arches.clone());
        check(&blob, &toc, OK, Some(OK));
    }
}

#[test]
fn toc_that_is_not_a_map_gives_not_found() {
    let (blob, mut toc) = noop_parts(&sample_kernel());
    toc.set("toc", V::A(vec![]));
    check(&blob, &toc, OK, Some(NOT_FOUND));
}

/// The reference's OversizedTocDeclarationTest: a TOC of exactly five bytes declaring
/// 0xffffffff items.
#[test]
fn oversized_declarations_fail_to_parse() {
    for tag in [0xddu8, 0xdf, 0xdb, 0xc6, 0xc9] {
        let mut bytes = header(b"KPAK", 1, 16);
        bytes.extend_from_slice(&[tag, 0xff, 0xff, 0xff, 0xff]);
        check_bytes(&bytes, PARSE, None);
    }
}

#[test]
fn zstd_blob_past_eof_is_io_error() {
    let (blob, mut toc) = zstd_parts(&sample_kernel());
    toc.set("zstd_size", V::U(blob.len() as u64 + 100_000));
    check(&blob, &toc, IO, None);
}

#[test]
fn malformed_zstd_tables_are_invalid_format() {
    let data = sample_kernel();
    let (blob, toc) = zstd_parts(&data);
    // zstd_size 0, 3 and 5 GiB.
    for size in [0u64, 3, 5 << 30] {
        let mut t = toc.clone();
        t.set("zstd_size", V::U(size));
        check(&blob, &t, FORMAT, None);
    }
    // num_kernels 2^20 + 1.
    let mut b = blob.clone();
    b[..4].copy_from_slice(&((1u32 << 20) + 1).to_le_bytes());
    check(&b, &toc, FORMAT, None);
    // num_kernels larger than the frames present.
    let mut b = blob.clone();
    b[..4].copy_from_slice(&2u32.to_le_bytes());
    check(&b, &toc, FORMAT, None);
    // a frame size past the blob.
    let mut b = blob.clone();
    b[4..8].copy_from_slice(&(blob.len() as u32).to_le_bytes());
    check(&b, &toc, FORMAT, None);
    // zstd_offset missing: the "blob" is the header, whose first word is a huge count.
    let mut t = toc.clone();
    t.remove("zstd_offset");
    check(&blob, &t, FORMAT, None);
    // zstd_size missing.
    let mut t = toc.clone();
    t.remove("zstd_size");
    check(&blob, &t, FORMAT, None);
}

#[test]
fn zstd_with_no_frames_opens_but_get_is_not_found() {
    let (_, mut toc) = zstd_parts(&sample_kernel());
    let blob = frame_table(&[]);
    toc.set("zstd_size", V::U(blob.len() as u64));
    check(&blob, &toc, OK, Some(NOT_FOUND));
}

#[test]
fn corrupt_frames_and_wrong_sizes_fail_to_decode() {
    let data = sample_kernel();
    let (blob, toc) = zstd_parts(&data);
    let mut b = blob.clone();
    let n = b.len();
    for byte in &mut b[n - 8..] {
        *byte ^= 0x5a;
    }
    check(&b, &toc, OK, Some(DECODE));
    for size in [data.len() as u64 - 1, data.len() as u64 + 1, 0, 1 << 60] {
        let mut t = toc.clone();
        t.at("toc")
            .at("k#0")
            .at("gfx900")
            .set("original_size", V::U(size));
        check(&blob, &t, OK, Some(DECODE));
    }
}

#[test]
fn zstd_ordinal_beyond_frames_is_not_found() {
    let (blob, mut toc) = zstd_parts(&sample_kernel());
    toc.at("toc").at("k#0").at("gfx900").set("ordinal", V::U(5));
    check(&blob, &toc, OK, Some(NOT_FOUND));
}

#[test]
fn empty_kernel_decodes_to_nothing() {
    let (blob, toc) = zstd_parts(&[]);
    check(&blob, &toc, OK, Some(OK));
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("e.kpack");
    std::fs::write(&p, archive_bytes(&blob, &toc.encode())).unwrap();
    assert_eq!(
        Archive::open(&p)
            .unwrap()
            .get_kernel("k#0", "gfx900")
            .unwrap(),
        Vec::<u8>::new()
    );
}

#[test]
fn frame_without_content_size_decodes() {
    let data = sample_kernel();
    let mut enc = zstd::bulk::Compressor::new(3).unwrap();
    enc.include_contentsize(false).unwrap();
    let frame = enc.compress(&data).unwrap();
    assert_eq!(
        zstd::zstd_safe::get_frame_content_size(&frame).unwrap(),
        None
    );
    let (_, mut toc) = zstd_parts(&data);
    let blob = frame_table(&[frame]);
    toc.set("zstd_size", V::U(blob.len() as u64));
    check(&blob, &toc, OK, Some(OK));
}

#[test]
fn a_directory_is_invalid_format() {
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(outcome(dir.path()), (FORMAT, None));
}

#[test]
fn a_missing_file_is_file_not_found() {
    assert_eq!(
        outcome(Path::new("/nonexistent/test.kpack")),
        (ErrorKind::FileNotFound as i32, None)
    );
}

#[test]
fn bin_typed_keys_never_match_and_nil_scheme_means_none() {
    let (blob, mut toc) = noop_parts(&sample_kernel());
    toc.set("compression_scheme", V::Nil);
    check(&blob, &toc, OK, Some(OK));
    let entry = toc.at("toc").at("k#0").clone();
    toc.set("toc", V::M(vec![(V::B(b"k#0".to_vec()), entry)]));
    check(&blob, &toc, OK, Some(NOT_FOUND));
}

// ---- TOC edge cases the reference accepts -------------------------------------------------

fn entry(ordinal: u64, size: Option<u64>) -> V {
    let mut pairs = vec![("type", s("hsaco")), ("ordinal", V::U(ordinal))];
    if let Some(size) = size {
        pairs.push(("original_size", V::U(size)));
    }
    m(pairs)
}

fn open_bytes(bytes: &[u8]) -> (tempfile::TempDir, rocm_kpack::Result<Archive>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("case.kpack");
    std::fs::write(&path, bytes).unwrap();
    let a = Archive::open(&path);
    (dir, a)
}

#[test]
fn none_entry_without_original_size_reads_with_its_blob_size() {
    let data = sample_kernel();
    let (blob, mut toc) = noop_parts(&data);
    toc.at("toc").at("k#0").set("gfx900", entry(0, None));
    // A sibling with an original_size is unaffected.
    toc.at("toc")
        .at("k#0")
        .set("gfx906", entry(0, Some(data.len() as u64)));
    check(&blob, &toc, OK, Some(OK));
    let (_d, a) = open_bytes(&archive_bytes(&blob, &toc.encode()));
    let a = a.unwrap();
    assert_eq!(a.get_kernel("k#0", "gfx900").unwrap(), data);
    assert_eq!(a.get_kernel("k#0", "gfx906").unwrap(), data);
    let e: Vec<_> = a
        .entries()
        .map(|(_, e)| (e.original_size, e.has_original_size))
        .collect();
    assert_eq!(e, [(data.len() as u64, false), (data.len() as u64, true)]);
}

#[test]
fn zstd_entry_without_original_size_is_a_parse_error() {
    let (blob, mut toc) = zstd_parts(&sample_kernel());
    toc.at("toc").at("k#0").set("gfx900", entry(0, None));
    check(&blob, &toc, PARSE, None);
    // Also when the scheme comes after the TOC map decided nothing yet.
    let (blob, toc) = zstd_parts(&sample_kernel());
    let V::M(mut pairs) = toc else { unreachable!() };
    let scheme = pairs
        .iter()
        .position(|(k, _)| matches!(k, V::S(x) if x == "compression_scheme"))
        .unwrap();
    let scheme = pairs.remove(scheme);
    pairs.insert(0, scheme);
    let mut toc = V::M(pairs);
    toc.at("toc").at("k#0").set("gfx900", entry(0, None));
    check(&blob, &toc, PARSE, None);
}

#[test]
fn a_binary_with_an_empty_arch_map_is_not_listed() {
    let data = sample_kernel();
    let (blob, mut toc) = noop_parts(&data);
    toc.at("toc").set("a/empty.so#0", m(vec![]));
    toc.at("toc").set("z/empty.so#0", m(vec![]));
    let (_d, a) = open_bytes(&archive_bytes(&blob, &toc.encode()));
    let a = a.unwrap();
    let keys: Vec<_> = a.binaries().map(|b| b.key).collect();
    assert_eq!(keys, ["k#0"]);
    assert_eq!(a.get_kernel("k#0", "gfx900").unwrap(), data);
}

/// `toc` with the root key `name` given twice: `first`, then `second`.
fn with_root_twice(toc: &V, name: &str, first: V, second: V) -> V {
    let V::M(pairs) = toc else { unreachable!() };
    let mut pairs: Vec<(V, V)> = pairs
        .iter()
        .filter(|(k, _)| !matches!(k, V::S(x) if x == name))
        .cloned()
        .collect();
    pairs.push((s(name), first));
    pairs.push((s(name), second));
    V::M(pairs)
}

#[test]
fn a_repeated_key_counts_at_its_first_occurrence() {
    let data = sample_kernel();
    let n = data.len() as u64;
    let (blob, toc) = noop_parts(&data);
    // Root: the scheme, the blobs list and the toc map.
    let scheme = with_root_twice(&toc, "compression_scheme", s("none"), s("zstd-per-kernel"));
    check(&blob, &scheme, OK, Some(OK));
    let scheme = with_root_twice(&toc, "compression_scheme", s("zstd-per-kernel"), s("none"));
    check(&blob, &scheme, FORMAT, None);
    let good_blobs = V::A(vec![m(vec![("offset", V::U(64)), ("size", V::U(n))])]);
    let blobs = with_root_twice(&toc, "blobs", good_blobs.clone(), V::A(vec![]));
    check(&blob, &blobs, OK, Some(OK));
    let blobs = with_root_twice(&toc, "blobs", V::A(vec![]), good_blobs);
    check(&blob, &blobs, OK, Some(NOT_FOUND));
    let good_toc = m(vec![("k#0", m(vec![("gfx900", entry(0, Some(n)))]))]);
    let tocs = with_root_twice(&toc, "toc", good_toc.clone(), m(vec![]));
    check(&blob, &tocs, OK, Some(OK));
    let tocs = with_root_twice(&toc, "toc", m(vec![]), good_toc);
    check(&blob, &tocs, OK, Some(NOT_FOUND));

    // A binary key, an arch, an entry field: first wins.
    let bin = |first: u64, second: u64| {
        let mut t = toc.clone();
        *t.at("toc") = V::M(vec![
            (s("k#0"), m(vec![("gfx900", entry(first, Some(n)))])),
            (s("k#0"), m(vec![("gfx900", entry(second, Some(n)))])),
        ]);
        t
    };
    check(&blob, &bin(0, 9), OK, Some(OK));
    check(&blob, &bin(9, 0), OK, Some(NOT_FOUND));
    let arch = |first: u64, second: u64| {
        let mut t = toc.clone();
        *t.at("toc").at("k#0") = V::M(vec![
            (s("gfx900"), entry(first, Some(n))),
            (s("gfx900"), entry(second, Some(n))),
        ]);
        t
    };
    check(&blob, &arch(0, 9), OK, Some(OK));
    check(&blob, &arch(9, 0), OK, Some(NOT_FOUND));
    let field = |first: u64, second: u64| {
        let mut t = toc.clone();
        *t.at("toc").at("k#0").at("gfx900") = V::M(vec![
            (s("type"), s("hsaco")),
            (s("ordinal"), V::U(first)),
            (s("ordinal"), V::U(second)),
            (s("original_size"), V::U(n)),
        ]);
        t
    };
    check(&blob, &field(0, 9), OK, Some(OK));
    check(&blob, &field(9, 0), OK, Some(NOT_FOUND));
    // A binary whose first occurrence is empty has no kernels, even if a later one has some.
    let mut t = toc.clone();
    *t.at("toc") = V::M(vec![
        (s("k#0"), m(vec![])),
        (s("k#0"), m(vec![("gfx900", entry(0, Some(n)))])),
    ]);
    let (_d, a) = open_bytes(&archive_bytes(&blob, &t.encode()));
    assert!(a.unwrap().binary_count() == 0);
}
