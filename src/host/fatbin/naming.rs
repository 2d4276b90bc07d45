//! The naming that importing and splitting share, the reference splitter's, so archives made
//! from a binary's code objects are the ones its split form looks for:
//! - `kernel_name` is the binary's path relative to the install root, `/`-separated
//!   ([`kernel_name_from_relative`], [`kernel_name_below`]);
//! - archives live in `<root>/.kpack/` ([`KPACK_DIR`]), one per arch named
//!   `<prefix>_<arch>.kpack` (or a single multi-arch `<prefix>.kpack`) ([`archive_file_name`],
//!   [`default_prefix`], [`validate_prefix`]);
//! - so the search path written into the binary is `../` once per directory level of
//!   `kernel_name`, then `.kpack/<prefix>_@GFXARCH@.kpack` ([`search_path`]).

use std::path::{Component, Path};

use crate::host::hipk;
use crate::names;

/// Directory, at the install root, that holds the archives.
pub(crate) const KPACK_DIR: &str = ".kpack";
/// Suffix of the metadata files `--emit-metadata` writes.
pub const METADATA_SUFFIX: &str = ".hipk.msgpack";

/// The `kernel_name` for a binary at `relative` (its path below the install root):
/// components joined by `/`. Absolute paths and `..` are refused.
pub fn kernel_name_from_relative(relative: &Path) -> Result<String, String> {
    let mut parts = Vec::new();
    for c in relative.components() {
        match c {
            Component::Normal(s) => parts.push(
                s.to_str()
                    .ok_or_else(|| format!("{}: path is not UTF-8", relative.display()))?,
            ),
            Component::CurDir => {}
            _ => return Err(format!("{}: not a path below the root", relative.display())),
        }
    }
    if parts.is_empty() {
        return Err(format!(
            "{:?}: names no file",
            relative.display().to_string()
        ));
    }
    Ok(parts.join("/"))
}

/// The `kernel_name` of `host` below the install root `root`. Reads the file system: the
/// directories of both are resolved through symlinks; the binary's own name is kept as given
/// (a symlinked library keeps the name it was asked for).
pub(crate) fn kernel_name_below(host: &Path, root: &Path) -> Result<String, String> {
    let root_abs = std::fs::canonicalize(root).map_err(|e| format!("{}: {e}", root.display()))?;
    let parent = host
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let parent_abs =
        std::fs::canonicalize(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
    let name = host
        .file_name()
        .ok_or_else(|| format!("{}: names no file", host.display()))?;
    let full = parent_abs.join(name);
    let rel = full.strip_prefix(&root_abs).map_err(|_| {
        format!(
            "{} is not below the root {}",
            host.display(),
            root.display()
        )
    })?;
    kernel_name_from_relative(rel)
}

/// The default archive prefix for a binary file name: the name up to its first `.`, without a
/// leading `lib` (`librocrand.so.1.1` → `rocrand`, `hipcc_app` → `hipcc_app`).
pub fn default_prefix(file_name: &str) -> String {
    let stem = file_name.split('.').next().unwrap_or(file_name);
    match stem.strip_prefix("lib") {
        Some(rest) if !rest.is_empty() => rest.to_owned(),
        _ => stem.to_owned(),
    }
}

/// Checks a user-supplied prefix: it becomes part of file names (a safe path component, see
/// [`names::check_component`]) and of the search path, where an `@` could form the
/// `@GFXARCH@` token, so `@` is refused too.
pub fn validate_prefix(prefix: &str) -> Result<(), String> {
    names::check_component(prefix).map_err(|why| format!("prefix {prefix:?} {why}"))?;
    if prefix.contains('@') {
        return Err(format!(
            "prefix {prefix:?} contains '@' (it could form the {} token)",
            hipk::GFXARCH_TOKEN
        ));
    }
    Ok(())
}

/// The archive file name: `<prefix>_<arch>.kpack`, or `<prefix>.kpack` for a multi-arch archive.
pub(crate) fn archive_file_name(prefix: &str, arch: Option<&str>) -> String {
    match arch {
        Some(a) => format!("{prefix}_{a}.kpack"),
        None => format!("{prefix}.kpack"),
    }
}

/// The search path a binary with this `kernel_name` carries: relative to the binary's
/// directory, up to the root, then into `.kpack/`. Per-arch archives use the `@GFXARCH@`
/// placeholder; a single archive is named directly.
pub fn search_path(kernel_name: &str, prefix: &str, single: bool) -> String {
    let depth = kernel_name.matches('/').count();
    let file = archive_file_name(
        prefix,
        if single {
            None
        } else {
            Some(hipk::GFXARCH_TOKEN)
        },
    );
    format!("{}{KPACK_DIR}/{file}", "../".repeat(depth))
}
