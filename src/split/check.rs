//! Checking a split tree against the original one: every rewritten binary's wrappers are HIPK
//! with their index, point at the marker, and for every wrapper and every arch the original
//! binary had, the archive found through the marker's search paths holds exactly the original
//! code object under `<kernel_name>#<index>`.
//!
//! The lookup follows the loader's path rules (search path relative to the binary's directory,
//! first `@GFXARCH@` replaced by the arch, archive matched by its `gfx_arches`) through the
//! archive API; it does not go through the C loader or its feature-subset fallback.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::rewrite::{HIPK_MAGIC, WRAPPER_SIZE};
use crate::archive::Archive;
use crate::elf::{ElfFile, FATBIN_SEGMENT_SECTION, KPACK_REF_SECTION};
use crate::import::{self, GFXARCH_PLACEHOLDER, KPACK_DIR};
use crate::msgpack;

/// What `verify_split` found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SplitCheck {
    /// Rewritten binaries checked.
    pub binaries: usize,
    /// (wrapper, arch) code objects compared.
    pub code_objects: usize,
    /// One line per problem, naming the binary.
    pub problems: Vec<String>,
}

/// The HIPK marker's contents.
pub fn parse_marker(bytes: &[u8]) -> Result<(Vec<String>, String), String> {
    let (v, _) = msgpack::decode_slice(bytes).map_err(|e| format!("marker is not msgpack: {e}"))?;
    let name = v.get("kernel_name").and_then(|n| n.as_str()).ok_or("marker has no kernel_name string")?;
    let paths = match v.get("kpack_search_paths") {
        Some(msgpack::Value::Array(items)) => items.iter().filter_map(|i| i.as_str()).map(str::to_owned).collect::<Vec<_>>(),
        _ => return Err("marker has no kpack_search_paths array".into()),
    };
    if paths.is_empty() {
        return Err("marker lists no search path".into());
    }
    Ok((paths, name.to_owned()))
}

/// Checks every split binary below `out_root` against the binary at the same relative path
/// below `original_root`.
pub fn verify_split(out_root: &Path, original_root: &Path) -> std::io::Result<SplitCheck> {
    let mut check = SplitCheck::default();
    let mut archives: HashMap<PathBuf, Option<Archive>> = HashMap::new();
    for rel in files_below(out_root)? {
        let path = out_root.join(&rel);
        let bytes = std::fs::read(&path)?;
        let Ok(elf) = ElfFile::parse(&bytes) else { continue };
        let Some(marker) = elf.section(KPACK_REF_SECTION) else { continue };
        check.binaries += 1;
        let mut problem = |m: String| check.problems.push(format!("{}: {m}", path.display()));
        let (paths, kernel_name) = match parse_marker(marker.data) {
            Ok(m) => m,
            Err(e) => {
                problem(e);
                continue;
            }
        };
        let Some(seg) = elf.section(FATBIN_SEGMENT_SECTION) else {
            problem(format!("has a marker but no {FATBIN_SEGMENT_SECTION}"));
            continue;
        };
        let wrappers = seg.data.len() / WRAPPER_SIZE;
        let mut indices = Vec::with_capacity(wrappers);
        for (i, w) in seg.data.chunks_exact(WRAPPER_SIZE).enumerate() {
            let magic = u32::from_le_bytes(w[0..4].try_into().expect("4 bytes"));
            let ptr = u64::from_le_bytes(w[8..16].try_into().expect("8 bytes"));
            let index = u64::from_le_bytes(w[16..24].try_into().expect("8 bytes")) as u32;
            if magic != HIPK_MAGIC {
                problem(format!("wrapper {i} has magic {magic:#010x}, not HIPK"));
            }
            if ptr != marker.address {
                problem(format!("wrapper {i} points at {ptr:#x}, not the marker at {:#x}", marker.address));
            }
            indices.push(index);
        }
        let original = original_root.join(&rel);
        let originals = match std::fs::read(&original).map_err(|e| e.to_string()).and_then(|b| {
            import::host_code_objects(&kernel_name, &b).map_err(|e| e.to_string())
        }) {
            Ok(c) => c,
            Err(e) => {
                problem(format!("original {}: {e}", original.display()));
                continue;
            }
        };
        let dir = path.parent().unwrap_or(Path::new("."));
        for &index in &indices {
            for co in originals.iter().filter(|c| c.index == index) {
                check.code_objects += 1;
                let found = paths.iter().find_map(|p| {
                    let candidate = dir.join(p.replacen(GFXARCH_PLACEHOLDER, &co.arch, 1));
                    let archive = archives.entry(candidate.clone()).or_insert_with(|| Archive::open(&candidate).ok());
                    let a = archive.as_ref().filter(|a| a.has_architecture(&co.arch))?;
                    a.get_kernel(&co.key, &co.arch).ok()
                });
                match found {
                    Some(bytes) if bytes == co.data => {}
                    Some(bytes) => problem(format!("{} [{}]: archive holds {} bytes that differ from the original's {}", co.key, co.arch, bytes.len(), co.data.len())),
                    None => problem(format!("{} [{}]: not found through {}", co.key, co.arch, paths.join(", "))),
                }
            }
        }
    }
    Ok(check)
}

/// Regular files below `root` (relative paths, sorted), skipping the archive folder.
fn files_below(root: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        for entry in std::fs::read_dir(root.join(&rel))? {
            let entry = entry?;
            let kind = entry.file_type()?;
            let child = rel.join(entry.file_name());
            if kind.is_dir() && entry.file_name() != KPACK_DIR {
                stack.push(child);
            } else if kind.is_file() {
                out.push(child);
            }
        }
    }
    out.sort();
    Ok(out)
}
