//! C ABI benchmark: `kpack_load_code_object` latency (first call on a fresh cache, and warm), and
//! `kpack_get_kernel` and `Archive::get_kernel` throughput over every kernel against plain zstd
//! decoding of the same frames (in memory, one context per thread, output buffer reused), with 1
//! and 2 threads. `kpack_get_kernel` is measured twice: on our layout, where every decode checks
//! the frame's BLAKE3 digest, and on the same kernels written `--reference-layout`, which has no
//! digest, so the run splits the integrity check's cost from the API's own. Two floors run beside
//! them: plain zstd with the BLAKE3 of each frame and nothing else (what checking every decode
//! costs at the least), and plain zstd of frames read from the file with `pread` (what reading
//! them costs at the least). Each figure is a ratio
//! against a baseline from the same run: the contenders run in turn, 31 rounds, and a ratio is the
//! median of the ratios within each round (rates are each one's best round).
//!
//! The loads use a realistic install: `PREFIX/lib/libbench.so` with the embedded pattern
//! `../.kpack/bench_@GFXARCH@.kpack`, a device list `[gfx942:sramecc+:xnack-, its generic]`
//! (eight candidate file names) and one archive, `bench_gfx942.kpack`.
//!
//! Run: `cargo bench --bench capi` (full) or `cargo bench --bench capi -- --quick` (CI smoke).

#[path = "common/mod.rs"]
mod common;
use common::{CodeLike, Rounds};

use std::ffi::{CString, c_char, c_void};
use std::hint::black_box;
use std::time::{Duration, Instant};

use rocm_kpack::ffi;
use rocm_kpack::{Archive, ArchiveWriter, Compression};

/// CPU time (user + system) of every thread of this process so far.
fn process_cpu() -> Duration {
    // SAFETY: getrusage only writes the struct it is given.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(u.ru_utime) + tv(u.ru_stime)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn hipk_metadata(kernel_name: &str, pattern: &str) -> Vec<u8> {
    let mut b = Vec::new();
    rmp::encode::write_map_len(&mut b, 2).unwrap();
    rmp::encode::write_str(&mut b, "kpack_search_paths").unwrap();
    rmp::encode::write_array_len(&mut b, 1).unwrap();
    rmp::encode::write_str(&mut b, pattern).unwrap();
    rmp::encode::write_str(&mut b, "kernel_name").unwrap();
    rmp::encode::write_str(&mut b, kernel_name).unwrap();
    b
}

/// One load through the C entry point; returns the code object's size.
fn c_load(
    cache: ffi::kpack_cache_t,
    meta: &[u8],
    binary: &CString,
    co: u32,
    arches: &[*const c_char],
) -> usize {
    let mut out: *mut c_void = std::ptr::null_mut();
    let mut size = 0usize;
    let rc = unsafe {
        ffi::kpack_load_code_object(
            cache,
            meta.as_ptr().cast(),
            binary.as_ptr(),
            co,
            arches.as_ptr(),
            arches.len(),
            &mut out,
            &mut size,
        )
    };
    assert_eq!(rc, 0, "load failed");
    unsafe { ffi::kpack_free_code_object(out) };
    size
}

fn c_get(archive: ffi::kpack_archive_t, key: &CString, arch: &CString) -> usize {
    let mut out: *mut c_void = std::ptr::null_mut();
    let mut size = 0usize;
    let rc =
        unsafe { ffi::kpack_get_kernel(archive, key.as_ptr(), arch.as_ptr(), &mut out, &mut size) };
    assert_eq!(rc, 0, "get failed");
    unsafe { ffi::kpack_free_kernel(out) };
    size
}

struct Row {
    name: String,
    value: String,
    ratio: Option<(f64, &'static str, &'static str, common::Sense)>,
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let (objects, size, iterations) = if quick {
        (8, 200_000, 20)
    } else {
        (64, 200_000, 200)
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let prefix = std::fs::canonicalize(dir.path()).unwrap();
    std::fs::create_dir_all(prefix.join("lib")).unwrap();
    std::fs::create_dir_all(prefix.join(".kpack")).unwrap();
    let archive_path = prefix.join(".kpack/bench_gfx942.kpack");
    // The same kernels twice: as we write them (frame positions and digests, checked on every
    // decode) and as the reference writer does (`--reference-layout`: nothing to check), so the
    // run shows what the integrity check costs apart from the API's own work.
    let reference_path = prefix.join("bench_reference.kpack");
    let keys: Vec<String> = (0..objects)
        .map(|i| format!("lib/libbench.so#{i}"))
        .collect();
    let mut code = CodeLike::new(7);
    let kernels: Vec<Vec<u8>> = keys.iter().map(|_| code.kernel(size)).collect();
    for (path, reference_layout) in [(&archive_path, false), (&reference_path, true)] {
        let mut w = ArchiveWriter::new(
            "bench",
            "gfx942",
            vec!["gfx942".into()],
            Compression::Zstd { level: 3 },
        )
        .unwrap();
        w.set_reference_layout(reference_layout);
        for (k, kernel) in keys.iter().zip(&kernels) {
            w.add_kernel(k, "gfx942", kernel.clone()).unwrap();
        }
        w.write(path, &|_| {}).unwrap();
    }
    drop(kernels);
    let meta = hipk_metadata("lib/libbench.so", "../.kpack/bench_@GFXARCH@.kpack");
    let binary = CString::new(prefix.join("lib/libbench.so").to_str().unwrap()).unwrap();
    let isa = CString::new("amdgcn-amd-amdhsa--gfx942:sramecc+:xnack-").unwrap();
    let generic = CString::new("amdgcn-amd-amdhsa--gfx9-4-generic:sramecc+:xnack-").unwrap();
    let arches = [isa.as_ptr(), generic.as_ptr()];
    let archive = Archive::open(&archive_path).unwrap();
    let mut rows = Vec::new();

    // Decode-only baseline: the same code object fetched straight from an open archive.
    let decode = median(
        (0..iterations)
            .map(|i| {
                let t = Instant::now();
                black_box(archive.get_kernel(&keys[i % objects], "gfx942").unwrap());
                t.elapsed()
            })
            .collect(),
    );
    rows.push(Row {
        name: format!("Archive::get_kernel, {} KB object", size / 1000),
        value: format!("{:.1} us", decode.as_secs_f64() * 1e6),
        ratio: None,
    });

    // First load on a fresh cache: creating it, resolving, opening the archive, decoding.
    let first = median(
        (0..iterations.min(50))
            .map(|i| {
                let t = Instant::now();
                let mut cache: ffi::kpack_cache_t = std::ptr::null_mut();
                assert_eq!(unsafe { ffi::kpack_cache_create(&mut cache) }, 0);
                black_box(c_load(cache, &meta, &binary, (i % objects) as u32, &arches));
                unsafe { ffi::kpack_cache_destroy(cache) };
                t.elapsed()
            })
            .collect(),
    );
    rows.push(Row {
        name: "kpack_load_code_object, fresh cache".into(),
        value: format!("{:.1} us", first.as_secs_f64() * 1e6),
        ratio: Some((
            first.as_secs_f64() / decode.as_secs_f64(),
            "decode only",
            "",
            common::Sense::Time,
        )),
    });

    // Warm loads: the archive is cached; resolution is re-done on every call, as in the reference.
    let mut cache: ffi::kpack_cache_t = std::ptr::null_mut();
    assert_eq!(unsafe { ffi::kpack_cache_create(&mut cache) }, 0);
    c_load(cache, &meta, &binary, 0, &arches);
    let warm = median(
        (0..iterations)
            .map(|i| {
                let t = Instant::now();
                black_box(c_load(cache, &meta, &binary, (i % objects) as u32, &arches));
                t.elapsed()
            })
            .collect(),
    );
    unsafe { ffi::kpack_cache_destroy(cache) };
    rows.push(Row {
        name: "kpack_load_code_object, warm cache".into(),
        value: format!("{:.1} us", warm.as_secs_f64() * 1e6),
        ratio: Some((
            warm.as_secs_f64() / decode.as_secs_f64(),
            "decode only",
            if quick { "" } else { "(target: near 1)" },
            common::Sense::Time,
        )),
    });

    // kpack_get_kernel through the C entry point against the Rust call, 1 and 2 threads.
    let path_c = CString::new(archive_path.to_str().unwrap()).unwrap();
    let mut handle: ffi::kpack_archive_t = std::ptr::null_mut();
    assert_eq!(unsafe { ffi::kpack_open(path_c.as_ptr(), &mut handle) }, 0);
    let reference_c = CString::new(reference_path.to_str().unwrap()).unwrap();
    let mut reference: ffi::kpack_archive_t = std::ptr::null_mut();
    assert_eq!(
        unsafe { ffi::kpack_open(reference_c.as_ptr(), &mut reference) },
        0
    );
    let c_keys: Vec<CString> = keys
        .iter()
        .map(|k| CString::new(k.as_str()).unwrap())
        .collect();
    let gfx942 = CString::new("gfx942").unwrap();
    let total = (objects * size) as f64;
    // Plain zstd: the same frames, already in memory, decoded with one context per thread into
    // a buffer reused from call to call (no allocation, no page faults): the decoding ceiling.
    let located: Vec<_> = keys
        .iter()
        .map(|k| archive.locate(k, "gfx942").unwrap())
        .collect();
    let offsets: Vec<u64> = located.iter().map(|r| r.stored.offset).collect();
    let frames: Vec<(Vec<u8>, usize)> = located
        .iter()
        .map(|r| {
            use std::os::unix::fs::FileExt;
            let mut f = vec![0u8; r.stored.size as usize];
            std::fs::File::open(&archive_path)
                .unwrap()
                .read_exact_at(&mut f, r.stored.offset)
                .unwrap();
            (f, r.size as usize)
        })
        .collect();
    // Raw pointers are not Send; the handle is documented as shareable across threads.
    let handle_addr = handle as usize;
    let reference_addr = reference as usize;
    // Every kernel `passes` times, split between `step` threads; `part` is this thread's share.
    // One pass over the set takes a few milliseconds: a timing of several passes is long enough
    // for a scheduler tick or a page-cache hiccup not to decide a ratio.
    let passes = if quick { 1 } else { 6 };
    let all = |n: usize| (0..passes).flat_map(move |_| 0..n);
    // Plain zstd of the frames in memory; with `hash`, each frame's BLAKE3 before its decode.
    let in_memory = |part: usize, step: usize, hash: bool| {
        let mut dctx = zstd::zstd_safe::DCtx::create();
        let mut out = Vec::new();
        for (f, size) in all(frames.len())
            .skip(part)
            .step_by(step)
            .map(|i| &frames[i])
        {
            if hash {
                black_box(blake3::hash(f));
            }
            out.resize(*size, 0);
            let n = dctx.decompress(&mut out[..], f).unwrap();
            assert_eq!(n, *size);
            black_box(&out);
        }
    };
    let zstd_part = |part: usize, step: usize| in_memory(part, step, false);
    // Two floors of the same decodes, so that a run shows what no implementation of the API
    // can avoid: the BLAKE3 check of every frame with nothing else, and reading each frame from
    // the file with nothing else. A system call right before a decode can cost the decode more
    // than the call itself (see docs/benchmarks.md).
    let hash_floor_part = |part: usize, step: usize| in_memory(part, step, true);
    let read_floor_part = |part: usize, step: usize| {
        use std::os::unix::fs::FileExt;
        let file = std::fs::File::open(&archive_path).unwrap();
        let mut dctx = zstd::zstd_safe::DCtx::create();
        let (mut out, mut frame) = (Vec::new(), Vec::new());
        for i in all(frames.len()).skip(part).step_by(step) {
            let ((f, size), offset) = (&frames[i], offsets[i]);
            frame.resize(f.len(), 0);
            file.read_exact_at(&mut frame, offset).unwrap();
            out.resize(*size, 0);
            let n = dctx.decompress(&mut out[..], &frame).unwrap();
            assert_eq!(n, *size);
            black_box(&out);
        }
    };
    let rust_part = |part: usize, step: usize| {
        for k in all(keys.len()).skip(part).step_by(step).map(|i| &keys[i]) {
            black_box(archive.get_kernel(k, "gfx942").unwrap());
        }
    };
    let c_over = |addr: usize, part: usize, step: usize| {
        for k in all(c_keys.len())
            .skip(part)
            .step_by(step)
            .map(|i| &c_keys[i])
        {
            black_box(c_get(addr as ffi::kpack_archive_t, k, &gfx942));
        }
    };
    let c_part = |part: usize, step: usize| c_over(handle_addr, part, step);
    let c_reference_part = |part: usize, step: usize| c_over(reference_addr, part, step);
    let parts: [&(dyn Fn(usize, usize) + Sync); 6] = [
        &zstd_part,
        &rust_part,
        &c_part,
        &c_reference_part,
        &hash_floor_part,
        &read_floor_part,
    ];
    // Wall time, and the CPU time of the whole process (every thread, user and system: page
    // faults count). On a machine whose cores other work keeps busy, wall time mostly measures
    // that work; CPU time still shows what each call costs.
    let timed = |f: &(dyn Fn(usize, usize) + Sync), threads: usize| {
        let (t, c) = (Instant::now(), process_cpu());
        if threads == 1 {
            f(0, 1);
        } else {
            std::thread::scope(|s| {
                for part in 0..threads {
                    s.spawn(move || f(part, threads));
                }
            });
        }
        (t.elapsed(), process_cpu() - c)
    };
    // The six are measured in turn within each round (the order rotating), and ratios are
    // medians of ratios within a round (`common::Rounds`): the baseline and the APIs see the
    // same machine even when the host takes time away in bursts. Absolute rates are each
    // one's best round.
    let rounds = if quick { 2 } else { 31 };
    let mut wall = [Rounds::new(parts.len()), Rounds::new(parts.len())];
    let mut cpu = [Rounds::new(parts.len()), Rounds::new(parts.len())];
    for round in 0..rounds {
        for (ti, threads) in [1, 2].into_iter().enumerate() {
            for i in wall[ti].order(round).collect::<Vec<_>>() {
                let (w, c) = timed(parts[i], threads);
                wall[ti].push(i, w);
                cpu[ti].push(i, c);
            }
        }
    }
    unsafe { ffi::kpack_close(handle) };
    unsafe { ffi::kpack_close(reference) };
    let rate = |d: Duration| total * passes as f64 / d.as_secs_f64() / 1e6;
    // Smoke runs print no targets: on a small set and a busy machine they measure nothing.
    let target = if quick { "" } else { "(target >= 0.95)" };
    const ZSTD: usize = 0;
    const NAMES: [&str; 6] = [
        "plain zstd decoding",
        "Archive::get_kernel",
        "kpack_get_kernel",
        "  the same, reference layout",
        "  floor: zstd + frame BLAKE3",
        "  floor: pread + zstd",
    ];
    for ti in 0..2 {
        let threads = ti + 1;
        let s = if threads == 1 { "" } else { "s" };
        for (i, name) in NAMES.into_iter().enumerate() {
            rows.push(Row {
                name: format!("{name}, {threads} thread{s}"),
                value: format!("{:.0} MB/s", rate(wall[ti].best(i))),
                ratio: match i {
                    ZSTD => None,
                    1 => Some((
                        wall[ti].median_ratio(i, ZSTD),
                        "plain zstd",
                        "",
                        common::Sense::Faster,
                    )),
                    2 => Some((
                        wall[ti].median_ratio(i, ZSTD),
                        "plain zstd",
                        target,
                        common::Sense::Faster,
                    )),
                    3 => Some((
                        wall[ti].median_ratio(i, ZSTD),
                        "plain zstd (no digest to check)",
                        "",
                        common::Sense::Faster,
                    )),
                    _ => Some((
                        wall[ti].median_ratio(i, ZSTD),
                        "plain zstd",
                        "",
                        common::Sense::Faster,
                    )),
                },
            });
        }
        for i in [1, 2] {
            rows.push(Row {
                name: format!("{}, {threads} thread{s}, CPU time", NAMES[i]),
                value: format!("{:.1} ms", cpu[ti].best(i).as_secs_f64() * 1e3),
                ratio: Some((
                    cpu[ti].median_ratio(i, ZSTD),
                    "plain zstd's CPU time / this",
                    "",
                    common::Sense::Faster,
                )),
            });
        }
    }

    println!(
        "kpack C ABI benchmark{}",
        if quick { " (quick smoke run)" } else { "" }
    );
    println!(
        "{:<44} {:>12} {:>9}  against",
        "measurement", "value", "ratio"
    );
    for r in rows {
        match r.ratio {
            Some((ratio, against, target, sense)) => println!(
                "{:<44} {:>12} {:>8.2}x  {}: {}",
                r.name,
                r.value,
                ratio,
                format!("{against} {}", common::against_for_print(target, quick)).trim_end(),
                common::plainly(ratio, sense)
            ),
            None => println!("{:<44} {:>12} {:>9}  baseline", r.name, r.value, "1.00x"),
        }
    }
}
