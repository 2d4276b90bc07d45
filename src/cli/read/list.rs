//! `kpack-fuse list`: one line per kernel of an archive (binary, arch, size, stored size,
//! ratio), or per code object of a host binary (a fat binary's bundles, or what the loader finds
//! for a HIPK binary), or JSON.

use std::path::Path;

use rocm_kpack::host::bundle::Layout;
use rocm_kpack::tools::import::IndexedCodeObject;

use super::input::{self, HipkRow, Input, InputArgs};
use crate::cli::exit::CliResult;

pub type Args = InputArgs<ListArgs>;

/// What `list` takes besides its input.
#[derive(Debug, clap::Args)]
pub struct ListArgs {
    /// Print JSON (one object with the archive's fields and a "kernels" array, each kernel with
    /// its recorded BLAKE3 digest in hex, or null) for scripts.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: Args) -> CliResult {
    match args.input()? {
        Input::Archive => list_archive(args),
        Input::Fat { host, kernel_name } => {
            let cos = input::fat_index(&args.archive, &host, &kernel_name)?;
            list_fat(&args.archive, &kernel_name, &cos, args.command.json);
            Ok(())
        }
        Input::Hipk { host, binary } => {
            let rows = input::hipk_rows(&host, &binary, &args.gpus)?;
            list_hipk(
                &args.archive,
                &host.metadata.kernel_name,
                &rows,
                &args.gpus,
                args.command.json,
            );
            Ok(())
        }
    }
}

/// The bundle a code object is in: `plain@OFFSET` or `ccob-vN@OFFSET`, its section offset.
fn bundle_name(c: &IndexedCodeObject) -> String {
    match c.bundle.layout {
        Layout::Uncompressed => format!("plain@{}", c.bundle.offset),
        Layout::Compressed { version } => format!("ccob-v{version}@{}", c.bundle.offset),
    }
}

fn print_json(doc: &serde_json::Value) {
    println!(
        "{}",
        serde_json::to_string_pretty(doc).expect("JSON of plain values")
    );
}

fn list_fat(path: &Path, kernel_name: &str, cos: &[IndexedCodeObject], json: bool) {
    if json {
        let kernels: Vec<_> = cos
            .iter()
            .map(|c| {
                serde_json::json!({
                    "key": c.key, "arch": c.arch, "triple": c.triple, "index": c.index,
                    "size": c.size, "bundle": bundle_name(c),
                })
            })
            .collect();
        print_json(&serde_json::json!({
            "binary": path.display().to_string(),
            "kind": "fat",
            "kernel_name": kernel_name,
            "kernels": kernels,
        }));
        return;
    }
    let width = cos.iter().map(|c| c.key.len()).max().unwrap_or(3).max(3);
    let awidth = cos.iter().map(|c| c.arch.len()).max().unwrap_or(4).max(4);
    println!(
        "{:<width$}  {:<awidth$}  {:>12}  BUNDLE",
        "KEY", "ARCH", "SIZE"
    );
    for c in cos {
        println!(
            "{:<width$}  {:<awidth$}  {:>12}  {}",
            c.key,
            c.arch,
            c.size,
            bundle_name(c)
        );
    }
}

fn list_hipk(path: &Path, kernel_name: &str, rows: &[HipkRow], gpus: &[String], json: bool) {
    if json {
        let kernels: Vec<_> = rows
            .iter()
            .map(|r| {
                let (archive, size, error) = match &r.found {
                    Ok(f) => (Some(f.path.display().to_string()), Some(f.size), None),
                    Err(e) => (None, None, Some(e.clone())),
                };
                serde_json::json!({
                    "key": r.key, "arch": r.arch, "index": r.index, "archive": archive,
                    "size": size, "error": error,
                })
            })
            .collect();
        print_json(&serde_json::json!({
            "binary": path.display().to_string(),
            "kind": "hipk",
            "kernel_name": kernel_name,
            "gpus": gpus,
            "kernels": kernels,
        }));
        return;
    }
    let width = rows.iter().map(|r| r.key.len()).max().unwrap_or(3).max(3);
    let awidth = rows
        .iter()
        .filter_map(|r| r.arch.as_ref().map(String::len))
        .max()
        .unwrap_or(4)
        .max(4);
    println!(
        "{:<width$}  {:<awidth$}  {:>12}  ARCHIVE",
        "KEY", "ARCH", "SIZE"
    );
    for r in rows {
        let arch = r.arch.as_deref().unwrap_or("-");
        match &r.found {
            Ok(f) => println!(
                "{:<width$}  {:<awidth$}  {:>12}  {}",
                r.key,
                arch,
                f.size,
                f.path.display()
            ),
            Err(e) => println!("{:<width$}  {:<awidth$}  error: {e}", r.key, arch),
        }
    }
}

fn list_archive(args: Args) -> CliResult {
    let archive = crate::cli::remote_args::open_archive(&args.archive, &args.remote)?;
    let mut rows = Vec::new();
    for ((b, e), key, entry) in archive.indexed_entries() {
        let row = match archive.locate_at(b, e) {
            Ok(k) => Row {
                key,
                arch: entry.arch,
                ordinal: entry.ordinal,
                size: Some(k.size),
                stored: Some(k.stored.size),
                blake3: k.digest,
                error: None,
            },
            Err(e) => Row {
                key,
                arch: entry.arch,
                ordinal: entry.ordinal,
                size: None,
                stored: None,
                blake3: archive.entry_digest(&entry).ok().flatten(),
                error: Some(e.to_string()),
            },
        };
        rows.push(row);
    }
    if args.command.json {
        let kernels: Vec<_> = rows
            .iter()
            .map(|r| {
                // `binary` is the older name of `key`, kept for scripts that read it.
                serde_json::json!({
                    "key": r.key, "binary": r.key, "arch": r.arch, "ordinal": r.ordinal,
                    "size": r.size, "stored_size": r.stored,
                    "blake3": r.blake3.map(|d| rocm_kpack::error::hex(&d)), "error": r.error,
                })
            })
            .collect();
        let doc = serde_json::json!({
            "archive": args.archive.display().to_string(),
            "scheme": archive.scheme().name(),
            "group_name": archive.group_name(),
            "gfx_arch_family": archive.gfx_arch_family(),
            "gfx_arches": archive.architectures(),
            "kernels": kernels,
        });
        print_json(&doc);
        return Ok(());
    }
    let width = rows.iter().map(|r| r.key.len()).max().unwrap_or(3).max(3);
    let awidth = rows.iter().map(|r| r.arch.len()).max().unwrap_or(4).max(4);
    println!(
        "{:<width$}  {:<awidth$}  {:>12}  {:>12}  {:>6}",
        "KEY", "ARCH", "SIZE", "STORED", "RATIO"
    );
    for r in &rows {
        match (r.size, r.stored) {
            (Some(size), Some(stored)) => {
                let ratio = if size == 0 {
                    "-".to_owned()
                } else {
                    format!("{:.2}", stored as f64 / size as f64)
                };
                println!(
                    "{:<width$}  {:<awidth$}  {:>12}  {:>12}  {:>6}",
                    r.key, r.arch, size, stored, ratio
                );
            }
            _ => println!(
                "{:<width$}  {:<awidth$}  error: {}",
                r.key,
                r.arch,
                r.error.as_deref().unwrap_or("")
            ),
        }
    }
    Ok(())
}

struct Row<'a> {
    key: &'a str,
    arch: &'a str,
    ordinal: u32,
    size: Option<u64>,
    stored: Option<u64>,
    /// The recorded BLAKE3 digest of the decoded kernel (archives we write).
    blake3: Option<[u8; 32]>,
    error: Option<String>,
}
