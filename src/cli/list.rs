//! `kpack-fuse list`: one line per kernel (binary, arch, size, stored size, ratio), or JSON.

use std::path::PathBuf;

use super::CliResult;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The archive to list.
    pub archive: PathBuf,
    /// Print JSON (one object with the archive's fields and a "kernels" array, each kernel with
    /// its recorded BLAKE3 digest in hex, or null) for scripts.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub remote: super::remote_args::RemoteArgs,
}

pub fn run(args: Args) -> CliResult {
    let archive = super::remote_args::open_archive(&args.archive, &args.remote)?;
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
    if args.json {
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
        println!(
            "{}",
            serde_json::to_string_pretty(&doc).expect("JSON of plain values")
        );
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
