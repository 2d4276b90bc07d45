//! Importing device code from ROCm fat binaries (`pack --from-fatbin`) and checking archives
//! against them (`verify --against`). The naming rules live in `rocm_kpack::tools::import`; this file
//! reads the binaries, resolves paths, writes the files and reports.

use std::path::{Path, PathBuf};

use rocm_kpack::host::fatbin::{self, CodeObject, HostFile, StreamError};
use rocm_kpack::tools::import::{self, ArchiveSet, Tag};
use rocm_kpack::tools::pack_pipeline::{self, Feed, Options};
use rocm_kpack::tools::split::{StageError, Staging};
use rocm_kpack::{Archive, Compression};

use crate::cli::exit::{CliError, CliResult, Exit};
use crate::cli::out::{errln, outln};
use crate::cli::progress;

/// What `pack --from-fatbin` was asked to do.
#[derive(Debug)]
pub struct ImportRequest {
    pub hosts: Vec<PathBuf>,
    pub out_dir: PathBuf,
    pub prefix: Option<String>,
    pub root: Option<PathBuf>,
    pub single: bool,
    pub emit_metadata: bool,
    /// With `emit_metadata`: pin each binary to the archives holding its code objects.
    pub pins: bool,
    pub compression: Compression,
    /// Write the reference writer's exact layout (no frame positions, no digests).
    pub reference_layout: bool,
}

/// One binary to import.
struct Host<'a> {
    path: &'a Path,
    kernel_name: String,
}

/// Streams every host's code objects through the parallel pipeline into archives staged in the
/// output directory (per arch, or one with `--single`), then renames them into place; nothing
/// is left on any failure. Memory does not grow with the binaries' size.
pub fn run(req: ImportRequest) -> CliResult {
    if req.hosts.is_empty() {
        return Err(CliError::new(
            Exit::Usage,
            "pack --from-fatbin needs at least one host binary",
        ));
    }
    let prefix = match &req.prefix {
        Some(p) => p.clone(),
        None => fatbin::default_prefix(&file_name(&req.hosts[0])?),
    };
    fatbin::validate_prefix(&prefix).map_err(|e| CliError::new(Exit::Usage, e))?;
    let hosts = name_hosts(&req)?;
    let metadata_names = if req.emit_metadata {
        metadata_file_names(&hosts)?
    } else {
        Vec::new()
    };

    let total: u64 = hosts
        .iter()
        .filter_map(|h| std::fs::metadata(h.path).ok())
        .map(|m| m.len())
        .sum();
    let bar = progress::bar(total);
    let tick = |n: u64| {
        if let Some(b) = &bar {
            b.inc(n)
        }
    };
    let mut staging = Staging::default();
    let mut archives = ArchiveSet::new(
        &req.out_dir,
        &prefix,
        req.single,
        req.compression,
        req.reference_layout,
    );
    let mut opts = Options::new(req.compression);
    opts.hash = !req.reference_layout;
    let count: CliResult<usize> = pack_pipeline::run(
        opts,
        |feed| {
            let mut count = 0usize;
            for h in &hosts {
                count += stream_host(h, feed, &tick)?;
            }
            Ok(count)
        },
        |tag: Tag, encoded| {
            archives.append(tag, encoded, |path| {
                staging.create(path).map_err(staging_error)
            })
        },
    );
    if let Some(b) = &bar {
        b.finish_and_clear();
    }
    let count = count?;
    if count == 0 {
        return Err(CliError::new(
            Exit::NotFound,
            "the binaries' .hip_fatbin sections hold no device code objects",
        ));
    }
    let finished = archives.finish()?;
    let mut lines = Vec::with_capacity(finished.len());
    let mut held: Vec<([u8; 32], Vec<String>)> = Vec::with_capacity(finished.len());
    for a in finished {
        Staging::seal(&a.done.file, &a.path, 0o644).map_err(staging_error)?;
        lines.push(format!(
            "{}: {} code objects [{}], {} bytes",
            a.path.display(),
            a.count,
            a.arches.join(", "),
            a.done.size
        ));
        held.push((a.done.toc_digest, a.kernel_names));
    }
    // The metadata goes last: its pins are the digests of the archives just finished.
    let metadata: Vec<(&String, Vec<u8>)> = hosts
        .iter()
        .zip(&metadata_names)
        .map(|(h, name)| {
            let pins: Option<Vec<[u8; 32]>> = req.pins.then(|| {
                held.iter()
                    .filter(|(_, names)| names.contains(&h.kernel_name))
                    .map(|(digest, _)| *digest)
                    .collect()
            });
            let search = vec![fatbin::search_path(&h.kernel_name, &prefix, req.single)];
            let bytes = rocm_kpack::host::hipk::metadata::encode_pinned(
                &search,
                &h.kernel_name,
                pins.as_deref(),
            );
            (name, bytes)
        })
        .collect();
    for (name, bytes) in &metadata {
        let path = req.out_dir.join(name);
        let mut file = staging.create(&path).map_err(staging_error)?;
        std::io::Write::write_all(&mut file, bytes).map_err(|e| {
            CliError::new(
                Exit::Output,
                format!("{}: cannot write: {e}", path.display()),
            )
        })?;
        Staging::seal(&file, &path, 0o644).map_err(staging_error)?;
        lines.push(format!(
            "{}: HIPK metadata, {} bytes",
            path.display(),
            bytes.len()
        ));
    }
    staging.commit().map_err(staging_error)?;
    for line in lines {
        outln!("{line}")?;
    }
    Ok(())
}

/// Each host's kernel name; two hosts with the same name are refused.
fn name_hosts(req: &ImportRequest) -> CliResult<Vec<Host<'_>>> {
    let mut hosts: Vec<Host<'_>> = Vec::with_capacity(req.hosts.len());
    for path in &req.hosts {
        let kernel_name = kernel_name_for(path, req.root.as_deref())?;
        if let Some(other) = hosts.iter().find(|h| h.kernel_name == kernel_name) {
            return Err(CliError::new(
                Exit::Usage,
                format!(
                    "{} and {} would both be named {kernel_name:?}; give --root so their paths below it differ",
                    other.path.display(),
                    path.display()
                ),
            ));
        }
        hosts.push(Host { path, kernel_name });
    }
    Ok(hosts)
}

/// The names of the `<binary>.hipk.msgpack` files `--emit-metadata` writes, one per host in
/// order; two hosts with the same file name are refused before anything is written.
fn metadata_file_names(hosts: &[Host<'_>]) -> CliResult<Vec<String>> {
    let mut names: Vec<String> = Vec::new();
    for h in hosts {
        let name = format!("{}{}", file_name(h.path)?, fatbin::METADATA_SUFFIX);
        if names.contains(&name) {
            return Err(CliError::new(
                Exit::Usage,
                format!("two binaries would write the same metadata file {name}"),
            ));
        }
        names.push(name);
    }
    Ok(names)
}

/// Reads one host without its device code and submits its code objects; returns how many.
fn stream_host(h: &Host<'_>, feed: &Feed<'_, Tag>, tick: &dyn Fn(u64)) -> CliResult<usize> {
    let unreadable = |e: std::io::Error| {
        CliError::new(
            Exit::Unreadable,
            format!("{}: cannot read: {e}", h.path.display()),
        )
    };
    let host = HostFile::open(h.path).map_err(unreadable)?;
    let count = import::submit_host_code_objects(&h.kernel_name, &host, feed, tick).map_err(
        |e| match e {
            // Every import failure means the input is not the fat binary it was given as.
            StreamError::Fatbin(e) => {
                CliError::new(Exit::BadFormat, format!("{}: {e}", h.path.display()))
            }
            StreamError::Read(e) => unreadable(e),
            StreamError::Visit(e) => CliError::from(e),
        },
    )?;
    tick(host.len() - host.fatbin().map_or(0, |f| f.len));
    Ok(count)
}

fn staging_error(e: StageError) -> CliError {
    CliError::new(Exit::Output, e.to_string())
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
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let bar = progress::bar(
        hosts
            .iter()
            .filter_map(|h| std::fs::metadata(h).ok())
            .map(|m| m.len())
            .sum(),
    );
    let tick = |n: u64| {
        if let Some(b) = &bar {
            b.inc(n)
        }
    };
    let mut problems: Vec<String> = Vec::new();
    let mut checked = 0usize;
    for host in hosts {
        match check_host(&opened, host, threads, &tick) {
            Ok((n, found)) => {
                checked += n;
                problems.extend(found);
            }
            Err(e) => {
                if let Some(b) = &bar {
                    b.finish_and_clear();
                }
                return Err(e);
            }
        }
    }
    if let Some(b) = &bar {
        b.finish_and_clear();
    }
    if problems.is_empty() {
        return outln!(
            "{} from {} match the archives byte for byte",
            crate::cli::plural::count_of(checked, "code object", "code objects"),
            crate::cli::plural::count_of(hosts.len(), "binary", "binaries")
        );
    }
    for p in &problems {
        errln!("{p}");
    }
    Err(CliError::new(
        Exit::Corrupt,
        format!(
            "{} of {} missing or differ",
            problems.len(),
            crate::cli::plural::count_of(checked, "code object is", "code objects are")
        ),
    ))
}

/// Checks one host binary's code objects against the archives in one pass; returns how many
/// there were and a line per one missing or different (for the best-matching kernel name).
fn check_host(
    opened: &[Archive],
    host: &Path,
    threads: usize,
    tick: &dyn Fn(u64),
) -> CliResult<(usize, Vec<String>)> {
    let name = file_name(host)?;
    let candidates = kernel_names_named(opened, &name);
    if candidates.is_empty() {
        return Ok((
            0,
            vec![format!(
                "{}: no key in the archives names a binary called {name:?}",
                host.display()
            )],
        ));
    }
    // One pass over the binary, under a placeholder name: each code object is checked under
    // every candidate name (keys are re-made per candidate) while the next is being read.
    let file = HostFile::open(host).map_err(|e| read_error(host, &e))?;
    let per_object: Vec<Vec<Option<String>>> = import::check_host_code_objects(
        "",
        &file,
        threads,
        |co, scratch| {
            candidates
                .iter()
                .map(|kernel_name| check_one(opened, host, kernel_name, co, scratch))
                .collect()
        },
        tick,
    )
    .map_err(|e| match e {
        // Every import failure means the input is not the fat binary it was given as.
        StreamError::Fatbin(e) => {
            CliError::new(Exit::BadFormat, format!("{}: {e}", host.display()))
        }
        StreamError::Read(e) => read_error(host, &e),
        StreamError::Visit(never) => match never {},
    })?;
    let mut best: Option<Vec<String>> = None;
    for c in 0..candidates.len() {
        let mismatches: Vec<String> = per_object.iter().filter_map(|r| r[c].clone()).collect();
        if best.as_ref().is_none_or(|b| mismatches.len() < b.len()) {
            best = Some(mismatches);
        }
    }
    tick(file.len() - file.fatbin().map_or(0, |f| f.len));
    Ok((per_object.len(), best.unwrap_or_default()))
}

fn read_error(path: &Path, e: &std::io::Error) -> CliError {
    CliError::new(Exit::Unreadable, rocm_kpack::error::io_message(path, e))
}

/// Checks one code object, decoding the archive's kernel into `scratch`; returns a message if
/// it is missing or different.
fn check_one(
    archives: &[Archive],
    host: &Path,
    kernel_name: &str,
    co: &CodeObject,
    scratch: &mut Vec<u8>,
) -> Option<String> {
    let key = format!("{kernel_name}#{}", co.index);
    let found = archives.iter().find_map(|a| {
        a.has_architecture(&co.arch)
            .then(|| a.locate(&key, &co.arch).ok().map(|k| (a, k)))
            .flatten()
    });
    let Some((a, kref)) = found else {
        return Some(format!(
            "{}: {key} [{}]: not in any archive",
            host.display(),
            co.arch
        ));
    };
    let read = a.read_with(&kref, |n| {
        // Called once the archive checked that the kernel really has `n` bytes.
        scratch.resize(n, 0);
        Some(scratch.as_mut_slice())
    });
    match read {
        Ok(bytes) if *bytes == *co.data => None,
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

/// The binary's `kernel_name`: its path below `root` (both resolved through symlinks of their
/// directories, not of the binary itself), or its own file name without a root.
pub(super) fn kernel_name_for(host: &Path, root: Option<&Path>) -> CliResult<String> {
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
    fatbin::kernel_name_from_relative(rel).map_err(|e| CliError::new(Exit::Usage, e))
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

#[cfg(test)]
mod tests;
