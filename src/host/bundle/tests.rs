//! Unit tests for bundle parsing. Fixtures are written out from the byte layouts by hand (not only
//! through the builders), so a builder bug cannot hide a parser bug.

use super::fixtures::{build_ccob, build_uncompressed};
use super::*;

fn le64(n: u64) -> [u8; 8] {
    n.to_le_bytes()
}

/// A two-entry bundle (host + gfx906) laid out by hand: header 32 bytes, host record 24+25,
/// device record 24+35, then 4 code-object bytes at offset 160.
fn handmade_bundle() -> Vec<u8> {
    let host = b"host-x86_64-unknown-linux";
    let dev = b"hipv4-amdgcn-amd-amdhsa--gfx906:xnack-";
    let mut b = Vec::new();
    b.extend_from_slice(b"__CLANG_OFFLOAD_BUNDLE__");
    b.extend_from_slice(&le64(2));
    b.extend_from_slice(&le64(160));
    b.extend_from_slice(&le64(0));
    b.extend_from_slice(&le64(host.len() as u64));
    b.extend_from_slice(host);
    b.extend_from_slice(&le64(160));
    b.extend_from_slice(&le64(4));
    b.extend_from_slice(&le64(dev.len() as u64));
    b.extend_from_slice(dev);
    assert!(b.len() <= 160);
    b.resize(160, 0);
    b.extend_from_slice(b"\x7fELF");
    b
}

/// A CCOB bundle laid out by hand from the spec's header tables.
fn handmade_ccob(version: u16, inner: &[u8]) -> Vec<u8> {
    let payload = zstd::bulk::compress(inner, 3).unwrap();
    let mut b = b"CCOB".to_vec();
    b.extend_from_slice(&version.to_le_bytes());
    b.extend_from_slice(&1u16.to_le_bytes());
    if version == 2 {
        b.extend_from_slice(&((24 + payload.len()) as u32).to_le_bytes());
        b.extend_from_slice(&(inner.len() as u32).to_le_bytes());
    } else {
        b.extend_from_slice(&le64((32 + payload.len()) as u64));
        b.extend_from_slice(&le64(inner.len() as u64));
    }
    b.extend_from_slice(&le64(0x1234_5678_9abc_def0));
    b.extend_from_slice(&payload);
    b
}

fn err(data: &[u8]) -> BundleError {
    parse_fatbin(data).expect_err("must be rejected")
}

#[test]
fn arch_is_text_after_last_double_dash() {
    assert_eq!(
        arch_of_triple("hipv4-amdgcn-amd-amdhsa--gfx90a:xnack-"),
        Some("gfx90a:xnack-")
    );
    assert_eq!(
        arch_of_triple("hip-amdgcn-amd-amdhsa--gfx1250-strict"),
        Some("gfx1250-strict")
    );
    assert_eq!(arch_of_triple("hipv4-amdgcn-amd-amdhsa--"), None);
    assert_eq!(arch_of_triple("hipv4-amdgcn-amd-amdhsa-gfx906"), None);
    assert!(is_host_triple("host-x86_64-unknown-linux"));
    assert!(!is_host_triple("hipv4-amdgcn-amd-amdhsa--gfx906"));
}

#[test]
fn parses_handmade_uncompressed_bundle() {
    let b = handmade_bundle();
    let bundles = parse_fatbin(&b).unwrap();
    assert_eq!(bundles.len(), 1);
    assert_eq!(bundles[0].offset, 0);
    assert_eq!(bundles[0].len, 164);
    assert_eq!(bundles[0].layout, Layout::Uncompressed);
    assert_eq!(
        bundles[0].entries,
        vec![Entry {
            triple: "hipv4-amdgcn-amd-amdhsa--gfx906:xnack-".into(),
            arch: "gfx906:xnack-".into(),
            offset: 160,
            data: Cow::Borrowed(&b"\x7fELF"[..]),
        }]
    );
    assert!(matches!(bundles[0].entries[0].data, Cow::Borrowed(_)));
}

#[test]
fn builder_matches_handmade_layout() {
    let built = build_uncompressed(
        &[
            ("host-x86_64-unknown-linux", &[]),
            ("hipv4-amdgcn-amd-amdhsa--gfx906:xnack-", b"\x7fELF"),
        ],
        32,
    );
    assert_eq!(built, handmade_bundle());
}

#[test]
fn builder_round_trips_with_alignment() {
    let a = vec![0xAAu8; 5000];
    let b = vec![0xBBu8; 10];
    let c = vec![0xCCu8; 4096];
    let built = build_uncompressed(
        &[
            ("host-x86_64-unknown-linux", &[]),
            ("hipv4-amdgcn-amd-amdhsa--gfx1030", &a),
            ("hipv4-amdgcn-amd-amdhsa--gfx803", &b),
            ("hipv4-amdgcn-amd-amdhsa--gfx90a:xnack+", &c),
        ],
        4096,
    );
    // Table fits in the first page; code objects at 4096, 12288, 16384.
    assert_eq!(built.len(), 16384 + 4096);
    let bundles = parse_fatbin(&built).unwrap();
    assert_eq!(bundles.len(), 1);
    let got: Vec<(&str, u64, &[u8])> = bundles[0]
        .entries
        .iter()
        .map(|e| (e.arch.as_str(), e.offset, &e.data[..]))
        .collect();
    assert_eq!(
        got,
        vec![
            ("gfx1030", 4096, &a[..]),
            ("gfx803", 12288, &b[..]),
            ("gfx90a:xnack+", 16384, &c[..])
        ]
    );
    assert_eq!(bundles[0].len, 20480);
}

#[test]
fn ccob_v2_and_v3_handmade() {
    let inner = handmade_bundle();
    for version in [2u16, 3] {
        let c = handmade_ccob(version, &inner);
        let d = decompress_ccob(&c).unwrap();
        assert_eq!(d.version, version);
        assert_eq!(d.total_size, c.len());
        assert_eq!(d.bundle, inner);
        let bundles = parse_fatbin(&c).unwrap();
        assert_eq!(bundles.len(), 1);
        assert_eq!(bundles[0].layout, Layout::Compressed { version });
        assert_eq!(bundles[0].len, c.len() as u64);
        assert_eq!(bundles[0].entries.len(), 1);
        assert_eq!(bundles[0].entries[0].arch, "gfx906:xnack-");
        assert_eq!(&bundles[0].entries[0].data[..], b"\x7fELF");
        assert_eq!(bundles[0].entries[0].offset, 160);
    }
}

#[test]
fn ccob_builder_matches_handmade_except_hash() {
    let inner = handmade_bundle();
    for version in [2u16, 3] {
        let mut hand = handmade_ccob(version, &inner);
        let hash_at = if version == 2 { 16 } else { 24 };
        hand[hash_at..hash_at + 8].fill(0);
        assert_eq!(build_ccob(version, &inner, 3).unwrap(), hand);
    }
    assert!(build_ccob(1, &inner, 3).is_err());
}

#[test]
fn concatenated_bundles_with_padding_in_order() {
    let one = build_uncompressed(
        &[
            ("hipv4-amdgcn-amd-amdhsa--gfx900", b"AAAA"),
            ("hipv4-amdgcn-amd-amdhsa--gfx1030", b"BB"),
        ],
        8,
    );
    let two = build_uncompressed(
        &[
            ("host-x86_64-unknown-linux", &[]),
            ("hipv4-amdgcn-amd-amdhsa--gfx900", b"CCC"),
        ],
        8,
    );
    let three = build_uncompressed(&[("hipv4-amdgcn-amd-amdhsa--gfx1030", b"DDDDD")], 8);
    let mut section = one.clone();
    section.resize(section.len().next_multiple_of(4096), 0);
    let at2 = section.len();
    section.extend_from_slice(&build_ccob(3, &two, 3).unwrap());
    let end2 = section.len();
    section.resize(section.len().next_multiple_of(4096), 0);
    let at3 = section.len();
    section.extend_from_slice(&build_ccob(2, &three, 19).unwrap());
    section.extend_from_slice(&[0u8; 100]);

    let bundles = parse_fatbin(&section).unwrap();
    type Summary<'a> = Vec<(u64, Layout, Vec<(&'a str, &'a [u8])>)>;
    let summary: Summary = bundles
        .iter()
        .map(|b| {
            (
                b.offset,
                b.layout,
                b.entries
                    .iter()
                    .map(|e| (e.arch.as_str(), &e.data[..]))
                    .collect(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        vec![
            (
                0,
                Layout::Uncompressed,
                vec![("gfx900", &b"AAAA"[..]), ("gfx1030", &b"BB"[..])]
            ),
            (
                at2 as u64,
                Layout::Compressed { version: 3 },
                vec![("gfx900", &b"CCC"[..])]
            ),
            (
                at3 as u64,
                Layout::Compressed { version: 2 },
                vec![("gfx1030", &b"DDDDD"[..])]
            ),
        ]
    );
    assert_eq!(bundles[1].len, (end2 - at2) as u64);
}

#[test]
fn zeroed_or_empty_section_has_no_bundles() {
    assert_eq!(parse_fatbin(&[]).unwrap(), vec![]);
    assert_eq!(parse_fatbin(&[0u8; 8192]).unwrap(), vec![]);
    assert_eq!(parse_fatbin(b"__CLANG_OFFLOAD_BUNDLE").unwrap(), vec![]);
}

#[test]
fn every_truncation_is_an_error_not_a_panic() {
    let b = handmade_bundle();
    for len in 0..b.len() {
        let r = parse_fatbin(&b[..len]);
        if len < 24 {
            assert_eq!(r, Ok(vec![]), "prefix of {len} bytes has no magic");
        } else {
            assert!(r.is_err(), "prefix of {len} bytes must be rejected");
        }
    }
    for version in [2u16, 3] {
        let c = handmade_ccob(version, &b);
        for len in 4..c.len() {
            assert!(
                parse_fatbin(&c[..len]).is_err(),
                "CCOB v{version} prefix of {len} bytes"
            );
        }
    }
}

#[test]
fn hostile_uncompressed_headers() {
    let mut huge_count = handmade_bundle();
    huge_count[24..32].copy_from_slice(&le64(u64::MAX));
    let e = err(&huge_count);
    assert_eq!(e.offset, 24);
    assert!(
        e.reason
            .contains("entry count 18446744073709551615 cannot fit"),
        "{}",
        e.reason
    );

    let mut huge_triple = handmade_bundle();
    huge_triple[48..56].copy_from_slice(&le64(1 << 40));
    assert!(
        err(&huge_triple)
            .reason
            .contains("triple length 1099511627776 is implausible")
    );

    let mut wrapping = handmade_bundle();
    wrapping[32..40].copy_from_slice(&le64(u64::MAX - 1));
    wrapping[40..48].copy_from_slice(&le64(4));
    assert!(
        err(&wrapping)
            .reason
            .contains("run past the 164 bytes present")
    );

    let mut past_end = handmade_bundle();
    let dev_size_at = 32 + 24 + 25 + 8;
    past_end[dev_size_at..dev_size_at + 8].copy_from_slice(&le64(5));
    let e = err(&past_end);
    assert!(
        e.reason
            .contains("entry 1 (hipv4-amdgcn-amd-amdhsa--gfx906:xnack-): bytes 160+5 run past"),
        "{}",
        e.reason
    );

    let mut no_arch = build_uncompressed(&[("hipv4-amdgcn-amd-amdhsa-gfx906", b"x")], 8);
    assert!(err(&no_arch).reason.contains("has no target ID"));
    no_arch[56] = 0xff;
    assert!(err(&no_arch).reason.contains("not UTF-8"));
}

#[test]
fn hostile_ccob_headers() {
    let inner = handmade_bundle();
    let good = handmade_ccob(3, &inner);

    let mut v4 = good.clone();
    v4[4] = 4;
    assert!(err(&v4).reason.contains("unsupported CCOB version 4"));

    let mut zlib = good.clone();
    zlib[6] = 0;
    assert!(
        err(&zlib)
            .reason
            .contains("unsupported compression method 0")
    );

    let mut small_total = good.clone();
    small_total[8..16].copy_from_slice(&le64(31));
    assert!(
        err(&small_total)
            .reason
            .contains("total size 31 is not between")
    );

    let mut big_total = good.clone();
    big_total[8..16].copy_from_slice(&le64(good.len() as u64 + 1));
    assert!(err(&big_total).reason.contains("is not between"));

    let mut bomb = good.clone();
    bomb[16..24].copy_from_slice(&le64(MAX_DECOMPRESSED + 1));
    assert!(err(&bomb).reason.contains("exceeds the"));

    // A declared size that is merely wrong (either way) is caught without trusting it.
    let mut liar = good.clone();
    liar[16..24].copy_from_slice(&le64(1 << 31));
    assert!(
        err(&liar)
            .reason
            .contains("payload decodes to 164 bytes, the header says 2147483648")
    );
    let mut short = good.clone();
    short[16..24].copy_from_slice(&le64(100));
    assert!(
        err(&short)
            .reason
            .contains("payload decodes to more than 100 bytes")
    );

    let mut garbage = good.clone();
    for b in &mut garbage[32..] {
        *b ^= 0x5a;
    }
    assert!(err(&garbage).reason.contains("does not decode"));

    // The inner bundle is parsed with the same checks.
    let bad_inner = handmade_ccob(2, &inner[..100]);
    assert!(
        err(&bad_inner)
            .reason
            .contains("inside decompressed CCOB bundle")
    );
}

#[test]
fn honours_total_size_and_resumes_after_it() {
    // Bytes after total_size that are not a bundle are skipped; a bundle right after is found.
    let inner = handmade_bundle();
    let mut s = handmade_ccob(3, &inner);
    s.extend_from_slice(b"junk");
    let at = s.len();
    s.extend_from_slice(&handmade_ccob(2, &inner));
    let bundles = parse_fatbin(&s).unwrap();
    assert_eq!(
        bundles.iter().map(|b| b.offset).collect::<Vec<_>>(),
        vec![0, at as u64]
    );
}

#[test]
fn random_mutations_never_panic() {
    let mut section = handmade_bundle();
    section.resize(4096, 0);
    section.extend_from_slice(&handmade_ccob(3, &handmade_bundle()));
    section.extend_from_slice(&handmade_ccob(2, &handmade_bundle()));
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for _ in 0..3000 {
        let mut m = section.clone();
        for _ in 0..1 + next() % 4 {
            let i = (next() % m.len() as u64) as usize;
            m[i] = next() as u8;
        }
        let cut = (next() % (m.len() as u64 + 1)) as usize;
        let _ = parse_fatbin(&m[..cut]);
    }
}

/// The walk over a file reads windows and grows table reads; it must find exactly what the
/// in-memory parse finds: a magic across the first 1 MiB scan window's end, an entry table
/// longer than the first 64 KiB table read, and a CCOB bundle.
#[test]
fn walking_a_file_finds_what_parsing_memory_finds() {
    let code: Vec<Vec<u8>> = (0..3u8).map(|i| vec![i + 1; 5000 + i as usize]).collect();
    let long_triple = format!("hipv4-amdgcn-amd-amdhsa--gfx90a:{}", "x".repeat(900));
    let mut entries: Vec<(String, &[u8])> = vec![("host-x86_64-unknown-linux".into(), &[])];
    for i in 0..80 {
        entries.push((format!("{long_triple}{i}"), &code[i % 3]));
    }
    let refs: Vec<(&str, &[u8])> = entries.iter().map(|(t, d)| (t.as_str(), *d)).collect();
    let big = build_uncompressed(&refs, 4096);
    let small = build_uncompressed(&[("hipv4-amdgcn-amd-amdhsa--gfx942", &code[2])], 4096);
    let ccob = build_ccob(3, &small, 3).unwrap();
    let mut section = vec![0u8; (1 << 20) - 10];
    section.extend_from_slice(&small);
    section.resize(section.len() + 333, 0);
    section.extend_from_slice(&big);
    section.extend_from_slice(&ccob);
    section.resize(section.len() + 77, 0);

    let mut file = tempfile::tempfile().unwrap();
    std::io::Write::write_all(&mut file, b"prefix").unwrap();
    std::io::Write::write_all(&mut file, &section).unwrap();
    let src = FileRange {
        file: &file,
        offset: 6,
        len: section.len() as u64,
    };
    let mut walked = Vec::new();
    walk_fatbin(&src, |e| {
        walked.push(match e {
            Event::Entry(e) => format!("{} {} {}", e.arch, e.offset, e.data.len()),
            Event::End(h) => format!("end {} {} {:?}", h.offset, h.len, h.layout),
        });
        Ok::<(), ()>(())
    })
    .unwrap();
    let mut parsed = Vec::new();
    for b in parse_fatbin(&section).unwrap() {
        for e in b.entries {
            parsed.push(format!("{} {} {}", e.arch, e.offset, e.data.len()));
        }
        parsed.push(format!("end {} {} {:?}", b.offset, b.len, b.layout));
    }
    assert_eq!(walked, parsed);
    assert_eq!(walked.len(), 1 + 1 + 80 + 1 + 1 + 1);
    assert_eq!(
        walked[1],
        format!("end {} {} Uncompressed", (1 << 20) - 10, small.len())
    );
    // Reads land the file's own bytes, from the range's offset.
    let tail = section.len() - 5000;
    assert!(src.read(tail as u64, 5000).unwrap()[..] == section[tail..]);
    assert!(src.read(0, 0).unwrap().is_empty());
    // Truncating the file under the walk is a read error, not a short code object.
    file.set_len(6 + (1 << 20)).unwrap();
    let Err(WalkError::Read(e)) = walk_fatbin(&src, |_| Ok::<(), ()>(())) else {
        panic!("a truncated file walked")
    };
    assert_eq!(
        (e.kind(), e.to_string().as_str()),
        (
            std::io::ErrorKind::UnexpectedEof,
            "the file ended inside its .hip_fatbin section (it changed while being read)"
        )
    );
}

/// A section in memory that records every range read from it.
struct Counting<'a> {
    bytes: &'a [u8],
    reads: std::cell::RefCell<Vec<(u64, u64)>>,
}

impl Source for Counting<'_> {
    fn len(&self) -> u64 {
        self.bytes.len() as u64
    }

    fn read(&self, at: u64, len: usize) -> std::io::Result<Cow<'_, [u8]>> {
        self.reads.borrow_mut().push((at, len as u64));
        Ok(Cow::Borrowed(&self.bytes[at as usize..at as usize + len]))
    }
}

/// The index finds what the walk finds, each code object's bytes where it says they are, and
/// reads no byte of an uncompressed bundle's code objects: of a section of 16 MiB of plain
/// code objects it reads under 1%.
#[test]
fn the_index_locates_code_objects_without_reading_them() {
    let code: Vec<Vec<u8>> = (0..4u8)
        .map(|i| vec![i + 1; (1 << 20) + i as usize])
        .collect();
    let mut section = Vec::new();
    let mut plain_code = Vec::new();
    for tu in 0..4 {
        let entries: Vec<(String, &[u8])> = [
            ("host-x86_64-unknown-linux".to_owned(), &[][..]),
            ("hipv4-amdgcn-amd-amdhsa--gfx942".to_owned(), &code[tu][..]),
            (
                "hipv4-amdgcn-amd-amdhsa--gfx90a:xnack-".to_owned(),
                &code[3 - tu][..],
            ),
        ]
        .into();
        let refs: Vec<(&str, &[u8])> = entries.iter().map(|(t, d)| (t.as_str(), *d)).collect();
        let bundle = build_uncompressed(&refs, 4096);
        section.resize(section.len().next_multiple_of(4096), 0);
        let start = section.len() as u64;
        section.extend_from_slice(&bundle);
        for l in index_fatbin(&bundle[..]).unwrap() {
            plain_code.push((start + l.offset, l.size));
        }
    }
    let small = build_uncompressed(
        &[("hipv4-amdgcn-amd-amdhsa--gfx1030", &code[0][..5000])],
        64,
    );
    section.extend_from_slice(&build_ccob(3, &small, 3).unwrap());

    let src = Counting {
        bytes: &section,
        reads: Default::default(),
    };
    let index = index_fatbin(&src).unwrap();
    let mut walked = Vec::new();
    walk_fatbin(&section[..], |e| {
        if let Event::Entry(e) = e {
            walked.push((e.arch, e.data.into_owned()));
        }
        Ok::<(), ()>(())
    })
    .unwrap();
    assert_eq!(index.len(), walked.len());
    assert_eq!(index.len(), 9);
    for (l, (arch, data)) in index.iter().zip(&walked) {
        assert_eq!((&l.arch, l.size), (arch, data.len() as u64));
        let bytes = match l.bundle.layout {
            Layout::Uncompressed => {
                let at = (l.bundle.offset + l.offset) as usize;
                section[at..at + l.size as usize].to_vec()
            }
            Layout::Compressed { .. } => {
                let bundle = decode_ccob_bundle(&section[..], &l.bundle).unwrap();
                bundle[l.offset as usize..(l.offset + l.size) as usize].to_vec()
            }
        };
        assert!(bytes == *data, "{arch}");
    }
    let reads = src.reads.borrow();
    for (at, n) in reads.iter() {
        for (co, size) in &plain_code {
            assert!(
                at + n <= *co || *at >= co + size,
                "read {at}+{n} touches the code object at {co}+{size}"
            );
        }
    }
    let total: u64 = reads.iter().map(|(_, n)| n).sum();
    assert!(
        total * 100 < section.len() as u64,
        "{total} of {} bytes read",
        section.len()
    );
    // A bundle the index placed must still be there when it is decoded.
    let ccob = index.last().unwrap().bundle;
    let moved = BundleHead {
        len: ccob.len - 1,
        ..ccob
    };
    let Err(WalkError::Bundle(e)) = decode_ccob_bundle(&section[..], &moved) else {
        panic!("a changed bundle decoded")
    };
    assert_eq!(e.reason, "CCOB bundle changed since it was indexed");
}
