//! `kpack-fuse pack`: a tree laid out as `<binary key>/<arch>.hsaco` (the layout the mount
//! shows), or the kernels a `--manifest` lists in order, becomes one archive; with
//! `--from-fatbin`, ROCm host binaries become per-arch archives. `manifest.rs` reads
//! `--manifest`; `--from-fatbin` is `cli/import/`.

mod manifest;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use rocm_kpack::archive::codec;
use rocm_kpack::tools::pack_pipeline::{self, ArchiveHead, PackFilesError};
use rocm_kpack::{ArchiveWriter, Compression, names};

use crate::cli::exit::{CliError, CliResult, Exit};
use crate::cli::import::{self, ImportRequest};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CompressionArg {
    /// One zstd frame per kernel (`zstd-per-kernel`).
    Zstd,
    /// Kernels stored as they are (`none`).
    None,
}

/// Options shared by every command that writes archives.
#[derive(Debug, Clone, clap::Args)]
pub struct CompressionArgs {
    /// How kernels are stored.
    #[arg(long, value_enum, default_value_t = CompressionArg::Zstd)]
    pub compression: CompressionArg,
    /// zstd level, 1 (fastest) to 22 (smallest).
    #[arg(long, default_value_t = codec::DEFAULT_LEVEL,
          value_parser = clap::value_parser!(i32).range(codec::MIN_LEVEL as i64..=codec::MAX_LEVEL as i64))]
    pub level: i32,
    /// Write exactly what the reference writer writes: no frame positions and no BLAKE3 digests
    /// in the TOC entries' metadata.
    #[arg(long)]
    pub reference_layout: bool,
}

impl CompressionArgs {
    pub fn compression(&self) -> Compression {
        match self.compression {
            CompressionArg::Zstd => Compression::Zstd { level: self.level },
            CompressionArg::None => Compression::None,
        }
    }
}

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The tree to pack: <binary key>/<arch>.hsaco files (symlinks are ignored).
    #[arg(
        required_unless_present_any = ["from_fatbin", "manifest"],
        conflicts_with_all = ["from_fatbin", "manifest"]
    )]
    pub dir: Option<PathBuf>,
    /// Pack the kernels this file lists, one `key<TAB>arch<TAB>path` per line (paths relative to
    /// the file), in its order: ordinals and the TOC's key and arch order follow the lines.
    #[arg(long, value_name = "FILE", conflicts_with = "from_fatbin")]
    pub manifest: Option<PathBuf>,
    /// Output: the archive file (tree mode) or a directory (with --from-fatbin).
    #[arg(short, long)]
    pub output: PathBuf,
    #[command(flatten)]
    pub compression: CompressionArgs,
    /// The TOC's group_name (default: the output file name without .kpack).
    #[arg(long)]
    pub group: Option<String>,
    /// The TOC's gfx_arch_family (default: the arch when there is one, else "mixed").
    #[arg(long)]
    pub family: Option<String>,
    /// The archive's arch list, in order (repeatable; default: the tree's arches, sorted, or the
    /// manifest's in order of first appearance). It must name every arch packed.
    #[arg(long = "arch", value_name = "ARCH")]
    pub arches: Vec<String>,
    /// Compression threads (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Read device code from the .hip_fatbin section of these ROCm host binaries instead.
    #[arg(long = "from-fatbin", value_name = "HOST", num_args = 1..)]
    pub from_fatbin: Vec<PathBuf>,
    /// With --from-fatbin: archive name prefix (<prefix>_<arch>.kpack).
    #[arg(long, requires = "from_fatbin")]
    pub prefix: Option<String>,
    /// With --from-fatbin: the install root kernel names are relative to.
    #[arg(long, requires = "from_fatbin")]
    pub root: Option<PathBuf>,
    /// With --from-fatbin: write one multi-arch archive instead of one per arch.
    #[arg(long, requires = "from_fatbin")]
    pub single: bool,
    /// With --from-fatbin: also write <binary>.hipk.msgpack, the HIPK metadata (pinned to the
    /// archives written, unless --no-pins).
    #[arg(long, requires = "from_fatbin")]
    pub emit_metadata: bool,
    /// With --emit-metadata: leave the pins out (the reference tooling's exact metadata).
    #[arg(long, requires = "emit_metadata")]
    pub no_pins: bool,
}

pub fn run(args: Args) -> CliResult {
    if !args.from_fatbin.is_empty() {
        return import::run(ImportRequest {
            hosts: args.from_fatbin,
            out_dir: args.output,
            prefix: args.prefix,
            root: args.root,
            single: args.single,
            emit_metadata: args.emit_metadata,
            pins: !args.no_pins,
            compression: args.compression.compression(),
            reference_layout: args.compression.reference_layout,
        });
    }
    // The kernels in packing order, and the arches present (the default arch list).
    let (source, listed, present): (PathBuf, Vec<(String, String, PathBuf)>, Vec<String>) =
        match &args.manifest {
            Some(manifest) => {
                let lines = manifest::read(manifest)?;
                let mut present: Vec<String> = Vec::new();
                for l in &lines {
                    if !present.contains(&l.arch) {
                        present.push(l.arch.clone());
                    }
                }
                let listed = lines.into_iter().map(|l| (l.key, l.arch, l.path)).collect();
                (manifest.clone(), listed, present)
            }
            None => {
                let dir = args.dir.clone().expect("clap requires DIR or --manifest");
                let tree = scan_tree(&dir)?;
                let present: BTreeSet<&str> = tree
                    .values()
                    .flat_map(|m| m.keys().map(String::as_str))
                    .collect();
                let present = present.into_iter().map(str::to_owned).collect();
                let listed = tree
                    .into_iter()
                    .flat_map(|(key, by_arch)| {
                        by_arch
                            .into_iter()
                            .map(move |(arch, path)| (key.clone(), arch, path))
                    })
                    .collect();
                (dir, listed, present)
            }
        };
    let arches: Vec<String> = if args.arches.is_empty() {
        present.clone()
    } else {
        let missing: Vec<&str> = present
            .iter()
            .map(String::as_str)
            .filter(|a| !args.arches.iter().any(|x| x == a))
            .collect();
        if !missing.is_empty() {
            return Err(CliError::new(
                Exit::Usage,
                format!(
                    "--arch does not name these arches found in {}: {}",
                    source.display(),
                    missing.join(", ")
                ),
            ));
        }
        args.arches.clone()
    };
    let group = args.group.clone().unwrap_or_else(|| {
        let name = args
            .output
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        name.strip_suffix(".kpack").unwrap_or(&name).to_owned()
    });
    let family = args
        .family
        .clone()
        .unwrap_or_else(|| match arches.as_slice() {
            [one] => one.clone(),
            _ => "mixed".to_owned(),
        });
    let compression = args.compression.compression();
    // Invalid TOC fields are refused before anything is read.
    ArchiveWriter::new(group.clone(), family.clone(), arches.clone(), compression)?;
    // A tree packs its keys sorted and each key's arches in arch-list order; a manifest packs
    // in its own order.
    let kernels: Vec<(String, String, PathBuf)> = if args.manifest.is_some() {
        listed
    } else {
        let mut listed = listed;
        let rank = |a: &str| arches.iter().position(|x| x == a);
        listed.sort_by(|x, y| (&x.0, rank(&x.1)).cmp(&(&y.0, rank(&y.1))));
        listed
    };
    // Each file with its size: the progress bar's total, and what the pipeline budgets for it.
    let mut total = 0u64;
    let mut sized = Vec::with_capacity(kernels.len());
    for (key, arch, path) in kernels {
        let size = std::fs::metadata(&path)
            .map_err(|e| CliError::io(Exit::Unreadable, &path, &e))?
            .len();
        total += size;
        sized.push((key, arch, (path, size)));
    }
    let head = ArchiveHead {
        group_name: group,
        gfx_arch_family: family,
        gfx_arches: arches,
        compression,
        reference_layout: args.compression.reference_layout,
    };
    // Reading, compressing, hashing and writing overlap (rocm_kpack::tools::pack_pipeline).
    let bar = crate::cli::progress::bar(total);
    let written = pack_pipeline::pack_files(
        &args.output,
        &head,
        args.threads,
        &sized,
        |(_, size): &(PathBuf, u64)| *size,
        |(path, size): &(PathBuf, u64), spares: &pack_pipeline::Spares| {
            read_into_spare(path, *size, spares)
                .map_err(|e| CliError::io(Exit::Unreadable, path, &e))
        },
        &|n| {
            if let Some(b) = &bar {
                b.inc(n)
            }
        },
    )
    .map_err(|e| match e {
        PackFilesError::Read(e) => e,
        PackFilesError::Write(e) => CliError::new(Exit::Output, e.to_string()),
    });
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    let written = written?;
    crate::cli::out::outln!(
        "packed {} ({}) from {} into {} ({})",
        crate::cli::plural::count_of(sized.len(), "kernel", "kernels"),
        crate::cli::plural::count(total, "byte", "bytes"),
        source.display(),
        args.output.display(),
        crate::cli::plural::count(written, "byte", "bytes")
    )
}

/// Reads a whole file, `size` bytes when it was listed, into a spent pipeline buffer (no page
/// faults, unlike a fresh one).
fn read_into_spare(
    path: &Path,
    size: u64,
    spares: &pack_pipeline::Spares,
) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut file = std::fs::File::open(path)?;
    let len = usize::try_from(size).unwrap_or(usize::MAX);
    let mut buf = spares
        .take(len)
        .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::OutOfMemory))?;
    // A file that changed size since it was listed is still read whole, as it is now.
    file.read_to_end(&mut buf)?;
    Ok(buf)
}

/// key -> arch -> file. Keys are the parent directories of `.hsaco` files, relative to `root`.
type Tree = BTreeMap<String, BTreeMap<String, PathBuf>>;

fn scan_tree(root: &Path) -> CliResult<Tree> {
    let meta = std::fs::metadata(root).map_err(|e| CliError::io(Exit::Unreadable, root, &e))?;
    if !meta.is_dir() {
        return Err(CliError::new(
            Exit::Usage,
            format!("{}: not a directory", root.display()),
        ));
    }
    let mut tree = Tree::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let entries =
            std::fs::read_dir(&dir).map_err(|e| CliError::io(Exit::Unreadable, &dir, &e))?;
        for entry in entries {
            let entry = entry.map_err(|e| CliError::io(Exit::Unreadable, &dir, &e))?;
            let path = entry.path();
            let ft = entry
                .file_type()
                .map_err(|e| CliError::io(Exit::Unreadable, &path, &e))?;
            if ft.is_symlink() {
                continue;
            }
            if ft.is_dir() {
                stack.push(path);
                continue;
            }
            let bad =
                |why: &str| CliError::new(Exit::BadFormat, format!("{}: {why}", path.display()));
            let name = entry.file_name();
            let name = name.to_str().ok_or_else(|| bad("file name is not UTF-8"))?;
            let arch = names::arch_from_hsaco_name(name).ok_or_else(|| {
                bad("unexpected file: the tree must hold only <binary key>/<arch>.hsaco files")
            })?;
            let rel = dir.strip_prefix(root).expect("walk stays under root");
            let key = rel
                .to_str()
                .ok_or_else(|| bad("path is not UTF-8"))?
                .to_owned();
            if key.is_empty() {
                return Err(bad(
                    "a .hsaco file directly in the tree's root has no binary key",
                ));
            }
            names::key_components(&key).map_err(|e| bad(&e))?;
            names::check_arch(arch).map_err(|e| bad(&e))?;
            tree.entry(key)
                .or_default()
                .insert(arch.to_owned(), path.clone());
        }
    }
    Ok(tree)
}
