//! Hand-made archives for the error matrices: a tiny msgpack value type whose encoding we
//! control completely (so tests can write wrong types, huge numbers, odd key types), and
//! builders for the header + blob + TOC layout.

use rmp::encode as e;

/// A msgpack value to encode.
#[derive(Debug, Clone)]
pub enum V {
    Nil,
    U(u64),
    I(i64),
    F(f64),
    S(String),
    B(Vec<u8>),
    A(Vec<V>),
    M(Vec<(V, V)>),
}

pub fn s(x: &str) -> V {
    V::S(x.to_owned())
}

/// A map with string keys.
pub fn m(pairs: Vec<(&str, V)>) -> V {
    V::M(pairs.into_iter().map(|(k, v)| (s(k), v)).collect())
}

impl V {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.encode_into(&mut out);
        out
    }

    fn encode_into(&self, out: &mut Vec<u8>) {
        match self {
            V::Nil => e::write_nil(out).unwrap(),
            V::U(u) => {
                e::write_uint(out, *u).unwrap();
            }
            V::I(i) => {
                e::write_sint(out, *i).unwrap();
            }
            V::F(f) => e::write_f64(out, *f).unwrap(),
            V::S(x) => e::write_str(out, x).unwrap(),
            V::B(b) => e::write_bin(out, b).unwrap(),
            V::A(items) => {
                e::write_array_len(out, items.len() as u32).unwrap();
                items.iter().for_each(|v| v.encode_into(out));
            }
            V::M(pairs) => {
                e::write_map_len(out, pairs.len() as u32).unwrap();
                for (k, v) in pairs {
                    k.encode_into(out);
                    v.encode_into(out);
                }
            }
        }
    }

    /// Replaces (or adds) a key of a map.
    pub fn set(&mut self, key: &str, value: V) {
        let V::M(pairs) = self else {
            panic!("not a map")
        };
        match pairs
            .iter_mut()
            .find(|(k, _)| matches!(k, V::S(x) if x == key))
        {
            Some(slot) => slot.1 = value,
            None => pairs.push((s(key), value)),
        }
    }

    /// Removes a key of a map.
    pub fn remove(&mut self, key: &str) {
        let V::M(pairs) = self else {
            panic!("not a map")
        };
        pairs.retain(|(k, _)| !matches!(k, V::S(x) if x == key));
    }

    /// A nested map by key (panics when absent: tests build their own TOCs).
    pub fn at(&mut self, key: &str) -> &mut V {
        let V::M(pairs) = self else {
            panic!("not a map")
        };
        &mut pairs
            .iter_mut()
            .find(|(k, _)| matches!(k, V::S(x) if x == key))
            .expect("key")
            .1
    }
}

/// A bare 16-byte header with any magic, version and TOC offset.
pub fn header(magic: &[u8; 4], version: u32, toc_offset: u64) -> Vec<u8> {
    let mut h = magic.to_vec();
    h.extend_from_slice(&version.to_le_bytes());
    h.extend_from_slice(&toc_offset.to_le_bytes());
    h
}

/// Header (with `toc_offset` = 64 + blob length) + zero padding + blob + TOC bytes.
pub fn archive_bytes(blob: &[u8], toc: &[u8]) -> Vec<u8> {
    let toc_offset = 64 + blob.len() as u64;
    let mut out = Vec::new();
    out.extend_from_slice(b"KPAK");
    out.extend_from_slice(&1u32.to_le_bytes());
    out.extend_from_slice(&toc_offset.to_le_bytes());
    out.resize(64, 0);
    out.extend_from_slice(blob);
    out.extend_from_slice(toc);
    out
}

fn entry(ordinal: u64, size: u64) -> V {
    m(vec![
        ("type", s("hsaco")),
        ("ordinal", V::U(ordinal)),
        ("original_size", V::U(size)),
    ])
}

/// One kernel `k#0` for `gfx900` stored plainly: returns (blob, TOC value).
pub fn noop_parts(data: &[u8]) -> (Vec<u8>, V) {
    let toc = m(vec![
        ("format_version", V::U(1)),
        ("group_name", s("g")),
        ("gfx_arch_family", s("gfx900")),
        ("gfx_arches", V::A(vec![s("gfx900")])),
        (
            "toc",
            m(vec![(
                "k#0",
                m(vec![("gfx900", entry(0, data.len() as u64))]),
            )]),
        ),
        ("compression_scheme", s("none")),
        (
            "blobs",
            V::A(vec![m(vec![
                ("offset", V::U(64)),
                ("size", V::U(data.len() as u64)),
            ])]),
        ),
    ]);
    (data.to_vec(), toc)
}

/// One zstd frame table (count + size-prefixed frames).
pub fn frame_table(frames: &[Vec<u8>]) -> Vec<u8> {
    let mut blob = (frames.len() as u32).to_le_bytes().to_vec();
    for f in frames {
        blob.extend_from_slice(&(f.len() as u32).to_le_bytes());
        blob.extend_from_slice(f);
    }
    blob
}

/// One kernel `k#0` for `gfx900` in a zstd frame: returns (blob, TOC value).
pub fn zstd_parts(data: &[u8]) -> (Vec<u8>, V) {
    let frame = zstd::bulk::compress(data, 3).unwrap();
    let blob = frame_table(&[frame]);
    let toc = m(vec![
        ("format_version", V::U(1)),
        ("group_name", s("g")),
        ("gfx_arch_family", s("gfx900")),
        ("gfx_arches", V::A(vec![s("gfx900")])),
        (
            "toc",
            m(vec![(
                "k#0",
                m(vec![("gfx900", entry(0, data.len() as u64))]),
            )]),
        ),
        ("compression_scheme", s("zstd-per-kernel")),
        ("zstd_offset", V::U(64)),
        ("zstd_size", V::U(blob.len() as u64)),
    ]);
    (blob, toc)
}

/// The whole valid `none` archive of [`noop_parts`].
pub fn noop_archive() -> Vec<u8> {
    let (blob, toc) = noop_parts(&sample_kernel());
    archive_bytes(&blob, &toc.encode())
}

/// The kernel the `*_parts` builders store.
pub fn sample_kernel() -> Vec<u8> {
    let mut k = b"SAMPLE_KERNEL_".to_vec();
    k.extend((0..500u32).map(|i| (i % 7) as u8));
    k
}

/// Bytes zstd cannot compress: their frame stores them as a raw block, so a byte flipped inside
/// the frame still decodes, to the right size, only wrong.
pub fn incompressible(seed: u64, len: usize) -> Vec<u8> {
    let mut next = super::xorshift(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    (0..len).map(|_| (next() >> 24) as u8).collect()
}

/// An archive of one gfx942 binary holding `kernels` (key, bytes), as our writer writes it with
/// `compression`, in the reference layout when `reference` is set.
pub fn gfx942_archive(
    kernels: Vec<(String, Vec<u8>)>,
    compression: rocm_kpack::Compression,
    reference: bool,
) -> Vec<u8> {
    let mut w =
        rocm_kpack::ArchiveWriter::new("g", "gfx942", vec!["gfx942".into()], compression).unwrap();
    w.set_reference_layout(reference);
    for (k, d) in kernels {
        w.add_kernel(&k, "gfx942", d).unwrap();
    }
    let mut out = Vec::new();
    w.write_to(&mut out, &|_| {}).unwrap();
    out
}

/// A digested archive (our writer's default layout) holding `kernels` as (key, arch, bytes),
/// with one byte flipped in the middle of the stored bytes of kernel `victim`. For zstd, checks
/// that the altered frame still decodes to the right size, so only the digest can catch it.
pub fn flipped_archive(
    compression: rocm_kpack::Compression,
    kernels: &[(&str, &str, Vec<u8>)],
    victim: usize,
) -> Vec<u8> {
    let arches: Vec<String> = kernels.iter().fold(Vec::new(), |mut v, k| {
        if !v.iter().any(|a| a == k.1) {
            v.push(k.1.to_owned());
        }
        v
    });
    let mut w = rocm_kpack::ArchiveWriter::new("g", "f", arches, compression).unwrap();
    for (k, a, d) in kernels {
        w.add_kernel(k, a, d.clone()).unwrap();
    }
    let mut bytes = Vec::new();
    w.write_to(&mut bytes, &|_| {}).unwrap();
    // Ordinals follow insertion; find the victim's stored bytes by walking the layout.
    let (start, len) = match compression {
        rocm_kpack::Compression::None => {
            let before: usize = kernels[..victim].iter().map(|k| k.2.len()).sum();
            (64 + before, kernels[victim].2.len())
        }
        rocm_kpack::Compression::Zstd { .. } => {
            let mut at = 68usize;
            for _ in 0..victim {
                at += 4 + u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
            }
            let size = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
            (at + 4, size)
        }
    };
    assert!(len > 0, "the victim must have stored bytes");
    bytes[start + len / 2] ^= 0x20;
    if let rocm_kpack::Compression::Zstd { .. } = compression {
        let frame = &bytes[start..start + len];
        let decoded = zstd::bulk::decompress(frame, 1 << 24).expect("still decodes");
        assert_eq!(decoded.len(), kernels[victim].2.len());
        assert_ne!(decoded, kernels[victim].2);
    }
    bytes
}
