//! Hostile archives whose headers claim far more than the file holds, each opened (and read)
//! in a child process whose peak resident memory is measured: the TOC claiming 2^32 entries,
//! `original_size` of 2^60, frame tables claiming more frames than the file, deeply nested
//! msgpack, and zstd frames recording huge content sizes.
//!
//! How it is measured: each test writes its file, then re-runs this test binary with
//! `KPACK_ALLOC_CASE` set, filtered to [`child`]. The child resets its peak-RSS counter
//! (`/proc/self/clear_refs`), caps its address space at the current size plus 64 x the file
//! plus 256 MiB (so even untouched reservations beyond that fail loudly), opens the archive,
//! reads every entry, and prints the error kinds, `VmHWM` and the elapsed time. The parent
//! asserts the exact kinds and that the peak grew by at most 16 x the file plus 6 MiB. A fresh
//! process per case keeps one case's heap out of another's figure.

use std::io::Write;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use rocm_kpack::{Archive, ErrorKind};

use crate::support::craft::*;

const CASE_VAR: &str = "KPACK_ALLOC_CASE";
const FILE_VAR: &str = "KPACK_ALLOC_FILE";
const MIB: u64 = 1 << 20;
/// A child case that allocates on purpose, to show the measurement can fail.
const TOUCH_CASE: &str = "touch-16x-plus-8mib";

/// One `VmXxx:` figure of /proc/self/status, in bytes.
fn status_bytes(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status
        .lines()
        .find(|l| l.starts_with(field))
        .unwrap_or_else(|| panic!("no {field}"));
    let kib: u64 = line[field.len()..]
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .unwrap();
    kib * 1024
}

fn kind_of(r: &Result<impl Sized, rocm_kpack::Error>) -> String {
    match r {
        Ok(_) => "ok".into(),
        Err(e) => format!("{:?}", e.kind()),
    }
}

/// The child side: does nothing unless the parent set `KPACK_ALLOC_CASE`.
#[test]
fn child() {
    let Some(case) = std::env::var_os(CASE_VAR) else {
        return;
    };
    let path = std::env::var_os(FILE_VAR).expect("file");
    let file_len = std::fs::metadata(&path).unwrap().len();
    // Reset the peak-RSS counter so the figure covers only what follows.
    std::fs::write("/proc/self/clear_refs", "5").expect("clear_refs");
    let rss_before = status_bytes("VmRSS:");
    let cap = status_bytes("VmSize:") + 64 * file_len + 256 * MIB;
    let limit = libc::rlimit {
        rlim_cur: cap,
        rlim_max: cap,
    };
    // SAFETY: plain syscall on a valid struct.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_AS, &limit) }, 0);

    if case == TOUCH_CASE {
        let mut v = vec![1u8; (16 * file_len + 8 * MIB) as usize];
        v[0] = std::hint::black_box(v[1]);
    }
    let start = Instant::now();
    let opened = Archive::open(&path);
    let mut gets = Vec::new();
    if let Ok(a) = &opened {
        let entries: Vec<(String, String)> = a
            .entries()
            .map(|(k, e)| (k.to_owned(), e.arch.to_owned()))
            .collect();
        gets.extend(
            entries
                .iter()
                .take(4)
                .map(|(k, arch)| kind_of(&a.get_kernel(k, arch))),
        );
    }
    let elapsed = start.elapsed();
    let hwm = status_bytes("VmHWM:");
    println!(
        "KPACK_ALLOC case={} open={} gets={} file={file_len} rss_before={rss_before} hwm={hwm} micros={}",
        case.to_string_lossy(),
        kind_of(&opened),
        if gets.is_empty() {
            "-".to_owned()
        } else {
            gets.join(",")
        },
        elapsed.as_micros()
    );
}

/// What a child reported.
#[derive(Debug)]
struct Measured {
    open: String,
    gets: String,
    file_len: u64,
    growth: u64,
    elapsed: Duration,
}

fn measure(case: &str, bytes: &[u8]) -> Measured {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("hostile.kpack");
    std::fs::File::create(&path)
        .unwrap()
        .write_all(bytes)
        .unwrap();
    run_child(case, &path)
}

fn run_child(case: &str, path: &Path) -> Measured {
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "alloc_bounds::child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CASE_VAR, case)
        .env(FILE_VAR, path)
        // One malloc arena, so a second thread's 64 MiB arena reservation is not in the figure.
        .env("MALLOC_ARENA_MAX", "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "child for {case} failed: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    // libtest prints its own "test ... " prefix on the same line, so look for the marker anywhere.
    let line = stdout
        .lines()
        .find_map(|l| l.split_once("KPACK_ALLOC ").map(|(_, rest)| rest))
        .unwrap_or_else(|| panic!("no report:\n{stdout}"));
    let field = |name: &str| -> String {
        let key = format!("{name}=");
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(&key))
            .unwrap()
            .to_owned()
    };
    let num = |name: &str| -> u64 { field(name).parse().unwrap() };
    let m = Measured {
        open: field("open"),
        gets: field("gets"),
        file_len: num("file"),
        growth: num("hwm").saturating_sub(num("rss_before")),
        elapsed: Duration::from_micros(num("micros")),
    };
    println!("{case}: {m:?}");
    m
}

/// What every child touches whatever the file: the code and the zstd context of a first open,
/// which grows with the size of the test binary (docs/reliability.md). A hostile size still
/// shows: it asks for 2^32 to 2^60 bytes.
const FIXED_ALLOWANCE: u64 = 6 * MIB;

/// The bound every case must meet: peak resident growth within 16 x the file plus the fixed
/// allowance.
fn assert_bounded(m: &Measured) {
    let bound = 16 * m.file_len + FIXED_ALLOWANCE;
    assert!(
        m.growth <= bound,
        "peak grew {} bytes for a {}-byte file (bound {bound})",
        m.growth,
        m.file_len
    );
}

fn expect(case: &str, bytes: &[u8], open: ErrorKind) -> Measured {
    let m = measure(case, bytes);
    assert_eq!(m.open, format!("{open:?}"), "{case}");
    assert_bounded(&m);
    m
}

fn expect_get(case: &str, bytes: &[u8], get: ErrorKind) -> Measured {
    let m = measure(case, bytes);
    assert_eq!(m.open, "ok", "{case}");
    assert!(
        m.gets.split(',').all(|g| g == format!("{get:?}")),
        "{case}: {}",
        m.gets
    );
    assert_bounded(&m);
    m
}

/// The measurement itself: a child that touches 16 x the file plus 8 MiB must be reported over
/// the bound, or the other cases would prove nothing.
#[test]
fn the_measurement_sees_a_touched_allocation() {
    let m = measure(TOUCH_CASE, &[0u8; 1024]);
    assert!(m.growth > 16 * 1024 + FIXED_ALLOWANCE, "{m:?}");
}

/// A header pointing at a TOC that follows it directly.
fn with_raw_toc(toc: &[u8]) -> Vec<u8> {
    let mut out = b"KPAK".to_vec();
    out.extend_from_slice(&1u32.to_le_bytes());
    out.extend_from_slice(&16u64.to_le_bytes());
    out.extend_from_slice(toc);
    out
}

/// `{"toc": <map32 header claiming `claim` entries>}` followed by `present` real entries.
fn toc_claiming(claim: u32, present: usize) -> Vec<u8> {
    let mut toc = vec![0x81, 0xa3, b't', b'o', b'c', 0xdf];
    toc.extend_from_slice(&claim.to_be_bytes());
    for i in 0..present {
        let key = format!("k{i:07}");
        toc.extend(V::S(key).encode());
        toc.extend(
            m(vec![(
                "gfx900",
                m(vec![("ordinal", V::U(0)), ("original_size", V::U(1))]),
            )])
            .encode(),
        );
    }
    with_raw_toc(&toc)
}

#[test]
fn toc_map32_claiming_2e32_entries() {
    expect(
        "map32-2e32-empty",
        &toc_claiming(u32::MAX, 0),
        ErrorKind::MsgpackParseFailed,
    );
    // The same claim with ~1 MiB of real entries behind it.
    expect(
        "map32-2e32-1mib",
        &toc_claiming(u32::MAX, 30_000),
        ErrorKind::MsgpackParseFailed,
    );
}

#[test]
fn toc_claiming_as_many_entries_as_the_bytes_allow() {
    // Passes the "two bytes per entry" check, so the parser starts reading; it must fail at the
    // end of the data without having reserved per-claimed-entry memory beyond the bound.
    let real = toc_claiming(0, 30_000).len() as u32;
    expect(
        "map32-half-bytes",
        &toc_claiming(real / 2, 30_000),
        ErrorKind::MsgpackParseFailed,
    );
}

#[test]
fn array32_and_root_map32_claims() {
    let mut arches = vec![0x81, 0xaa];
    arches.extend_from_slice(b"gfx_arches");
    arches.extend_from_slice(&[0xdd, 0xff, 0xff, 0xff, 0xff]);
    arches.extend((0..100_000).flat_map(|_| [0xa1, b'g']));
    expect(
        "array32-2e32-arches",
        &with_raw_toc(&arches),
        ErrorKind::MsgpackParseFailed,
    );
    let mut blobs = vec![0x81, 0xa5];
    blobs.extend_from_slice(b"blobs");
    blobs.extend_from_slice(&[0xdd, 0xff, 0xff, 0xff, 0xff]);
    expect(
        "array32-2e32-blobs",
        &with_raw_toc(&blobs),
        ErrorKind::MsgpackParseFailed,
    );
    expect(
        "root-map32-2e32",
        &with_raw_toc(&[0xdf, 0xff, 0xff, 0xff, 0xff]),
        ErrorKind::MsgpackParseFailed,
    );
}

#[test]
fn deeply_nested_msgpack() {
    expect(
        "nested-arrays-1mib",
        &with_raw_toc(&vec![0x91; 1 << 20]),
        ErrorKind::MsgpackParseFailed,
    );
    let maps = [0x81u8, 0xa1, b'k'].repeat(350_000);
    expect(
        "nested-maps-1mib",
        &with_raw_toc(&maps),
        ErrorKind::MsgpackParseFailed,
    );
    // Nesting inside an entry field, below the parts the TOC walker reads itself.
    let mut toc = vec![
        0x81, 0xa3, b't', b'o', b'c', 0x81, 0xa1, b'k', 0x81, 0xa1, b'a', 0x81, 0xa1, b'x',
    ];
    toc.extend(vec![0x91; 1 << 20]);
    expect(
        "nested-in-entry-1mib",
        &with_raw_toc(&toc),
        ErrorKind::MsgpackParseFailed,
    );
}

fn zstd_with(frame_table_blob: &[u8], original_size: u64) -> Vec<u8> {
    let (_, mut toc) = zstd_parts(&sample_kernel());
    toc.set("zstd_size", V::U(frame_table_blob.len() as u64));
    toc.at("toc")
        .at("k#0")
        .at("gfx900")
        .set("original_size", V::U(original_size));
    archive_bytes(frame_table_blob, &toc.encode())
}

#[test]
fn original_size_of_2e60_with_a_tiny_frame() {
    let frame = zstd::bulk::compress(&sample_kernel(), 3).unwrap();
    expect_get(
        "original-size-2e60",
        &zstd_with(&frame_table(std::slice::from_ref(&frame)), 1 << 60),
        ErrorKind::DecompressionFailed,
    );
    // A frame that does not record its size: only the expansion ceiling stands between the claim
    // and an allocation, and 2^60 is far above it.
    let mut enc = zstd::bulk::Compressor::new(3).unwrap();
    enc.include_contentsize(false).unwrap();
    let unsized_frame = enc.compress(&sample_kernel()).unwrap();
    expect_get(
        "original-size-2e60-unsized",
        &zstd_with(&frame_table(&[unsized_frame]), 1 << 60),
        ErrorKind::DecompressionFailed,
    );
}

/// A zstd frame whose header records `content_size` but holds one empty raw block.
fn frame_recording(content_size: u64) -> Vec<u8> {
    let mut f = 0xFD2F_B528u32.to_le_bytes().to_vec();
    f.push(0b1110_0000); // 8-byte content size, single segment, no checksum, no dictionary
    f.extend_from_slice(&content_size.to_le_bytes());
    f.extend_from_slice(&[0x01, 0x00, 0x00]); // last block, raw, 0 bytes
    f
}

#[test]
fn frame_header_recording_a_huge_content_size() {
    let frame = frame_recording(1 << 60);
    assert_eq!(
        zstd::zstd_safe::get_frame_content_size(&frame).unwrap(),
        Some(1 << 60)
    );
    let table = frame_table(&[frame]);
    // The TOC agrees with the frame: still far above what the frame's bytes can produce.
    expect_get(
        "frame-records-2e60",
        &zstd_with(&table, 1 << 60),
        ErrorKind::DecompressionFailed,
    );
    // The TOC claims a modest size the frame contradicts.
    expect_get(
        "frame-records-2e60-toc-100",
        &zstd_with(&table, 100),
        ErrorKind::DecompressionFailed,
    );
}

#[test]
fn frame_tables_claiming_more_than_the_file() {
    // 2^20 frames (the limit) claimed by a 64-byte blob.
    let mut blob = (1u32 << 20).to_le_bytes().to_vec();
    blob.resize(64, 0);
    expect(
        "frames-2e20-in-64-bytes",
        &zstd_with(&blob, 1),
        ErrorKind::InvalidFormat,
    );
    // One frame claiming 4 GiB - 1 bytes.
    let mut blob = 1u32.to_le_bytes().to_vec();
    blob.extend_from_slice(&u32::MAX.to_le_bytes());
    blob.resize(64, 0);
    expect(
        "frame-of-4gib-in-64-bytes",
        &zstd_with(&blob, 1),
        ErrorKind::InvalidFormat,
    );
    // zstd_size claiming 4 GiB in a small file.
    let (blob, mut toc) = zstd_parts(&sample_kernel());
    toc.set("zstd_size", V::U(4 << 30));
    expect(
        "zstd-size-4gib",
        &archive_bytes(&blob, &toc.encode()),
        ErrorKind::IoError,
    );
    // The full 2^20 empty frames really present (a 4 MiB table): opens, and the index costs
    // 16 bytes per frame, four times the table itself.
    let mut blob = (1u32 << 20).to_le_bytes().to_vec();
    blob.resize(4 + 4 * (1 << 20), 0);
    let m = expect_get(
        "frames-2e20-present",
        &zstd_with(&blob, 1),
        ErrorKind::DecompressionFailed,
    );
    assert!(m.elapsed < Duration::from_secs(20), "{m:?}");
}

#[test]
fn plain_blobs_claiming_more_than_the_file() {
    let data = sample_kernel();
    let (blob, mut toc) = noop_parts(&data);
    toc.set(
        "blobs",
        V::A(vec![m(vec![("offset", V::U(64)), ("size", V::U(1 << 60))])]),
    );
    expect_get(
        "noop-blob-2e60",
        &archive_bytes(&blob, &toc.encode()),
        ErrorKind::IoError,
    );
}

/// Not memory but time: one key with 100,000 arches, each written twice (the second with
/// another ordinal). Repeated arches used to be found by a linear search, which made this
/// quadratic (40,000 arches took 29 s); it must now open in well under the 20 s allowed, keep
/// each arch once in first-seen order, and keep the first value (the reference's rule).
#[test]
fn one_key_with_many_repeated_arches_opens_in_linear_time() {
    let n = 100_000u32;
    let mut toc = vec![0x81, 0xa3, b't', b'o', b'c', 0x81, 0xa1, b'k', 0xdf];
    toc.extend_from_slice(&(2 * n).to_be_bytes());
    for pass in 0..2u64 {
        for i in 0..n {
            toc.extend(V::S(format!("gfx{i:06}")).encode());
            toc.extend(
                m(vec![
                    ("ordinal", V::U(pass)),
                    ("original_size", V::U(u64::from(i))),
                ])
                .encode(),
            );
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("arches.kpack");
    std::fs::write(&path, with_raw_toc(&toc)).unwrap();
    let start = Instant::now();
    let archive = Archive::open(&path).unwrap();
    let elapsed = start.elapsed();
    assert!(elapsed < Duration::from_secs(20), "open took {elapsed:?}");
    let arches: Vec<_> = archive.binary(0).unwrap().arches().collect();
    assert_eq!(arches.len(), n as usize);
    for (i, e) in arches.iter().enumerate() {
        assert_eq!(
            (e.arch, e.ordinal, e.original_size),
            (format!("gfx{i:06}").as_str(), 0, i as u64)
        );
    }
}

/// Not memory but time: `list` and `verify` over one key with 100,000 arches. They walked the
/// entries and then looked each up again by name, a linear search through the key's arches, so
/// the walk was quadratic; through the entries' indices it must finish well under the 30 s allowed.
/// The entries have no stored blobs, so each is listed and reported as not found.
#[test]
fn list_and_verify_of_one_key_with_many_arches_take_linear_time() {
    let n = 100_000u32;
    let mut toc = vec![0x81, 0xa3, b't', b'o', b'c', 0x81, 0xa1, b'k', 0xdf];
    toc.extend_from_slice(&n.to_be_bytes());
    for i in 0..n {
        toc.extend(V::S(format!("gfx{i:06}")).encode());
        toc.extend(
            m(vec![
                ("ordinal", V::U(u64::from(i))),
                ("original_size", V::U(1)),
            ])
            .encode(),
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("arches.kpack");
    std::fs::write(&path, with_raw_toc(&toc)).unwrap();
    for command in ["list", "verify"] {
        let start = Instant::now();
        let o = crate::cli::kpack_fuse(&[&command, &path]);
        let elapsed = start.elapsed();
        assert!(
            elapsed < Duration::from_secs(30),
            "{command} took {elapsed:?}"
        );
        let out = String::from_utf8_lossy(if command == "list" {
            &o.stdout
        } else {
            &o.stderr
        });
        assert!(
            out.lines().filter(|l| l.contains("gfx")).count() >= n as usize,
            "{command}: every entry shown"
        );
        assert!(out.contains(&format!("gfx{:06}", n - 1)), "{command}");
    }
}

/// Not memory but time: a FIFO where the archive should be. Opening one for reading used to wait
/// for a writer forever; now it reads as an empty file (an I/O error) at once.
#[test]
fn a_fifo_in_place_of_the_archive_does_not_block_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fifo.kpack");
    let c_path = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: a valid C string and mode.
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
    let (tx, rx) = std::sync::mpsc::channel();
    let p = path.clone();
    std::thread::spawn(move || tx.send(Archive::open(&p).map(|_| ()).map_err(|e| e.kind())));
    let got = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("Archive::open on a FIFO blocked");
    assert_eq!(got, Err(ErrorKind::IoError));
}

/// HIPK metadata without a terminator, read from a length-less pointer: the readable bytes end
/// at a `PROT_NONE` guard page exactly `MAX_METADATA_BYTES` after the pointer, so a decoder that
/// looked past its cap would fault. Each document never completes inside the cap; each must
/// fail as `InvalidMetadata` without touching the guard page.
#[test]
fn metadata_without_a_terminator_stops_at_the_cap() {
    use rocm_kpack::host::hipk::metadata::{HipkMetadata, MAX_METADATA_BYTES};

    use crate::fuzz_regressions::checks::hipk_metadata::GuardedCopy;

    let cap = MAX_METADATA_BYTES;
    let fill = |head: &[u8], byte: u8| -> Vec<u8> {
        let mut v = head.to_vec();
        v.resize(cap, byte);
        v
    };
    let cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "array16 of 65535 nils, cap holds fewer",
            fill(&[0xdc, 0xff, 0xff], 0xc0),
        ),
        (
            "array32 claiming 2^32 items",
            fill(&[0xdd, 0xff, 0xff, 0xff, 0xff], 0xc0),
        ),
        ("nesting up to the cap", vec![0x91; cap]),
        ("map whose last value runs into the cap", {
            let mut v = vec![0x82, 0xab];
            v.extend_from_slice(b"kernel_name");
            v.extend_from_slice(&[0xa1, b'k', 0xb2]);
            v.extend_from_slice(b"kpack_search_paths");
            v.extend_from_slice(&[0xdc, 0xff, 0xff]);
            fill(&v, 0xa0)
        }),
        (
            "str32 claiming past the cap",
            fill(&[0x81, 0xdb, 0x00, 0x01, 0x00, 0x00], b'x'),
        ),
    ];
    for (name, bytes) in cases {
        assert_eq!(bytes.len(), cap, "{name}");
        let guarded = GuardedCopy::new(&bytes);
        // SAFETY: the cap's worth of bytes is readable; the page after it is the guard.
        let got = unsafe { HipkMetadata::parse_pointer(guarded.ptr()) };
        assert_eq!(
            got.map_err(|e| e.kind()).err(),
            Some(ErrorKind::InvalidMetadata),
            "{name}"
        );
    }
}
