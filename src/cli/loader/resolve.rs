//! `kpack-fuse resolve`: shows, step by step, which paths, archives and targets the loader tries
//! for a HIPK host binary, and which code object it picks. The steps are the loader's own trace
//! events (the same ones `ROCM_KPACK_DEBUG` logs), so what is shown is what the library does.
//! Also what `load` (and, for HIPK binaries, `list` and `extract`) take from here: the host
//! binary and ISA arguments, reading a HIPK binary, and the arch list of `--gpu`.

use std::path::{Path, PathBuf};

use rocm_kpack::host::hipk::HipkHost;
use rocm_kpack::host::target_id;
use rocm_kpack::loader::{Event, LoadRequest, Loader, LoaderConfig, Recorder};

use crate::cli::exit::{CliError, CliResult, Exit};
use crate::cli::out::outln;

/// The arguments `resolve` and `load` share: the host binary and the device's ISA list.
#[derive(Debug, clap::Args)]
pub struct HostArgs {
    /// The HIPK host binary (executable or shared library).
    pub binary: PathBuf,
    /// Device ISA, e.g. gfx942:sramecc+:xnack- (with or without amdgcn-amd-amdhsa--). Given
    /// once, the list is [ISA, its generic ISA] as the HIP runtime builds it; repeat to pass an
    /// exact list instead. Named as in `mount --gpu`; `--arch` is its older spelling.
    #[arg(long = "gpu", alias = "arch", value_name = "ISA", required = true)]
    pub gpus: Vec<String>,
}

/// A host binary read for loading: its HIPK parts, the path the runtime would report for it, and
/// the arch list.
pub struct OpenedHost {
    pub host: HipkHost,
    pub binary: PathBuf,
    pub arches: Vec<String>,
}

impl OpenedHost {
    pub fn arch_refs(&self) -> Vec<Option<&str>> {
        self.arches.iter().map(|a| Some(a.as_str())).collect()
    }
}

impl HostArgs {
    pub fn open(&self) -> CliResult<OpenedHost> {
        Ok(OpenedHost {
            host: read_host(&self.binary)?,
            binary: runtime_path(&self.binary),
            arches: arch_list(&self.gpus),
        })
    }
}

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub host: HostArgs,
    /// Code-object index to resolve (default: every HIPK wrapper's index, or 0 without wrappers).
    #[arg(long, value_name = "N")]
    pub co: Option<u32>,
    /// Print one JSON document instead of text.
    #[arg(long)]
    pub json: bool,
}

/// The arch list for `--gpu` values: one value means the device list `[isa, generic(isa)]`,
/// several are used exactly as given.
pub fn arch_list(args: &[String]) -> Vec<String> {
    match args {
        [one] => target_id::device_arch_list(one),
        many => many.to_vec(),
    }
}

/// Reads a host binary's HIPK metadata and wrappers.
pub fn read_host(path: &Path) -> CliResult<HipkHost> {
    let bytes = std::fs::read(path).map_err(|e| CliError::io(Exit::Unreadable, path, &e))?;
    HipkHost::read(&bytes)
        .map_err(|e| CliError::new(Exit::BadFormat, format!("{}: {e}", path.display())))
}

/// The path the runtime would report for the binary: `/proc/self/maps` shows the resolved file.
pub fn runtime_path(path: &Path) -> PathBuf {
    std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf())
}

pub fn run(args: Args) -> CliResult {
    let opened = args.host.open()?;
    let arch_refs = opened.arch_refs();
    let OpenedHost {
        host,
        binary,
        arches,
    } = &opened;
    let cos = match args.co {
        Some(co) => vec![co],
        None => match host.hipk_code_objects() {
            v if v.is_empty() => vec![0],
            v => v,
        },
    };
    let loader = Loader::new(LoaderConfig::from_env());

    let mut results = Vec::new();
    let mut failure = None;
    for co in cos {
        let mut rec = Recorder::default();
        let request = LoadRequest {
            binary_path: binary,
            co_index: co,
            arch_list: &arch_refs,
        };
        let outcome =
            loader.load_code_object(|| Ok(host.metadata.clone()), &request, alloc, &mut rec);
        let outcome = outcome.map(|l| (l.data.len(), l.archive, l.target));
        results.push((co, rec.events, outcome));
    }

    if args.json {
        let code_objects: Vec<serde_json::Value> = results
            .iter()
            .map(|(co, events, outcome)| {
                let result = match outcome {
                    Ok((size, archive, target)) => serde_json::json!({
                        "ok": true, "size": size, "archive": archive.display().to_string(), "target": target,
                    }),
                    Err(e) => serde_json::json!({
                        "ok": false, "code": e.kind().code(), "error": e.kind().name(), "message": e.to_string(),
                    }),
                };
                serde_json::json!({
                    "co_index": co,
                    "lookup_key": host.metadata.lookup_key(*co),
                    "result": result,
                    "steps": events,
                })
            })
            .collect();
        let doc = serde_json::json!({
            "binary": binary.display().to_string(),
            "kernel_name": host.metadata.kernel_name,
            "search_paths": host.metadata.search_paths.iter().map(|p| p.to_string_lossy()).collect::<Vec<_>>(),
            "arch_list": arches,
            "pins": pins_hex(host),
            "wrappers": host.wrappers,
            "code_objects": code_objects,
        });
        outln!(
            "{}",
            serde_json::to_string_pretty(&doc).expect("JSON values always serialise")
        )?;
    } else {
        outln!("binary:       {}", binary.display())?;
        outln!("kernel_name:  {}", host.metadata.kernel_name)?;
        for p in &host.metadata.search_paths {
            outln!("search path:  {}", p.to_string_lossy())?;
        }
        match pins_hex(host) {
            None => outln!("pins:         none (any archive on the search path is used)")?,
            Some(pins) => {
                for p in pins {
                    outln!("pin:          toc blake3 {p}")?;
                }
            }
        }
        if host.wrappers.is_empty() {
            outln!(
                "wrappers:     none ({} not found)",
                rocm_kpack::host::elf::FATBIN_SEGMENT_SECTION
            )?;
        }
        for w in &host.wrappers {
            outln!(
                "wrapper {}:    {} version {} co {}",
                w.index,
                w.magic_name(),
                w.version,
                w.co_index
            )?;
        }
        outln!("arch list:    {}", arches.join(", "))?;
        for (co, events, outcome) in &results {
            outln!()?;
            outln!("code object {co} (key {}):", host.metadata.lookup_key(*co))?;
            for e in events {
                if let Some(line) = describe(e) {
                    outln!("  {line}")?;
                }
            }
            match outcome {
                Ok((size, archive, target)) => {
                    outln!("  => {target} from {} ({size} bytes)", archive.display())?
                }
                Err(e) => outln!("  => {} ({}): {e}", e.kind().name(), e.kind().code())?,
            }
        }
    }
    for (_, _, outcome) in results {
        if let Err(e) = outcome {
            failure = Some(e);
        }
    }
    match failure {
        Some(e) => Err(e.into()),
        None => Ok(()),
    }
}

/// The binary's pins (TOC digests) in hex, `None` when it has none.
fn pins_hex(host: &HipkHost) -> Option<Vec<String>> {
    let pins = host.metadata.pins.as_ref()?;
    Some(
        pins.iter()
            .map(|p| blake3::Hash::from(*p).to_hex().to_string())
            .collect(),
    )
}

/// A buffer for a decoded code object; `None` when the size cannot be allocated.
pub fn alloc(n: usize) -> Option<Vec<u8>> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).ok()?;
    v.resize(n, 0);
    Some(v)
}

/// One human-readable line per loader step (the parsed-metadata step is shown in the header).
fn describe(event: &Event) -> Option<String> {
    Some(match event {
        Event::MetadataParsed { .. } | Event::CacheCreated { .. } => return None,
        Event::Disabled => "ROCM_KPACK_DISABLE is set: loading is disabled".into(),
        Event::MetadataInvalid { reason } => format!("bad metadata: {reason}"),
        Event::UsingOverride { paths } => {
            let paths = crate::cli::plural::count_of(*paths, "path is", "paths are");
            format!("ROCM_KPACK_PATH is set: only its {paths} tried")
        }
        Event::PrependingPrefix { paths } => format!(
            "ROCM_KPACK_PATH_PREFIX: {} first",
            crate::cli::plural::count_of(*paths, "path", "paths")
        ),
        Event::ExpandedPattern { pattern, path } => format!("path    {path}   (from {pattern})"),
        Event::UnsafeTarget { pattern, target } => {
            format!("skip    arch {target:?}: not a plain path component (pattern {pattern})")
        }
        Event::DirectPath { original, resolved } => {
            format!("path    {resolved}   (from {original})")
        }
        Event::ArchiveMissing { path, reason } => format!("skip    {path}: {reason}"),
        Event::ArchiveOpenFailed { path, reason, .. } => format!("skip    {path}: {reason}"),
        Event::ArchiveOpened {
            path,
            architectures,
        } => {
            format!("open    {path}   gfx_arches [{}]", architectures.join(", "))
        }
        Event::ArchiveReused { path } => format!("reuse   {path}"),
        Event::PinMatched { path, .. } => {
            format!("pinned  {path}: its TOC digest is one of the pins")
        }
        Event::ArchiveNotPinned { path, toc_blake3 } => {
            format!("skip    {path}: not pinned by the binary (toc blake3 {toc_blake3})")
        }
        Event::NoValidArchives { paths } if *paths == 1 => {
            "the one path is not a usable archive".into()
        }
        Event::NoValidArchives { paths } => {
            format!("none of the {paths} paths is a usable archive")
        }
        Event::TryingArchitecture { arch: a } => {
            format!(
                "arch    {a}: targets {}",
                target_id::compatible_targets(a).join(", ")
            )
        }
        Event::Candidate { archive, target } => format!("  try   {target} in {archive}"),
        Event::KernelFound { size } => format!("  found {size} bytes"),
        Event::KernelMissing { reason, .. } => format!("  miss  {reason}"),
        Event::NotInAnyArchive { last_error } => {
            format!("not in any compatible archive (last error {last_error})")
        }
        Event::NoCompatibleArchive => "no archive lists a compatible target".into(),
        Event::Loaded { .. } => return None,
    })
}
