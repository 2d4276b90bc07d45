//! Splitting a set of binaries of one install tree: each rewritten binary goes to the same
//! relative path under the output root, and all of them share per-arch archives in
//! `<out root>/.kpack/<prefix>_<arch>.kpack`. Binaries without device code are copied unchanged.
//!
//! Three phases, each a function: (1) every binary is read without its device code and checked
//! (all refusals happen here) while its code objects stream through the parallel pipeline into
//! the per-arch archives, written under temporary names; (2) the archives are finished; (3) the
//! rewritten binaries are written file to file (kept ranges copied by the kernel where it can).
//! Memory held does not grow with the size of the binaries' device code. No output may replace
//! an input (compared as directory entries and as resolved files, so symlinked directories do
//! not slip through), and an output root equal to the input root is refused. Inputs are never
//! opened for writing. All outputs go through [`Staging`]: temporary names, removed with the
//! directories made for them on any failure, so a refused binary leaves no trace; then renames,
//! archives before the binaries that need them.

use std::fmt;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::stage::{StageError, Staging};
use super::{Prepared, SplitError, prepare};
use crate::archive::writer::Compression;
use crate::host::hipk::metadata::Pin;
use crate::loader::search::weakly_canonical;
use crate::tools::import::{self, ArchiveSet, HostFile, KPACK_DIR, StreamError, Tag};
use crate::tools::pack_pipeline::{self, Feed, Options};

/// What `split` was asked to do.
#[derive(Debug, Clone)]
pub struct SplitRequest {
    pub hosts: Vec<PathBuf>,
    pub root: PathBuf,
    pub out_root: PathBuf,
    /// Archive prefix; by default derived from the first binary's name (see
    /// [`import::default_prefix`]).
    pub prefix: Option<String>,
    pub compression: Compression,
    /// Write the archives in the reference writer's exact layout (no frame positions, no
    /// digests).
    pub reference_layout: bool,
    /// Pin each rewritten binary to the archives it was split into (their TOC digests in its
    /// HIPK metadata). Off (`--no-pins`): the marker is byte-identical to the reference's.
    pub pins: bool,
}

/// What happened to one binary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Split {
        wrappers: usize,
        code_objects: usize,
        size_before: u64,
        size_after: u64,
    },
    /// No `.hip_fatbin`: copied byte for byte.
    Copied,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BinaryReport {
    pub output: PathBuf,
    pub kernel_name: String,
    pub outcome: Outcome,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SplitReport {
    pub binaries: Vec<BinaryReport>,
    /// Archives written, with their number of code objects.
    pub archives: Vec<(PathBuf, usize)>,
}

/// Why a split run failed; each names the file concerned.
#[derive(Debug)]
pub enum TreeError {
    Usage(String),
    Read { path: PathBuf, source: io::Error },
    Refused { path: PathBuf, error: SplitError },
    Write { path: PathBuf, source: io::Error },
    Archive(crate::Error),
}

impl fmt::Display for TreeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TreeError::Usage(m) => f.write_str(m),
            TreeError::Read { path, source } => {
                write!(f, "{}: cannot read: {source}", path.display())
            }
            TreeError::Refused { path, error } => write!(f, "{}: {error}", path.display()),
            TreeError::Write { path, source } => {
                write!(f, "{}: cannot write: {source}", path.display())
            }
            TreeError::Archive(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for TreeError {}

impl From<StageError> for TreeError {
    fn from(e: StageError) -> Self {
        TreeError::Write {
            path: e.path,
            source: e.source,
        }
    }
}

/// The output root used when none is given: `<ROOT>.split` beside the (canonical) input root.
pub fn default_out_root(root: &Path) -> Result<PathBuf, TreeError> {
    let abs = std::fs::canonicalize(root).map_err(|source| TreeError::Read {
        path: root.to_path_buf(),
        source,
    })?;
    match (abs.parent(), abs.file_name()) {
        (Some(parent), Some(name)) => Ok(parent.join(format!("{}.split", name.to_string_lossy()))),
        _ => Err(TreeError::Usage(format!(
            "the root {} has no sibling directory; give -o OUTROOT",
            abs.display()
        ))),
    }
}

/// One input binary and where it goes.
struct Host {
    path: PathBuf,
    kernel_name: String,
    output: PathBuf,
}

/// What phase 1 decided for a binary.
enum Plan {
    Split {
        prepared: Box<Prepared>,
        code_objects: usize,
        size_before: u64,
    },
    Copy {
        size: u64,
    },
}

/// A finished archive: (TOC digest, the binaries it holds code objects of).
type Held = ([u8; 32], Vec<String>);

impl From<crate::Error> for TreeError {
    fn from(e: crate::Error) -> TreeError {
        TreeError::Archive(e)
    }
}

/// Splits the binaries of one install tree.
pub fn split_tree(req: &SplitRequest) -> Result<SplitReport, TreeError> {
    split_tree_with_progress(req, &|_| {})
}

/// [`split_tree`], reporting progress in bytes of the input binaries (their total is the sum
/// of their sizes): device code as its bundles are read, the rest as binaries are written.
pub fn split_tree_with_progress(
    req: &SplitRequest,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<SplitReport, TreeError> {
    let prefix = check_request(req)?;
    let hosts = name_hosts(req)?;
    let inputs = input_entries(&hosts);
    check_outputs(hosts.iter().map(|h| &h.output), &inputs)?;
    let mut staging = Staging::default();
    let (plans, archives, held) = read_and_pack(req, &prefix, &hosts, &mut staging, progress)?;
    check_outputs(archives.iter().map(|a| &a.0), &inputs)?;
    let pins = |kernel_name: &str| -> Option<Vec<Pin>> {
        req.pins.then(|| {
            held.iter()
                .filter(|(_, names)| names.iter().any(|n| n == kernel_name))
                .map(|(digest, _)| *digest)
                .collect()
        })
    };
    let binaries = write_binaries(&hosts, plans, &prefix, &pins, &mut staging, progress)?;
    staging.commit()?;
    Ok(SplitReport { binaries, archives })
}

/// The request's own consistency: hosts given, the output root not the input root, a valid
/// prefix (returned).
fn check_request(req: &SplitRequest) -> Result<String, TreeError> {
    if req.hosts.is_empty() {
        return Err(TreeError::Usage(
            "split needs at least one host binary".into(),
        ));
    }
    let root = std::fs::canonicalize(&req.root).map_err(|source| TreeError::Read {
        path: req.root.clone(),
        source,
    })?;
    if weakly_canonical(&req.out_root) == root {
        return Err(TreeError::Usage(format!(
            "the output root {} is the input root; split never modifies its inputs, give another -o",
            req.out_root.display()
        )));
    }
    let prefix = match &req.prefix {
        Some(p) => p.clone(),
        None => import::default_prefix(
            &req.hosts[0]
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
        ),
    };
    import::validate_prefix(&prefix).map_err(TreeError::Usage)?;
    Ok(prefix)
}

/// Each host's kernel name (its path below the root) and output path; a binary given twice is
/// refused.
fn name_hosts(req: &SplitRequest) -> Result<Vec<Host>, TreeError> {
    let mut hosts: Vec<Host> = Vec::with_capacity(req.hosts.len());
    for path in &req.hosts {
        let kernel_name = import::kernel_name_below(path, &req.root).map_err(TreeError::Usage)?;
        if hosts.iter().any(|h| h.kernel_name == kernel_name) {
            return Err(TreeError::Usage(format!(
                "{} is given twice",
                path.display()
            )));
        }
        hosts.push(Host {
            path: path.clone(),
            output: req.out_root.join(&kernel_name),
            kernel_name,
        });
    }
    Ok(hosts)
}

/// The inputs as directory entries and as resolved files, each with the path given.
fn input_entries(hosts: &[Host]) -> Vec<(PathBuf, &Path)> {
    let mut inputs = Vec::new();
    for h in hosts {
        inputs.push((entry(&h.path), h.path.as_path()));
        if let Ok(real) = std::fs::canonicalize(&h.path) {
            inputs.push((real, h.path.as_path()));
        }
    }
    inputs
}

/// No output may replace an input or be a directory.
fn check_outputs<'p>(
    outputs: impl Iterator<Item = &'p PathBuf>,
    inputs: &[(PathBuf, &Path)],
) -> Result<(), TreeError> {
    for output in outputs {
        let at = entry(output);
        if let Some((_, input)) = inputs.iter().find(|(i, _)| *i == at) {
            return Err(TreeError::Usage(format!(
                "{} would replace the input {}; split never modifies its inputs, give another -o",
                output.display(),
                input.display()
            )));
        }
        if output.is_dir() {
            return Err(TreeError::Write {
                path: output.clone(),
                source: io::Error::new(io::ErrorKind::IsADirectory, "a directory is in the way"),
            });
        }
    }
    Ok(())
}

/// Phase 1: each binary is read without its device code and planned (every refusal happens
/// here); its code objects stream through the pipeline into the staged per-arch archives, in
/// first-seen arch order. Returns the plans, the archives written with their sizes, and what
/// each archive holds (for the pins).
#[allow(clippy::type_complexity)]
fn read_and_pack(
    req: &SplitRequest,
    prefix: &str,
    hosts: &[Host],
    staging: &mut Staging,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<(Vec<Plan>, Vec<(PathBuf, usize)>, Vec<Held>), TreeError> {
    let kpack = req.out_root.join(KPACK_DIR);
    let mut set = ArchiveSet::new(&kpack, prefix, false, req.compression, req.reference_layout);
    let mut opts = Options::new(req.compression);
    opts.hash = !req.reference_layout;
    let plans = pack_pipeline::run(
        opts,
        |feed| {
            let mut plans = Vec::with_capacity(hosts.len());
            for h in hosts {
                plans.push(plan_binary(h, feed, progress)?);
            }
            Ok(plans)
        },
        |tag: Tag, encoded| {
            set.append(tag, encoded, |path| {
                staging.create(path).map_err(TreeError::from)
            })
        },
    )?;
    let finished = set.finish()?;
    let mut archives = Vec::with_capacity(finished.len());
    let mut held = Vec::with_capacity(finished.len());
    for a in finished {
        Staging::seal(&a.done.file, &a.path, 0o644)?;
        archives.push((a.path, a.count));
        held.push((a.done.toc_digest, a.kernel_names));
    }
    Ok((plans, archives, held))
}

/// Reads one binary: a binary without device code is to be copied; any other is prepared for
/// the rewrite (or refused), and its code objects submitted.
fn plan_binary(
    h: &Host,
    feed: &Feed<'_, Tag>,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<Plan, TreeError> {
    let refused = |error| TreeError::Refused {
        path: h.path.clone(),
        error,
    };
    let read_error = |source| TreeError::Read {
        path: h.path.clone(),
        source,
    };
    let host = HostFile::open(&h.path).map_err(read_error)?;
    let prepared = match prepare(host.image()) {
        Ok(p) => p,
        // Only reached for ELF files: prepare refuses anything else first.
        Err(SplitError::NoDeviceCode) => return Ok(Plan::Copy { size: host.len() }),
        Err(error) => return Err(refused(error)),
    };
    let code_objects =
        import::submit_host_code_objects(&h.kernel_name, &host, feed, &|n| progress(n)).map_err(
            |e| match e {
                StreamError::Import(e) => refused(SplitError::from_import(e)),
                StreamError::Read(e) => read_error(e),
                StreamError::Visit(e) => TreeError::Archive(e),
            },
        )?;
    Ok(Plan::Split {
        prepared: Box::new(prepared),
        code_objects,
        size_before: host.len(),
    })
}

/// Phase 3: each binary is written under its temporary name, file to file: the rewrite with
/// its marker, or a copy.
fn write_binaries(
    hosts: &[Host],
    plans: Vec<Plan>,
    prefix: &str,
    pins: &dyn Fn(&str) -> Option<Vec<Pin>>,
    staging: &mut Staging,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<Vec<BinaryReport>, TreeError> {
    let mut reports = Vec::with_capacity(hosts.len());
    for (h, plan) in hosts.iter().zip(plans) {
        let read_error = |source| TreeError::Read {
            path: h.path.clone(),
            source,
        };
        let input = std::fs::File::open(&h.path).map_err(read_error)?;
        let meta = input.metadata().map_err(read_error)?;
        let mode = meta.permissions().mode();
        let expected = match &plan {
            Plan::Split { size_before, .. } => *size_before,
            Plan::Copy { size } => *size,
        };
        if meta.len() != expected {
            return Err(read_error(io::Error::other(
                "the file changed size while being split",
            )));
        }
        let out = staging.create(&h.output)?;
        let write_error = |source| TreeError::Write {
            path: h.output.clone(),
            source,
        };
        let outcome = match plan {
            Plan::Split {
                prepared,
                code_objects,
                size_before,
            } => {
                let pins = pins(&h.kernel_name);
                let marker = super::marker(&h.kernel_name, prefix, pins.as_deref());
                let rewrite = prepared.finish(&marker);
                rewrite.write_file(&input, &out).map_err(write_error)?;
                progress(size_before - rewrite.device_code);
                Outcome::Split {
                    wrappers: rewrite.wrappers,
                    code_objects,
                    size_before,
                    size_after: rewrite.len(),
                }
            }
            Plan::Copy { size } => {
                super::emit::copy_file(&input, &out, size).map_err(write_error)?;
                progress(size);
                Outcome::Copied
            }
        };
        Staging::seal(&out, &h.output, mode)?;
        reports.push(BinaryReport {
            output: h.output.clone(),
            kernel_name: h.kernel_name.clone(),
            outcome,
        });
    }
    Ok(reports)
}

/// The directory entry a path names: its parent resolved through symlinks (as far as it exists),
/// then its own name, unresolved.
fn entry(path: &Path) -> PathBuf {
    let parent = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let dir = weakly_canonical(parent);
    match path.file_name() {
        Some(name) => dir.join(name),
        None => dir,
    }
}
