//! Splitting a set of binaries of one install tree: each rewritten binary goes to the same
//! relative path under the output root, and all of them share per-arch archives in
//! `<out root>/.kpack/<prefix>_<arch>.kpack`. Binaries without device code are copied unchanged.
//!
//! Every input is read and split in memory, and the archives encoded, before anything is
//! written, so a refused binary leaves no trace. No output may replace an input (compared as
//! directory entries and as resolved files, so symlinked directories do not slip through), and
//! an output root equal to the input root is refused. Inputs are never opened for writing. The
//! outputs are then written all-or-nothing through [`Staging`]: temporary names, then renames,
//! archives before the binaries that need them.

use std::fmt;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::stage::Staging;
use super::{SplitError, split_binary};
use crate::import::{self, ImportedHost, KPACK_DIR};
use crate::loader::search::weakly_canonical;
use crate::writer::Compression;

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

struct Pending {
    output: PathBuf,
    kernel_name: String,
    bytes: Vec<u8>,
    mode: u32,
    outcome: Outcome,
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

pub fn split_tree(req: &SplitRequest) -> Result<SplitReport, TreeError> {
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

    // 1. Read and split everything in memory: a refusal leaves no trace on disk.
    let mut pending: Vec<Pending> = Vec::new();
    let mut hosts: Vec<ImportedHost> = Vec::new();
    let mut inputs: Vec<(PathBuf, &Path)> = Vec::new();
    for path in &req.hosts {
        let kernel_name = import::kernel_name_below(path, &req.root).map_err(TreeError::Usage)?;
        if pending.iter().any(|p| p.kernel_name == kernel_name) {
            return Err(TreeError::Usage(format!(
                "{} is given twice",
                path.display()
            )));
        }
        let bytes = std::fs::read(path).map_err(|source| TreeError::Read {
            path: path.clone(),
            source,
        })?;
        let mode = std::fs::metadata(path)
            .map(|m| m.permissions().mode())
            .unwrap_or(0o755);
        inputs.push((entry(path), path));
        if let Ok(real) = std::fs::canonicalize(path) {
            inputs.push((real, path));
        }
        let output = req.out_root.join(&kernel_name);
        match split_binary(&bytes, &kernel_name, &prefix) {
            Ok(s) => {
                let outcome = Outcome::Split {
                    wrappers: s.result.wrappers,
                    code_objects: s.code_objects.len(),
                    size_before: bytes.len() as u64,
                    size_after: s.result.bytes.len() as u64,
                };
                hosts.push(ImportedHost {
                    kernel_name: kernel_name.clone(),
                    code_objects: s.code_objects,
                });
                pending.push(Pending {
                    output,
                    kernel_name,
                    bytes: s.result.bytes,
                    mode,
                    outcome,
                });
            }
            Err(SplitError::NoDeviceCode) => {
                // Only reached for ELF files: split_binary refuses anything else first.
                pending.push(Pending {
                    output,
                    kernel_name,
                    bytes,
                    mode,
                    outcome: Outcome::Copied,
                });
            }
            Err(error) => {
                return Err(TreeError::Refused {
                    path: path.clone(),
                    error,
                });
            }
        }
    }
    let kpack = req.out_root.join(KPACK_DIR);
    let mut archives: Vec<(PathBuf, usize, Vec<u8>)> = Vec::new();
    if !hosts.is_empty() {
        for plan in import::plan_archives(hosts, &prefix, false, req.compression)
            .map_err(TreeError::Archive)?
        {
            let mut plan = plan;
            plan.writer.set_reference_layout(req.reference_layout);
            let mut bytes = Vec::new();
            plan.writer
                .write_to(&mut bytes, &|_| {})
                .map_err(TreeError::Archive)?;
            archives.push((kpack.join(&plan.file_name), plan.writer.len(), bytes));
        }
    }

    // 2. No output may replace an input or be a directory.
    for output in archives
        .iter()
        .map(|a| &a.0)
        .chain(pending.iter().map(|p| &p.output))
    {
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

    // 3. Write everything under temporary names, then rename: archives before the binaries
    // that need them.
    let mut staging = Staging::default();
    for (path, _, bytes) in &archives {
        staging.stage(path, bytes, 0o644)?;
    }
    for p in &pending {
        staging.stage(&p.output, &p.bytes, p.mode)?;
    }
    staging.commit()?;
    Ok(SplitReport {
        binaries: pending
            .into_iter()
            .map(|p| BinaryReport {
                output: p.output,
                kernel_name: p.kernel_name,
                outcome: p.outcome,
            })
            .collect(),
        archives: archives.into_iter().map(|(path, n, _)| (path, n)).collect(),
    })
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
