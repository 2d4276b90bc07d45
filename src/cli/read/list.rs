//! `kpack-fuse list`: one line per kernel of an archive (binary, arch, size, stored size,
//! ratio), or per code object of a host binary (a fat binary's bundles, or what the loader finds
//! for a HIPK binary), or JSON. The three kinds of row go through one printer ([`print`]).

use rocm_kpack::Archive;
use rocm_kpack::archive::format::TocEntry;
use rocm_kpack::host::bundle::Layout;
use rocm_kpack::host::fatbin::IndexedCodeObject;

use super::input::{self, HipkRow, Input, InputArgs};
use crate::cli::exit::CliResult;
use crate::cli::out::outln;

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
    let file = &args.archive;
    match args.input()? {
        Input::Archive => list_archive(&args),
        Input::Fat { host, kernel_name } => {
            let cos = input::fat_index(file, &host, &kernel_name)?;
            let doc = serde_json::json!({
                "binary": file.display().to_string(),
                "kind": "fat",
                "kernel_name": kernel_name,
            });
            let columns = [("SIZE", 12), ("BUNDLE", 0)];
            print(args.command.json, doc, &columns, &cos)
        }
        Input::Hipk { host, binary } => {
            let gpus = &args.gpus;
            let rows = input::hipk_rows(&host, &binary, gpus)?;
            let doc = serde_json::json!({
                "binary": file.display().to_string(),
                "kind": "hipk",
                "kernel_name": host.metadata.kernel_name,
                "gpus": gpus,
            });
            let columns = [("SIZE", 12), ("ARCHIVE", 0)];
            print(args.command.json, doc, &columns, &rows)
        }
    }
}

fn list_archive(args: &Args) -> CliResult {
    let archives =
        crate::cli::remote_args::open_archives(&args.archive, &args.remote, &args.gpus, false)?;
    let mut rows = Vec::new();
    // An artifact's layers merge as the mount merges them: the first to hold a kernel wins.
    let mut seen = std::collections::HashSet::new();
    for archive in &archives {
        for ((b, e), key, entry) in archive.indexed_entries() {
            if archives.len() > 1 && !seen.insert((key, entry.arch)) {
                continue;
            }
            rows.push(archive_row(archive, b, e, key, &entry));
        }
    }
    let about = |a: &Archive| {
        serde_json::json!({
            "archive": a.path().display().to_string(),
            "scheme": a.scheme().name(),
            "group_name": a.group_name(),
            "gfx_arch_family": a.gfx_arch_family(),
            "gfx_arches": a.architectures(),
        })
    };
    let doc = match archives.as_slice() {
        [one] => {
            let mut doc = about(one);
            doc["archive"] = args.archive.display().to_string().into();
            doc
        }
        many => serde_json::json!({
            "artifact": args.archive.display().to_string(),
            "layers": many.iter().map(|a| about(a)).collect::<Vec<_>>(),
        }),
    };
    let columns = [("SIZE", 12), ("STORED", 12), ("RATIO", 6)];
    print(args.command.json, doc, &columns, &rows)
}

/// The listing row of the entry at `(b, e)`.
fn archive_row<'a>(
    archive: &Archive,
    b: usize,
    e: usize,
    key: &'a str,
    entry: &TocEntry<'a>,
) -> Row<'a> {
    match archive.locate_at(b, e) {
        Ok(k) => Row {
            key,
            arch: entry.arch,
            ordinal: entry.ordinal,
            size: Some(k.size),
            stored: Some(k.stored.size),
            blake3: k.digest,
            error: None,
        },
        Err(err) => Row {
            key,
            arch: entry.arch,
            ordinal: entry.ordinal,
            size: None,
            stored: None,
            blake3: archive.entry_digest(entry).ok().flatten(),
            error: Some(err.to_string()),
        },
    }
}

/// One line of a listing: a kernel of an archive, or a code object of a host binary.
trait Listed {
    fn key(&self) -> &str;
    /// Its arch, `-` where there is none.
    fn arch(&self) -> &str;
    /// Its cells after KEY and ARCH, or why it has none.
    fn cells(&self) -> Result<Vec<String>, String>;
    /// Its object in the document's "kernels".
    fn json(&self) -> serde_json::Value;
}

/// Prints a listing: as JSON, `doc` with the rows as its "kernels"; else as a table, KEY and
/// ARCH as wide as their longest value, then `columns` (each header and cell right-aligned to
/// its width; a width of 0, for the last, leaves it as it is), or `error: ...` after ARCH.
fn print<T: Listed>(
    json: bool,
    mut doc: serde_json::Value,
    columns: &[(&str, usize)],
    rows: &[T],
) -> CliResult {
    if json {
        doc["kernels"] = rows.iter().map(Listed::json).collect();
        return outln!(
            "{}",
            serde_json::to_string_pretty(&doc).expect("JSON of plain values")
        );
    }
    let width = rows.iter().map(|r| r.key().len()).max().unwrap_or(3).max(3);
    let awidth = rows
        .iter()
        .map(|r| r.arch().len())
        .max()
        .unwrap_or(4)
        .max(4);
    let line = |key: &str, arch: &str, rest: &[String]| {
        let mut line = format!("{key:<width$}  {arch:<awidth$}");
        for (cell, (_, w)) in rest.iter().zip(columns) {
            line.push_str(&format!("  {cell:>w$}"));
        }
        line
    };
    let headers: Vec<String> = columns.iter().map(|(h, _)| h.to_string()).collect();
    outln!("{}", line("KEY", "ARCH", &headers))?;
    for r in rows {
        match r.cells() {
            Ok(cells) => outln!("{}", line(r.key(), r.arch(), &cells))?,
            Err(e) => outln!("{:<width$}  {:<awidth$}  error: {e}", r.key(), r.arch())?,
        }
    }
    Ok(())
}

/// The bundle a code object is in: `plain@OFFSET` or `ccob-vN@OFFSET`, its section offset.
fn bundle_name(c: &IndexedCodeObject) -> String {
    match c.bundle.layout {
        Layout::Uncompressed => format!("plain@{}", c.bundle.offset),
        Layout::Compressed { version } => format!("ccob-v{version}@{}", c.bundle.offset),
    }
}

/// A code object of a fat binary.
impl Listed for IndexedCodeObject {
    fn key(&self) -> &str {
        &self.key
    }

    fn arch(&self) -> &str {
        &self.arch
    }

    fn cells(&self) -> Result<Vec<String>, String> {
        Ok(vec![self.size.to_string(), bundle_name(self)])
    }

    fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "key": self.key, "arch": self.arch, "triple": self.triple, "index": self.index,
            "size": self.size, "bundle": bundle_name(self),
        })
    }
}

/// A code object of a HIPK binary, as the loader finds it.
impl Listed for HipkRow {
    fn key(&self) -> &str {
        &self.key
    }

    fn arch(&self) -> &str {
        self.arch.as_deref().unwrap_or("-")
    }

    fn cells(&self) -> Result<Vec<String>, String> {
        match &self.found {
            Ok(f) => Ok(vec![f.size.to_string(), f.path.display().to_string()]),
            Err(e) => Err(e.clone()),
        }
    }

    fn json(&self) -> serde_json::Value {
        let (archive, size, error) = match &self.found {
            Ok(f) => (Some(f.path.display().to_string()), Some(f.size), None),
            Err(e) => (None, None, Some(e.clone())),
        };
        serde_json::json!({
            "key": self.key, "arch": self.arch, "index": self.index, "archive": archive,
            "size": size, "error": error,
        })
    }
}

/// A kernel of an archive.
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

impl Listed for Row<'_> {
    fn key(&self) -> &str {
        self.key
    }

    fn arch(&self) -> &str {
        self.arch
    }

    fn cells(&self) -> Result<Vec<String>, String> {
        match (self.size, self.stored) {
            (Some(size), Some(stored)) => {
                let ratio = if size == 0 {
                    "-".to_owned()
                } else {
                    format!("{:.2}", stored as f64 / size as f64)
                };
                Ok(vec![size.to_string(), stored.to_string(), ratio])
            }
            _ => Err(self.error.clone().unwrap_or_default()),
        }
    }

    fn json(&self) -> serde_json::Value {
        // `binary` is the older name of `key`, kept for scripts that read it.
        serde_json::json!({
            "key": self.key, "binary": self.key, "arch": self.arch, "ordinal": self.ordinal,
            "size": self.size, "stored_size": self.stored,
            "blake3": self.blake3.map(|d| rocm_kpack::error::hex(&d)), "error": self.error,
        })
    }
}
