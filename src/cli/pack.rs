//! `kpack-fuse pack` (being written).

use super::{CliError, CliResult, Exit};

#[derive(Debug, clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> CliResult {
    Err(CliError::new(Exit::Failure, "pack is not built yet"))
}
