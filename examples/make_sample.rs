//! Builds the README's sample archive from a real ROCm fat binary: the binary's code objects for
//! the chosen arches, keyed exactly as `pack --from-fatbin --root ROOT --single` keys them,
//! in one multi-arch zstd archive.
//!
//! Usage: make_sample ROOT BINARY OUTPUT LEVEL ARCH...
//! (BINARY must lie below ROOT; its path below ROOT is the kernel name.)
//! Run by `samples/make-sample.sh`.

use std::path::Path;
use std::process::ExitCode;

use rocm_kpack::Compression;
use rocm_kpack::host::fatbin;
use rocm_kpack::tools::import::{ArchiveSet, Tag};
use rocm_kpack::tools::pack_pipeline::{self, Options};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 5 {
        eprintln!("usage: make_sample ROOT BINARY OUTPUT LEVEL ARCH...");
        return ExitCode::from(2);
    }
    match make(&args[0], &args[1], &args[2], &args[3], &args[4..]) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("make_sample: {e}");
            ExitCode::FAILURE
        }
    }
}

fn make(
    root: &str,
    binary: &str,
    output: &str,
    level: &str,
    arches: &[String],
) -> Result<(), String> {
    let rel = Path::new(binary)
        .strip_prefix(root)
        .map_err(|_| format!("{binary} is not below {root}"))?;
    let kernel_name = fatbin::kernel_name_from_relative(rel)?;
    let bytes = std::fs::read(binary).map_err(|e| format!("{binary}: {e}"))?;
    let all =
        fatbin::host_code_objects(&kernel_name, &bytes).map_err(|e| format!("{binary}: {e}"))?;
    // Keys are computed over all arches first, so a subset keeps the keys the full import gives.
    let mut code_objects = Vec::new();
    for arch in arches {
        let mut found: Vec<_> = all.iter().filter(|c| &c.arch == arch).cloned().collect();
        if found.is_empty() {
            return Err(format!("{binary} has no code object for {arch}"));
        }
        code_objects.append(&mut found);
    }
    let level: i32 = level
        .parse()
        .map_err(|_| format!("bad zstd level {level:?}"))?;
    // Through the pipeline into an ArchiveSet, as `pack --from-fatbin --single` writes it.
    let output = Path::new(output);
    let dir = output.parent().unwrap_or(Path::new("."));
    let compression = Compression::Zstd { level };
    let mut set = ArchiveSet::new(dir, "rocrand-sample", true, compression, false);
    pack_pipeline::run(
        Options::new(compression),
        |feed| {
            for co in code_objects {
                let (tag, data) = Tag::split(co, &kernel_name);
                feed.submit(tag, data)?;
            }
            Ok(())
        },
        |tag, encoded| {
            set.append(tag, encoded, |p| {
                std::fs::File::create(p).map_err(|e| rocm_kpack::Error::io(p, "cannot create", e))
            })
        },
    )
    .map_err(|e: rocm_kpack::Error| e.to_string())?;
    let a = set
        .finish()
        .map_err(|e| e.to_string())?
        .pop()
        .ok_or("no code objects")?;
    if a.path != output {
        std::fs::rename(&a.path, output).map_err(|e| format!("{}: {e}", output.display()))?;
    }
    println!(
        "{}: {} code objects [{}], {} bytes",
        output.display(),
        a.count,
        a.arches.join(", "),
        a.done.size
    );
    Ok(())
}
