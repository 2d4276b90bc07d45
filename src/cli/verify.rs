//! `kpack-fuse verify` (being written).

use super::{CliError, CliResult, Exit};

#[derive(Debug, clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> CliResult {
    Err(CliError::new(Exit::Failure, "verify is not built yet"))
}
