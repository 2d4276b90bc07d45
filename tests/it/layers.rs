//! The library's layers import one way (docs/architecture.md): each folder of `src/` may name
//! only the layers listed for it. Read from the sources, so a new import across a layer fails
//! here rather than in a review.

use std::path::Path;

/// Each layer and the layers of the library it may import (besides itself and the shared
/// modules `error`, `names`, `bytes` and `sync`).
const ALLOWED: &[(&str, &[&str])] = &[
    ("archive", &[]),
    ("host", &["archive"]),
    ("loader", &["archive", "host"]),
    ("tools", &["archive", "host", "loader"]),
    ("fs", &["archive", "host", "loader"]),
    ("ffi", &["archive", "host", "loader"]),
];

const LAYERS: &[&str] = &["archive", "host", "loader", "tools", "fs", "ffi"];

fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
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
