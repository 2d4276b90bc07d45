//! What `list` and `extract` were given: their shared arguments ([`InputArgs`]), and an
//! archive or a host binary whose code objects they show, told apart by the rules every input
//! follows (`rocm_kpack::host::input_kind`). A fat binary's code objects are found in its
//! `.hip_fatbin` (keyed as `pack --from-fatbin` keys them); a HIPK binary's are what the loader
//! finds through its marker. Any other ELF file is refused with one line saying what it is.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rocm_kpack::Archive;
use rocm_kpack::host::fatbin::{self, HostFile, IndexedCodeObject, StreamError};
use rocm_kpack::host::hipk::{self, HipkHost};
use rocm_kpack::host::input_kind::{InputKind, input_kind};
use rocm_kpack::loader::{Expansion, LoadRequest, Loader, LoaderConfig, Silent};

use crate::cli::exit::{CliError, CliResult, Exit};
use crate::cli::remote_args::RemoteArgs;

/// The arguments of `list` and `extract`: the file, then the command's own arguments (`T`),
/// then how a host binary is read and the network flags of a remote archive.
#[derive(Debug, clap::Args)]
pub struct InputArgs<T: clap::Args> {
    /// The archive, or a host binary: a fat binary (the code objects of its offload bundles)
    /// or a HIPK binary (what the loader finds for each code-object index).
    #[arg(value_name = "FILE")]
    pub archive: PathBuf,
    #[command(flatten)]
    pub command: T,
    /// Fat binary: its kernel name is its path below ROOT, as with `pack --from-fatbin --root`
    /// (default: its file name).
    #[arg(long)]
    pub root: Option<PathBuf>,
    /// HIPK binary: only the code objects the loader picks for this device ISA (one --gpu is
    /// [ISA, its generic ISA]; repeat to pass an exact list). oci:// artifact: only the layers
    /// with code for this GPU (repeatable; auto: this node's GPUs).
    #[arg(long = "gpu", value_name = "ISA")]
    pub gpus: Vec<String>,
    #[command(flatten)]
    pub remote: RemoteArgs,
}

impl<T: clap::Args> InputArgs<T> {
    /// What the file is, with `--root` and `--gpu` refused where they do not apply.
    pub fn input(&self) -> CliResult<Input> {
        let path = &self.archive;
        let remote = crate::remote::is_remote(&path.to_string_lossy());
        let input = detect(path, remote, self.root.as_deref())?;
        // For an oci:// artifact, --gpu chooses its layers (`oci::select`).
        let oci = crate::oci::is_oci(&path.to_string_lossy());
        check_flags(
            path,
            &input,
            self.root.is_some(),
            !self.gpus.is_empty() && !oci,
        )?;
        Ok(input)
    }
}

/// An input of `list` or `extract`.
pub enum Input {
    Archive,
    /// A fat binary, opened with only its headers read, and its kernel name.
    Fat {
        host: HostFile,
        kernel_name: String,
    },
    /// A HIPK binary and the path the runtime would report for it.
    Hipk {
        host: HipkHost,
        binary: PathBuf,
    },
}

/// Tells what `path` is, by the rules every input follows ([`input_kind`]): anything but a
/// local ELF file is an archive (a remote one, or a file the archive reader then accepts or
/// refuses with its own message). `root` names a fat binary's kernel name as
/// `pack --from-fatbin --root` does.
fn detect(path: &Path, remote: bool, root: Option<&Path>) -> CliResult<Input> {
    if remote {
        return Ok(Input::Archive);
    }
    let kind = input_kind(path).map_err(|e| CliError::io(Exit::Unreadable, path, &e))?;
    match kind {
        InputKind::Directory | InputKind::Archive | InputKind::Other => Ok(Input::Archive),
        InputKind::FatBinary(host) => Ok(Input::Fat {
            host,
            kernel_name: crate::cli::import::kernel_name_for(path, root)?,
        }),
        InputKind::HipkBinary(_) => Ok(Input::Hipk {
            host: crate::cli::loader::resolve::read_host(path)?,
            binary: crate::cli::loader::resolve::runtime_path(path),
        }),
        InputKind::OtherElf(Ok(kind)) => Err(CliError::new(
            Exit::BadFormat,
            format!(
                "{}: {}; neither a kpack archive nor a host binary with device code",
                path.display(),
                kind.describe()
            ),
        )),
        InputKind::OtherElf(Err(e)) => Err(CliError::new(
            Exit::BadFormat,
            format!("{}: {e}", path.display()),
        )),
    }
}

/// Refuses flags that do nothing for this input: `--root` names a fat binary's code objects,
/// `--gpu` picks among a HIPK binary's archives.
fn check_flags(path: &Path, input: &Input, root: bool, gpus: bool) -> CliResult {
    let what = match input {
        Input::Archive => "an archive",
        Input::Fat { .. } => "a fat binary",
        Input::Hipk { .. } => "a HIPK binary",
    };
    let misplaced = match input {
        _ if root && !matches!(input, Input::Fat { .. }) => Some("--root (for fat binaries)"),
        _ if gpus && !matches!(input, Input::Hipk { .. }) => Some("--gpu (for HIPK binaries)"),
        _ => None,
    };
    match misplaced {
        Some(flag) => Err(CliError::new(
            Exit::Usage,
            format!("{}: is {what}; {flag} does not apply", path.display()),
        )),
        None => Ok(()),
    }
}

/// The code objects of a fat binary, without reading them.
pub fn fat_index(
    path: &Path,
    host: &HostFile,
    kernel_name: &str,
) -> CliResult<Vec<IndexedCodeObject>> {
    fatbin::index_host_code_objects(kernel_name, host).map_err(|e| import_error(path, e))
}

/// A failure reading a fat binary's device code, as `pack --from-fatbin` reports it.
pub fn import_error<E: Into<CliError>>(path: &Path, e: StreamError<E>) -> CliError {
    match e {
        StreamError::Fatbin(e) => {
            CliError::new(Exit::BadFormat, format!("{}: {e}", path.display()))
        }
        StreamError::Read(e) => CliError::io(Exit::Unreadable, path, &e),
        StreamError::Visit(e) => e.into(),
    }
}

/// One code object of a HIPK binary as the loader finds it.
pub struct HipkRow {
    pub index: u32,
    pub key: String,
    /// The target it is stored for; `None` when nothing was found.
    pub arch: Option<String>,
    pub found: Result<Found, String>,
}

pub struct Found {
    pub path: PathBuf,
    pub archive: Arc<Archive>,
    pub size: u64,
}

/// What the loader finds for each code-object index of a HIPK binary: its HIPK wrappers'
/// indices (or, without wrappers, every index its archives hold for it). Without `gpus`,
/// every (archive, arch) on its search paths that holds the key, in search order; with them,
/// the one code object the loader picks for that device, as `kpack_load_code_object` picks it.
pub fn hipk_rows(host: &HipkHost, binary: &Path, gpus: &[String]) -> CliResult<Vec<HipkRow>> {
    let meta = &host.metadata;
    let loader = Loader::new(LoaderConfig::from_env());
    let arches = crate::cli::loader::resolve::arch_list(gpus);
    let arch_refs: Vec<Option<&str>> = arches.iter().map(|a| Some(a.as_str())).collect();
    let expansion = if gpus.is_empty() {
        Expansion::Existing
    } else {
        Expansion::Targets(&arch_refs)
    };
    let paths = loader.search_paths(meta, binary, expansion, &mut Silent);
    let mut opened = loader
        .open_archives(&paths, meta.pins.as_deref(), &mut Silent)
        .archives;
    // The loader keeps a file reached twice; it is listed once.
    let mut seen = std::collections::HashSet::new();
    opened.retain(|(p, _)| seen.insert(p.clone()));
    let mut indices = host.hipk_code_objects();
    if indices.is_empty() {
        for (_, a) in &opened {
            indices.extend(
                a.entries()
                    .filter_map(|(key, _)| hipk::split_lookup_key(key))
                    .filter(|(name, _)| *name == meta.kernel_name)
                    .map(|(_, i)| i),
            );
        }
    }
    indices.sort_unstable();
    indices.dedup();
    let mut rows = Vec::new();
    for index in indices {
        let key = meta.lookup_key(index);
        let before = rows.len();
        if gpus.is_empty() {
            for (path, a) in &opened {
                for (k, entry) in a.entries().filter(|(k, _)| *k == key) {
                    rows.push(HipkRow {
                        index,
                        key: k.to_owned(),
                        arch: Some(entry.arch.to_owned()),
                        found: a
                            .locate(k, entry.arch)
                            .map(|r| Found {
                                path: path.clone(),
                                archive: Arc::clone(a),
                                size: r.size,
                            })
                            .map_err(|e| e.to_string()),
                    });
                }
            }
        } else {
            let request = LoadRequest {
                binary_path: binary,
                co_index: index,
                arch_list: &arch_refs,
            };
            let loaded = loader.load_code_object(
                || Ok(meta.clone()),
                &request,
                |n| Some(vec![0u8; n]),
                &mut Silent,
            );
            // The loader opened its archive through its cache, which hands back the same one.
            let picked = loaded.map(|l| {
                let archive = loader.cache().get_or_open(&l.archive, &mut Silent);
                (l, archive)
            });
            rows.push(match picked {
                Ok((l, Some((_, archive)))) => HipkRow {
                    index,
                    key: key.clone(),
                    arch: Some(l.target),
                    found: Ok(Found {
                        path: l.archive,
                        archive,
                        size: l.data.len() as u64,
                    }),
                },
                Ok((l, None)) => HipkRow {
                    index,
                    key: key.clone(),
                    arch: Some(l.target),
                    found: Err(format!("{}: no longer opens", l.archive.display())),
                },
                Err(e) => HipkRow {
                    index,
                    key: key.clone(),
                    arch: None,
                    found: Err(e.to_string()),
                },
            });
        }
        if rows.len() == before {
            rows.push(HipkRow {
                index,
                key,
                arch: None,
                found: Err(format!(
                    "in no archive on the search paths ({} candidate paths)",
                    paths.len()
                )),
            });
        }
    }
    Ok(rows)
}
