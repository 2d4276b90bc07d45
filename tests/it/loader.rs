//! The Rust loader end to end (the C tests cover the same through the ABI): the exact decision
//! trace of a fall-through load, and one open per archive under concurrent first use.

use std::ffi::OsString;

use rocm_kpack::loader::{
    Event, HipkMetadata, LoadRequest, Loader, LoaderConfig, Recorder, Silent,
};

use crate::support::layout::{self, padded};

fn metadata() -> HipkMetadata {
    HipkMetadata {
        kernel_name: "lib/libfoo.so".into(),
        search_paths: vec![OsString::from("../.kpack/foo_@GFXARCH@.kpack")],
        pins: None,
    }
}

fn vec_alloc(n: usize) -> Option<Vec<u8>> {
    Some(vec![0u8; n])
}

fn scenarios() -> (tempfile::TempDir, std::path::PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(tmp.path()).unwrap();
    layout::write_assets(&root.join("assets"));
    layout::write_scenarios(&root.join("s"), &root.join("assets"));
    (tmp, root.join("s"))
}

#[test]
fn fall_through_trace_is_exact() {
    let (_tmp, s) = scenarios();
    let loader = Loader::new(LoaderConfig::default());
    let binary = s.join("multi/lib/libfoo.so");
    let arches = [Some("amdgcn-amd-amdhsa--gfx942:xnack+")];
    let request = LoadRequest {
        binary_path: &binary,
        co_index: 1,
        arch_list: &arches,
    };
    let mut rec = Recorder::default();
    let loaded = loader
        .load_code_object(|| Ok(metadata()), &request, vec_alloc, &mut rec)
        .unwrap();
    assert_eq!(loaded.data, padded("BARE_CO1"));
    assert_eq!(loaded.target, "gfx942");
    let k = |f: &str| s.join("multi/.kpack").join(f).display().to_string();
    let pattern = k("foo_@GFXARCH@.kpack");
    let miss_reason = match &rec.events[7] {
        Event::KernelMissing { reason, .. } => reason.clone(),
        e => panic!("expected a miss, got {e:?}"),
    };
    assert!(miss_reason.contains("lib/libfoo.so#1"), "{miss_reason}");
    assert_eq!(
        rec.events,
        [
            Event::MetadataParsed {
                kernel_name: "lib/libfoo.so".into(),
                co_index: 1,
                lookup_key: "lib/libfoo.so#1".into(),
                search_paths: 1
            },
            Event::ExpandedPattern {
                pattern: pattern.clone(),
                path: k("foo_gfx942:xnack+.kpack")
            },
            Event::ExpandedPattern {
                pattern,
                path: k("foo_gfx942.kpack")
            },
            Event::ArchiveOpened {
                path: k("foo_gfx942:xnack+.kpack"),
                architectures: vec!["gfx942:xnack+".into()]
            },
            Event::ArchiveOpened {
                path: k("foo_gfx942.kpack"),
                architectures: vec!["gfx942".into()]
            },
            Event::TryingArchitecture {
                arch: "amdgcn-amd-amdhsa--gfx942:xnack+".into()
            },
            Event::Candidate {
                archive: k("foo_gfx942:xnack+.kpack"),
                target: "gfx942:xnack+".into()
            },
            Event::KernelMissing {
                code: 5,
                reason: miss_reason.clone()
            },
            Event::Candidate {
                archive: k("foo_gfx942.kpack"),
                target: "gfx942".into()
            },
            Event::KernelFound { size: 32 },
            Event::Loaded {
                size: 32,
                archive: k("foo_gfx942.kpack"),
                target: "gfx942".into()
            },
        ]
    );
}

#[test]
fn concurrent_loads_open_each_archive_once() {
    let (_tmp, s) = scenarios();
    let loader = Loader::new(LoaderConfig::default());
    let binary = s.join("multi/lib/libfoo.so");
    let arches = [
        Some("amdgcn-amd-amdhsa--gfx942:sramecc+:xnack+"),
        Some("amdgcn-amd-amdhsa--gfx9-4-generic:sramecc+:xnack+"),
    ];
    let expect = [
        padded("XNACKP_CO0"),
        padded("BARE_CO1"),
        padded("GENERIC_CO2"),
    ];
    std::thread::scope(|scope| {
        for t in 0..8u32 {
            let (loader, binary, arches, expect) = (&loader, &binary, &arches, &expect);
            scope.spawn(move || {
                for i in 0..50u32 {
                    let co = (i + t) % 3;
                    let request = LoadRequest {
                        binary_path: binary,
                        co_index: co,
                        arch_list: arches,
                    };
                    let got = loader
                        .load_code_object(|| Ok(metadata()), &request, vec_alloc, &mut Silent)
                        .unwrap();
                    assert_eq!(got.data, expect[co as usize]);
                }
            });
        }
    });
    assert_eq!(loader.cache().open_count(), 3);
    assert_eq!(loader.cache().len(), 3);
}

#[test]
fn search_paths_and_archives_resolve_on_their_own() {
    let (_tmp, s) = scenarios();
    let loader = Loader::new(LoaderConfig::default());
    let binary = s.join("multi/lib/libfoo.so");
    let arches = [Some("gfx942:xnack+"), Some("gfx9-4-generic:xnack+")];
    let request = LoadRequest {
        binary_path: &binary,
        co_index: 0,
        arch_list: &arches,
    };
    let archives = loader
        .resolve_archives(&metadata(), &request, &mut Silent)
        .unwrap();
    let names: Vec<&str> = archives
        .iter()
        .map(|(p, _)| p.file_name().unwrap().to_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "foo_gfx942:xnack+.kpack",
            "foo_gfx942.kpack",
            "foo_gfx9-4-generic.kpack"
        ]
    );
    assert!(
        archives
            .iter()
            .all(|(p, _)| p.starts_with(s.join("multi/.kpack")))
    );
}

/// Path safety: the caller's arch list cannot steer a `@GFXARCH@` search path out of its
/// directory. An archive planted where `.kpack/@GFXARCH@/foo.kpack` with arch `../planted` would
/// point (and listing exactly that arch) is never opened; a plain arch still loads.
#[test]
fn a_hostile_arch_never_opens_an_archive_outside_the_pattern_directory() {
    use rocm_kpack::{ArchiveWriter, Compression};
    let tmp = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(tmp.path()).unwrap();
    let write = |dir: &std::path::Path, arch: &str, data: &[u8]| {
        std::fs::create_dir_all(dir).unwrap();
        let mut w = ArchiveWriter::new("g", "f", vec![arch.into()], Compression::None).unwrap();
        w.add_kernel("lib/libfoo.so#0", arch, data.to_vec())
            .unwrap();
        w.write(&dir.join("foo.kpack"), &|_| {}).unwrap();
    };
    write(&root.join("planted"), "../planted", b"PLANTED");
    write(&root.join(".kpack/gfx900"), "gfx900", b"GFX900");
    std::fs::create_dir_all(root.join("lib")).unwrap();
    let meta = || {
        Ok(HipkMetadata {
            kernel_name: "lib/libfoo.so".into(),
            search_paths: vec![OsString::from("../.kpack/@GFXARCH@/foo.kpack")],
            pins: None,
        })
    };
    let loader = Loader::new(LoaderConfig::default());
    let binary = root.join("lib/libfoo.so");
    let pattern = root
        .join(".kpack/@GFXARCH@/foo.kpack")
        .display()
        .to_string();

    let hostile = [Some("../planted")];
    let request = LoadRequest {
        binary_path: &binary,
        co_index: 0,
        arch_list: &hostile,
    };
    let mut rec = Recorder::default();
    let err = loader
        .load_code_object(meta, &request, vec_alloc, &mut rec)
        .unwrap_err();
    assert_eq!(err.kind(), rocm_kpack::ErrorKind::ArchiveNotFound, "{err}");
    assert!(rec.events.contains(&Event::UnsafeTarget {
        pattern: pattern.clone(),
        target: "../planted".into()
    }));
    assert!(
        !rec.events
            .iter()
            .any(|e| matches!(e, Event::ArchiveOpened { .. })),
        "{:?}",
        rec.events
    );

    let mixed = [Some("../planted"), Some("gfx900")];
    let request = LoadRequest {
        binary_path: &binary,
        co_index: 0,
        arch_list: &mixed,
    };
    let loaded = loader
        .load_code_object(meta, &request, vec_alloc, &mut Silent)
        .unwrap();
    assert_eq!(
        (loaded.data, loaded.target.as_str()),
        (b"GFX900".to_vec(), "gfx900")
    );
}
