//! The library's layers import one way (docs/architecture.md): each folder of `src/` may name
//! only the layers listed for it. Read from the sources, so a new import across a layer fails
//! here rather than in a review.

use std::path::Path;

/// Each layer and the layers of the library it may import (besides itself and the shared
/// modules `error`, `names`, `bytes`, `sync` and `atomic_file`).
const ALLOWED: &[(&str, &[&str])] = &[
    ("archive", &[]),
    ("host", &["archive"]),
    ("loader", &["archive", "host"]),
    ("tools", &["archive", "host", "loader"]),
    ("fs", &["archive", "host", "loader"]),
    ("ffi", &["archive", "host", "loader"]),
];

const LAYERS: &[&str] = &["archive", "host", "loader", "tools", "fs", "ffi"];

/// Every `.rs` file below `dir`.
pub(crate) fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let p = entry.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn layers_import_one_way() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut wrong = Vec::new();
    for (layer, allowed) in ALLOWED {
        let mut files = Vec::new();
        rust_files(&src.join(layer), &mut files);
        assert!(!files.is_empty(), "src/{layer} has no sources");
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap();
            for other in LAYERS
                .iter()
                .filter(|o| *o != layer && !allowed.contains(o))
            {
                let path = format!("crate::{other}::");
                if let Some(line) = text.lines().find(|l| l.contains(&path)) {
                    wrong.push(format!("{}: {}", file.display(), line.trim()));
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "imports across layers:\n{}",
        wrong.join("\n")
    );
}

/// The program's remote sources stand below the command line: nothing in `src/remote/` names
/// `crate::cli`.
#[test]
fn remote_does_not_import_the_command_line() {
    let mut files = Vec::new();
    rust_files(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("src/remote"),
        &mut files,
    );
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        assert!(
            !text.contains("crate::cli"),
            "{} imports the command line",
            file.display()
        );
    }
}

/// The parts of `src/fs/` and the parts each may name (besides itself and, except for the
/// store and `errno`, the module's root: `KpackFs` and the other shared types). The store knows
/// nothing of who reads it, the policy nothing of how bytes are made; only the FUSE adapter
/// sees everything.
const FS_PARTS: &[(&str, &[&str])] = &[
    ("errno", &[]),
    ("store", &["errno"]),
    ("tree", &[]),
    ("policy", &["tree"]),
    ("read", &["errno", "store", "tree"]),
    ("namespace", &["errno", "store", "tree"]),
    ("setup", &["tree"]),
    ("steps", &["errno", "policy", "read", "store", "tree"]),
    (
        "fuse",
        &["errno", "policy", "read", "steps", "store", "tree", "setup"],
    ),
];

/// Leaves of `src/fs/` that name nothing of the module's root either (its `KpackFs`, its
/// shared types): `crate::fs::` only ever followed by one of the allowed parts, and no
/// `super::super::`.
const FS_LEAVES: &[&str] = &["errno", "store"];

/// The sources of one part of `src/fs/`: a folder, or one file.
fn fs_part_files(part: &str) -> Vec<std::path::PathBuf> {
    let fs = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/fs");
    let mut files = Vec::new();
    if fs.join(part).is_dir() {
        rust_files(&fs.join(part), &mut files);
    } else {
        files.push(fs.join(format!("{part}.rs")));
    }
    files
}

#[test]
fn fs_parts_import_one_way() {
    let mut wrong = Vec::new();
    for (part, allowed) in FS_PARTS {
        for file in fs_part_files(part) {
            let text = std::fs::read_to_string(&file).unwrap();
            for (other, _) in FS_PARTS
                .iter()
                .filter(|(o, _)| o != part && !allowed.contains(o))
            {
                let names = [
                    format!("crate::fs::{other}"),
                    format!("super::{other}::"),
                    format!("super::super::{other}::"),
                ];
                if let Some(line) = text
                    .lines()
                    .find(|l| names.iter().any(|n| l.contains(n.as_str())))
                {
                    wrong.push(format!("{}: {}", file.display(), line.trim()));
                }
            }
        }
    }
    for leaf in FS_LEAVES {
        let allowed = FS_PARTS.iter().find(|(p, _)| p == leaf).unwrap().1;
        // A part's own name, then the end of a path segment: `errno` is not `errnos`.
        let names_part = |rest: &str, part: &str| {
            rest.strip_prefix(part)
                .is_some_and(|after| !after.starts_with(|c: char| c == '_' || c.is_alphanumeric()))
        };
        for file in fs_part_files(leaf) {
            // `super::` is the module's root from a part's top file (`errno.rs`,
            // `store/mod.rs`), `super::super::` from a file inside a folder part; one more
            // inside an inline module (`mod tests { ... }`, at the end of a file).
            let top = file.file_name().is_some_and(|n| n == "mod.rs")
                || file.parent().is_some_and(|d| d.ends_with("src/fs"));
            let mut root = String::from(if top { "super::" } else { "super::super::" });
            let text = std::fs::read_to_string(&file).unwrap();
            for line in text.lines() {
                let t = line.trim_start();
                if t.starts_with("mod ") && t.ends_with('{') {
                    root.push_str("super::");
                }
                let names_root = line.match_indices("crate::fs::").any(|(at, m)| {
                    let rest = &line[at + m.len()..];
                    !names_part(rest, leaf) && !allowed.iter().any(|a| names_part(rest, a))
                }) || line.contains("crate::fs;")
                    || line.contains("crate::{")
                    || line.contains(root.as_str());
                if names_root {
                    wrong.push(format!("{}: {}", file.display(), line.trim()));
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "imports across the parts of src/fs:\n{}",
        wrong.join("\n")
    );
}

/// fuser's types stay in the adapter: nothing outside `src/fs/fuse/` names its items.
#[test]
fn only_the_adapter_knows_fuser() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let adapter = src.join("fs/fuse");
    let named: Vec<String> = files
        .iter()
        .filter(|f| !f.starts_with(&adapter))
        .filter(|f| {
            let text = std::fs::read_to_string(f).unwrap();
            // A path to an item of the crate (`fuser::Session`, `fuser::{...}`), not a log
            // target such as "fuser::session" in a filter string.
            text.lines().any(|l| {
                l.trim_start().starts_with("use fuser")
                    || l.match_indices("fuser::").any(|(at, m)| {
                        l[at + m.len()..]
                            .chars()
                            .next()
                            .is_some_and(|c| c == '{' || c.is_ascii_uppercase())
                    })
            })
        })
        .map(|f| f.display().to_string())
        .collect();
    assert!(
        named.is_empty(),
        "fuser named outside the adapter: {named:?}"
    );
}

/// The `use` statements of `text` before its test module, each joined onto one line.
fn use_statements(text: &str) -> Vec<String> {
    let code = text.split("#[cfg(test)]").next().unwrap_or("");
    let mut out = Vec::new();
    let mut current: Option<String> = None;
    for line in code.lines().map(str::trim) {
        let starts = line.starts_with("use ") || line.starts_with("pub");
        if current.is_none() && starts && line.contains("use ") {
            current = Some(String::new());
        }
        if let Some(stmt) = current.as_mut() {
            stmt.push_str(line);
            stmt.push(' ');
            if line.ends_with(';') {
                out.push(stmt.trim().trim_end_matches(';').to_owned());
                current = None;
            }
        }
    }
    out
}

/// The items of a `use` path after `prefix`: `X` for `prefix X`, each item of `prefix {X, Y}`;
/// each as the name it is imported by (`Y as Z` is `Z`). Paths into submodules (`a::X`) are
/// not items of the module `prefix` names.
fn items_after(path: &str, prefix: &str) -> Vec<String> {
    let Some(rest) = path.strip_prefix(prefix) else {
        return Vec::new();
    };
    let rest = rest.trim();
    let list = match rest.strip_prefix('{') {
        Some(l) => l.trim_end().trim_end_matches('}'),
        // `prefix sub::…`: items of a submodule, not of `prefix`.
        None if rest.contains("::") => return Vec::new(),
        None => rest,
    };
    list.split(',')
        .map(str::trim)
        .filter(|i| !i.is_empty() && !i.contains("::"))
        .map(|i| i.split(" as ").last().unwrap_or(i).trim().to_owned())
        .collect()
}

/// Inside `src/cli`, `src/tools/split` and `src/fs`, no file imports a name through what its
/// folder's `mod.rs` re-exports (`use super::X` where `mod.rs` has `pub use part::X`): it names
/// the module that defines `X`. A folder's `mod.rs` is then a list of its parts, never a place
/// its own children depend on.
#[test]
fn no_child_imports_through_its_parents_reexports() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut wrong = Vec::new();
    for root in ["cli", "tools/split", "fs"] {
        let mut files = Vec::new();
        rust_files(&src.join(root), &mut files);
        for mod_rs in files.iter().filter(|f| f.ends_with("mod.rs")) {
            let dir = mod_rs.parent().unwrap();
            let reexported: Vec<String> = use_statements(&std::fs::read_to_string(mod_rs).unwrap())
                .iter()
                .filter_map(|s| s.strip_prefix("pub"))
                .filter_map(|s| s.split_once("use ").map(|(_, path)| path.trim().to_owned()))
                .flat_map(|path| {
                    // The names a re-export brings in: the last segment, or a `{...}` list's.
                    let (base, list) = match path.rfind('{') {
                        Some(b) => (path[..b].to_owned(), path[b..].to_owned()),
                        None => match path.rfind("::") {
                            Some(c) => (path[..c + 2].to_owned(), path[c + 2..].to_owned()),
                            None => (String::new(), path.clone()),
                        },
                    };
                    items_after(&format!("{base}{list}"), &base)
                })
                .filter(|n| n != "self" && n != "*")
                .collect();
            let module = dir.strip_prefix(&src).unwrap().to_str().unwrap();
            let through = format!("crate::{}::", module.replace('/', "::"));
            for child in files
                .iter()
                .filter(|f| f.parent() == Some(dir) && !f.ends_with("mod.rs"))
            {
                for stmt in use_statements(&std::fs::read_to_string(child).unwrap()) {
                    let Some(path) = stmt.split_once("use ").map(|(_, p)| p.trim()) else {
                        continue;
                    };
                    let named = items_after(path, "super::")
                        .into_iter()
                        .chain(items_after(path, &through));
                    if named.into_iter().any(|n| reexported.contains(&n)) {
                        wrong.push(format!("{}: {stmt}", child.display()));
                    }
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "imports through a parent's re-exports:\n{}",
        wrong.join("\n")
    );
}
