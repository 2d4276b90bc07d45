//! Writes a clang offload bundle of code objects, as a HIP compiler puts one in a host binary's
//! `.hip_fatbin`: a host entry first, then one `hipv4-amdgcn-amd-amdhsa--ARCH` entry per code
//! object, each at a multiple of 4096 bytes (as clang aligns them).
//!
//! Usage: make_bundle OUTPUT ARCH=CODE_OBJECT...
//! Run by `samples/make-hipk-sample.sh`.

#[path = "../tests/it/support/bundles.rs"]
#[allow(dead_code)] // Only uncompressed bundles are made here.
mod bundles;

use std::process::ExitCode;

use bundles::build_uncompressed;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 2 {
        eprintln!("usage: make_bundle OUTPUT ARCH=CODE_OBJECT...");
        return ExitCode::from(2);
    }
    match make(&args[0], &args[1..]) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("make_bundle: {e}");
            ExitCode::FAILURE
        }
    }
}

fn make(output: &str, objects: &[String]) -> Result<(), String> {
    let mut read = Vec::new();
    for spec in objects {
        let (arch, path) = spec
            .split_once('=')
            .ok_or_else(|| format!("{spec}: expected ARCH=CODE_OBJECT"))?;
        let bytes = std::fs::read(path).map_err(|e| format!("{path}: {e}"))?;
        read.push((format!("hipv4-amdgcn-amd-amdhsa--{arch}"), bytes));
    }
    let mut entries: Vec<(&str, &[u8])> = vec![("host-x86_64-unknown-linux-gnu", &[])];
    entries.extend(read.iter().map(|(t, b)| (t.as_str(), b.as_slice())));
    std::fs::write(output, build_uncompressed(&entries, 4096)).map_err(|e| format!("{output}: {e}"))
}
