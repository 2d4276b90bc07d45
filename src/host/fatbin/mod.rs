//! Fat host binaries read: the code objects of a binary's `.hip_fatbin` offload bundles, found
//! without loading the device code ([`HostFile`], the index), seen as an archive for the mount
//! ([`open_fat_archive`]), and the naming that importing and splitting share.
//!
//! The naming rules are the reference splitter's, so archives made from these code objects are
//! the ones a split binary looks for:
//! - key `<kernel_name>#<i>`, where `i` counts one binary's code objects *per arch*, in bundle
//!   order (with one bundle per translation unit this equals the wrapper index the runtime
//!   passes);
//! - `kernel_name` is the binary's path relative to the install root, `/`-separated;
//! - archives live in `<root>/.kpack/`, one per arch named `<prefix>_<arch>.kpack` (or a single
//!   multi-arch `<prefix>.kpack`), so the search path written into the binary is `../` once per
//!   directory level of `kernel_name`, then `.kpack/<prefix>_@GFXARCH@.kpack`.
//!
//! Writing archives is `tools::import`'s (and `split`'s), on top of these functions.

use std::fmt;
use std::path::{Component, Path};

use crate::host::bundle::{self, BundleError};
use crate::host::elf::{self, ElfFile};
use crate::host::hipk;
use crate::names;

mod fat_archive;
mod host_file;
pub use fat_archive::open_fat_archive;
pub use host_file::{HostFile, is_elf_file};

/// Directory, at the install root, that holds the archives.
pub const KPACK_DIR: &str = ".kpack";
/// Suffix of the metadata files `--emit-metadata` writes.
pub const METADATA_SUFFIX: &str = ".hipk.msgpack";

/// Why a host binary cannot be imported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImportError {
    /// Not a readable ELF file.
    NotElf(String),
    /// The ELF file has no `.hip_fatbin` section.
    NoDeviceCode,
    /// The binary already carries a `.rocm_kpack_ref` marker: its device code was moved out.
    AlreadySplit,
    /// The section's bundles are malformed.
    Bundle(BundleError),
    /// A bundle names a target that cannot be used in a file name.
    BadArch { triple: String, reason: String },
}

impl fmt::Display for ImportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ImportError::NotElf(why) => write!(f, "not an ELF host binary: {why}"),
            ImportError::NoDeviceCode => write!(
                f,
                "has no {} section (no device code to import)",
                elf::HIP_FATBIN_SECTION
            ),
            ImportError::AlreadySplit => write!(
                f,
                "already split: it has a {} marker and its device code lives in kpack archives",
                elf::KPACK_REF_SECTION
            ),
            ImportError::Bundle(e) => write!(f, "{}: {e}", elf::HIP_FATBIN_SECTION),
            ImportError::BadArch { triple, reason } => {
                write!(
                    f,
                    "bundle triple {triple:?} names a target that cannot be a file name: {reason}"
                )
            }
        }
    }
}

impl std::error::Error for ImportError {}

/// One device code object of a host binary, with its archive key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CodeObject {
    /// `<kernel_name>#<index>`.
    pub key: String,
    pub arch: String,
    /// The bundler triple it came from.
    pub triple: String,
    /// Its position among this binary's code objects for `arch`.
    pub index: u32,
    pub data: Vec<u8>,
}

/// Keys the code objects of one `.hip_fatbin` section: per-arch counters in bundle order.
pub fn code_objects(kernel_name: &str, fatbin: &[u8]) -> Result<Vec<CodeObject>, ImportError> {
    let mut out = Vec::new();
    visit_code_objects(
        kernel_name,
        fatbin,
        |co| {
            out.push(co);
            Ok::<(), std::convert::Infallible>(())
        },
        &|_| {},
    )
    .map_err(|e| match e {
        StreamError::Import(e) => e,
        StreamError::Read(e) => ImportError::NotElf(e.to_string()),
        StreamError::Visit(never) => match never {},
    })?;
    Ok(out)
}

/// Why visiting a binary's code objects stopped.
#[derive(Debug)]
pub enum StreamError<E> {
    Import(ImportError),
    /// Reading the file failed.
    Read(std::io::Error),
    /// The visitor's own error.
    Visit(E),
}

/// Visits the code objects of a `.hip_fatbin` section in order, keyed as [`code_objects`] keys
/// them, holding one code object (or one decompressed CCOB bundle) at a time. `progress`
/// receives the section bytes of each bundle once its code objects were visited.
pub fn visit_code_objects<S, E>(
    kernel_name: &str,
    fatbin: &S,
    mut visit: impl FnMut(CodeObject) -> Result<(), E>,
    progress: &dyn Fn(u64),
) -> Result<(), StreamError<E>>
where
    S: bundle::Source + ?Sized,
{
    let mut counters = Counters::default();
    bundle::walk_fatbin(fatbin, |event| {
        let e = match event {
            bundle::Event::Entry(e) => e,
            bundle::Event::End(head) => {
                progress(head.len);
                return Ok(());
            }
        };
        let index = counters
            .next(&e.arch, &e.triple)
            .map_err(StreamError::Import)?;
        visit(CodeObject {
            key: hipk::lookup_key(kernel_name, index),
            arch: e.arch,
            triple: e.triple,
            index,
            data: e.data.into_owned(),
        })
        .map_err(StreamError::Visit)
    })
    .map_err(|e| match e {
        bundle::WalkError::Bundle(e) => StreamError::Import(ImportError::Bundle(e)),
        bundle::WalkError::Read(e) => StreamError::Read(e),
        bundle::WalkError::Visit(e) => e,
    })
}

/// Numbers one binary's code objects per arch, in bundle order, checking each arch.
#[derive(Default)]
struct Counters(Vec<(String, u32)>);

impl Counters {
    /// The index of the next code object for `arch` (from `triple`).
    fn next(&mut self, arch: &str, triple: &str) -> Result<u32, ImportError> {
        // The arch names an archive file and a tree's `<arch>.hsaco`: the same rule as `pack`.
        if let Err(reason) = names::check_arch(arch) {
            return Err(ImportError::BadArch {
                triple: triple.to_owned(),
                reason,
            });
        }
        Ok(match self.0.iter_mut().find(|(a, _)| a == arch) {
            Some((_, n)) => {
                *n += 1;
                *n
            }
            None => {
                self.0.push((arch.to_owned(), 0));
                0
            }
        })
    }
}

/// One code object of a fat binary, keyed as [`visit_code_objects`] keys it, with where it
/// lies instead of its bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexedCodeObject {
    pub key: String,
    pub arch: String,
    pub triple: String,
    pub index: u32,
    pub size: u64,
    /// The bundle it is in, and its offset in that bundle's uncompressed form.
    pub bundle: bundle::BundleHead,
    pub offset: u64,
}

/// The code objects of a `.hip_fatbin` section, keyed as [`visit_code_objects`] keys them,
/// found without reading them (see [`bundle::index_fatbin`]).
pub fn index_code_objects<S>(
    kernel_name: &str,
    fatbin: &S,
) -> Result<Vec<IndexedCodeObject>, StreamError<std::convert::Infallible>>
where
    S: bundle::Source + ?Sized,
{
    let located = bundle::index_fatbin(fatbin).map_err(|e| match e {
        bundle::WalkError::Bundle(e) => StreamError::Import(ImportError::Bundle(e)),
        bundle::WalkError::Read(e) => StreamError::Read(e),
        bundle::WalkError::Visit(never) => match never {},
    })?;
    let mut counters = Counters::default();
    located
        .into_iter()
        .map(|l| {
            let index = counters
                .next(&l.arch, &l.triple)
                .map_err(StreamError::Import)?;
            Ok(IndexedCodeObject {
                key: hipk::lookup_key(kernel_name, index),
                arch: l.arch,
                triple: l.triple,
                index,
                size: l.size,
                bundle: l.bundle,
                offset: l.offset,
            })
        })
        .collect()
}

/// [`index_code_objects`] of a host binary opened with [`HostFile`] (only its headers need
/// be read: [`HostFile::open_headers`]). Binaries already split are refused, as by
/// [`host_code_objects`].
pub fn index_host_code_objects(
    kernel_name: &str,
    host: &HostFile,
) -> Result<Vec<IndexedCodeObject>, StreamError<std::convert::Infallible>> {
    check_fat(host).map_err(StreamError::Import)?;
    match host.fatbin() {
        Some(range) => index_code_objects(kernel_name, &range),
        None => Ok(Vec::new()),
    }
}

/// What an ELF file is to the tools that read device code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostKind {
    /// A `.hip_fatbin` section with contents and no HIPK marker: its code objects are in it.
    Fat,
    /// A `.rocm_kpack_ref` marker: its code objects are in archives found through it.
    Hipk,
    /// A `.hip_fatbin` section without contents (`SHT_NOBITS`), as `objcopy --only-keep-debug`
    /// leaves it: a separated debug file, which holds no device code.
    SeparatedDebug,
    /// Neither a `.hip_fatbin` section nor a marker.
    NoDeviceCode,
}

impl HostKind {
    /// What the file is, for a message that says why it has no device code to read.
    pub fn describe(self) -> &'static str {
        match self {
            HostKind::Fat => "a fat host binary",
            HostKind::Hipk => "a HIPK host binary (its device code lives in kpack archives)",
            HostKind::SeparatedDebug => {
                "a separated debug file: its .hip_fatbin section has no contents (SHT_NOBITS)"
            }
            HostKind::NoDeviceCode => {
                "an ELF file without device code (no .hip_fatbin section, no .rocm_kpack_ref marker)"
            }
        }
    }
}

/// The kind of an ELF file from its bytes (only its headers and section-name table are looked
/// at, so an image from [`HostFile::open_tables`] will do).
pub fn host_kind(image: &[u8]) -> Result<HostKind, ImportError> {
    let file = ElfFile::parse(image).map_err(ImportError::NotElf)?;
    if file.section(elf::KPACK_REF_SECTION).is_some() {
        return Ok(HostKind::Hipk);
    }
    Ok(match file.section(elf::HIP_FATBIN_SECTION) {
        Some(s) if s.file_offset.is_none() => HostKind::SeparatedDebug,
        Some(_) => HostKind::Fat,
        None => HostKind::NoDeviceCode,
    })
}

/// Refuses a host binary that is not ELF, is already split, or has no `.hip_fatbin`.
fn check_fat(host: &HostFile) -> Result<(), ImportError> {
    match host_kind(host.image())? {
        HostKind::Hipk => Err(ImportError::AlreadySplit),
        HostKind::NoDeviceCode => Err(ImportError::NoDeviceCode),
        // A section without file contents holds no bundles.
        HostKind::Fat | HostKind::SeparatedDebug => Ok(()),
    }
}

/// Visits the code objects of a host binary opened with [`HostFile`], reading its device code
/// through positioned reads. Binaries already split are refused, as by [`host_code_objects`].
/// `progress` receives section bytes as bundles are read (see [`visit_code_objects`]).
pub fn visit_host_code_objects<E>(
    kernel_name: &str,
    host: &HostFile,
    visit: impl FnMut(CodeObject) -> Result<(), E>,
    progress: &dyn Fn(u64),
) -> Result<(), StreamError<E>> {
    check_fat(host).map_err(StreamError::Import)?;
    match host.fatbin() {
        Some(range) => visit_code_objects(kernel_name, &range, visit, progress),
        // A section without file contents holds no bundles.
        None => Ok(()),
    }
}

/// Reads the device code of an ELF host binary. Binaries already split are refused.
pub fn host_code_objects(
    kernel_name: &str,
    elf_bytes: &[u8],
) -> Result<Vec<CodeObject>, ImportError> {
    let file = ElfFile::parse(elf_bytes).map_err(ImportError::NotElf)?;
    if file.section(elf::KPACK_REF_SECTION).is_some() {
        return Err(ImportError::AlreadySplit);
    }
    let section = file
        .section(elf::HIP_FATBIN_SECTION)
        .ok_or(ImportError::NoDeviceCode)?;
    code_objects(kernel_name, section.data)
}

/// The `kernel_name` for a binary at `relative` (its path below the install root):
/// components joined by `/`. Absolute paths and `..` are refused.
pub fn kernel_name_from_relative(relative: &Path) -> Result<String, String> {
    let mut parts = Vec::new();
    for c in relative.components() {
        match c {
            Component::Normal(s) => parts.push(
                s.to_str()
                    .ok_or_else(|| format!("{}: path is not UTF-8", relative.display()))?,
            ),
            Component::CurDir => {}
            _ => return Err(format!("{}: not a path below the root", relative.display())),
        }
    }
    if parts.is_empty() {
        return Err(format!(
            "{:?}: names no file",
            relative.display().to_string()
        ));
    }
    Ok(parts.join("/"))
}

/// The `kernel_name` of `host` below the install root `root`. Reads the file system: the
/// directories of both are resolved through symlinks; the binary's own name is kept as given
/// (a symlinked library keeps the name it was asked for).
pub fn kernel_name_below(host: &Path, root: &Path) -> Result<String, String> {
    let root_abs = std::fs::canonicalize(root).map_err(|e| format!("{}: {e}", root.display()))?;
    let parent = host
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let parent_abs =
        std::fs::canonicalize(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
    let name = host
        .file_name()
        .ok_or_else(|| format!("{}: names no file", host.display()))?;
    let full = parent_abs.join(name);
    let rel = full.strip_prefix(&root_abs).map_err(|_| {
        format!(
            "{} is not below the root {}",
            host.display(),
            root.display()
        )
    })?;
    kernel_name_from_relative(rel)
}

/// The default archive prefix for a binary file name: the name up to its first `.`, without a
/// leading `lib` (`librocrand.so.1.1` → `rocrand`, `hipcc_app` → `hipcc_app`).
pub fn default_prefix(file_name: &str) -> String {
    let stem = file_name.split('.').next().unwrap_or(file_name);
    match stem.strip_prefix("lib") {
        Some(rest) if !rest.is_empty() => rest.to_owned(),
        _ => stem.to_owned(),
    }
}

/// Checks a user-supplied prefix: it becomes part of file names (a safe path component, see
/// [`names::check_component`]) and of the search path, where an `@` could form the
/// `@GFXARCH@` token, so `@` is refused too.
pub fn validate_prefix(prefix: &str) -> Result<(), String> {
    names::check_component(prefix).map_err(|why| format!("prefix {prefix:?} {why}"))?;
    if prefix.contains('@') {
        return Err(format!(
            "prefix {prefix:?} contains '@' (it could form the {} token)",
            hipk::GFXARCH_TOKEN
        ));
    }
    Ok(())
}

/// The archive file name: `<prefix>_<arch>.kpack`, or `<prefix>.kpack` for a multi-arch archive.
pub fn archive_file_name(prefix: &str, arch: Option<&str>) -> String {
    match arch {
        Some(a) => format!("{prefix}_{a}.kpack"),
        None => format!("{prefix}.kpack"),
    }
}

/// The search path a binary with this `kernel_name` carries: relative to the binary's
/// directory, up to the root, then into `.kpack/`. Per-arch archives use the `@GFXARCH@`
/// placeholder; a single archive is named directly.
pub fn search_path(kernel_name: &str, prefix: &str, single: bool) -> String {
    let depth = kernel_name.matches('/').count();
    let file = archive_file_name(
        prefix,
        if single {
            None
        } else {
            Some(hipk::GFXARCH_TOKEN)
        },
    );
    format!("{}{KPACK_DIR}/{file}", "../".repeat(depth))
}
