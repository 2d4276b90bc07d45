//! Splitting a set of binaries of one install tree: each rewritten binary goes to the same
//! relative path under the output root, and all of them share per-arch archives in
//! `<out root>/.kpack/<prefix>_<arch>.kpack`. Binaries without device code are copied unchanged.
//!
//! Every input is read and split in memory before anything is written, so a refused binary
//! leaves no partial output; the archives are written before the binaries that need them; every
//! file goes through a temporary name and a rename. Inputs are never opened for writing, and an
//! output root equal to the input root is refused.

use std::fmt;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::{SplitError, split_binary};
use crate::import::{self, ImportedHost, KPACK_DIR};
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
}

/// What happened to one binary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Split { wrappers: usize, code_objects: usize, size_before: u64, size_after: u64 },
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
            TreeError::Read { path, source } => write!(f, "{}: cannot read: {source}", path.display()),
            TreeError::Refused { path, error } => write!(f, "{}: {error}", path.display()),
            TreeError::Write { path, source } => write!(f, "{}: cannot write: {source}", path.display()),
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

pub fn split_tree(req: &SplitRequest) -> Result<SplitReport, TreeError> {
    if req.hosts.is_empty() {
        return Err(TreeError::Usage("split needs at least one host binary".into()));
    }
    let canon = |p: &Path| std::fs::canonicalize(p).map_err(|source| TreeError::Read { path: p.to_path_buf(), source });
    let root = canon(&req.root)?;
    std::fs::create_dir_all(&req.out_root).map_err(|source| TreeError::Write { path: req.out_root.clone(), source })?;
    if canon(&req.out_root)? == root {
        return Err(TreeError::Usage(format!(
            "the output root {} is the input root; split never modifies its inputs, give another -o",
            req.out_root.display()
        )));
    }
    let prefix = match &req.prefix {
        Some(p) => p.clone(),
        None => import::default_prefix(&req.hosts[0].file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()),
    };
    import::validate_prefix(&prefix).map_err(TreeError::Usage)?;

    let mut pending: Vec<Pending> = Vec::new();
    let mut hosts: Vec<ImportedHost> = Vec::new();
    for path in &req.hosts {
        let kernel_name = import::kernel_name_below(path, &req.root).map_err(TreeError::Usage)?;
        if pending.iter().any(|p| p.kernel_name == kernel_name) {
            return Err(TreeError::Usage(format!("{} is given twice", path.display())));
        }
        let bytes = std::fs::read(path).map_err(|source| TreeError::Read { path: path.clone(), source })?;
        let mode = std::fs::metadata(path).map(|m| m.permissions().mode()).unwrap_or(0o755);
        let output = req.out_root.join(&kernel_name);
        let refused = |error| TreeError::Refused { path: path.clone(), error };
        match split_binary(&bytes, &kernel_name, &prefix) {
            Ok(s) => {
                let outcome = Outcome::Split {
                    wrappers: s.result.wrappers,
                    code_objects: s.code_objects.len(),
                    size_before: bytes.len() as u64,
                    size_after: s.result.bytes.len() as u64,
                };
                hosts.push(ImportedHost { kernel_name: kernel_name.clone(), code_objects: s.code_objects });
                pending.push(Pending { output, kernel_name, bytes: s.result.bytes, mode, outcome });
            }
            Err(SplitError::NoDeviceCode) => {
                // Only reached for ELF files: split_binary refuses anything else first.
                pending.push(Pending { output, kernel_name, bytes, mode, outcome: Outcome::Copied });
            }
            Err(e) => return Err(refused(e)),
        }
    }

    let kpack = req.out_root.join(KPACK_DIR);
    let mut archives = Vec::new();
    if !hosts.is_empty() {
        std::fs::create_dir_all(&kpack).map_err(|source| TreeError::Write { path: kpack.clone(), source })?;
        for plan in import::plan_archives(hosts, &prefix, false, req.compression).map_err(TreeError::Archive)? {
            let path = kpack.join(&plan.file_name);
            plan.writer.write(&path, &|_| {}).map_err(TreeError::Archive)?;
            archives.push((path, plan.writer.len()));
        }
    }
    let mut binaries = Vec::new();
    for p in pending {
        write_atomically(&p.output, &p.bytes, p.mode)?;
        binaries.push(BinaryReport { output: p.output, kernel_name: p.kernel_name, outcome: p.outcome });
    }
    Ok(SplitReport { binaries, archives })
}

/// Writes through a temporary name in the same directory, with the input's permissions.
fn write_atomically(path: &Path, bytes: &[u8], mode: u32) -> Result<(), TreeError> {
    let fail = |source| TreeError::Write { path: path.to_path_buf(), source };
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(fail)?;
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = dir.join(format!(".{name}.split{}", std::process::id()));
    let result = std::fs::write(&tmp, bytes)
        .and_then(|_| std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode & 0o7777)))
        .and_then(|_| std::fs::rename(&tmp, path));
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.map_err(fail)
}
