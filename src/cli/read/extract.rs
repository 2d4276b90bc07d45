//! `kpack-fuse extract`: every kernel to `DEST/<binary key>/<arch>.hsaco`, from an archive or a
//! host binary (a fat binary's code objects keyed as `pack --from-fatbin` keys them, or what the
//! loader finds for a HIPK binary). Every key and arch is checked before the first byte is
//! written, so an input with one hostile name writes nothing; directories are created without
//! following symlinks, so nothing lands outside DEST.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use rocm_kpack::host::fatbin::{self, CodeObject};
use rocm_kpack::names;

use super::input::{self, Input, InputArgs};
use crate::cli::exit::{CliError, CliResult, Exit};

pub type Args = InputArgs<ExtractArgs>;

/// What `extract` takes besides its input.
#[derive(Debug, clap::Args)]
pub struct ExtractArgs {
    /// Destination directory (created when missing).
    pub dest: PathBuf,
    /// Overwrite files that already exist.
    #[arg(long)]
    pub force: bool,
}

pub fn run(args: Args) -> CliResult {
    match args.input()? {
        Input::Archive => extract_archive(&args),
        Input::Fat { host, kernel_name } => {
            let cos = input::fat_index(&args.archive, &host, &kernel_name)?;
            let plan = cos.iter().map(|c| (c.key.as_str(), c.arch.as_str()));
            let mut out = Output::plan(&args, plan, cos.iter().map(|c| c.size).sum())?;
            // The same walk `pack --from-fatbin` reads its code objects with.
            fatbin::visit_host_code_objects(
                &kernel_name,
                &host,
                |co: CodeObject| out.write(&co.key, &co.arch, &co.data),
                &|_| {},
            )
            .map_err(|e| input::import_error(&args.archive, e))?;
            out.finish()
        }
        Input::Hipk { host, binary } => {
            let rows = input::hipk_rows(&host, &binary, &args.gpus)?;
            // The first archive on the search path that holds a (key, arch) is the one shown.
            let mut found: Vec<(&str, &str, &input::Found)> = Vec::new();
            for r in &rows {
                if let (Some(arch), Ok(f)) = (&r.arch, &r.found) {
                    if !found.iter().any(|(k, a, _)| *k == r.key && a == arch) {
                        found.push((&r.key, arch, f));
                    }
                }
            }
            let total = found.iter().map(|(_, _, f)| f.size).sum();
            let mut out = Output::plan(&args, found.iter().map(|(k, a, _)| (*k, *a)), total)?;
            for (key, arch, f) in found {
                out.write(key, arch, &f.archive.get_kernel(key, arch)?)?;
            }
            out.finish()
        }
    }
}

fn extract_archive(args: &Args) -> CliResult {
    let archives =
        crate::cli::remote_args::open_archives(&args.archive, &args.remote, &args.gpus, false)?;
    // An artifact's layers merge as the mount merges them: the first to hold a kernel wins.
    let mut seen = std::collections::HashSet::new();
    let mut chosen = Vec::new();
    for archive in &archives {
        for (key, entry) in archive.entries() {
            if seen.insert((key, entry.arch)) {
                chosen.push((archive, key, entry));
            }
        }
    }
    let total = chosen.iter().map(|(_, _, e)| e.original_size).sum();
    let mut out = Output::plan(args, chosen.iter().map(|(_, k, e)| (*k, e.arch)), total)?;
    for (archive, key, entry) in &chosen {
        let data = archive.get_kernel(key, entry.arch)?;
        out.write(key, entry.arch, &data)?;
    }
    out.finish()
}

/// The destination tree being written.
struct Output<'a> {
    dest: &'a Path,
    force: bool,
    count: u64,
    bytes: u64,
    bar: Option<indicatif::ProgressBar>,
}

impl<'a> Output<'a> {
    /// Checks every (key, arch) that will be written, then creates DEST.
    fn plan<'k>(
        args: &'a Args,
        names: impl Iterator<Item = (&'k str, &'k str)>,
        total: u64,
    ) -> CliResult<Output<'a>> {
        for (key, arch) in names {
            let refuse = |why: String| {
                CliError::new(
                    Exit::Output,
                    format!("{}: refusing to extract: {why}", args.archive.display()),
                )
            };
            names::key_components(key).map_err(refuse)?;
            names::check_arch(arch).map_err(refuse)?;
        }
        fs::create_dir_all(&args.command.dest).map_err(|e| out_err(&args.command.dest, e))?;
        Ok(Output {
            dest: &args.command.dest,
            force: args.command.force,
            count: 0,
            bytes: 0,
            bar: crate::cli::progress::bar(total),
        })
    }

    /// Writes one kernel to `DEST/<key>/<arch>.hsaco` (names checked by [`plan`](Self::plan)).
    fn write(&mut self, key: &str, arch: &str, data: &[u8]) -> CliResult {
        let parts = names::key_components(key)
            .map_err(|why| CliError::new(Exit::Output, format!("{key}: {why}")))?;
        let mut dir = self.dest.to_path_buf();
        for part in parts {
            dir.push(part);
            match fs::symlink_metadata(&dir) {
                Ok(m) if m.is_dir() => {}
                Ok(_) => {
                    return Err(CliError::new(
                        Exit::Output,
                        format!(
                            "{}: exists and is not a directory (symlinks are not followed)",
                            dir.display()
                        ),
                    ));
                }
                Err(_) => fs::create_dir(&dir).map_err(|e| out_err(&dir, e))?,
            }
        }
        let file = dir.join(names::hsaco_name(arch));
        if self.force {
            if let Ok(m) = fs::symlink_metadata(&file) {
                if !m.is_file() {
                    return Err(CliError::new(
                        Exit::Output,
                        format!("{}: exists and is not a regular file", file.display()),
                    ));
                }
                fs::remove_file(&file).map_err(|e| out_err(&file, e))?;
            }
        }
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&file)
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::AlreadyExists => CliError::new(
                    Exit::Output,
                    format!(
                        "{}: already exists (use --force to overwrite)",
                        file.display()
                    ),
                ),
                _ => out_err(&file, e),
            })?;
        f.write_all(data).map_err(|e| out_err(&file, e))?;
        self.count += 1;
        self.bytes += data.len() as u64;
        if let Some(b) = &self.bar {
            b.inc(data.len() as u64);
        }
        Ok(())
    }

    fn finish(self) -> CliResult {
        if let Some(b) = self.bar {
            b.finish_and_clear();
        }
        crate::cli::out::outln!(
            "extracted {} ({}) into {}",
            crate::cli::plural::count(self.count, "kernel", "kernels"),
            crate::cli::plural::count(self.bytes, "byte", "bytes"),
            self.dest.display()
        )
    }
}

fn out_err(p: &Path, e: std::io::Error) -> CliError {
    CliError::io(Exit::Output, p, &e)
}
