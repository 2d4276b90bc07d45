//! The crafted archives of the C API's open/get error matrix (tests/c/api.c): one file per row,
//! built with the msgpack value type of `craft` so a TOC can hold any shape, wrong types
//! included.

use std::path::Path;

use super::craft::{V, m, s};

/// A file: 16-byte header, zero padding to 64, `blob`, then `toc` (toc_offset = 64 + blob).
pub fn kpack(toc: &[u8], blob: &[u8]) -> Vec<u8> {
    super::craft::archive_bytes(blob, toc)
}

pub use super::craft::header;

/// `"ZSTD_KERNEL_"` then `z` to 300 bytes (the zstd matrix kernel).
pub fn zstd_kernel() -> Vec<u8> {
    let mut k = b"ZSTD_KERNEL_".to_vec();
    k.resize(300, b'z');
    k
}

/// `"NOOP_KERNEL_"` then `n` to 64 bytes (the NoOp matrix kernel).
pub fn noop_kernel() -> Vec<u8> {
    let mut k = b"NOOP_KERNEL_".to_vec();
    k.resize(64, b'n');
    k
}

/// A TOC entry map.
pub fn entry(ordinal: V, original_size: V) -> V {
    m(vec![
        ("type", s("hsaco")),
        ("ordinal", ordinal),
        ("original_size", original_size),
    ])
}

/// A NoOp TOC for one kernel `lib/a.so#0` @ `gfx900`, with overridable pieces.
pub struct NoopToc {
    pub arches: V,
    pub toc: V,
    pub scheme: Option<V>,
    pub blobs: Option<V>,
}

impl NoopToc {
    pub fn new(len: usize) -> NoopToc {
        NoopToc {
            arches: V::A(vec![s("gfx900")]),
            toc: m(vec![(
                "lib/a.so#0",
                m(vec![("gfx900", entry(V::U(0), V::U(len as u64)))]),
            )]),
            scheme: Some(s("none")),
            blobs: Some(V::A(vec![m(vec![
                ("offset", V::U(64)),
                ("size", V::U(len as u64)),
            ])])),
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut pairs = vec![
            ("format_version", V::U(1)),
            ("group_name", s("test")),
            ("gfx_arch_family", s("gfx900")),
            ("gfx_arches", self.arches.clone()),
            ("toc", self.toc.clone()),
        ];
        if let Some(v) = &self.scheme {
            pairs.push(("compression_scheme", v.clone()));
        }
        if let Some(v) = &self.blobs {
            pairs.push(("blobs", v.clone()));
        }
        m(pairs).encode()
    }
}

/// A zstd blob: u32 count, then (u32 size, frame) per frame.
pub fn zstd_blob(count: u32, frames: &[Vec<u8>]) -> Vec<u8> {
    let mut out = count.to_le_bytes().to_vec();
    for f in frames {
        out.extend_from_slice(&(f.len() as u32).to_le_bytes());
        out.extend_from_slice(f);
    }
    out
}

/// A zstd archive for one kernel `lib/a.so#0` @ `gfx1100` with the given blob and TOC numbers;
/// `None` leaves a field out.
pub fn zstd_file(
    blob: &[u8],
    ordinal: u64,
    original_size: u64,
    zstd_offset: Option<V>,
    zstd_size: Option<V>,
) -> Vec<u8> {
    let mut pairs = vec![
        ("format_version", V::U(1)),
        ("gfx_arches", V::A(vec![s("gfx1100")])),
        (
            "toc",
            m(vec![(
                "lib/a.so#0",
                m(vec![("gfx1100", entry(V::U(ordinal), V::U(original_size)))]),
            )]),
        ),
        ("compression_scheme", s("zstd-per-kernel")),
    ];
    if let Some(v) = zstd_offset {
        pairs.push(("zstd_offset", v));
    }
    if let Some(v) = zstd_size {
        pairs.push(("zstd_size", v));
    }
    kpack(&m(pairs).encode(), blob)
}

/// Writes every file of the open/get error matrix (tests/c/api.c) into `dir`.
pub fn write_error_matrix(dir: &Path) {
    let w = |name: &str, bytes: Vec<u8>| std::fs::write(dir.join(name), bytes).unwrap();
    let k = noop_kernel();
    let noop = |t: &NoopToc| kpack(&t.encode(), &k);

    w("valid_noop.kpack", noop(&NoopToc::new(k.len())));
    w("empty.kpack", Vec::new());
    w("short_8.kpack", header(b"KPAK", 1, 16)[..8].to_vec());
    w("short_15.kpack", header(b"KPAK", 1, 16)[..15].to_vec());
    w("header_only.kpack", header(b"KPAK", 1, 16));
    let good = noop(&NoopToc::new(k.len()));
    let patch = |at: usize, bytes: &[u8]| {
        let mut v = good.clone();
        v[at..at + bytes.len()].copy_from_slice(bytes);
        v
    };
    w("magic_XPAK.kpack", patch(0, b"XPAK"));
    w("magic_kpak.kpack", patch(0, b"kpak"));
    w("version_0.kpack", patch(4, &0u32.to_le_bytes()));
    w("version_2.kpack", patch(4, &2u32.to_le_bytes()));
    w(
        "toc_offset_eof.kpack",
        patch(8, &(good.len() as u64).to_le_bytes()),
    );
    w(
        "toc_offset_2p63.kpack",
        patch(8, &(1u64 << 63).to_le_bytes()),
    );
    w("toc_offset_0.kpack", patch(8, &0u64.to_le_bytes()));
    w(
        "toc_array.kpack",
        kpack(&V::A(vec![V::U(1), s("x")]).encode(), &k),
    );
    let mut truncated = good.clone();
    truncated.truncate(good.len() - 3);
    w("toc_truncated.kpack", truncated);
    let mut trailing = good.clone();
    trailing.extend_from_slice(b"\xc1\xc1garbage after the TOC");
    w("toc_trailing_garbage.kpack", trailing);
    w(
        "scheme_missing.kpack",
        noop(&NoopToc {
            scheme: None,
            ..NoopToc::new(k.len())
        }),
    );
    w(
        "scheme_lz4.kpack",
        noop(&NoopToc {
            scheme: Some(s("lz4")),
            ..NoopToc::new(k.len())
        }),
    );
    w(
        "scheme_int.kpack",
        noop(&NoopToc {
            scheme: Some(V::U(1)),
            ..NoopToc::new(k.len())
        }),
    );
    w(
        "noop_no_blobs.kpack",
        noop(&NoopToc {
            blobs: None,
            ..NoopToc::new(k.len())
        }),
    );
    let blobs = |offset: u64, size: u64| {
        Some(V::A(vec![m(vec![
            ("offset", V::U(offset)),
            ("size", V::U(size)),
        ])]))
    };
    w(
        "noop_offset_past_eof.kpack",
        noop(&NoopToc {
            blobs: blobs(1 << 20, 64),
            ..NoopToc::new(k.len())
        }),
    );
    w(
        "noop_size_past_eof.kpack",
        noop(&NoopToc {
            blobs: blobs(64, 1 << 20),
            ..NoopToc::new(k.len())
        }),
    );
    let one_entry = |ordinal: V, size: V| {
        m(vec![(
            "lib/a.so#0",
            m(vec![("gfx900", entry(ordinal, size))]),
        )])
    };
    w(
        "noop_ordinal_past_blobs.kpack",
        noop(&NoopToc {
            toc: one_entry(V::U(1), V::U(64)),
            ..NoopToc::new(k.len())
        }),
    );
    w(
        "noop_wrong_original_size.kpack",
        noop(&NoopToc {
            toc: one_entry(V::U(0), V::U(7)),
            ..NoopToc::new(k.len())
        }),
    );
    w(
        "ordinal_str.kpack",
        noop(&NoopToc {
            toc: one_entry(s("0"), V::U(64)),
            ..NoopToc::new(k.len())
        }),
    );
    w(
        "ordinal_negative.kpack",
        noop(&NoopToc {
            toc: one_entry(V::I(-1), V::U(64)),
            ..NoopToc::new(k.len())
        }),
    );
    w(
        "ordinal_2p32.kpack",
        noop(&NoopToc {
            toc: one_entry(V::U(1 << 32), V::U(64)),
            ..NoopToc::new(k.len())
        }),
    );
    w(
        "original_size_float.kpack",
        noop(&NoopToc {
            toc: one_entry(V::U(0), V::F(64.0)),
            ..NoopToc::new(k.len())
        }),
    );
    w(
        "blob_offset_str.kpack",
        noop(&NoopToc {
            blobs: Some(V::A(vec![m(vec![("offset", s("64")), ("size", V::U(64))])])),
            ..NoopToc::new(k.len())
        }),
    );
    w(
        "gfx_arches_str.kpack",
        noop(&NoopToc {
            arches: s("gfx900"),
            ..NoopToc::new(k.len())
        }),
    );
    w(
        "gfx_arches_ints.kpack",
        noop(&NoopToc {
            arches: V::A(vec![s("gfx900"), V::U(7), s("gfx906")]),
            ..NoopToc::new(k.len())
        }),
    );
    let bin_key = V::M(vec![(
        V::B(b"lib/a.so#0".to_vec()),
        m(vec![("gfx900", entry(V::U(0), V::U(64)))]),
    )]);
    w(
        "toc_bin_key.kpack",
        noop(&NoopToc {
            toc: bin_key,
            ..NoopToc::new(k.len())
        }),
    );
    w(
        "toc_not_map.kpack",
        noop(&NoopToc {
            toc: V::A(vec![s("lib/a.so#0")]),
            ..NoopToc::new(k.len())
        }),
    );
    // The reference's 5-byte TOCs declaring 2^32-1 items or bytes, at offset 16.
    for tag in [0xddu8, 0xdf, 0xdb, 0xc6, 0xc9] {
        let mut v = header(b"KPAK", 1, 16);
        v.extend_from_slice(&[tag, 0xff, 0xff, 0xff, 0xff]);
        w(&format!("oversized_{tag:02x}.kpack"), v);
    }
    // The reference's InvalidNumericTocFieldTest: one numeric field given as a string.
    for field in [
        "offset",
        "size",
        "zstd_offset",
        "zstd_size",
        "ordinal",
        "original_size",
    ] {
        let bad = || s("not-an-integer");
        let num = |name: &str, v: u64| if name == field { bad() } else { V::U(v) };
        let toc = m(vec![
            ("gfx_arches", V::A(vec![s("gfx900")])),
            (
                "toc",
                m(vec![(
                    "lib/a.so#0",
                    m(vec![(
                        "gfx900",
                        entry(num("ordinal", 0), num("original_size", 4)),
                    )]),
                )]),
            ),
            (
                "compression_scheme",
                s(if field.starts_with("zstd") {
                    "zstd-per-kernel"
                } else {
                    "none"
                }),
            ),
            (
                "blobs",
                V::A(vec![m(vec![
                    ("offset", num("offset", 16)),
                    ("size", num("size", 4)),
                ])]),
            ),
            ("zstd_offset", num("zstd_offset", 16)),
            ("zstd_size", num("zstd_size", 4)),
        ]);
        let mut v = header(b"KPAK", 1, 16);
        v.extend_from_slice(&toc.encode());
        w(&format!("numeric_str_{field}.kpack"), v);
    }

    // zstd rows.
    let z = zstd_kernel();
    let frame = zstd::bulk::compress(&z, 3).unwrap();
    let blob = zstd_blob(1, std::slice::from_ref(&frame));
    let n = z.len() as u64;
    let bl = blob.len() as u64;
    w(
        "valid_zstd.kpack",
        zstd_file(&blob, 0, n, Some(V::U(64)), Some(V::U(bl))),
    );
    w(
        "zstd_size_past_eof.kpack",
        zstd_file(&blob, 0, n, Some(V::U(64)), Some(V::U(bl + 4096))),
    );
    w(
        "zstd_size_0.kpack",
        zstd_file(&blob, 0, n, Some(V::U(64)), Some(V::U(0))),
    );
    w(
        "zstd_size_3.kpack",
        zstd_file(&blob, 0, n, Some(V::U(64)), Some(V::U(3))),
    );
    w(
        "zstd_size_5gib.kpack",
        zstd_file(&blob, 0, n, Some(V::U(64)), Some(V::U(5 << 30))),
    );
    let huge = zstd_blob((1 << 20) + 1, std::slice::from_ref(&frame));
    w(
        "zstd_num_kernels_huge.kpack",
        zstd_file(&huge, 0, n, Some(V::U(64)), Some(V::U(huge.len() as u64))),
    );
    let more = zstd_blob(2, std::slice::from_ref(&frame));
    w(
        "zstd_num_kernels_gt_frames.kpack",
        zstd_file(&more, 0, n, Some(V::U(64)), Some(V::U(more.len() as u64))),
    );
    let mut long_frame = blob.clone();
    long_frame[4..8].copy_from_slice(&(frame.len() as u32 + 100).to_le_bytes());
    w(
        "zstd_frame_size_past_blob.kpack",
        zstd_file(&long_frame, 0, n, Some(V::U(64)), Some(V::U(bl))),
    );
    w(
        "zstd_offset_missing.kpack",
        zstd_file(&blob, 0, n, None, Some(V::U(bl))),
    );
    w(
        "zstd_size_missing.kpack",
        zstd_file(&blob, 0, n, Some(V::U(64)), None),
    );
    let none = zstd_blob(0, &[]);
    w(
        "zstd_num_kernels_0.kpack",
        zstd_file(&none, 0, n, Some(V::U(64)), Some(V::U(4))),
    );
    let mut corrupt = blob.clone();
    let last = corrupt.len() - 6;
    for b in &mut corrupt[12..last] {
        *b ^= 0x5a;
    }
    w(
        "zstd_corrupt_frame.kpack",
        zstd_file(&corrupt, 0, n, Some(V::U(64)), Some(V::U(bl))),
    );
    w(
        "zstd_original_size_minus_1.kpack",
        zstd_file(&blob, 0, n - 1, Some(V::U(64)), Some(V::U(bl))),
    );
    w(
        "zstd_original_size_plus_1.kpack",
        zstd_file(&blob, 0, n + 1, Some(V::U(64)), Some(V::U(bl))),
    );
    w(
        "zstd_original_size_0.kpack",
        zstd_file(&blob, 0, 0, Some(V::U(64)), Some(V::U(bl))),
    );
    w(
        "zstd_ordinal_past_frames.kpack",
        zstd_file(&blob, 1, n, Some(V::U(64)), Some(V::U(bl))),
    );
    let empty_frame = zstd::bulk::compress(&[], 3).unwrap();
    let eb = zstd_blob(1, &[empty_frame]);
    w(
        "zstd_empty_kernel.kpack",
        zstd_file(&eb, 0, 0, Some(V::U(64)), Some(V::U(eb.len() as u64))),
    );
    let streamed = zstd::stream::encode_all(&z[..], 3).unwrap();
    let sb = zstd_blob(1, &[streamed]);
    w(
        "zstd_no_content_size.kpack",
        zstd_file(&sb, 0, n, Some(V::U(64)), Some(V::U(sb.len() as u64))),
    );
    std::fs::create_dir_all(dir.join("a_directory.kpack")).unwrap();

    // TOC edge cases the reference accepts: a `none` entry without original_size reads with its
    // blob's size (zstd: parse error); a repeated key counts at its first occurrence; a binary
    // with an empty arch map is not a binary.
    let mut t = NoopToc::new(k.len());
    t.toc = m(vec![(
        "lib/a.so#0",
        m(vec![(
            "gfx900",
            m(vec![("type", s("hsaco")), ("ordinal", V::U(0))]),
        )]),
    )]);
    w("noop_no_original_size.kpack", noop(&t));
    let dup = |first: u64, second: u64| {
        let mut t = NoopToc::new(k.len());
        t.toc = V::M(vec![
            (
                s("lib/a.so#0"),
                m(vec![("gfx900", entry(V::U(first), V::U(k.len() as u64)))]),
            ),
            (
                s("lib/a.so#0"),
                m(vec![("gfx900", entry(V::U(second), V::U(k.len() as u64)))]),
            ),
        ]);
        noop(&t)
    };
    w("dup_key_first_good.kpack", dup(0, 7));
    w("dup_key_first_bad.kpack", dup(7, 0));
    let mut t = NoopToc::new(k.len());
    t.toc = m(vec![
        ("lib/0empty.so#0", m(vec![])),
        (
            "lib/a.so#0",
            m(vec![("gfx900", entry(V::U(0), V::U(k.len() as u64)))]),
        ),
        ("lib/z.so#0", m(vec![])),
    ]);
    w("empty_arch_map.kpack", noop(&t));
    {
        let zk = zstd_kernel();
        let frame = zstd::bulk::compress(&zk, 3).unwrap();
        let blob = zstd_blob(1, &[frame]);
        let toc = m(vec![
            ("gfx_arches", V::A(vec![s("gfx1100")])),
            (
                "toc",
                m(vec![(
                    "lib/a.so#0",
                    m(vec![(
                        "gfx1100",
                        m(vec![("type", s("hsaco")), ("ordinal", V::U(0))]),
                    )]),
                )]),
            ),
            ("compression_scheme", s("zstd-per-kernel")),
            ("zstd_offset", V::U(64)),
            ("zstd_size", V::U(blob.len() as u64)),
        ]);
        w("zstd_no_original_size.kpack", kpack(&toc.encode(), &blob));
    }

    // Archives with BLAKE3 digests (our writer's default): intact ones read; a flipped byte that
    // still decodes is a decompression failure.
    use super::craft::{flipped_archive, incompressible};
    use rocm_kpack::Compression;
    let zstd3 = Compression::Zstd { level: 3 };
    let zk = zstd_kernel();
    let mut ok = rocm_kpack::ArchiveWriter::new("g", "f", vec!["gfx1100".into()], zstd3).unwrap();
    ok.add_kernel("lib/a.so#0", "gfx1100", zk.clone()).unwrap();
    let mut bytes = Vec::new();
    ok.write_to(&mut bytes, &|_| {}).unwrap();
    // The frame digest's 32 bytes follow its key and a `bin 8` header of length 32.
    let frame_key = b"\xacframe_blake3\xc4\x20";
    let at = |bytes: &[u8]| {
        bytes
            .windows(frame_key.len())
            .position(|w| w == frame_key)
            .expect("our writer records frame digests")
            + frame_key.len()
    };
    let mut altered = bytes.clone();
    let d = at(&altered);
    altered[d] ^= 0x01;
    w("digest_zstd_frame_digest_altered.kpack", altered);
    w("digest_zstd_ok.kpack", bytes);
    let raw = incompressible(7, 4096);
    let flipped = flipped_archive(
        zstd3,
        &[
            ("lib/a.so#0", "gfx1100", raw),
            ("lib/b.so#0", "gfx1100", zk.clone()),
        ],
        0,
    );
    // The same archive as written before frame digests: their key renamed to one no reader
    // knows, so only the decoded bytes' digest can catch the flipped byte.
    let mut blake3_only = flipped.clone();
    while let Some(p) = blake3_only
        .windows(frame_key.len())
        .position(|w| w == frame_key)
    {
        blake3_only[p + 12] = b'X';
    }
    w("digest_zstd_blake3_only_flipped.kpack", blake3_only);
    let b3 = rocm_kpack::Archive::open(dir.join("digest_zstd_blake3_only_flipped.kpack")).unwrap();
    let kref = b3.locate("lib/a.so#0", "gfx1100").unwrap();
    assert!(
        kref.frame_digest.is_none() && kref.digest.is_some(),
        "{kref:?}"
    );
    w("digest_zstd_flipped.kpack", flipped);
    w(
        "digest_noop_flipped.kpack",
        flipped_archive(Compression::None, &[("lib/a.so#0", "gfx900", k.clone())], 0),
    );

    // The reference KpackAPITest's fake 20-byte headers: magic, u32 version, u32 compression,
    // u64 toc_offset. The u64 read at byte 8 therefore mixes compression and toc_offset.
    let fake = |magic: &[u8; 4], version: u32, toc_offset: u64| {
        let mut v = magic.to_vec();
        v.extend_from_slice(&version.to_le_bytes());
        v.extend_from_slice(&0u32.to_le_bytes());
        v.extend_from_slice(&toc_offset.to_le_bytes());
        v
    };
    w("ref_wrong_magic.kpack", fake(b"XXXX", 1, 20));
    w("ref_version_999.kpack", fake(b"KPAK", 999, 20));
    w("ref_toc_beyond.kpack", fake(b"KPAK", 1, 1_000_000));
}
