//! `kpack-fuse split`: fat ROCm host binaries become HIPK host binaries plus shared per-arch
//! archives in `<OUTROOT>/.kpack/`. The work is `rocm_kpack::tools::split::split_tree`; this file maps
//! its errors to exit codes and prints a summary.
//! `verify --split OUTROOT --original ROOT` calls [`verify_tree`].

use std::path::{Path, PathBuf};

use std::collections::BTreeMap;

use rocm_kpack::tools::split::{self, Kept, Outcome, SplitRequest, TreeError};

use super::pack::CompressionArgs;
use crate::cli::exit::{CliError, CliResult, Exit};
use crate::cli::out::{errln, outln};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Host binaries, or directories to walk, below ROOT. Fat binaries are split; every other
    /// file (not ELF, no device code, separated debug files, already split) is copied as it is,
    /// and symlinks found in directories are recreated.
    #[arg(required = true, value_name = "PATH")]
    pub hosts: Vec<PathBuf>,
    /// The install root: kernel names are the binaries' paths below it.
    #[arg(long)]
    pub root: PathBuf,
    /// Where the rewritten tree goes (binaries at the same relative paths, archives in .kpack/);
    /// default: ROOT.split beside ROOT.
    #[arg(short, long, value_name = "OUTROOT")]
    pub output: Option<PathBuf>,
    /// Archive name prefix (<prefix>_<arch>.kpack; default: the first binary's name without
    /// "lib" and extensions).
    #[arg(long)]
    pub prefix: Option<String>,
    #[command(flatten)]
    pub compression: CompressionArgs,
    /// Do not pin the rewritten binaries to their archives: their HIPK marker is then
    /// byte-identical to the reference tooling's (see docs/split.md).
    #[arg(long)]
    pub no_pins: bool,
}

pub fn run(args: Args) -> CliResult {
    let out_root = match args.output {
        Some(o) => o,
        None => {
            let o = split::default_out_root(&args.root).map_err(cli_error)?;
            outln!("writing to {}", o.display())?;
            o
        }
    };
    let req = SplitRequest {
        hosts: args.hosts,
        root: args.root,
        out_root,
        prefix: args.prefix,
        compression: args.compression.compression(),
        reference_layout: args.compression.reference_layout,
        pins: !args.no_pins,
    };
    // Progress is counted in bytes of the input binaries (an unreadable one counts 0 here and
    // is reported by the split itself).
    let total = req
        .hosts
        .iter()
        .map(|h| std::fs::metadata(h).map_or(0, |m| m.len()))
        .sum();
    let bar = super::progress::bar(total);
    let report = split::split_tree_with_progress(&req, &|n| {
        if let Some(b) = &bar {
            b.inc(n);
        }
    });
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    let report = report.map_err(cli_error)?;
    for b in &report.binaries {
        match &b.outcome {
            Outcome::Split {
                wrappers,
                code_objects,
                size_before,
                size_after,
            } => outln!(
                "{}: {} now HIPK, {} moved out, {size_before} -> {size_after} bytes",
                b.output.display(),
                super::plural::count_of(*wrappers, "wrapper", "wrappers"),
                super::plural::count_of(*code_objects, "code object", "code objects")
            )?,
            Outcome::Copied(_) | Outcome::Linked => {}
        }
    }
    for (path, n) in &report.archives {
        outln!(
            "{}: {}",
            path.display(),
            super::plural::count_of(*n, "code object", "code objects")
        )?;
    }
    for (path, why) in &report.skipped {
        outln!("skipped {}: {why}", path.display())?;
    }
    outln!("{}", summary(&report))
}

/// The one line that ends a run: what was split, copied as it is (by reason), and skipped.
fn summary(report: &split::SplitReport) -> String {
    use super::plural::count_of;
    let (mut split, mut links) = (0, 0);
    let mut kept: BTreeMap<Kept, usize> = BTreeMap::new();
    for b in &report.binaries {
        match b.outcome {
            Outcome::Split { .. } => split += 1,
            Outcome::Copied(k) => *kept.entry(k).or_default() += 1,
            Outcome::Linked => links += 1,
        }
    }
    let copied: usize = kept.values().sum();
    let mut line = format!(
        "{}; {}",
        count_of(split, "binary split", "binaries split"),
        count_of(copied, "file copied as it is", "files copied as they are")
    );
    if copied > 0 {
        let reasons: Vec<String> = kept
            .iter()
            .map(|(k, n)| match k {
                Kept::NotElf => format!("{n} not ELF"),
                Kept::NoDeviceCode => format!("{n} without device code"),
                Kept::SeparatedDebug => {
                    count_of(*n, "separated debug file", "separated debug files")
                }
                Kept::AlreadySplit => format!("{n} already split"),
            })
            .collect();
        line += &format!(" ({})", reasons.join(", "));
    }
    line += &format!(
        "; {}; {} skipped",
        count_of(links, "symlink recreated", "symlinks recreated"),
        report.skipped.len()
    );
    line
}

/// `verify --split OUTROOT --original ROOT`.
pub fn verify_tree(out_root: &Path, original_root: &Path) -> CliResult {
    // Known once the library has listed the tree.
    let bar = std::cell::OnceCell::new();
    let check = split::verify_split_with_progress(
        out_root,
        original_root,
        &mut |total| {
            let _ = bar.set(super::progress::bar(total));
        },
        &|n| {
            if let Some(Some(b)) = bar.get() {
                b.inc(n)
            }
        },
    );
    if let Some(Some(b)) = bar.get() {
        b.finish_and_clear();
    }
    let check = check.map_err(|e| CliError::io(Exit::Unreadable, out_root, &e))?;
    // A binary that does not parse is a problem to report, not a reason to say "none found".
    if check.binaries == 0 && check.problems.is_empty() {
        return Err(CliError::new(
            Exit::NotFound,
            format!("{}: no split binaries found", out_root.display()),
        ));
    }
    for p in &check.problems {
        errln!("BAD {p}");
    }
    if !check.problems.is_empty() {
        return Err(CliError::new(
            Exit::Corrupt,
            format!(
                "{} problems in {} split binaries",
                check.problems.len(),
                check.binaries
            ),
        ));
    }
    outln!(
        "{} split binaries: {} code objects loaded through their markers, byte-identical to the originals",
        check.binaries,
        check.code_objects
    )
}

fn cli_error(e: TreeError) -> CliError {
    let exit = match &e {
        TreeError::Usage(_) => Exit::Usage,
        TreeError::Read { .. } => Exit::Unreadable,
        // Every refusal means an input is not a fat binary we can rewrite.
        TreeError::Refused { .. } => Exit::BadFormat,
        TreeError::Write { .. } => Exit::Output,
        TreeError::Archive(_) => Exit::Output,
    };
    CliError::new(exit, e.to_string())
}
