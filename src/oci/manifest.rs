//! The kernel-pack artifact: an OCI image manifest with `artifactType`
//! `application/vnd.kpack-fuse.pack.v1`, the empty config, one layer per archive (its bytes
//! unchanged) and, for archives whose frames are not positioned in their TOC, a kernel index
//! layer right after it. Serialization is deterministic (fixed field order, sorted annotations,
//! no timestamps), so the same archives always give the same manifest digest. [`Pack::parse`]
//! is the reader's strict view of a fetched manifest.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::reference::Digest;
use super::registry::one_line;

pub const MANIFEST_MEDIA_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";
pub const INDEX_MEDIA_TYPE: &str = "application/vnd.oci.image.index.v1+json";
pub const DOCKER_MANIFEST_MEDIA_TYPE: &str = "application/vnd.docker.distribution.manifest.v2+json";
pub const DOCKER_LIST_MEDIA_TYPE: &str =
    "application/vnd.docker.distribution.manifest.list.v2+json";
#[cfg(test)]
pub const IMAGE_CONFIG_MEDIA_TYPE: &str = "application/vnd.oci.image.config.v1+json";

pub const ARTIFACT_TYPE: &str = "application/vnd.kpack-fuse.pack.v1";
pub const ARCHIVE_LAYER_TYPE: &str = "application/vnd.kpack-fuse.archive.v1";
pub const KERNEL_INDEX_LAYER_TYPE: &str = "application/vnd.kpack-fuse.kernel-index.v1";

pub const EMPTY_MEDIA_TYPE: &str = "application/vnd.oci.empty.v1+json";
pub const EMPTY_DIGEST: &str =
    "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a";
/// The empty config's bytes (uploaded like any blob).
pub const EMPTY_BLOB: &[u8] = b"{}";

pub const ANN_TITLE: &str = "org.opencontainers.image.title";
pub const ANN_ARCHES: &str = "dev.kpack-fuse.arches";
pub const ANN_TOC_OFFSET: &str = "dev.kpack-fuse.toc.offset";
pub const ANN_TOC_LENGTH: &str = "dev.kpack-fuse.toc.length";
pub const ANN_TOC_BLAKE3: &str = "dev.kpack-fuse.toc.blake3";
pub const ANN_FRAMES: &str = "dev.kpack-fuse.frames";
pub const ANN_KERNEL_INDEX: &str = "dev.kpack-fuse.kernel-index";
pub const ANN_INDEX_OF: &str = "dev.kpack-fuse.index-of";

/// The largest manifest read (the distribution specification's limit).
pub const MAX_MANIFEST: usize = 4 << 20;

/// An OCI content descriptor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Descriptor {
    #[serde(rename = "mediaType")]
    pub media_type: String,
    pub digest: String,
    pub size: u64,
    #[serde(
        rename = "artifactType",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub artifact_type: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// An OCI image manifest (fields in the order they are written).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageManifest {
    #[serde(rename = "schemaVersion")]
    pub schema_version: u32,
    #[serde(rename = "mediaType", default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
    #[serde(
        rename = "artifactType",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub artifact_type: Option<String>,
    pub config: Descriptor,
    pub layers: Vec<Descriptor>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

impl ImageManifest {
    /// A kernel-pack manifest of `layers` (in order), with the empty config.
    pub fn pack(layers: Vec<Descriptor>) -> ImageManifest {
        ImageManifest {
            schema_version: 2,
            media_type: Some(MANIFEST_MEDIA_TYPE.into()),
            artifact_type: Some(ARTIFACT_TYPE.into()),
            config: Descriptor {
                media_type: EMPTY_MEDIA_TYPE.into(),
                digest: EMPTY_DIGEST.into(),
                size: EMPTY_BLOB.len() as u64,
                artifact_type: None,
                annotations: BTreeMap::new(),
            },
            layers,
            annotations: BTreeMap::new(),
        }
    }

    /// The manifest's bytes: compact JSON, fields in a fixed order.
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a manifest always serializes")
    }
}

/// Where an archive's TOC lies in its layer: from `offset` to the end, `length` bytes, whose
/// BLAKE3 is `blake3`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TocPlace {
    pub offset: u64,
    pub length: u64,
    pub blake3: [u8; 32],
}

/// Where a reader finds each kernel's frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FramesFrom {
    /// Every frame's position and digest are in the TOC.
    Toc,
    /// In the kernel index layer with this digest and size.
    Index { digest: Digest, size: u64 },
    /// The layer carries no kpack-fuse annotations (pushed by another tool): read it whole.
    Unknown,
}

/// The descriptor of an archive layer.
pub fn archive_layer(
    title: &str,
    digest: &Digest,
    size: u64,
    arches: &[String],
    toc: &TocPlace,
    frames: &FramesFrom,
) -> Descriptor {
    let mut a = BTreeMap::new();
    a.insert(ANN_TITLE.into(), title.into());
    a.insert(ANN_ARCHES.into(), arches.join(","));
    a.insert(ANN_TOC_OFFSET.into(), toc.offset.to_string());
    a.insert(ANN_TOC_LENGTH.into(), toc.length.to_string());
    a.insert(ANN_TOC_BLAKE3.into(), super::reference::hex(&toc.blake3));
    match frames {
        FramesFrom::Toc => {
            a.insert(ANN_FRAMES.into(), "toc".into());
        }
        FramesFrom::Index { digest, .. } => {
            a.insert(ANN_FRAMES.into(), "index".into());
            a.insert(ANN_KERNEL_INDEX.into(), digest.to_string());
        }
        FramesFrom::Unknown => {}
    }
    Descriptor {
        media_type: ARCHIVE_LAYER_TYPE.into(),
        digest: digest.to_string(),
        size,
        artifact_type: None,
        annotations: a,
    }
}

/// The descriptor of the kernel index layer of the archive titled `archive_title`.
pub fn index_layer(archive_title: &str, digest: &Digest, size: u64) -> Descriptor {
    let mut a = BTreeMap::new();
    a.insert(ANN_TITLE.into(), format!("{archive_title}.index"));
    a.insert(ANN_INDEX_OF.into(), archive_title.into());
    Descriptor {
        media_type: KERNEL_INDEX_LAYER_TYPE.into(),
        digest: digest.to_string(),
        size,
        artifact_type: None,
        annotations: a,
    }
}

/// One archive of a pack, as a reader sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackLayer {
    /// The file name the archive is shown under (its title annotation).
    pub title: String,
    pub digest: Digest,
    pub size: u64,
    pub media_type: String,
    /// The archive's architectures (empty when not annotated).
    pub arches: Vec<String>,
    pub toc: Option<TocPlace>,
    pub frames: FramesFrom,
}

/// A fetched manifest that is a kernel pack.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pack {
    pub layers: Vec<PackLayer>,
}

/// Whether `s` is a plain file name (a title a file can be shown under).
fn plain_name(s: &str) -> bool {
    !s.is_empty()
        && s != "."
        && s != ".."
        && s.len() <= 255
        && !s.contains('/')
        && !s.bytes().any(|b| b == 0 || b.is_ascii_control())
}

/// A decimal `u64` without sign, spaces or leading zeros.
fn strict_u64(s: &str) -> Option<u64> {
    if s.is_empty() || (s.len() > 1 && s.starts_with('0')) || !s.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    s.parse().ok()
}

fn hex32(s: &str) -> Option<[u8; 32]> {
    if s.len() != 64 || !s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

/// A JSON error on one bounded line (serde quotes the strings it did not expect).
fn clip(e: &serde_json::Error) -> String {
    one_line(&e.to_string(), 200)
}

impl Pack {
    /// Reads `bytes` (served with `content_type`) as a kernel pack: `what` names the reference
    /// in messages. Anything else (an index, a container image, another artifact) is an error
    /// saying what it is instead.
    pub fn parse(what: &str, content_type: &str, bytes: &[u8]) -> Result<Pack, String> {
        #[derive(Deserialize)]
        struct Probe {
            #[serde(rename = "mediaType")]
            media_type: Option<String>,
            manifests: Option<Vec<serde_json::Value>>,
        }
        let probe: Probe = serde_json::from_slice(bytes)
            .map_err(|e| format!("{what}: the manifest is not JSON: {}", clip(&e)))?;
        let mt = probe
            .media_type
            .clone()
            .unwrap_or_else(|| content_type.to_owned());
        if mt == INDEX_MEDIA_TYPE || mt == DOCKER_LIST_MEDIA_TYPE || probe.manifests.is_some() {
            let n = probe.manifests.map_or(0, |m| m.len());
            return Err(format!(
                "{what}: is an image index of {n} manifests, not a kernel pack"
            ));
        }
        if mt == DOCKER_MANIFEST_MEDIA_TYPE {
            return Err(format!(
                "{what}: is a container image (a Docker image manifest), not a kernel pack"
            ));
        }
        if mt != MANIFEST_MEDIA_TYPE {
            return Err(format!(
                "{what}: is a manifest of type {:?}, not a kernel pack",
                one_line(&mt, 100)
            ));
        }
        let m: ImageManifest = serde_json::from_slice(bytes)
            .map_err(|e| format!("{what}: not an OCI image manifest: {}", clip(&e)))?;
        let ours = m.artifact_type.as_deref() == Some(ARTIFACT_TYPE)
            || m.config.media_type == ARTIFACT_TYPE;
        if !ours {
            return Err(match &m.artifact_type {
                Some(t) => format!(
                    "{what}: is an artifact of type {}, not a kernel pack",
                    one_line(t, 100)
                ),
                None => format!(
                    "{what}: is a container image (config {}), not a kernel pack",
                    one_line(&m.config.media_type, 100)
                ),
            });
        }
        let layer_err = |i: usize, d: &Descriptor, why: String| {
            format!("{what}: layer {i} ({}): {why}", one_line(&d.digest, 80))
        };
        // Index layers by digest, with the archive title they belong to.
        let mut indexes: BTreeMap<&str, (&Descriptor, Option<&str>)> = BTreeMap::new();
        for d in &m.layers {
            if d.media_type == KERNEL_INDEX_LAYER_TYPE {
                indexes.insert(
                    &d.digest,
                    (d, d.annotations.get(ANN_INDEX_OF).map(String::as_str)),
                );
            }
        }
        let mut layers = Vec::new();
        let mut titles = std::collections::HashSet::new();
        for (i, d) in m.layers.iter().enumerate() {
            if d.media_type == KERNEL_INDEX_LAYER_TYPE {
                Digest::parse(&d.digest).map_err(|w| layer_err(i, d, w))?;
                continue;
            }
            let digest = Digest::parse(&d.digest).map_err(|w| layer_err(i, d, w))?;
            let title = d
                .annotations
                .get(ANN_TITLE)
                .ok_or_else(|| layer_err(i, d, format!("no {ANN_TITLE} annotation")))?;
            if !plain_name(title) {
                return Err(layer_err(
                    i,
                    d,
                    format!("title {:?} is not a file name", one_line(title, 100)),
                ));
            }
            if !titles.insert(title.clone()) {
                return Err(layer_err(i, d, format!("title {title:?} appears twice")));
            }
            let ann = |k: &str| d.annotations.get(k).map(String::as_str);
            let bad = |k: &str, v: &str, want: &str| {
                layer_err(
                    i,
                    d,
                    format!("annotation {k}={:?} is not {want}", one_line(v, 100)),
                )
            };
            let arches = match ann(ANN_ARCHES) {
                None => Vec::new(),
                Some(v) => {
                    let items: Vec<String> = v.split(',').map(str::to_owned).collect();
                    if v.is_empty()
                        || items
                            .iter()
                            .any(|a| a.is_empty() || a.bytes().any(|b| !b.is_ascii_graphic()))
                    {
                        return Err(bad(ANN_ARCHES, v, "a comma-separated list of arches"));
                    }
                    items
                }
            };
            let toc = match (
                ann(ANN_TOC_OFFSET),
                ann(ANN_TOC_LENGTH),
                ann(ANN_TOC_BLAKE3),
            ) {
                (None, None, None) => None,
                (Some(o), Some(l), Some(b)) => {
                    let offset = strict_u64(o).ok_or_else(|| bad(ANN_TOC_OFFSET, o, "a number"))?;
                    let length = strict_u64(l).ok_or_else(|| bad(ANN_TOC_LENGTH, l, "a number"))?;
                    let blake3 =
                        hex32(b).ok_or_else(|| bad(ANN_TOC_BLAKE3, b, "64 lowercase hex"))?;
                    if offset.checked_add(length) != Some(d.size) || length == 0 {
                        return Err(layer_err(
                            i,
                            d,
                            format!(
                                "the TOC place {offset}+{length} does not end at the layer's \
                                 size {}",
                                d.size
                            ),
                        ));
                    }
                    Some(TocPlace {
                        offset,
                        length,
                        blake3,
                    })
                }
                _ => {
                    return Err(layer_err(
                        i,
                        d,
                        format!(
                            "{ANN_TOC_OFFSET}, {ANN_TOC_LENGTH} and {ANN_TOC_BLAKE3} must come \
                             together"
                        ),
                    ));
                }
            };
            let frames = match (ann(ANN_FRAMES), ann(ANN_KERNEL_INDEX)) {
                (None, None) => FramesFrom::Unknown,
                (Some("toc"), None) => FramesFrom::Toc,
                (Some("index"), Some(k)) => {
                    let digest =
                        Digest::parse(k).map_err(|_| bad(ANN_KERNEL_INDEX, k, "a digest"))?;
                    let (idx, of) = indexes.get(k).ok_or_else(|| {
                        layer_err(i, d, format!("its kernel index {k} is not a layer"))
                    })?;
                    if *of != Some(title.as_str()) {
                        return Err(layer_err(
                            i,
                            d,
                            format!("its kernel index {k} is not marked {ANN_INDEX_OF}={title}"),
                        ));
                    }
                    FramesFrom::Index {
                        digest,
                        size: idx.size,
                    }
                }
                (Some("index"), None) => {
                    return Err(layer_err(
                        i,
                        d,
                        format!("{ANN_FRAMES}=index without {ANN_KERNEL_INDEX}"),
                    ));
                }
                (Some("toc") | None, Some(_)) => {
                    return Err(layer_err(
                        i,
                        d,
                        format!("{ANN_KERNEL_INDEX} without {ANN_FRAMES}=index"),
                    ));
                }
                (Some(f), _) => {
                    return Err(bad(ANN_FRAMES, f, "\"toc\" or \"index\""));
                }
            };
            layers.push(PackLayer {
                title: title.clone(),
                digest,
                size: d.size,
                media_type: d.media_type.clone(),
                arches,
                toc,
                frames,
            });
        }
        if layers.is_empty() {
            return Err(format!("{what}: the kernel pack holds no archive layer"));
        }
        Ok(Pack { layers })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(c: char) -> Digest {
        Digest::parse(&format!("sha256:{}", c.to_string().repeat(64))).unwrap()
    }

    fn sample() -> ImageManifest {
        let toc = TocPlace {
            offset: 100,
            length: 28,
            blake3: [0xab; 32],
        };
        ImageManifest::pack(vec![
            archive_layer(
                "a.kpack",
                &d('1'),
                128,
                &["gfx942".into(), "gfx90a".into()],
                &toc,
                &FramesFrom::Toc,
            ),
            archive_layer(
                "b.kpack",
                &d('2'),
                128,
                &["gfx1100".into()],
                &toc,
                &FramesFrom::Index {
                    digest: d('3'),
                    size: 40,
                },
            ),
            index_layer("b.kpack", &d('3'), 40),
        ])
    }

    #[test]
    fn manifests_serialize_to_exact_bytes() {
        let h = |c: char| c.to_string().repeat(64);
        let ab = "ab".repeat(32);
        let want = format!(
            concat!(
                r#"{{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","#,
                r#""artifactType":"application/vnd.kpack-fuse.pack.v1","#,
                r#""config":{{"mediaType":"application/vnd.oci.empty.v1+json","#,
                r#""digest":"sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a","size":2}},"#,
                r#""layers":["#,
                r#"{{"mediaType":"application/vnd.kpack-fuse.archive.v1","digest":"sha256:{one}","size":128,"#,
                r#""annotations":{{"dev.kpack-fuse.arches":"gfx942,gfx90a","dev.kpack-fuse.frames":"toc","#,
                r#""dev.kpack-fuse.toc.blake3":"{ab}","dev.kpack-fuse.toc.length":"28","#,
                r#""dev.kpack-fuse.toc.offset":"100","org.opencontainers.image.title":"a.kpack"}}}},"#,
                r#"{{"mediaType":"application/vnd.kpack-fuse.archive.v1","digest":"sha256:{two}","size":128,"#,
                r#""annotations":{{"dev.kpack-fuse.arches":"gfx1100","dev.kpack-fuse.frames":"index","#,
                r#""dev.kpack-fuse.kernel-index":"sha256:{three}","#,
                r#""dev.kpack-fuse.toc.blake3":"{ab}","dev.kpack-fuse.toc.length":"28","#,
                r#""dev.kpack-fuse.toc.offset":"100","org.opencontainers.image.title":"b.kpack"}}}},"#,
                r#"{{"mediaType":"application/vnd.kpack-fuse.kernel-index.v1","digest":"sha256:{three}","size":40,"#,
                r#""annotations":{{"dev.kpack-fuse.index-of":"b.kpack","org.opencontainers.image.title":"b.kpack.index"}}}}"#,
                r#"]}}"#
            ),
            one = h('1'),
            two = h('2'),
            three = h('3'),
            ab = ab
        );
        assert_eq!(String::from_utf8(sample().to_bytes()).unwrap(), want);
        assert_eq!(EMPTY_DIGEST, Digest::of(EMPTY_BLOB).as_str());
    }

    #[test]
    fn packs_parse_back() {
        let bytes = sample().to_bytes();
        let p = Pack::parse("r", MANIFEST_MEDIA_TYPE, &bytes).unwrap();
        assert_eq!(p.layers.len(), 2);
        assert_eq!(p.layers[0].title, "a.kpack");
        assert_eq!(p.layers[0].arches, ["gfx942", "gfx90a"]);
        assert_eq!(p.layers[0].frames, FramesFrom::Toc);
        assert_eq!(
            p.layers[0].toc,
            Some(TocPlace {
                offset: 100,
                length: 28,
                blake3: [0xab; 32]
            })
        );
        assert_eq!(
            p.layers[1].frames,
            FramesFrom::Index {
                digest: d('3'),
                size: 40
            }
        );
        // A layer pushed by another tool: only a title.
        let mut m = sample();
        m.layers.truncate(1);
        m.layers[0].annotations.retain(|k, _| k == ANN_TITLE);
        m.layers[0].media_type = "application/octet-stream".into();
        let p = Pack::parse("r", "", &m.to_bytes()).unwrap();
        assert_eq!(p.layers[0].frames, FramesFrom::Unknown);
        assert_eq!(p.layers[0].toc, None);
        assert!(p.layers[0].arches.is_empty());
    }

    #[test]
    fn annotations_are_checked_strictly() {
        let cases: &[(&str, Option<&str>, &str)] = &[
            (ANN_TOC_OFFSET, Some("0100"), "is not a number"),
            (ANN_TOC_OFFSET, Some("+1"), "is not a number"),
            (
                ANN_TOC_OFFSET,
                Some("99"),
                "does not end at the layer's size",
            ),
            (ANN_TOC_LENGTH, None, "must come together"),
            (ANN_TOC_BLAKE3, Some(&"AB".repeat(32)), "64 lowercase hex"),
            (ANN_FRAMES, Some("elsewhere"), "\"toc\" or \"index\""),
            (ANN_ARCHES, Some("gfx942,,gfx90a"), "comma-separated"),
            (ANN_ARCHES, Some(""), "comma-separated"),
            (ANN_TITLE, None, "no org.opencontainers.image.title"),
            (ANN_TITLE, Some("../x"), "is not a file name"),
            (ANN_TITLE, Some("b.kpack"), "appears twice"),
            (
                ANN_KERNEL_INDEX,
                Some("sha256:x"),
                "without dev.kpack-fuse.frames=index",
            ),
        ];
        for (key, value, why) in cases {
            let mut m = sample();
            match value {
                Some(v) => m.layers[0].annotations.insert((*key).into(), (*v).into()),
                None => m.layers[0].annotations.remove(*key),
            };
            let e = Pack::parse("oci://h/r:t", MANIFEST_MEDIA_TYPE, &m.to_bytes()).unwrap_err();
            assert!(e.contains(why), "{key}={value:?}: {e}");
            let layer = if *why == "appears twice" {
                "layer 1 (sha256:2222"
            } else {
                "layer 0 (sha256:1111"
            };
            assert!(e.starts_with(&format!("oci://h/r:t: {layer}")), "{e}");
        }
        let mut m = sample();
        m.layers[1]
            .annotations
            .insert(ANN_KERNEL_INDEX.into(), d('4').to_string());
        let e = Pack::parse("r", MANIFEST_MEDIA_TYPE, &m.to_bytes()).unwrap_err();
        assert!(e.contains("is not a layer"), "{e}");
        let mut m = sample();
        m.layers[2]
            .annotations
            .insert(ANN_INDEX_OF.into(), "a.kpack".into());
        let e = Pack::parse("r", MANIFEST_MEDIA_TYPE, &m.to_bytes()).unwrap_err();
        assert!(
            e.contains("not marked dev.kpack-fuse.index-of=b.kpack"),
            "{e}"
        );
    }

    #[test]
    fn other_things_say_what_they_are() {
        let idx = br#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[{},{}]}"#;
        assert_eq!(
            Pack::parse("R", "", idx).unwrap_err(),
            "R: is an image index of 2 manifests, not a kernel pack"
        );
        let list = br#"{"schemaVersion":2,"manifests":[{}]}"#;
        assert_eq!(
            Pack::parse("R", DOCKER_LIST_MEDIA_TYPE, list).unwrap_err(),
            "R: is an image index of 1 manifests, not a kernel pack"
        );
        let mut m = sample();
        m.artifact_type = None;
        m.config.media_type = IMAGE_CONFIG_MEDIA_TYPE.into();
        assert_eq!(
            Pack::parse("R", "", &m.to_bytes()).unwrap_err(),
            "R: is a container image (config application/vnd.oci.image.config.v1+json), not a \
             kernel pack"
        );
        m.artifact_type = Some("application/x-other".into());
        assert_eq!(
            Pack::parse("R", "", &m.to_bytes()).unwrap_err(),
            "R: is an artifact of type application/x-other, not a kernel pack"
        );
        assert!(
            Pack::parse("R", "", b"[1]")
                .unwrap_err()
                .contains("not JSON")
        );
        let docker = br#"{"schemaVersion":2,"mediaType":"application/vnd.docker.distribution.manifest.v2+json"}"#;
        assert!(
            Pack::parse("R", "", docker)
                .unwrap_err()
                .contains("container image")
        );
    }
}
