//! Checking a split tree against the original one, through the loader.
//!
//! For every rewritten binary below the output root (a file with a `.rocm_kpack_ref` section),
//! every wrapper must be HIPK, point at the marker and carry its index; then, for each wrapper
//! and each arch the original binary has a code object for at that index, the code object is
//! loaded the way `kpack_load_code_object` loads it — HIPK metadata parsed from the marker's
//! bytes, search paths resolved against the rewritten binary's directory, archives opened and
//! searched by [`Loader::load_code_object`] — and must be byte-identical to the original's.
//!
//! The loader runs with a default configuration: `ROCM_KPACK_PATH*` and `ROCM_KPACK_DISABLE`
//! in the caller's environment are ignored, since the point is what the binary itself carries.
//! One loader serves the whole run, so each archive is opened once.

use std::path::{Path, PathBuf};

use crate::elf::{ELF_MAGIC, ElfFile, FATBIN_SEGMENT_SECTION, KPACK_REF_SECTION};
use crate::hipk::wrapper::{HIPK_MAGIC, parse_wrappers};
use crate::import::{self, KPACK_DIR};
use crate::loader::{HipkMetadata, LoadRequest, Loader, LoaderConfig, Silent};

/// What `verify_split` found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SplitCheck {
    /// Rewritten binaries checked.
    pub binaries: usize,
    /// (wrapper, arch) code objects loaded and compared.
    pub code_objects: usize,
    /// One line per problem, naming the binary.
    pub problems: Vec<String>,
}

/// Checks every split binary below `out_root` against the binary at the same relative path
/// below `original_root`. I/O errors walking `out_root` are returned; everything about a single
/// binary (unreadable, malformed, missing original, load failure, different bytes) is a problem
/// line.
pub fn verify_split(out_root: &Path, original_root: &Path) -> std::io::Result<SplitCheck> {
    let mut check = SplitCheck::default();
    let loader = Loader::new(LoaderConfig::default());
    for rel in files_below(out_root)? {
        let path = out_root.join(&rel);
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) => {
                check
                    .problems
                    .push(format!("{}: cannot read: {e}", path.display()));
                continue;
            }
        };
        // Files that are not ELF (data, scripts) are not binaries; an ELF file that does not
        // parse is a problem, never silently "not split".
        if !bytes.starts_with(ELF_MAGIC) {
            continue;
        }
        let elf = match ElfFile::parse(&bytes) {
            Ok(elf) => elf,
            Err(e) => {
                check.problems.push(format!("{}: {e}", path.display()));
                continue;
            }
        };
        let Some(marker) = elf.section(KPACK_REF_SECTION) else {
            continue;
        };
        check.binaries += 1;
        let mut problems = Vec::new();
        check.code_objects += verify_binary(
            &loader,
            &path,
            &elf,
            marker.data,
            marker.address,
            &original_root.join(&rel),
            &mut problems,
        );
        check.problems.extend(
            problems
                .into_iter()
                .map(|m| format!("{}: {m}", path.display())),
        );
    }
    Ok(check)
}

/// Checks one rewritten binary; returns the number of code objects loaded and compared.
fn verify_binary(
    loader: &Loader,
    path: &Path,
    elf: &ElfFile<'_>,
    marker: &[u8],
    marker_address: u64,
    original: &Path,
    problems: &mut Vec<String>,
) -> usize {
    let metadata = match HipkMetadata::parse(marker) {
        Ok(m) => m,
        Err(e) => {
            problems.push(format!("marker: {e}"));
            return 0;
        }
    };
    let Some(seg) = elf.section(FATBIN_SEGMENT_SECTION) else {
        problems.push(format!("has a marker but no {FATBIN_SEGMENT_SECTION}"));
        return 0;
    };
    let wrappers = parse_wrappers(seg.data, true);
    for (i, w) in wrappers.iter().enumerate() {
        if w.magic != HIPK_MAGIC {
            problems.push(format!("wrapper {i} has magic {:#010x}, not HIPK", w.magic));
        }
        if w.pointer != marker_address {
            problems.push(format!(
                "wrapper {i} points at {:#x}, not at the marker ({marker_address:#x})",
                w.pointer
            ));
        }
    }
    let originals = match std::fs::read(original)
        .map_err(|e| crate::error::describe_io(&e))
        .and_then(|b| {
            import::host_code_objects(&metadata.kernel_name, &b).map_err(|e| e.to_string())
        }) {
        Ok(c) => c,
        Err(e) => {
            problems.push(format!("original {}: {e}", original.display()));
            return 0;
        }
    };
    let mut compared = 0;
    for co in &originals {
        if !wrappers
            .iter()
            .any(|w| w.magic == HIPK_MAGIC && w.co_index == co.index)
        {
            problems.push(format!(
                "{} [{}]: no HIPK wrapper carries index {}",
                co.key, co.arch, co.index
            ));
        }
    }
    for w in wrappers.iter().filter(|w| w.magic == HIPK_MAGIC) {
        for co in originals.iter().filter(|c| c.index == w.co_index) {
            compared += 1;
            let arch_list = [Some(co.arch.as_str())];
            let request = LoadRequest {
                binary_path: path,
                co_index: w.co_index,
                arch_list: &arch_list,
            };
            let loaded = loader.load_code_object(
                || Ok(metadata.clone()),
                &request,
                |n| Some(vec![0u8; n]),
                &mut Silent,
            );
            match loaded {
                Ok(l) if l.data == co.data && l.target == co.arch => {}
                Ok(l) if l.data == co.data => problems.push(format!(
                    "{} [{}]: loaded as target {} from {}, not as {}",
                    co.key,
                    co.arch,
                    l.target,
                    l.archive.display(),
                    co.arch
                )),
                Ok(l) => problems.push(format!(
                    "{} [{}]: {} holds {} bytes that differ from the original's {}",
                    co.key,
                    co.arch,
                    l.archive.display(),
                    l.data.len(),
                    co.data.len()
                )),
                Err(e) => problems.push(format!(
                    "{} [{}]: does not load: {} ({e})",
                    co.key,
                    co.arch,
                    e.kind().name()
                )),
            }
        }
    }
    compared
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
