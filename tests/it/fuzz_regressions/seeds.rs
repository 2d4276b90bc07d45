//! The fuzz seed corpora, generated from the open matrix's malformed cases (the same builders as
//! `open_matrix.rs`) plus a few hostile documents, each archive with the outcome the reference
//! gives. The files under `tests/fixtures/fuzz/` are this list written out; a test checks they
//! still match, and `KPACK_BLESS_FUZZ_SEEDS=1 cargo test fuzz_regressions` rewrites them.

use rocm_kpack::ErrorKind::{self, *};

use crate::support::craft::*;

/// A whole-file seed and what `Archive::open` and the probe `get_kernel("k#0", "gfx900")` give.
pub struct ArchiveSeed {
    pub name: String,
    pub bytes: Vec<u8>,
    pub open: Result<(), ErrorKind>,
    /// `None` when open fails.
    pub probe: Option<Result<(), ErrorKind>>,
}

fn patched(mut bytes: Vec<u8>, at: usize, with: &[u8]) -> Vec<u8> {
    bytes[at..at + with.len()].copy_from_slice(with);
    bytes
}

/// Every open-matrix case as bytes with its expected outcome.
pub fn archive_seeds() -> Vec<ArchiveSeed> {
    let mut out = Vec::new();
    let mut add = |name: &str,
                   bytes: Vec<u8>,
                   open: Result<(), ErrorKind>,
                   probe: Option<Result<(), ErrorKind>>| {
        out.push(ArchiveSeed {
            name: name.to_owned(),
            bytes,
            open,
            probe,
        })
    };
    let ok = Some(Ok(()));
    let data = sample_kernel();
    let (nblob, ntoc) = noop_parts(&data);
    let (zblob, ztoc) = zstd_parts(&data);
    let with_toc = |blob: &[u8], toc: &V| archive_bytes(blob, &toc.encode());
    let noop_with = |f: &dyn Fn(&mut V)| {
        let mut t = ntoc.clone();
        f(&mut t);
        archive_bytes(&nblob, &t.encode())
    };
    let zstd_with = |f: &dyn Fn(&mut V)| {
        let mut t = ztoc.clone();
        f(&mut t);
        archive_bytes(&zblob, &t.encode())
    };
    let entry_set = |field: &'static str, v: V| {
        move |t: &mut V| t.at("toc").at("k#0").at("gfx900").set(field, v.clone())
    };

    add("valid-noop", noop_archive(), Ok(()), ok);
    add("valid-zstd", with_toc(&zblob, &ztoc), Ok(()), ok);
    add(
        "golden-noop",
        include_bytes!("../../fixtures/test_noop.kpack").to_vec(),
        Ok(()),
        Some(Err(KernelNotFound)),
    );
    add(
        "golden-zstd",
        include_bytes!("../../fixtures/test_zstd.kpack").to_vec(),
        Ok(()),
        Some(Err(KernelNotFound)),
    );
    add("empty-file", vec![], Err(IoError), None);
    add(
        "short-8",
        noop_archive()[..8].to_vec(),
        Err(InvalidFormat),
        None,
    );
    add(
        "short-15",
        noop_archive()[..15].to_vec(),
        Err(InvalidFormat),
        None,
    );
    add(
        "header-only",
        header(b"KPAK", 1, 16),
        Err(InvalidFormat),
        None,
    );
    add(
        "magic-XPAK",
        patched(noop_archive(), 0, b"XPAK"),
        Err(InvalidFormat),
        None,
    );
    add(
        "magic-lowercase",
        patched(noop_archive(), 0, b"kpak"),
        Err(InvalidFormat),
        None,
    );
    for v in [0u32, 2, 999] {
        add(
            &format!("version-{v}"),
            patched(noop_archive(), 4, &v.to_le_bytes()),
            Err(UnsupportedVersion),
            None,
        );
    }
    let len = noop_archive().len() as u64;
    add(
        "toc-offset-at-eof",
        patched(noop_archive(), 8, &len.to_le_bytes()),
        Err(InvalidFormat),
        None,
    );
    add(
        "toc-offset-2e63",
        patched(noop_archive(), 8, &(1u64 << 63).to_le_bytes()),
        Err(InvalidFormat),
        None,
    );
    add(
        "toc-offset-zero",
        patched(noop_archive(), 8, &0u64.to_le_bytes()),
        Err(MsgpackParseFailed),
        None,
    );
    add(
        "toc-is-array",
        with_toc(&nblob, &V::A(vec![V::U(1)])),
        Err(MsgpackParseFailed),
        None,
    );
    let n = noop_archive().len();
    add(
        "toc-truncated",
        noop_archive()[..n - 3].to_vec(),
        Err(MsgpackParseFailed),
        None,
    );
    add(
        "garbage-after-toc",
        [noop_archive(), b"\xc1\xc1garbage".to_vec()].concat(),
        Ok(()),
        ok,
    );
    add(
        "scheme-missing",
        noop_with(&|t| t.remove("compression_scheme")),
        Ok(()),
        ok,
    );
    add(
        "scheme-lz4",
        noop_with(&|t| t.set("compression_scheme", s("lz4"))),
        Ok(()),
        ok,
    );
    add(
        "scheme-int",
        noop_with(&|t| t.set("compression_scheme", V::U(1))),
        Ok(()),
        ok,
    );
    add(
        "scheme-nil",
        noop_with(&|t| t.set("compression_scheme", V::Nil)),
        Ok(()),
        ok,
    );
    add(
        "noop-no-blobs",
        noop_with(&|t| t.remove("blobs")),
        Ok(()),
        Some(Err(KernelNotFound)),
    );
    for (i, (offset, size)) in [
        (1u64 << 40, data.len() as u64),
        (64, 1 << 40),
        (u64::MAX, 2),
    ]
    .into_iter()
    .enumerate()
    {
        let blobs = V::A(vec![m(vec![
            ("offset", V::U(offset)),
            ("size", V::U(size)),
        ])]);
        add(
            &format!("noop-blob-past-eof-{i}"),
            noop_with(&|t| t.set("blobs", blobs.clone())),
            Ok(()),
            Some(Err(IoError)),
        );
    }
    add(
        "noop-ordinal-beyond",
        noop_with(&entry_set("ordinal", V::U(1))),
        Ok(()),
        Some(Err(KernelNotFound)),
    );
    add(
        "noop-original-size-ignored",
        noop_with(&entry_set("original_size", V::U(3))),
        Ok(()),
        ok,
    );
    let typed: [(&str, &str, V); 5] = [
        ("ordinal-str", "ordinal", s("0")),
        ("ordinal-negative", "ordinal", V::I(-1)),
        ("ordinal-2e32", "ordinal", V::U(1 << 32)),
        ("original-size-float", "original_size", V::F(12.0)),
        ("original-size-negative", "original_size", V::I(-5)),
    ];
    for (name, field, v) in typed {
        add(
            &format!("typed-{name}"),
            noop_with(&entry_set(field, v)),
            Err(MsgpackParseFailed),
            None,
        );
    }
    let str_offset = V::A(vec![m(vec![
        ("offset", s("64")),
        ("size", V::U(data.len() as u64)),
    ])]);
    add(
        "typed-blob-offset-str",
        noop_with(&|t| t.set("blobs", str_offset.clone())),
        Err(MsgpackParseFailed),
        None,
    );
    for field in [
        "offset",
        "size",
        "zstd_offset",
        "zstd_size",
        "ordinal",
        "original_size",
    ] {
        let mut toc = if field.starts_with("zstd") {
            ztoc.clone()
        } else {
            ntoc.clone()
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
        let bytes = [header(b"KPAK", 1, 16), toc.encode()].concat();
        add(
            &format!("toc-at-16-bad-{field}"),
            bytes,
            Err(MsgpackParseFailed),
            None,
        );
    }
    add(
        "gfx-arches-str",
        noop_with(&|t| t.set("gfx_arches", s("gfx900"))),
        Ok(()),
        ok,
    );
    add(
        "gfx-arches-mixed",
        noop_with(&|t| t.set("gfx_arches", V::A(vec![V::U(3), s("gfx900")]))),
        Ok(()),
        ok,
    );
    add(
        "toc-not-map",
        noop_with(&|t| t.set("toc", V::A(vec![]))),
        Ok(()),
        Some(Err(KernelNotFound)),
    );
    for tag in [0xddu8, 0xdf, 0xdb, 0xc6, 0xc9] {
        let bytes = [header(b"KPAK", 1, 16), vec![tag, 0xff, 0xff, 0xff, 0xff]].concat();
        add(
            &format!("oversized-{tag:02x}"),
            bytes,
            Err(MsgpackParseFailed),
            None,
        );
    }
    let big = zblob.len() as u64 + 100_000;
    add(
        "zstd-blob-past-eof",
        zstd_with(&|t| t.set("zstd_size", V::U(big))),
        Err(IoError),
        None,
    );
    for size in [0u64, 3, 5 << 30] {
        add(
            &format!("zstd-size-{size}"),
            zstd_with(&|t| t.set("zstd_size", V::U(size))),
            Err(InvalidFormat),
            None,
        );
    }
    let count_over = patched(zblob.clone(), 0, &((1u32 << 20) + 1).to_le_bytes());
    add(
        "zstd-count-over-limit",
        with_toc(&count_over, &ztoc),
        Err(InvalidFormat),
        None,
    );
    add(
        "zstd-count-2",
        with_toc(&patched(zblob.clone(), 0, &2u32.to_le_bytes()), &ztoc),
        Err(InvalidFormat),
        None,
    );
    let past = patched(zblob.clone(), 4, &(zblob.len() as u32).to_le_bytes());
    add(
        "zstd-frame-past-blob",
        with_toc(&past, &ztoc),
        Err(InvalidFormat),
        None,
    );
    add(
        "zstd-offset-missing",
        zstd_with(&|t| t.remove("zstd_offset")),
        Err(InvalidFormat),
        None,
    );
    add(
        "zstd-size-missing",
        zstd_with(&|t| t.remove("zstd_size")),
        Err(InvalidFormat),
        None,
    );
    let empty_table = frame_table(&[]);
    let mut t = ztoc.clone();
    t.set("zstd_size", V::U(empty_table.len() as u64));
    add(
        "zstd-no-frames",
        with_toc(&empty_table, &t),
        Ok(()),
        Some(Err(KernelNotFound)),
    );
    let mut corrupt = zblob.clone();
    let zl = corrupt.len();
    corrupt[zl - 8..].iter_mut().for_each(|b| *b ^= 0x5a);
    add(
        "zstd-corrupt-frame",
        with_toc(&corrupt, &ztoc),
        Ok(()),
        Some(Err(DecompressionFailed)),
    );
    for (name, size) in [
        ("minus-1", data.len() as u64 - 1),
        ("plus-1", data.len() as u64 + 1),
        ("0", 0),
        ("2e60", 1 << 60),
    ] {
        let bytes = zstd_with(&entry_set("original_size", V::U(size)));
        add(
            &format!("zstd-original-size-{name}"),
            bytes,
            Ok(()),
            Some(Err(DecompressionFailed)),
        );
    }
    add(
        "zstd-ordinal-beyond",
        zstd_with(&entry_set("ordinal", V::U(5))),
        Ok(()),
        Some(Err(KernelNotFound)),
    );
    let (eblob, etoc) = zstd_parts(&[]);
    add("zstd-empty-kernel", with_toc(&eblob, &etoc), Ok(()), ok);
    let mut enc = zstd::bulk::Compressor::new(3).unwrap();
    enc.include_contentsize(false).unwrap();
    let unsized_table = frame_table(&[enc.compress(&data).unwrap()]);
    let mut t = ztoc.clone();
    t.set("zstd_size", V::U(unsized_table.len() as u64));
    add(
        "zstd-frame-without-size",
        with_toc(&unsized_table, &t),
        Ok(()),
        ok,
    );
    let entry = ntoc.clone().at("toc").at("k#0").clone();
    add(
        "bin-typed-key",
        noop_with(&|t| t.set("toc", V::M(vec![(V::B(b"k#0".to_vec()), entry.clone())]))),
        Ok(()),
        Some(Err(KernelNotFound)),
    );
    out
}

/// TOC seeds: the TOC of every archive seed whose header points inside it, plus hostile
/// documents for the bare decoder.
pub fn toc_seeds() -> Vec<(String, Vec<u8>)> {
    let mut out: Vec<(String, Vec<u8>)> = archive_seeds()
        .into_iter()
        .filter(|s| s.bytes.len() > 16 && &s.bytes[..4] == b"KPAK")
        .filter_map(|s| {
            let at = u64::from_le_bytes(s.bytes[8..16].try_into().unwrap());
            let at = usize::try_from(at).ok().filter(|&a| a < s.bytes.len())?;
            Some((s.name, s.bytes[at..].to_vec()))
        })
        .collect();
    out.push(("nested-arrays-200".into(), vec![0x91; 200]));
    out.push(("nested-maps-200".into(), [0x81u8, 0xa1, b'k'].repeat(200)));
    out.push((
        "map32-claims-2e32".into(),
        vec![0xdf, 0xff, 0xff, 0xff, 0xff, 0xa3, b't', b'o', b'c'],
    ));
    out.push((
        "toc-map32-claims-2e32".into(),
        [&[0x81, 0xa3][..], b"toc", &[0xdf, 0xff, 0xff, 0xff, 0xff]].concat(),
    ));
    out.push((
        "every-scalar".into(),
        vec![
            0x9f, 0xc0, 0xc2, 0xc3, 0xcc, 1, 0xd0, 0x80, 0xca, 0, 0, 0, 0, 0xcb, 0, 0, 0, 0, 0, 0,
            0, 0, 0xc4, 1, 0, 0xd4, 1, 2, 0xc7, 1, 5, 6, 0xe0, 0xd9, 1, b'x', 0xa0, 0xc1, 0, 0, 0,
        ],
    ));
    out
}

/// Frame-table seeds: the zstd seeds' blobs behind a mode byte (0: whole reads, 0x23: reads of
/// at most four bytes, 0x10: an `Interrupted` error before every read).
pub fn zstd_index_seeds() -> Vec<(String, Vec<u8>)> {
    let data = sample_kernel();
    let (blob, _) = zstd_parts(&data);
    let (empty, _) = zstd_parts(&[]);
    let two = frame_table(&[
        zstd::bulk::compress(&data, 1).unwrap(),
        zstd::bulk::compress(b"x", 1).unwrap(),
    ]);
    let mut out = Vec::new();
    for (mode, mname) in [(0u8, "whole"), (0x23, "short-reads"), (0x10, "interrupted")] {
        for (name, b) in [
            ("one-frame", &blob),
            ("empty-kernel", &empty),
            ("two-frames", &two),
        ] {
            out.push((format!("{name}-{mname}"), [vec![mode], b.clone()].concat()));
        }
    }
    out.push((
        "count-2e20-plus-1".into(),
        vec![0, 1, 0, 0x10, 0, 0, 0, 0, 0],
    ));
    out.push((
        "frame-past-end".into(),
        vec![0, 1, 0, 0, 0, 9, 0, 0, 0, 0xaa],
    ));
    out
}

/// Structured-mutation seeds (see fuzz/src/checks/archive_mutate.rs for the edit format).
pub fn archive_mutate_seeds() -> Vec<(String, Vec<u8>)> {
    vec![
        ("noop-as-is".into(), vec![0]),
        ("zstd-as-is".into(), vec![1]),
        ("zstd-u32-2e20-plus-1-at-64".into(), vec![1, 1, 0, 64, 10]),
        ("noop-toc-offset-max".into(), vec![0, 2, 0, 8, 15]),
        ("zstd-cut-in-frame".into(), vec![1, 3, 0, 100, 0]),
        ("noop-grow-first-byte".into(), vec![0, 4, 0, 0, 200]),
    ]
}

/// HIPK metadata seeds: the real shape, each way of getting it wrong, and a truncated document.
pub fn hipk_metadata_seeds() -> Vec<(String, Vec<u8>)> {
    let good = m(vec![
        ("kernel_name", s("lib/libx.so")),
        (
            "kpack_search_paths",
            V::A(vec![s("x_@GFXARCH@.kpack"), s("/abs/y.kpack")]),
        ),
    ]);
    let encoded = good.encode();
    vec![
        ("valid".into(), encoded.clone()),
        (
            "valid-with-trailing-bytes".into(),
            [encoded.clone(), vec![0xc1; 8]].concat(),
        ),
        ("truncated".into(), encoded[..encoded.len() - 4].to_vec()),
        (
            "kernel-name-bin".into(),
            m(vec![
                ("kernel_name", V::B(b"x".to_vec())),
                ("kpack_search_paths", V::A(vec![s("a")])),
            ])
            .encode(),
        ),
        (
            "paths-not-strings".into(),
            m(vec![
                ("kernel_name", s("x")),
                ("kpack_search_paths", V::A(vec![V::U(1), V::Nil])),
            ])
            .encode(),
        ),
        (
            "paths-not-array".into(),
            m(vec![
                ("kernel_name", s("x")),
                ("kpack_search_paths", s("a")),
            ])
            .encode(),
        ),
        ("not-a-map".into(), V::A(vec![s("kernel_name")]).encode()),
        ("nested-200".into(), vec![0x91; 200]),
    ]
}

/// Offload-bundle seeds: plain and CCOB (v2, v3) bundles built by the project's own builders,
/// two bundles with padding between them, and truncations.
pub fn bundle_seeds() -> Vec<(String, Vec<u8>)> {
    use crate::support::bundles::{build_ccob, build_uncompressed};
    let plain = build_uncompressed(
        &[
            ("host-x86_64-unknown-linux-gnu-", &[]),
            ("hipv4-amdgcn-amd-amdhsa--gfx942:xnack-", b"CODE-942"),
            ("hipv4-amdgcn-amd-amdhsa--gfx1100", b"CODE-1100"),
        ],
        8,
    );
    let v2 = build_ccob(2, &plain, 3).unwrap();
    let v3 = build_ccob(3, &plain, 3).unwrap();
    vec![
        ("plain".into(), plain.clone()),
        ("ccob-v2".into(), v2.clone()),
        ("ccob-v3".into(), v3.clone()),
        (
            "plain-pad-ccob".into(),
            [plain.clone(), vec![0; 13], v3.clone()].concat(),
        ),
        ("plain-truncated".into(), plain[..plain.len() - 3].to_vec()),
        ("ccob-truncated".into(), v2[..v2.len() / 2].to_vec()),
    ]
}

/// `/proc/self/maps` seeds: an address (8 bytes, little-endian) then the text.
pub fn maps_seeds() -> Vec<(String, Vec<u8>)> {
    let text = b"00400000-00452000 r-xp 00000000 08:02 173521      /usr/bin/prog\n\
00651000-00652000 rw-p 00051000 08:02 173521      /usr/bin/my prog (deleted)\n\
00e03000-00e24000 rw-p 00000000 00:00 0           [heap]\n\
7f0000000000-7f0000001000 r--p 00000000 00:00 0 \n";
    let at = |addr: u64| [addr.to_le_bytes().to_vec(), text.to_vec()].concat();
    vec![
        ("in-first".into(), at(0x0040_1000)),
        ("in-deleted".into(), at(0x0065_1800)),
        ("in-heap".into(), at(0x00e0_4000)),
        ("nowhere".into(), at(u64::MAX)),
    ]
}
