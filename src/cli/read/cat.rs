//! `kpack-fuse cat`: one kernel to standard output.

use std::path::PathBuf;

use crate::cli::exit::CliResult;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The archive: a path, or a remote source (s3://, http(s)://, oci://).
    pub archive: PathBuf,
    /// The kernel's key (the KEY column of `list`), e.g. lib/libfoo.so#0.
    pub key: String,
    /// The arch, e.g. gfx90a:xnack-.
    pub arch: String,
    /// For an oci:// artifact: read only the layers with code for this GPU (repeatable; auto:
    /// this node's GPUs); the first layer that holds the kernel answers.
    #[arg(long = "gpu", value_name = "ARCH")]
    pub gpus: Vec<String>,
    #[command(flatten)]
    pub remote: crate::cli::remote_args::RemoteArgs,
}

pub fn run(args: Args) -> CliResult {
    let archives =
        crate::cli::remote_args::open_archives(&args.archive, &args.remote, &args.gpus, false)?;
    // An artifact's layers are searched in order, as the mount merges them.
    let holder = archives
        .iter()
        .find(|a| a.entry_index(&args.key, &args.arch).is_some())
        .unwrap_or(&archives[0]);
    let data = holder.get_kernel(&args.key, &args.arch)?;
    crate::cli::out::bytes(&data)
}
