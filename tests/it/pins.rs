//! Pins: a host binary whose HIPK metadata lists the TOC digests of its archives only
//! takes code objects from those archives. Scenario: the binary was split into `first.kpack` and
//! `second.kpack` (both hold its code object), then `first.kpack` was swapped for another valid
//! archive of the same name. The pinned binary skips it and falls through to `second.kpack`; the
//! same binary without pins takes the swapped archive, as the reference loader would.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

use rocm_kpack::host::hipk::metadata::{self, Pin};
use rocm_kpack::loader::{Event, HipkMetadata, LoadRequest, Loader, LoaderConfig, Recorder};
use rocm_kpack::{Archive, Compression, ErrorKind};

use crate::mount::sources::hipk_library;
use crate::mount::write_archive;
use crate::support::mount::{Mount, fuse_available};

const KEY: &str = "lib/libpin.so#0";

struct Layout {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    first: PathBuf,
    second: PathBuf,
    pins: Vec<Pin>,
    swapped_digest: String,
}

fn hex(d: [u8; 32]) -> String {
    blake3::Hash::from(d).to_hex().to_string()
}

/// `root/.kpack/{first,second}.kpack` as split wrote them (their TOC digests are the pins), then
/// `first.kpack` replaced by a valid archive holding other bytes under the same key.
fn layout() -> Layout {
    let tmp = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(tmp.path()).unwrap();
    let kp = root.join(".kpack");
    std::fs::create_dir_all(&kp).unwrap();
    std::fs::create_dir_all(root.join("lib")).unwrap();
    let first = kp.join("first.kpack");
    let second = kp.join("second.kpack");
    write_archive(
        &first,
        Compression::None,
        &[(KEY, "gfx900", b"LEGIT-1".to_vec())],
    );
    write_archive(
        &second,
        Compression::Zstd { level: 3 },
        &[(KEY, "gfx900", b"LEGIT-2".to_vec())],
    );
    let pins = vec![
        Archive::open(&first).unwrap().toc_digest(),
        Archive::open(&second).unwrap().toc_digest(),
    ];
    write_archive(
        &first,
        Compression::None,
        &[(KEY, "gfx900", b"EVIL".to_vec())],
    );
    let swapped = Archive::open(&first).unwrap().toc_digest();
    assert!(!pins.contains(&swapped));
    Layout {
        _tmp: tmp,
        root,
        first,
        second,
        pins,
        swapped_digest: hex(swapped),
    }
}

fn meta(pins: Option<&[Pin]>) -> HipkMetadata {
    HipkMetadata {
        kernel_name: "lib/libpin.so".into(),
        search_paths: vec![
            OsString::from("../.kpack/first.kpack"),
            OsString::from("../.kpack/second.kpack"),
        ],
        pins: pins.map(<[Pin]>::to_vec),
    }
}

fn load(
    l: &Layout,
    pins: Option<&[Pin]>,
    config: LoaderConfig,
) -> (rocm_kpack::Result<(Vec<u8>, PathBuf)>, Vec<Event>) {
    let loader = Loader::new(config);
    let binary = l.root.join("lib/libpin.so");
    let arches = [Some("gfx900")];
    let request = LoadRequest {
        binary_path: &binary,
        co_index: 0,
        arch_list: &arches,
    };
    let mut rec = Recorder::default();
    let got = loader
        .load_code_object(
            || Ok(meta(pins)),
            &request,
            |n| Some(vec![0u8; n]),
            &mut rec,
        )
        .map(|l| (l.data, l.archive));
    (got, rec.events)
}

#[test]
fn a_pinned_binary_skips_a_swapped_archive_and_falls_through() {
    let l = layout();
    let (got, events) = load(&l, Some(&l.pins), LoaderConfig::default());
    assert_eq!(got.unwrap(), (b"LEGIT-2".to_vec(), l.second.clone()));
    assert!(
        events.contains(&Event::ArchiveNotPinned {
            path: l.first.display().to_string(),
            toc_blake3: l.swapped_digest.clone(),
        }),
        "{events:?}"
    );
    assert!(
        events.contains(&Event::PinMatched {
            path: l.second.display().to_string(),
            toc_blake3: hex(l.pins[1]),
        }),
        "{events:?}"
    );
    // The debug log names the skipped archive.
    let lines: Vec<String> = events.iter().flat_map(Event::log_lines).collect();
    assert!(
        lines.contains(&format!(
            "archive not pinned by the binary, skipped: {} (toc blake3 {})",
            l.first.display(),
            l.swapped_digest
        )),
        "{lines:?}"
    );

    // The same binary without pins takes the first archive on its path, as today.
    let (got, events) = load(&l, None, LoaderConfig::default());
    assert_eq!(got.unwrap(), (b"EVIL".to_vec(), l.first.clone()));
    assert!(
        !events
            .iter()
            .any(|e| matches!(e, Event::ArchiveNotPinned { .. } | Event::PinMatched { .. }))
    );
}

#[test]
fn rocm_kpack_path_overrides_are_held_to_the_pins() {
    let l = layout();
    let only_swapped = LoaderConfig {
        path_override: vec![l.first.clone()],
        ..Default::default()
    };
    let (got, _) = load(&l, Some(&l.pins), only_swapped.clone());
    assert_eq!(got.unwrap_err().kind(), ErrorKind::ArchiveNotFound);
    let (got, _) = load(&l, None, only_swapped);
    assert_eq!(got.unwrap().0, b"EVIL");
    let both = LoaderConfig {
        path_override: vec![l.first.clone(), l.second.clone()],
        ..Default::default()
    };
    let (got, _) = load(&l, Some(&l.pins), both);
    assert_eq!(got.unwrap().0, b"LEGIT-2");
    // The prefix too: a pinned archive on the prefix still wins, an unpinned one is skipped.
    let prefix = LoaderConfig {
        path_prefix: vec![l.first.clone()],
        ..Default::default()
    };
    let (got, _) = load(&l, Some(&l.pins), prefix);
    assert_eq!(got.unwrap().0, b"LEGIT-2");
}

/// A gcc-built library carrying the pinned metadata, for the CLI and the mount.
fn pinned_binary(l: &Layout, pins: Option<&[Pin]>) -> PathBuf {
    let bytes = metadata::encode_pinned(
        &[
            "../.kpack/first.kpack".into(),
            "../.kpack/second.kpack".into(),
        ],
        "lib/libpin.so",
        pins,
    );
    hipk_library(&l.root.join("lib/libpin.so"), Some(&bytes))
}

fn resolve(binary: &Path, json: bool) -> (Option<i32>, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kpack-fuse"));
    cmd.arg("resolve").arg(binary).args(["--gpu", "gfx900"]);
    if json {
        cmd.arg("--json");
    }
    let out = cmd
        .env_remove("ROCM_KPACK_PATH")
        .env_remove("ROCM_KPACK_PATH_PREFIX")
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[test]
fn resolve_shows_which_candidates_match_a_pin() {
    let l = layout();
    let binary = pinned_binary(&l, Some(&l.pins));
    let (code, text) = resolve(&binary, false);
    assert_eq!(code, Some(0), "{text}");
    for line in [
        format!("pin:          toc blake3 {}", hex(l.pins[0])),
        format!("pin:          toc blake3 {}", hex(l.pins[1])),
        format!(
            "  skip    {}: not pinned by the binary (toc blake3 {})",
            l.first.display(),
            l.swapped_digest
        ),
        format!(
            "  pinned  {}: its TOC digest is one of the pins",
            l.second.display()
        ),
        format!("  => gfx900 from {} (7 bytes)", l.second.display()),
    ] {
        assert!(text.lines().any(|t| t == line), "{line:?} not in\n{text}");
    }
    let (code, json) = resolve(&binary, true);
    assert_eq!(code, Some(0));
    let doc: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(
        doc["pins"],
        serde_json::json!([hex(l.pins[0]), hex(l.pins[1])])
    );
    let steps = doc["code_objects"][0]["steps"].as_array().unwrap();
    assert!(steps.contains(&serde_json::json!({
        "event": "archive_not_pinned",
        "path": l.first.display().to_string(),
        "toc_blake3": l.swapped_digest,
    })));

    // Without pins: no pin lines, and the swapped archive is taken.
    let unpinned = pinned_binary(&l, None);
    let (code, text) = resolve(&unpinned, false);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("pins:         none (any archive on the search path is used)\n"));
    assert!(text.contains(&format!("  => gfx900 from {} (4 bytes)", l.first.display())));
    let (_, json) = resolve(&unpinned, true);
    let doc: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(doc["pins"], serde_json::Value::Null);
}

#[test]
fn the_mount_hides_unpinned_archives_unless_no_pins() {
    use rocm_kpack::fs::setup::source::{self, SourceErrorKind, SourceOptions};
    let l = layout();
    let binary = pinned_binary(&l, Some(&l.pins));
    let opened = source::open(&binary, &SourceOptions::default()).unwrap();
    assert_eq!(opened.archives.len(), 1);
    assert_eq!(opened.archives[0].path(), l.second);
    assert_eq!(
        opened.warnings,
        [format!(
            "hiding {}: {} does not pin it (toc blake3 {}; --no-pins shows it)",
            l.first.display(),
            binary.display(),
            l.swapped_digest
        )]
    );
    let strict = SourceOptions {
        strict: true,
        ..Default::default()
    };
    assert_eq!(
        source::open(&binary, &strict).unwrap_err().kind,
        SourceErrorKind::BadFormat
    );
    let no_pins = SourceOptions {
        no_pins: true,
        ..Default::default()
    };
    let opened = source::open(&binary, &no_pins).unwrap();
    assert_eq!(opened.archives.len(), 2);
    assert!(opened.warnings.is_empty());

    if !fuse_available() {
        return;
    }
    let want = |name: &str, bytes: &[u8]| {
        let dir = l.root.join(name);
        let f = dir.join(KEY).join("gfx900.hsaco");
        std::fs::create_dir_all(f.parent().unwrap()).unwrap();
        std::fs::write(f, bytes).unwrap();
        dir
    };
    let m = Mount::start(&binary, &[]);
    m.check("tree", want("want-pinned", b"LEGIT-2").to_str().unwrap());
    m.stop();
    let m = Mount::start(&binary, &["-o", "no_pins"]);
    m.check("tree", want("want-unpinned", b"EVIL").to_str().unwrap());
    m.stop();
}

/// The marker bytes of a rewritten binary.
fn marker_of(binary: &Path) -> Vec<u8> {
    let bytes = std::fs::read(binary).unwrap();
    let elf = rocm_kpack::host::elf::ElfFile::parse(&bytes).unwrap();
    elf.section(rocm_kpack::host::elf::KPACK_REF_SECTION)
        .unwrap()
        .data
        .to_vec()
}

fn split_cli(host: &Path, root: &Path, out: &Path, extra: &[&str]) {
    let o = Command::new(env!("CARGO_BIN_EXE_kpack-fuse"))
        .arg("split")
        .arg(host)
        .arg("--root")
        .arg(root)
        .args(["--prefix", "pn", "-o"])
        .arg(out)
        .args(extra)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

/// `split` pins each binary to the archives it was split into; `--no-pins` writes the reference
/// tooling's marker byte for byte. A pinned split binary refuses an archive swapped in later.
#[test]
fn split_pins_its_archives_and_no_pins_writes_the_reference_marker() {
    use crate::split::{HIPF, Kind, build, tu_blobs};
    let tmp = tempfile::tempdir().unwrap();
    let dir = std::fs::canonicalize(tmp.path()).unwrap();
    let lib = build(
        &dir,
        "in/lib/libpn.so",
        &tu_blobs(),
        HIPF,
        Kind::Library,
        "",
    );
    let search = ["../.kpack/pn_@GFXARCH@.kpack".to_string()];

    let plain = dir.join("plain");
    split_cli(&lib, &dir.join("in"), &plain, &["--no-pins"]);
    assert_eq!(
        marker_of(&plain.join("lib/libpn.so")),
        metadata::encode(&search, "lib/libpn.so")
    );

    let out = dir.join("out");
    split_cli(&lib, &dir.join("in"), &out, &[]);
    let digests: Vec<Pin> = ["gfx900", "gfx90a:xnack-"]
        .iter()
        .map(|a| {
            Archive::open(out.join(format!(".kpack/pn_{a}.kpack")))
                .unwrap()
                .toc_digest()
        })
        .collect();
    let binary = out.join("lib/libpn.so");
    assert_eq!(
        marker_of(&binary),
        metadata::encode_pinned(&search, "lib/libpn.so", Some(&digests))
    );
    // Both splits wrote the same archives: pins change nothing else.
    for a in ["gfx900", "gfx90a:xnack-"] {
        let name = format!(".kpack/pn_{a}.kpack");
        assert!(
            std::fs::read(out.join(&name)).unwrap() == std::fs::read(plain.join(&name)).unwrap()
        );
    }

    let load = |binary: &Path| {
        Command::new(env!("CARGO_BIN_EXE_kpack-fuse"))
            .arg("load")
            .arg(binary)
            .args(["--gpu", "gfx900", "--co", "1", "-o"])
            .arg(dir.join("got.hsaco"))
            .env_remove("ROCM_KPACK_PATH")
            .env_remove("ROCM_KPACK_PATH_PREFIX")
            .output()
            .unwrap()
    };
    let o = load(&binary);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(std::fs::read(dir.join("got.hsaco")).unwrap() == vec![b'b'; 65536]);

    // Swap the gfx900 archive for another valid one with the same name and keys.
    let k900 = out.join(".kpack/pn_gfx900.kpack");
    write_archive(
        &k900,
        Compression::None,
        &[
            ("lib/libpn.so#0", "gfx900", b"swapped".to_vec()),
            ("lib/libpn.so#1", "gfx900", b"swapped".to_vec()),
            ("lib/libpn.so#2", "gfx900", b"swapped".to_vec()),
        ],
    );
    let o = load(&binary);
    assert_eq!(o.status.code(), Some(5));
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        stderr.contains(&format!(
            "not pinned by the binary, so not used: {}",
            k900.display()
        )),
        "{stderr}"
    );
    // The unpinned split of the same binary takes the swapped archive, as the reference would.
    std::fs::copy(&k900, plain.join(".kpack/pn_gfx900.kpack")).unwrap();
    let o = load(&plain.join("lib/libpn.so"));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(std::fs::read(dir.join("got.hsaco")).unwrap(), b"swapped");
}

/// The size of pins: a library with 120 bundles of 7 arches each (840 code objects). The
/// reference reads at most 64 KiB of metadata; ours grows by 34 bytes per archive, not per
/// code object.
#[test]
fn metadata_of_a_large_split_stays_small() {
    use crate::split::{HIPF, Kind, build};
    use crate::support::bundles::build_uncompressed;
    let arches = [
        "gfx900",
        "gfx906",
        "gfx908",
        "gfx90a:xnack-",
        "gfx942",
        "gfx1030",
        "gfx1100",
    ];
    let blobs: Vec<Vec<u8>> = (0..120u32)
        .map(|tu| {
            let data: Vec<Vec<u8>> = arches
                .iter()
                .map(|a| format!("tu{tu}-{a}").into_bytes())
                .collect();
            let triples: Vec<String> = arches
                .iter()
                .map(|a| format!("hipv4-amdgcn-amd-amdhsa--{a}"))
                .collect();
            let mut entries: Vec<(&str, &[u8])> = vec![("host-x86_64-unknown-linux", &[])];
            entries.extend(
                triples
                    .iter()
                    .map(String::as_str)
                    .zip(data.iter().map(Vec::as_slice)),
            );
            build_uncompressed(&entries, 64)
        })
        .collect();
    let tmp = tempfile::tempdir().unwrap();
    let dir = std::fs::canonicalize(tmp.path()).unwrap();
    let lib = build(&dir, "in/lib/libbig.so", &blobs, HIPF, Kind::Library, "");
    let out = dir.join("out");
    split_cli(&lib, &dir.join("in"), &out, &[]);
    let marker = marker_of(&out.join("lib/libbig.so"));
    let parsed = HipkMetadata::parse(&marker).unwrap();
    assert_eq!(parsed.pins.as_ref().map(Vec::len), Some(7));
    let plain = metadata::encode(&["../.kpack/pn_@GFXARCH@.kpack".into()], "lib/libbig.so");
    // Exactly the reference's bytes plus the key and 7 bin8 digests.
    assert_eq!(marker.len(), plain.len() + 15 + 1 + 7 * 34);
    eprintln!(
        "HIPK metadata of a 120-bundle, 7-arch split: {} bytes ({} without pins)",
        marker.len(),
        plain.len()
    );
    assert!(marker.len() < 1024, "{}", marker.len());
}
