//! `kpack-fuse resolve` (being written).

use super::{CliError, CliResult, Exit};

#[derive(Debug, clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> CliResult {
    Err(CliError::new(Exit::Failure, "resolve is not built yet"))
}
