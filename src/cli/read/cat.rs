//! `kpack-fuse cat`: one kernel to standard output.

use std::path::PathBuf;

use crate::cli::exit::CliResult;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The archive.
    pub archive: PathBuf,
    /// The kernel's key (the KEY column of `list`), e.g. lib/libfoo.so#0.
    pub key: String,
    /// The arch, e.g. gfx90a:xnack-.
    pub arch: String,
    #[command(flatten)]
    pub remote: crate::cli::remote_args::RemoteArgs,
}

pub fn run(args: Args) -> CliResult {
    let archive = crate::cli::remote_args::open_archive(&args.archive, &args.remote)?;
    let data = archive.get_kernel(&args.key, &args.arch)?;
    crate::cli::out::bytes(&data)
}
