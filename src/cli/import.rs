//! Importing device code from ROCm fat binaries (`pack --from-fatbin`, `verify --against`)
//! (being written).

use std::path::PathBuf;

use super::{CliError, CliResult, Exit};
use rocm_kpack::Compression;

/// What `pack --from-fatbin` was asked to do.
#[derive(Debug)]
pub struct ImportRequest {
    pub hosts: Vec<PathBuf>,
    pub out_dir: PathBuf,
    pub prefix: Option<String>,
    pub root: Option<PathBuf>,
    pub single: bool,
    pub emit_metadata: bool,
    pub compression: Compression,
}

pub fn run(_req: ImportRequest) -> CliResult {
    Err(CliError::new(Exit::Failure, "pack --from-fatbin is not built yet"))
}

/// `verify ARCHIVE... --against HOST...`: every code object of the hosts' fat binaries must be
/// in the archives, byte for byte.
pub fn verify_against(_archives: &[PathBuf], _hosts: &[PathBuf]) -> CliResult {
    Err(CliError::new(Exit::Failure, "verify --against is not built yet"))
}
