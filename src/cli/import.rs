//! Importing device code from ROCm fat binaries (`pack --from-fatbin`) and checking archives
//! against them (`verify --against`). The naming rules live in `rocm_kpack::import`; this file
//! reads the binaries, resolves paths, writes the files and reports.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use indicatif::{ProgressBar, ProgressStyle};
use rocm_kpack::import::{self, CodeObject, ImportError, ImportedHost};
use rocm_kpack::{Archive, Compression};

use super::{CliError, CliResult, Exit};

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
    /// Write the reference writer's exact layout (no frame positions, no digests).
    pub reference_layout: bool,
}

/// Below this much device code a progress bar would only flicker.
const PROGRESS_THRESHOLD: u64 = 64 << 20;

pub fn run(req: ImportRequest) -> CliResult {
    if req.hosts.is_empty() {
        return Err(CliError::new(
            Exit::Usage,
            "pack --from-fatbin needs at least one host binary",
        ));
    }
    let prefix = match &req.prefix {
        Some(p) => p.clone(),
        None => import::default_prefix(&file_name(&req.hosts[0])?),
    };
    import::validate_prefix(&prefix).map_err(|e| CliError::new(Exit::Usage, e))?;

    let mut hosts: Vec<ImportedHost> = Vec::with_capacity(req.hosts.len());
    let mut metadata: Vec<(String, Vec<u8>)> = Vec::new();
    for path in &req.hosts {
        let kernel_name = kernel_name_for(path, req.root.as_deref())?;
        if let Some(other) = hosts.iter().position(|h| h.kernel_name == kernel_name) {
            return Err(CliError::new(
                Exit::Usage,
                format!(
                    "{} and {} would both be named {kernel_name:?}; give --root so their paths below it differ",
                    req.hosts[other].display(),
                    path.display()
                ),
            ));
        }
        let code_objects = read_host(path, &kernel_name)?;
        if req.emit_metadata {
            let name = format!("{}{}", file_name(path)?, import::METADATA_SUFFIX);
            if metadata.iter().any(|(n, _)| *n == name) {
                return Err(CliError::new(
                    Exit::Usage,
                    format!("two binaries would write the same metadata file {name}"),
                ));
            }
            let search = vec![import::search_path(&kernel_name, &prefix, req.single)];
            metadata.push((
                name,
                rocm_kpack::hipk::metadata::encode(&search, &kernel_name),
            ));
        }
        hosts.push(ImportedHost {
            kernel_name,
            code_objects,
        });
    }

    let total: u64 = hosts
        .iter()
        .flat_map(|h| &h.code_objects)
        .map(|c| c.data.len() as u64)
        .sum();
    let count: usize = hosts.iter().map(|h| h.code_objects.len()).sum();
    if count == 0 {
        return Err(CliError::new(
            Exit::NotFound,
            "the binaries' .hip_fatbin sections hold no device code objects",
        ));
    }
    let mut plans = import::plan_archives(hosts, &prefix, req.single, req.compression)?;
    for plan in &mut plans {
        plan.writer.set_reference_layout(req.reference_layout);
    }

    std::fs::create_dir_all(&req.out_dir).map_err(|e| {
        CliError::new(
            Exit::Output,
            format!("{}: cannot create directory: {e}", req.out_dir.display()),
        )
    })?;
    let bar = progress_bar(total);
    let tick = |n: u64| {
        if let Some(b) = &bar {
            b.inc(n)
        }
    };
    for plan in &plans {
        let path = req.out_dir.join(&plan.file_name);
        let size = plan
            .writer
            .write(&path, &tick)
            .map_err(|e| CliError::new(Exit::Output, e.to_string()))?;
        let line = format!(
            "{}: {} code objects [{}], {size} bytes",
            path.display(),
            plan.writer.len(),
            plan.arches.join(", ")
        );
        match &bar {
            Some(b) => b.println(line),
            None => println!("{line}"),
        }
    }
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    for (name, bytes) in metadata {
        let path = req.out_dir.join(name);
        write_atomically(&path, &bytes)?;
        println!("{}: HIPK metadata, {} bytes", path.display(), bytes.len());
    }
    Ok(())
}

/// `verify ARCHIVE... --against HOST...`: every code object of the hosts' fat binaries must be
/// in the archives, byte for byte. The archives do not say where the install root was, so each
/// host is matched to the key names in the archives whose last path component is the host's
/// file name (a name used by several binaries is tried for each).
pub fn verify_against(archives: &[PathBuf], hosts: &[PathBuf]) -> CliResult {
    let opened: Vec<Archive> = archives
        .iter()
        .map(Archive::open)
        .collect::<Result<_, _>>()?;
    let mut problems: Vec<String> = Vec::new();
    let mut checked = 0usize;
    for host in hosts {
        let name = file_name(host)?;
        let candidates = kernel_names_named(&opened, &name);
        if candidates.is_empty() {
            problems.push(format!(
                "{}: no key in the archives names a binary called {name:?}",
                host.display()
            ));
            continue;
        }
        // Parse once under a placeholder name; keys are re-made per candidate.
        let objects = read_host(host, "")?;
        let mut best: Option<Vec<String>> = None;
        for kernel_name in &candidates {
            let mismatches: Vec<String> = objects
                .iter()
                .filter_map(|co| check_one(&opened, host, kernel_name, co))
                .collect();
            if best.as_ref().is_none_or(|b| mismatches.len() < b.len()) {
                best = Some(mismatches);
            }
        }
        checked += objects.len();
        problems.extend(best.unwrap_or_default());
    }
    if problems.is_empty() {
        println!(
            "{} from {} match the archives byte for byte",
            super::words::count_of(checked, "code object", "code objects"),
            super::words::count_of(hosts.len(), "binary", "binaries")
        );
        return Ok(());
    }
    for p in &problems {
        eprintln!("{p}");
    }
    Err(CliError::new(
        Exit::Corrupt,
        format!(
            "{} of {} missing or differ",
            problems.len(),
            super::words::count_of(checked, "code object is", "code objects are")
        ),
    ))
}

/// Checks one code object; returns a message if it is missing or different.
fn check_one(
    archives: &[Archive],
    host: &Path,
    kernel_name: &str,
    co: &CodeObject,
) -> Option<String> {
    let key = format!("{kernel_name}#{}", co.index);
    let holder = archives
        .iter()
        .find(|a| a.has_architecture(&co.arch) && a.locate(&key, &co.arch).is_ok());
    let Some(a) = holder else {
        return Some(format!(
            "{}: {key} [{}]: not in any archive",
            host.display(),
            co.arch
        ));
    };
    match a.get_kernel(&key, &co.arch) {
        Ok(bytes) if bytes == co.data => None,
        Ok(bytes) => {
            let first = bytes
                .iter()
                .zip(&co.data)
                .position(|(x, y)| x != y)
                .unwrap_or(bytes.len().min(co.data.len()));
            Some(format!(
                "{}: {key} [{}]: {} holds {} bytes, the fat binary {}; first difference at byte {first}",
                host.display(),
                co.arch,
                a.path().display(),
                bytes.len(),
                co.data.len()
            ))
        }
        Err(e) => Some(format!("{}: {key} [{}]: {e}", host.display(), co.arch)),
    }
}

/// Key names (`key` without `#N`) in the archives whose last component is `file`.
fn kernel_names_named(archives: &[Archive], file: &str) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for a in archives {
        for b in a.binaries() {
            let Some((base, _)) = b.key.rsplit_once('#') else {
                continue;
            };
            if base.rsplit('/').next() == Some(file) && !names.iter().any(|n| n == base) {
                names.push(base.to_owned());
            }
        }
    }
    names
}

/// Reads a host binary and keys its code objects.
fn read_host(path: &Path, kernel_name: &str) -> CliResult<Vec<CodeObject>> {
    let bytes = std::fs::read(path)
        .map_err(|e| CliError::new(Exit::Unreadable, rocm_kpack::error::io_message(path, &e)))?;
    // Every import failure means the input is not the fat binary it was given as.
    import::host_code_objects(kernel_name, &bytes).map_err(|e: ImportError| {
        CliError::new(Exit::BadFormat, format!("{}: {e}", path.display()))
    })
}

/// The binary's `kernel_name`: its path below `root` (both resolved through symlinks of their
/// directories, not of the binary itself), or its own file name without a root.
fn kernel_name_for(host: &Path, root: Option<&Path>) -> CliResult<String> {
    let Some(root) = root else {
        return file_name(host);
    };
    let unreadable = |p: &Path, e: std::io::Error| CliError::io(Exit::Unreadable, p, &e);
    let root_abs = std::fs::canonicalize(root).map_err(|e| unreadable(root, e))?;
    let parent = host
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let parent_abs = std::fs::canonicalize(parent).map_err(|e| unreadable(parent, e))?;
    let full = parent_abs.join(file_name(host)?);
    let rel = full.strip_prefix(&root_abs).map_err(|_| {
        CliError::new(
            Exit::Usage,
            format!("{} is not below --root {}", host.display(), root.display()),
        )
    })?;
    import::kernel_name_from_relative(rel).map_err(|e| CliError::new(Exit::Usage, e))
}

fn file_name(path: &Path) -> CliResult<String> {
    path.file_name()
        .and_then(|n| n.to_str())
        .map(str::to_owned)
        .ok_or_else(|| {
            CliError::new(
                Exit::Usage,
                format!("{}: not a UTF-8 file name", path.display()),
            )
        })
}

/// Writes a small file through a temporary name, so readers never see half of it.
fn write_atomically(path: &Path, bytes: &[u8]) -> CliResult {
    let tmp = path.with_file_name(format!(".{}.tmp{}", file_name(path)?, std::process::id()));
    let fail = |e: std::io::Error| {
        CliError::new(
            Exit::Output,
            format!("{}: cannot write: {e}", path.display()),
        )
    };
    std::fs::write(&tmp, bytes).map_err(fail)?;
    std::fs::rename(&tmp, path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        fail(e)
    })
}

/// A byte-count bar on stderr, only for a person watching a large import.
fn progress_bar(total: u64) -> Option<ProgressBar> {
    if total < PROGRESS_THRESHOLD || !std::io::stderr().is_terminal() {
        return None;
    }
    let bar = ProgressBar::new(total);
    if let Ok(style) =
        ProgressStyle::with_template("{bar:40} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}")
    {
        bar.set_style(style);
    }
    Some(bar)
}

#[cfg(test)]
mod tests;
