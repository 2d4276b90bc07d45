//! Round trips over random trees (property-style with a fixed-seed generator, so failures
//! reproduce), and concurrent reads of one archive from 8 threads.

use std::sync::Arc;

use rocm_kpack::{Archive, ArchiveWriter, Compression};

use crate::support::fat_host::Rng;

const ARCHES: [&str; 5] = [
    "gfx900",
    "gfx90a:xnack-",
    "gfx90a:xnack+",
    "gfx1100",
    "gfx942:sramecc+:xnack-",
];

fn random_kernels(rng: &mut Rng) -> Vec<(String, String, Vec<u8>)> {
    let mut out = Vec::new();
    let binaries = rng.below(12) as usize;
    for b in 0..binaries {
        let depth = rng.below(3);
        let mut key = String::new();
        for d in 0..depth {
            key.push_str(&format!("dir{}/", (d + rng.below(3))));
        }
        key.push_str(&format!("lib{b}.so#{}", rng.below(4)));
        for arch in ARCHES {
            if rng.below(2) == 0 {
                let len = match rng.below(4) {
                    0 => 0,
                    1 => rng.below(100) as usize,
                    _ => rng.below(20_000) as usize,
                };
                out.push((key.clone(), arch.to_owned(), rng.kernel(len)));
            }
        }
    }
    out
}

#[test]
fn random_trees_round_trip_through_both_schemes() {
    let dir = tempfile::tempdir().unwrap();
    for seed in 0..40u64 {
        let mut rng = Rng::new(seed);
        let kernels = random_kernels(&mut rng);
        for compression in [
            Compression::None,
            Compression::Zstd {
                level: 1 + (seed % 5) as i32,
            },
        ] {
            let mut w = ArchiveWriter::new(
                "g",
                "f",
                ARCHES.iter().map(|a| a.to_string()).collect(),
                compression,
            )
            .unwrap();
            for (k, a, d) in &kernels {
                w.add_kernel(k, a, d.clone()).unwrap();
            }
            let path = dir.path().join(format!("{seed}.kpack"));
            w.write(&path, &|_| {}).unwrap();
            let archive = Archive::open(&path).unwrap();
            assert_eq!(archive.entries().count(), kernels.len(), "seed {seed}");
            for (k, a, d) in &kernels {
                assert_eq!(&archive.get_kernel(k, a).unwrap(), d, "seed {seed} {k} {a}");
            }
            let keys: Vec<&str> = archive.binaries().map(|b| b.key).collect();
            let mut sorted = keys.clone();
            sorted.sort();
            sorted.dedup();
            assert_eq!(keys, sorted, "binaries come sorted and unique");
        }
    }
}

#[test]
fn output_does_not_depend_on_thread_count() {
    let mut rng = Rng::new(99);
    let kernels: Vec<_> = (0..40)
        .map(|i| (format!("b{i}#0"), "gfx900".to_owned(), rng.kernel(80_000)))
        .collect();
    let bytes = |threads| {
        let mut w = ArchiveWriter::new(
            "g",
            "gfx900",
            vec!["gfx900".into()],
            Compression::Zstd { level: 3 },
        )
        .unwrap();
        w.set_threads(threads);
        for (k, a, d) in &kernels {
            w.add_kernel(k, a, d.clone()).unwrap();
        }
        let mut out = Vec::new();
        w.write_to(&mut out, &|_| {}).unwrap();
        out
    };
    assert_eq!(bytes(1), bytes(4));
}

#[test]
fn duplicate_kernels_are_refused() {
    let mut w = ArchiveWriter::new("g", "f", vec!["gfx900".into()], Compression::None).unwrap();
    w.add_kernel("a\\b#0", "gfx900", vec![1]).unwrap();
    let e = w.add_kernel("a/b#0", "gfx900", vec![2]).unwrap_err();
    assert_eq!(e.kind(), rocm_kpack::ErrorKind::InvalidArgument);
    assert!(ArchiveWriter::new("g", "f", vec![], Compression::Zstd { level: 23 }).is_err());
}

#[test]
fn eight_threads_read_one_archive_concurrently() {
    let mut rng = Rng::new(7);
    let kernels: Vec<_> = (0..16)
        .map(|i| {
            (
                format!("lib/l{i}.so#0"),
                "gfx900".to_owned(),
                rng.kernel(50_000 + i * 1000),
            )
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    for compression in [Compression::None, Compression::Zstd { level: 3 }] {
        let mut w = ArchiveWriter::new("g", "gfx900", vec!["gfx900".into()], compression).unwrap();
        for (k, a, d) in &kernels {
            w.add_kernel(k, a, d.clone()).unwrap();
        }
        let path = dir.path().join("c.kpack");
        w.write(&path, &|_| {}).unwrap();
        let archive = Arc::new(Archive::open(&path).unwrap());
        let kernels = Arc::new(kernels.clone());
        let handles: Vec<_> = (0..8)
            .map(|t| {
                let archive = archive.clone();
                let kernels = kernels.clone();
                std::thread::spawn(move || {
                    for i in 0..200 {
                        // Half the threads hit the same kernel, half spread out.
                        let idx = if t % 2 == 0 {
                            3
                        } else {
                            (i * 7 + t) % kernels.len()
                        };
                        let (k, a, d) = &kernels[idx];
                        assert_eq!(&archive.get_kernel(k, a).unwrap(), d);
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
    }
}
