//! `kpack-fuse mount` and `unmount` (being written).

use super::{CliError, CliResult, Exit};

#[derive(Debug, clap::Args)]
pub struct MountArgs {}

#[derive(Debug, clap::Args)]
pub struct UnmountArgs {}

pub fn run_mount(_args: MountArgs) -> CliResult {
    Err(CliError::new(Exit::Failure, "mount is not built yet"))
}

pub fn run_unmount(_args: UnmountArgs) -> CliResult {
    Err(CliError::new(Exit::Failure, "unmount is not built yet"))
}
