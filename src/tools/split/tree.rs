//! Splitting a set of binaries of one install tree: each rewritten binary goes to the same
//! relative path under the output root, and all of them share per-arch archives in
//! `<out root>/.kpack/<prefix>_<arch>.kpack`. Directories given are walked (in name order, not
//! following symlinked directories, leaving out the output root). Every file that is not a fat
//! binary is carried over as it is, its reason counted ([`Kept`]): not ELF (archives of an
//! earlier split among them), no device code, a separated debug file, already split; symlinks
//! met in a walk are recreated with the same target. So splitting a split tree again gives the
//! same tree.
//!
//! Every input is first classified from its headers alone, and any malformed ELF file refused,
//! before anything is written. Then three phases, each a function: (1) every fat binary is read
//! without its device code and checked (all other refusals happen here) while its code objects
//! stream through the parallel pipeline into the per-arch archives, written under temporary
//! names; (2) the archives are finished; (3) the rewritten binaries are written file to file
//! (kept ranges copied by the kernel where it can). Memory held does not grow with the size of
//! the binaries' device code. No output may replace
//! an input (compared as directory entries and as resolved files, so symlinked directories do
//! not slip through), and an output root equal to the input root is refused. Inputs are never
//! opened for writing. All outputs go through [`Staging`]: temporary names, removed with the
//! directories made for them on any failure, so a refused binary leaves no trace; then renames,
//! archives before the binaries that need them.

use std::fmt;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::error::SplitError;
use super::rewrite::{Prepared, prepare};
use super::stage::{StageError, Staging};
use crate::archive::writer::Compression;
use crate::host::fatbin::{self, HostFile, HostKind, KPACK_DIR, StreamError};
use crate::host::hipk::metadata::Pin;
use crate::loader::search::weakly_canonical;
use crate::tools::import::{self, ArchiveSet, Tag};
use crate::tools::pack_pipeline::{self, Feed, Options};

/// What `split` was asked to do.
#[derive(Debug, Clone)]
pub struct SplitRequest {
    pub hosts: Vec<PathBuf>,
    pub root: PathBuf,
    pub out_root: PathBuf,
    /// Archive prefix; by default derived from the first binary's name (see
    /// [`fatbin::default_prefix`]).
    pub prefix: Option<String>,
    pub compression: Compression,
    /// Write the archives in the reference writer's exact layout (no frame positions, no
    /// digests).
    pub reference_layout: bool,
    /// Pin each rewritten binary to the archives it was split into (their TOC digests in its
    /// HIPK metadata). Off (`--no-pins`): the marker is byte-identical to the reference's.
    pub pins: bool,
}

/// What happened to one input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Split {
        wrappers: usize,
        code_objects: usize,
        size_before: u64,
        size_after: u64,
    },
    /// Not a fat binary: copied byte for byte.
    Copied(Kept),
    /// A symlink met in a walked directory: recreated with the same target.
    Linked,
}

/// Why a file is carried over as it is instead of split.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kept {
    NotElf,
    NoDeviceCode,
    SeparatedDebug,
    AlreadySplit,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BinaryReport {
    pub output: PathBuf,
    pub kernel_name: String,
    pub outcome: Outcome,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SplitReport {
    /// Every input, in order, with what became of it.
    pub binaries: Vec<BinaryReport>,
    /// Archives written, with their number of code objects.
    pub archives: Vec<(PathBuf, usize)>,
    /// Entries of walked directories left out, with the reason.
    pub skipped: Vec<(PathBuf, String)>,
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

/// One input and where it goes.
struct Host {
    path: PathBuf,
    kernel_name: String,
    output: PathBuf,
    class: Class,
}

/// What an input is, from its headers.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Class {
    Fat,
    Kept(Kept),
    /// A symlink met in a walk, and its target.
    Link(PathBuf),
}

/// What phase 1 decided for an input.
enum Plan {
    Write(Write),
    Link(PathBuf),
}

/// A file to write: a rewritten binary or a copy.
enum Write {
    Split {
        prepared: Box<Prepared>,
        code_objects: usize,
        size_before: u64,
    },
    Copy {
        size: u64,
        kept: Kept,
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
    let (inputs, skipped) = expand_inputs(req)?;
    let hosts = name_hosts(req, &inputs)?;
    let prefix = check_request(req, &hosts)?;
    let inputs = input_entries(&hosts);
    check_outputs(hosts.iter().map(|h| &h.output), &inputs)?;
    let mut staging = Staging::default();
    let (plans, archives, held) = read_and_pack(req, &prefix, &hosts, &mut staging, progress)?;
    check_outputs(archives.iter().map(|a| &a.0), &inputs)?;
    // An archive of a former split, met in the tree, is copied: it must not be written too.
    for (archive, _) in &archives {
        if let Some(h) = hosts.iter().find(|h| h.output == *archive) {
            return Err(TreeError::Usage(format!(
                "{}: this split writes this archive, and would also copy {} there; \
                 give another --prefix or leave the old archive out",
                archive.display(),
                h.path.display()
            )));
        }
    }
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
    Ok(SplitReport {
        binaries,
        archives,
        skipped,
    })
}

/// A valid prefix (returned): the one given, else derived from the first fat binary's name.
fn check_request(req: &SplitRequest, hosts: &[Host]) -> Result<String, TreeError> {
    let first_fat = hosts.iter().find(|h| h.class == Class::Fat);
    let prefix = match (&req.prefix, first_fat) {
        (Some(p), _) => p.clone(),
        (None, Some(h)) => fatbin::default_prefix(
            &h.path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
        ),
        // No archive will be written: the prefix names nothing.
        (None, None) => return Ok(String::new()),
    };
    fatbin::validate_prefix(&prefix).map_err(TreeError::Usage)?;
    Ok(prefix)
}

/// Entries of walked directories left out, with the reason.
type Skipped = Vec<(PathBuf, String)>;

/// One path to split or carry over: given, or met in a walked directory (where a symlink is
/// carried over as a link instead of followed).
struct Input {
    path: PathBuf,
    walked_link: bool,
}

/// The inputs, with directories walked, and the walked entries left out with why. Checks
/// first that inputs are given and that the output root is not the input root.
fn expand_inputs(req: &SplitRequest) -> Result<(Vec<Input>, Skipped), TreeError> {
    if req.hosts.is_empty() {
        return Err(TreeError::Usage(
            "split needs at least one host binary or directory".into(),
        ));
    }
    let read_error = |path: &Path| {
        let path = path.to_path_buf();
        move |source| TreeError::Read { path, source }
    };
    let root = std::fs::canonicalize(&req.root).map_err(read_error(&req.root))?;
    let out_root = weakly_canonical(&req.out_root);
    if out_root == root {
        return Err(TreeError::Usage(format!(
            "the output root {} is the input root; split never modifies its inputs, give another -o",
            req.out_root.display()
        )));
    }
    let mut inputs = Vec::new();
    let mut skipped = Vec::new();
    for path in &req.hosts {
        if !std::fs::metadata(path).map_err(read_error(path))?.is_dir() {
            inputs.push(Input {
                path: path.clone(),
                walked_link: false,
            });
            continue;
        }
        let mut stack = vec![path.clone()];
        while let Some(dir) = stack.pop() {
            let mut entries = std::fs::read_dir(&dir)
                .and_then(|d| d.collect::<io::Result<Vec<_>>>())
                .map_err(read_error(&dir))?;
            entries.sort_by_key(|e| e.file_name());
            // Walked depth first in name order: subdirectories go on the stack reversed.
            let mut subdirs = Vec::new();
            for e in entries {
                let p = e.path();
                let kind = e.file_type().map_err(read_error(&p))?;
                if kind.is_dir() {
                    // An output root inside the tree (a former run) is not an input.
                    if weakly_canonical(&p) != out_root {
                        subdirs.push(p);
                    }
                } else if kind.is_symlink() || kind.is_file() {
                    inputs.push(Input {
                        path: p,
                        walked_link: kind.is_symlink(),
                    });
                } else {
                    skipped.push((p, "not a regular file, directory or symlink".to_owned()));
                }
            }
            stack.extend(subdirs.into_iter().rev());
        }
    }
    Ok((inputs, skipped))
}

/// Each input's kernel name (its path below the root), output path and class; an input given
/// twice (or given and met in a walk) is refused, and so is a malformed ELF file: all before
/// anything is written.
fn name_hosts(req: &SplitRequest, inputs: &[Input]) -> Result<Vec<Host>, TreeError> {
    let mut hosts: Vec<Host> = Vec::with_capacity(inputs.len());
    for input in inputs {
        let path = &input.path;
        let kernel_name = fatbin::kernel_name_below(path, &req.root).map_err(TreeError::Usage)?;
        if hosts.iter().any(|h| h.kernel_name == kernel_name) {
            return Err(TreeError::Usage(format!(
                "{} is given twice",
                path.display()
            )));
        }
        let class = if input.walked_link {
            Class::Link(std::fs::read_link(path).map_err(|source| TreeError::Read {
                path: path.clone(),
                source,
            })?)
        } else {
            classify(path)?
        };
        hosts.push(Host {
            path: path.clone(),
            output: req.out_root.join(&kernel_name),
            kernel_name,
            class,
        });
    }
    Ok(hosts)
}

/// Whether a file is a fat binary to split, or why it is kept as it is; reads its headers only.
fn classify(path: &Path) -> Result<Class, TreeError> {
    let read_error = |source| TreeError::Read {
        path: path.to_path_buf(),
        source,
    };
    if !fatbin::is_elf_file(path).map_err(read_error)? {
        return Ok(Class::Kept(Kept::NotElf));
    }
    let host = HostFile::open_tables(path).map_err(read_error)?;
    let kind = fatbin::host_kind(host.image()).map_err(|e| TreeError::Refused {
        path: path.to_path_buf(),
        error: SplitError::from_fatbin(e),
    })?;
    Ok(match kind {
        HostKind::Fat => Class::Fat,
        HostKind::Hipk => Class::Kept(Kept::AlreadySplit),
        HostKind::SeparatedDebug => Class::Kept(Kept::SeparatedDebug),
        HostKind::NoDeviceCode => Class::Kept(Kept::NoDeviceCode),
    })
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
    match &h.class {
        Class::Fat => {}
        Class::Kept(kept) => {
            let size = std::fs::metadata(&h.path).map_err(read_error)?.len();
            return Ok(Plan::Write(Write::Copy { size, kept: *kept }));
        }
        Class::Link(target) => return Ok(Plan::Link(target.clone())),
    }
    let host = HostFile::open(&h.path).map_err(read_error)?;
    let prepared = prepare(host.image()).map_err(refused)?;
    let code_objects =
        import::submit_host_code_objects(&h.kernel_name, &host, feed, &|n| progress(n)).map_err(
            |e| match e {
                StreamError::Fatbin(e) => refused(SplitError::from_fatbin(e)),
                StreamError::Read(e) => read_error(e),
                StreamError::Visit(e) => TreeError::Archive(e),
            },
        )?;
    Ok(Plan::Write(Write::Split {
        prepared: Box::new(prepared),
        code_objects,
        size_before: host.len(),
    }))
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
        let report = |outcome| BinaryReport {
            output: h.output.clone(),
            kernel_name: h.kernel_name.clone(),
            outcome,
        };
        let plan = match plan {
            Plan::Write(w) => w,
            Plan::Link(target) => {
                staging.symlink(&h.output, &target)?;
                reports.push(report(Outcome::Linked));
                continue;
            }
        };
        let read_error = |source| TreeError::Read {
            path: h.path.clone(),
            source,
        };
        let input = std::fs::File::open(&h.path).map_err(read_error)?;
        let meta = input.metadata().map_err(read_error)?;
        let mode = meta.permissions().mode();
        let expected = match &plan {
            Write::Split { size_before, .. } => *size_before,
            Write::Copy { size, .. } => *size,
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
            Write::Split {
                prepared,
                code_objects,
                size_before,
            } => {
                let pins = pins(&h.kernel_name);
                let marker = super::binary::marker(&h.kernel_name, prefix, pins.as_deref());
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
            Write::Copy { size, kept } => {
                super::emit::copy_file(&input, &out, size).map_err(write_error)?;
                progress(size);
                Outcome::Copied(kept)
            }
        };
        Staging::seal(&out, &h.output, mode)?;
        reports.push(report(outcome));
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
