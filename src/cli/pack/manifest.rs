//! `pack --manifest FILE`: the kernels to pack, in the caller's order. One kernel per line,
//! `key<TAB>arch<TAB>path`, the path relative to the manifest's directory (or absolute). The
//! order of the lines gives the ordinals and the TOC's key and arch order, as the reference
//! writer's insertion order does, so archives written by other tools can be reproduced exactly.

use std::path::{Path, PathBuf};

use rocm_kpack::names;

use crate::cli::exit::{CliError, CliResult, Exit};

/// One manifest line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    pub key: String,
    pub arch: String,
    pub path: PathBuf,
}

/// Reads and checks a manifest: three tab-separated fields per line, keys and arches as `pack`
/// accepts them in a tree, each (key, arch) once. Empty lines are skipped.
pub fn read(manifest: &Path) -> CliResult<Vec<Line>> {
    let text = std::fs::read(manifest).map_err(|e| CliError::io(Exit::Unreadable, manifest, &e))?;
    let text = String::from_utf8(text).map_err(|_| {
        CliError::new(
            Exit::BadFormat,
            format!("{}: not UTF-8 text", manifest.display()),
        )
    })?;
    parse(&text, manifest)
}

fn parse(text: &str, manifest: &Path) -> CliResult<Vec<Line>> {
    let base = manifest
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let mut lines = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for (n, raw) in text.lines().enumerate() {
        let bad = |why: String| {
            CliError::new(
                Exit::BadFormat,
                format!("{}:{}: {why}", manifest.display(), n + 1),
            )
        };
        if raw.is_empty() {
            continue;
        }
        let fields: Vec<&str> = raw.split('\t').collect();
        let [key, arch, path] = fields.as_slice() else {
            return Err(bad(format!(
                "expected key<TAB>arch<TAB>path, found {} field{}",
                fields.len(),
                if fields.len() == 1 { "" } else { "s" }
            )));
        };
        names::key_components(key).map_err(|e| bad(e.to_string()))?;
        names::check_arch(arch).map_err(|e| bad(e.to_string()))?;
        if path.is_empty() {
            return Err(bad("empty path".into()));
        }
        if !seen.insert((key.to_string(), arch.to_string())) {
            return Err(bad(format!("{key} [{arch}] is listed twice")));
        }
        lines.push(Line {
            key: key.to_string(),
            arch: arch.to_string(),
            path: base.join(path),
        });
    }
    if lines.is_empty() {
        return Err(CliError::new(
            Exit::BadFormat,
            format!("{}: lists no kernels", manifest.display()),
        ));
    }
    Ok(lines)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_keep_their_order_and_paths_are_relative_to_the_manifest() {
        let got = parse(
            "lib/b.so#0\tgfx906\tk/one.bin\n\nbin/a#0\tgfx900\t/abs/two.bin\n",
            Path::new("/m/list.tsv"),
        )
        .unwrap();
        assert_eq!(
            got,
            [
                Line {
                    key: "lib/b.so#0".into(),
                    arch: "gfx906".into(),
                    path: "/m/k/one.bin".into()
                },
                Line {
                    key: "bin/a#0".into(),
                    arch: "gfx900".into(),
                    path: "/abs/two.bin".into()
                },
            ]
        );
    }

    #[test]
    fn bad_lines_are_named() {
        let m = Path::new("m.tsv");
        let msg = |text: &str| parse(text, m).unwrap_err().message;
        assert_eq!(
            msg("a#0\tgfx900\tx\nb#0 gfx900 y\n"),
            "m.tsv:2: expected key<TAB>arch<TAB>path, found 1 field"
        );
        assert_eq!(
            msg("a#0\tgfx900\tx\na#0\tgfx900\ty\n"),
            "m.tsv:2: a#0 [gfx900] is listed twice"
        );
        assert_eq!(msg("a#0\tgfx900\t\n"), "m.tsv:1: empty path");
        assert_eq!(msg("\n"), "m.tsv: lists no kernels");
        assert!(msg("../x#0\tgfx900\tp\n").starts_with("m.tsv:1: "));
        assert!(msg("a#0\tgfx/900\tp\n").starts_with("m.tsv:1: "));
    }
}
