//! `kpack-fuse extract`: every kernel to `DEST/<binary key>/<arch>.hsaco`. Every key and arch is
//! checked before the first byte is written, so an archive with one hostile name writes nothing;
//! directories are created without following symlinks, so nothing lands outside DEST.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use rocm_kpack::names;

use super::{CliError, CliResult, Exit};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The archive.
    pub archive: PathBuf,
    /// Destination directory (created when missing).
    pub dest: PathBuf,
    /// Overwrite files that already exist.
    #[arg(long)]
    pub force: bool,
    #[command(flatten)]
    pub remote: super::remote_args::RemoteArgs,
}

pub fn run(args: Args) -> CliResult {
    let archive = super::remote_args::open_archive(&args.archive, &args.remote)?;
    let mut plan = Vec::new();
    for (key, entry) in archive.entries() {
        let refuse = |why: String| {
            CliError::new(
                Exit::Output,
                format!("{}: refusing to extract: {why}", args.archive.display()),
            )
        };
        let parts = names::key_components(key).map_err(refuse)?;
        names::check_arch(entry.arch).map_err(refuse)?;
        plan.push((key, entry.arch, parts));
    }
    let out_err = |p: &Path, e: std::io::Error| CliError::io(Exit::Output, p, &e);
    fs::create_dir_all(&args.dest).map_err(|e| out_err(&args.dest, e))?;
    let mut count = 0u64;
    let mut bytes = 0u64;
    let bar = super::progress::bar(archive.entries().map(|(_, e)| e.original_size).sum());
    for (key, arch, parts) in plan {
        let mut dir = args.dest.clone();
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
        let data = archive.get_kernel(key, arch)?;
        let file = dir.join(names::hsaco_name(arch));
        if args.force {
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
        f.write_all(&data).map_err(|e| out_err(&file, e))?;
        count += 1;
        bytes += data.len() as u64;
        if let Some(b) = &bar {
            b.inc(data.len() as u64);
        }
    }
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    println!(
        "extracted {} ({}) into {}",
        super::plural::count(count, "kernel", "kernels"),
        super::plural::count(bytes, "byte", "bytes"),
        args.dest.display()
    );
    Ok(())
}
