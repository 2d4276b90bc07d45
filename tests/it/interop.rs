//! Archives we write, read by an independent Python reader (tests/python/read_kpack.py, using
//! the PyPI `msgpack` and `zstandard` packages that `.ci/run` installs).

use std::path::Path;
use std::process::Command;

use rocm_kpack::{ArchiveWriter, Compression};

use crate::support::fat_host::Rng;

fn python_read(archive: &Path, out: &Path) -> Vec<(String, String, u32, Vec<u8>)> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/read_kpack.py");
    let status = Command::new("python3")
        .arg(&script)
        .arg(archive)
        .arg(out)
        .status()
        .expect("python3 must be installed (see .ci/run)");
    assert!(
        status.success(),
        "the Python reader failed (pip install msgpack zstandard?)"
    );
    let manifest = std::fs::read_to_string(out.join("manifest.tsv")).unwrap();
    manifest
        .lines()
        .map(|line| {
            let f: Vec<&str> = line.split('\t').collect();
            let data = std::fs::read(out.join(format!("{}.bin", f[0]))).unwrap();
            assert_eq!(data.len(), f[4].parse::<usize>().unwrap());
            (
                f[1].to_owned(),
                f[2].to_owned(),
                f[3].parse().unwrap(),
                data,
            )
        })
        .collect()
}

#[test]
fn python_reads_our_archives() {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = Rng::new(2024);
    let arches = ["gfx1100", "gfx90a:xnack+", "gfx9-4-generic"];
    let kernels: Vec<(String, String, Vec<u8>)> = (0..9)
        .map(|i| {
            (
                format!("lib/sub/lib{}.so#{}", i / 3, i % 2),
                arches[i % 3].to_owned(),
                rng.kernel(1000 + i * 3000),
            )
        })
        .collect();
    for (name, compression) in [
        ("none", Compression::None),
        ("zstd", Compression::Zstd { level: 19 }),
    ] {
        let mut w = ArchiveWriter::new(
            "interop",
            "mixed",
            arches.iter().map(|a| a.to_string()).collect(),
            compression,
        )
        .unwrap();
        for (k, a, d) in &kernels {
            w.add_kernel(k, a, d.clone()).unwrap();
        }
        let path = dir.path().join(format!("{name}.kpack"));
        w.write(&path, &|_| {}).unwrap();
        let out = dir.path().join(format!("{name}.out"));
        let read = python_read(&path, &out);
        assert_eq!(read.len(), kernels.len());
        for (k, a, d) in &kernels {
            let found = read
                .iter()
                .find(|r| &r.0 == k && &r.1 == a)
                .unwrap_or_else(|| panic!("{k} {a} missing"));
            assert_eq!(&found.3, d, "{name} {k} {a}");
        }
        let ordinals: Vec<u32> = read.iter().map(|r| r.2).collect();
        let mut sorted = ordinals.clone();
        sorted.sort();
        assert_eq!(sorted, (0..kernels.len() as u32).collect::<Vec<_>>());
        let meta = std::fs::read_to_string(out.join("meta.tsv")).unwrap();
        assert!(meta.contains("group_name\tinterop\n"), "{meta}");
        assert!(
            meta.contains("gfx_arches\tgfx1100,gfx90a:xnack+,gfx9-4-generic\n"),
            "{meta}"
        );
        let scheme = if name == "none" {
            "none"
        } else {
            "zstd-per-kernel"
        };
        assert!(
            meta.contains(&format!("compression_scheme\t{scheme}\n")),
            "{meta}"
        );
    }
}
