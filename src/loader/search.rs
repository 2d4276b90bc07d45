//! Which archive files the loader tries, in order, for one HIPK binary.
//!
//! The rules (same as the reference library):
//! - `ROCM_KPACK_PATH` set: exactly its entries, nothing else.
//! - Otherwise `ROCM_KPACK_PATH_PREFIX` entries first, then each embedded search path in metadata
//!   order. A relative embedded path is resolved against the directory of the binary with a
//!   "weakly canonical" resolution (symlinks, `.` and `..` of the part that exists are resolved;
//!   the rest is normalised lexically). An absolute one is used as written.
//! - A resolved path containing `@GFXARCH@` expands into one path per compatible target of each
//!   arch in the caller's list (feature subsets, most specific first; see `arch`). Only the
//!   first occurrence is replaced. Environment entries are never expanded.
//! - A target that is not one plain path component (`/`, `.`, `..`, NUL; only a broken or
//!   hostile arch list gives one) is not substituted: no expanded path leaves the pattern's
//!   directory. The reference substitutes any string; real target IDs never differ.
//!
//! - Without a device (the mount with no `--gpu`), a `@GFXARCH@` path stands instead for every
//!   existing file that fits it ([`Expansion::Existing`]).
//!
//! Nothing here opens archives: [`super::Loader::open_archives`] does, for the loader and the
//! mount alike.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Component, Path, PathBuf};

use super::config::LoaderConfig;
use super::trace::{Event, Trace, emit};
use crate::host::hipk::GFXARCH_TOKEN;
use crate::host::target_id;
use crate::names;

/// What `@GFXARCH@` in an embedded search path stands for.
#[derive(Debug, Clone, Copy)]
pub enum Expansion<'a> {
    /// Each compatible target of each arch in the caller's list, most specific first (what the
    /// loader does for a device); `None` entries are skipped.
    Targets(&'a [Option<&'a str>]),
    /// Every existing file that fits the pattern ([`existing_matches`]): the archives a binary
    /// could load on *some* device (the mount without `--gpu`).
    Existing,
}

/// The ordered list of archive paths to try.
pub fn build_search_paths(
    config: &LoaderConfig,
    binary_path: &Path,
    embedded: &[OsString],
    expansion: Expansion<'_>,
    trace: &mut dyn Trace,
) -> Vec<PathBuf> {
    if !config.path_override.is_empty() {
        emit(trace, || Event::UsingOverride {
            paths: config.path_override.len(),
        });
        return config.path_override.clone();
    }
    let mut paths = Vec::new();
    if !config.path_prefix.is_empty() {
        emit(trace, || Event::PrependingPrefix {
            paths: config.path_prefix.len(),
        });
        paths.extend(config.path_prefix.iter().cloned());
    }
    for raw in embedded {
        let resolved = resolve_path(binary_path, Path::new(raw));
        if find_token(resolved.as_os_str()).is_none() {
            emit(trace, || Event::DirectPath {
                original: Path::new(raw).display().to_string(),
                resolved: resolved.display().to_string(),
            });
            paths.push(resolved);
            continue;
        }
        let mut add = |path: PathBuf, trace: &mut dyn Trace| {
            emit(trace, || Event::ExpandedPattern {
                pattern: resolved.display().to_string(),
                path: path.display().to_string(),
            });
            paths.push(path);
        };
        match expansion {
            Expansion::Targets(arch_list) => {
                expand_for_targets(&resolved, arch_list, trace, &mut add)
            }
            Expansion::Existing => {
                for path in existing_matches(&resolved) {
                    add(path, trace);
                }
            }
        }
    }
    paths
}

/// One path per compatible target of each arch, skipping targets that are not safe path
/// components (the arch list comes from the caller: a hostile or broken one must not turn
/// `.kpack/@GFXARCH@/foo.kpack` into a path outside `.kpack`).
fn expand_for_targets(
    resolved: &Path,
    arch_list: &[Option<&str>],
    trace: &mut dyn Trace,
    add: &mut dyn FnMut(PathBuf, &mut dyn Trace),
) {
    for a in arch_list.iter().flatten() {
        for target in target_id::compatible_targets(a) {
            if names::is_safe_component(&target) {
                add(replace_first_token(resolved, &target), trace);
            } else {
                emit(trace, || Event::UnsafeTarget {
                    pattern: resolved.display().to_string(),
                    target: target.clone(),
                });
            }
        }
    }
}

/// Resolves an embedded search path against the binary's directory. Absolute paths are returned
/// unchanged. A binary path ending in `/` is its own directory (the parent of an empty last
/// component, as the reference takes it): `../x` from `/opt/rocm/lib/` is `/opt/rocm/x`.
pub fn resolve_path(binary_path: &Path, path: &Path) -> PathBuf {
    if path.is_absolute() {
        return path.to_path_buf();
    }
    let dir = if binary_path.as_os_str().as_bytes().ends_with(b"/") {
        binary_path
    } else {
        binary_path.parent().unwrap_or(Path::new(""))
    };
    weakly_canonical(&dir.join(path))
}

/// Canonicalises the longest leading part of `path` that exists, then appends the rest and
/// normalises it lexically. Never fails: when nothing exists, the path is only normalised.
///
/// The search runs from the full path towards the root, so the usual cases cost one or two
/// `realpath` calls (the file exists, or its directory does) instead of one `stat` per component.
pub fn weakly_canonical(path: &Path) -> PathBuf {
    let components: Vec<Component<'_>> = path.components().collect();
    for existing in (1..=components.len()).rev() {
        let head: PathBuf = components[..existing]
            .iter()
            .map(|c| c.as_os_str())
            .collect();
        if let Ok(mut out) = std::fs::canonicalize(&head) {
            if existing == components.len() {
                return out;
            }
            for c in &components[existing..] {
                out.push(c.as_os_str());
            }
            return lexically_normal(&out);
        }
    }
    lexically_normal(path)
}

/// Removes `.` components and folds `name/..` pairs, without touching the file system. `..` at
/// the root stays at the root; leading `..` of a relative path are kept.
pub fn lexically_normal(path: &Path) -> PathBuf {
    let mut parts: Vec<Component<'_>> = Vec::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => match parts.last() {
                Some(Component::Normal(_)) => {
                    parts.pop();
                }
                Some(Component::RootDir) | Some(Component::Prefix(_)) => {}
                _ => parts.push(c),
            },
            _ => parts.push(c),
        }
    }
    if parts.is_empty() {
        return PathBuf::from(".");
    }
    parts.iter().map(|c| c.as_os_str()).collect()
}

fn find_token(s: &OsStr) -> Option<usize> {
    let token = GFXARCH_TOKEN.as_bytes();
    s.as_bytes().windows(token.len()).position(|w| w == token)
}

/// `path` with its first `@GFXARCH@` replaced by `target` (unchanged when there is none).
pub fn replace_first_token(path: &Path, target: &str) -> PathBuf {
    let bytes = path.as_os_str().as_bytes();
    let Some(at) = find_token(path.as_os_str()) else {
        return path.to_path_buf();
    };
    let mut out = Vec::with_capacity(bytes.len() + target.len());
    out.extend_from_slice(&bytes[..at]);
    out.extend_from_slice(target.as_bytes());
    out.extend_from_slice(&bytes[at + GFXARCH_TOKEN.len()..]);
    PathBuf::from(OsString::from_vec(out))
}

/// The existing files a resolved search path can name when no device arch list is known: with
/// no `@GFXARCH@` the path itself (if it is a regular file); otherwise every directory entry
/// that fits the pattern of the component holding the first token, with any non-empty text in
/// place of the token (as the loader replaces only the first one, later tokens must appear
/// literally), followed by the rest of the path. Matches come in byte order of the entry name,
/// and only those that exist as regular files (symlinks followed) are returned.
///
/// Used by the mount to show every archive a HIPK binary could load on some device.
pub fn existing_matches(resolved: &Path) -> Vec<PathBuf> {
    let is_file = |p: &Path| std::fs::metadata(p).map(|m| m.is_file()).unwrap_or(false);
    let components: Vec<Component<'_>> = resolved.components().collect();
    let Some(at) = components
        .iter()
        .position(|c| find_token(c.as_os_str()).is_some())
    else {
        return if is_file(resolved) {
            vec![resolved.to_path_buf()]
        } else {
            Vec::new()
        };
    };
    let dir: PathBuf = if at == 0 {
        PathBuf::from(".")
    } else {
        components[..at].iter().map(|c| c.as_os_str()).collect()
    };
    let pattern = components[at].as_os_str().as_bytes();
    let token_at = find_token(components[at].as_os_str()).expect("found above");
    let (head, tail) = (
        &pattern[..token_at],
        &pattern[token_at + GFXARCH_TOKEN.len()..],
    );
    let rest: PathBuf = components[at + 1..].iter().map(|c| c.as_os_str()).collect();
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut names: Vec<OsString> = entries
        .filter_map(|e| e.ok().map(|e| e.file_name()))
        .filter(|n| {
            let b = n.as_bytes();
            b.len() > head.len() + tail.len() && b.starts_with(head) && b.ends_with(tail)
        })
        .collect();
    names.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
    names
        .into_iter()
        .map(|n| {
            if at == 0 && !resolved.has_root() {
                PathBuf::from(&n)
            } else {
                dir.join(&n)
            }
        })
        .map(|p| {
            if rest.as_os_str().is_empty() {
                p
            } else {
                p.join(&rest)
            }
        })
        .filter(|p| is_file(p))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::loader::trace::{Recorder, Silent};

    fn os(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    #[test]
    fn expands_every_feature_subset_of_every_arch() {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::create_dir_all(root.join("lib")).unwrap();
        std::fs::create_dir_all(root.join(".kpack")).unwrap();
        let binary = root.join("lib/libfoo.so");
        let list = [
            Some("amdgcn-amd-amdhsa--gfx942:sramecc+:xnack-"),
            None,
            Some("amdgcn-amd-amdhsa--gfx9-4-generic:sramecc+:xnack-"),
        ];
        let paths = build_search_paths(
            &LoaderConfig::default(),
            &binary,
            &os(&["../.kpack/foo_@GFXARCH@.kpack"]),
            Expansion::Targets(&list),
            &mut Silent,
        );
        let k = root.join(".kpack");
        let want: Vec<PathBuf> = [
            "gfx942:sramecc+:xnack-",
            "gfx942:sramecc+",
            "gfx942:xnack-",
            "gfx942",
            "gfx9-4-generic:sramecc+:xnack-",
            "gfx9-4-generic:sramecc+",
            "gfx9-4-generic:xnack-",
            "gfx9-4-generic",
        ]
        .iter()
        .map(|t| k.join(format!("foo_{t}.kpack")))
        .collect();
        assert_eq!(paths, want);
    }

    #[test]
    fn hostile_targets_never_leave_the_pattern_directory() {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::create_dir_all(root.join("lib")).unwrap();
        let list = [
            Some("../../etc/passwd"),
            Some("a/b"),
            Some(".."),
            Some("."),
            Some("gfx942:../../x"),
            Some("gfx9\0x"),
            Some("gfx900"),
        ];
        let mut rec = Recorder::default();
        let paths = build_search_paths(
            &LoaderConfig::default(),
            &root.join("lib/libfoo.so"),
            &os(&["../.kpack/@GFXARCH@/foo.kpack"]),
            Expansion::Targets(&list),
            &mut rec,
        );
        let k = root.join(".kpack");
        // Only the plain targets are substituted: gfx942 (its hostile feature dropped) and gfx900.
        assert_eq!(
            paths,
            [k.join("gfx942/foo.kpack"), k.join("gfx900/foo.kpack")]
        );
        let pattern = k.join("@GFXARCH@/foo.kpack").display().to_string();
        let skipped: Vec<&str> = rec
            .events
            .iter()
            .filter_map(|e| match e {
                Event::UnsafeTarget { pattern: p, target } => {
                    assert_eq!(*p, pattern);
                    Some(target.as_str())
                }
                _ => None,
            })
            .collect();
        assert_eq!(
            skipped,
            [
                "../../etc/passwd",
                "a/b",
                "..",
                ".",
                "gfx942:../../x",
                "gfx9\0x"
            ]
        );
        for p in &paths {
            assert!(lexically_normal(p).starts_with(&k), "{p:?}");
        }
    }

    #[test]
    fn only_the_first_token_is_replaced() {
        let p = replace_first_token(Path::new("/a/@GFXARCH@/x_@GFXARCH@.kpack"), "gfx900");
        assert_eq!(p, Path::new("/a/gfx900/x_@GFXARCH@.kpack"));
        assert_eq!(
            replace_first_token(Path::new("/a/b"), "gfx900"),
            Path::new("/a/b")
        );
    }

    #[test]
    fn override_is_exclusive_and_prefix_comes_first() {
        let cfg = LoaderConfig {
            path_override: vec!["/o/@GFXARCH@.kpack".into()],
            path_prefix: vec!["/p.kpack".into()],
            ..Default::default()
        };
        let mut rec = Recorder::default();
        let paths = build_search_paths(
            &cfg,
            Path::new("/b/x.so"),
            &os(&["/e.kpack"]),
            Expansion::Targets(&[Some("gfx900")]),
            &mut rec,
        );
        assert_eq!(paths, [PathBuf::from("/o/@GFXARCH@.kpack")]);
        assert_eq!(rec.events, [Event::UsingOverride { paths: 1 }]);

        let cfg = LoaderConfig {
            path_prefix: vec!["rel.kpack".into()],
            ..Default::default()
        };
        let mut rec = Recorder::default();
        let paths = build_search_paths(
            &cfg,
            Path::new("/nonexistent-dir/x.so"),
            &os(&["/e.kpack", "y/../z.kpack"]),
            Expansion::Targets(&[Some("gfx900")]),
            &mut rec,
        );
        assert_eq!(
            paths,
            [
                PathBuf::from("rel.kpack"),
                PathBuf::from("/e.kpack"),
                PathBuf::from("/nonexistent-dir/z.kpack")
            ]
        );
        assert_eq!(rec.events[0], Event::PrependingPrefix { paths: 1 });
        assert_eq!(
            rec.events[2],
            Event::DirectPath {
                original: "y/../z.kpack".into(),
                resolved: "/nonexistent-dir/z.kpack".into()
            }
        );
    }

    #[test]
    fn relative_paths_resolve_symlinks_of_the_existing_part() {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::create_dir_all(root.join("real/lib")).unwrap();
        std::os::unix::fs::symlink(root.join("real"), root.join("link")).unwrap();
        let got = resolve_path(
            &root.join("link/lib/libfoo.so"),
            Path::new("../.kpack/a.kpack"),
        );
        assert_eq!(got, root.join("real/.kpack/a.kpack"));
        // Absolute paths are left exactly as written.
        let abs = root.join("link/./x.kpack");
        assert_eq!(resolve_path(&root.join("b.so"), &abs), abs);
        // A binary given without a directory resolves against the current directory's view.
        assert_eq!(
            resolve_path(Path::new("b.so"), Path::new("no-such-dir-xyz/../a.kpack")),
            PathBuf::from("a.kpack")
        );
    }

    #[test]
    fn a_binary_path_ending_in_a_slash_is_its_own_directory() {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::create_dir_all(root.join("opt/rocm/lib")).unwrap();
        let lib = format!("{}/opt/rocm/lib/", root.display());
        assert_eq!(
            resolve_path(Path::new(&lib), Path::new("../.kpack/x.kpack")),
            root.join("opt/rocm/.kpack/x.kpack")
        );
        assert_eq!(
            resolve_path(Path::new("/nonexistent-dir/lib/"), Path::new("a.kpack")),
            Path::new("/nonexistent-dir/lib/a.kpack")
        );
        assert_eq!(
            resolve_path(Path::new("/nonexistent-dir/lib"), Path::new("a.kpack")),
            Path::new("/nonexistent-dir/a.kpack")
        );
    }

    #[test]
    fn lexical_normalisation() {
        assert_eq!(
            lexically_normal(Path::new("/a/./b/../c")),
            Path::new("/a/c")
        );
        assert_eq!(lexically_normal(Path::new("/../a")), Path::new("/a"));
        assert_eq!(
            lexically_normal(Path::new("../a/../../b")),
            Path::new("../../b")
        );
        assert_eq!(lexically_normal(Path::new("a/..")), Path::new("."));
    }

    #[test]
    fn empty_and_bare_prefix_arches_expand_to_nothing_useful() {
        let paths = build_search_paths(
            &LoaderConfig::default(),
            Path::new("/nonexistent-dir/x.so"),
            &os(&["f_@GFXARCH@.kpack"]),
            Expansion::Targets(&[Some(""), Some("amdgcn-amd-amdhsa--")]),
            &mut Silent,
        );
        assert_eq!(
            paths,
            [PathBuf::from(
                "/nonexistent-dir/f_amdgcn-amd-amdhsa--.kpack"
            )]
        );
    }
    #[test]
    fn existing_matches_fit_the_pattern_in_byte_order() {
        let dir = tempfile::tempdir().unwrap();
        let k = std::fs::canonicalize(dir.path()).unwrap();
        for name in [
            "foo_gfx942.kpack",
            "foo_gfx90a:xnack+.kpack",
            "foo_.kpack",
            "bar_gfx942.kpack",
            "foo_gfx1100.kpack.bak",
        ] {
            std::fs::write(k.join(name), b"x").unwrap();
        }
        std::fs::create_dir(k.join("foo_gfxdir.kpack")).unwrap();
        let got = existing_matches(&k.join("foo_@GFXARCH@.kpack"));
        assert_eq!(
            got,
            [
                k.join("foo_gfx90a:xnack+.kpack"),
                k.join("foo_gfx942.kpack")
            ]
        );
        // No token: the path itself, when it is a regular file.
        assert_eq!(
            existing_matches(&k.join("bar_gfx942.kpack")),
            [k.join("bar_gfx942.kpack")]
        );
        assert!(existing_matches(&k.join("missing.kpack")).is_empty());
        // A token in a directory component, and later tokens kept literally.
        std::fs::create_dir_all(k.join("gfx900")).unwrap();
        std::fs::create_dir_all(k.join("gfx1030")).unwrap();
        std::fs::write(k.join("gfx900/a.kpack"), b"x").unwrap();
        std::fs::write(k.join("gfx1030/a_@GFXARCH@.kpack"), b"x").unwrap();
        assert_eq!(
            existing_matches(&k.join("@GFXARCH@/a.kpack")),
            [k.join("gfx900/a.kpack")]
        );
        assert_eq!(
            existing_matches(&k.join("@GFXARCH@/a_@GFXARCH@.kpack")),
            [k.join("gfx1030/a_@GFXARCH@.kpack")]
        );
        assert!(existing_matches(&k.join("nodir/@GFXARCH@.kpack")).is_empty());
    }
}
