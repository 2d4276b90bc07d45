//! `kpack-fuse load`: loads one code object of a HIPK host binary exactly as
//! `kpack_load_code_object` would (same loader, same environment variables, same debug log) and
//! writes it to a file.

use std::path::PathBuf;

use rocm_kpack::loader::{LoadRequest, Loader, LoaderConfig, Silent, StderrLog, Trace};

use super::resolve::{HostArgs, alloc};
use crate::cli::exit::{CliError, CliResult, Exit};

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub host: HostArgs,
    /// Code-object index (the wrapper's index).
    #[arg(long, value_name = "N")]
    pub co: u32,
    /// Where to write the code object.
    #[arg(short = 'o', long = "output", value_name = "OUT.hsaco")]
    pub output: PathBuf,
}

pub fn run(args: Args) -> CliResult {
    let opened = args.host.open()?;
    let arch_refs = opened.arch_refs();
    let loader = Loader::new(LoaderConfig::from_env());
    let mut log = StderrLog;
    let mut silent = Silent;
    let trace: &mut dyn Trace = if loader.config().debug {
        log.record(loader.created_event());
        &mut log
    } else {
        &mut silent
    };
    let request = LoadRequest {
        binary_path: &opened.binary,
        co_index: args.co,
        arch_list: &arch_refs,
    };
    let loaded =
        loader.load_code_object(|| Ok(opened.host.metadata.clone()), &request, alloc, trace)?;
    std::fs::write(&args.output, &loaded.data)
        .map_err(|e| CliError::io(Exit::Output, &args.output, &e))?;
    crate::cli::out::outln!(
        "{}: {} bytes ({} from {})",
        args.output.display(),
        loaded.data.len(),
        loaded.target,
        loaded.archive.display()
    )
}
