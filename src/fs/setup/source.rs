//! What a mount shows: one archive, a directory of archives, the archives of a HIPK host
//! binary, or the code objects of a fat host binary (read as an archive, see
//! `host::fatbin::open_fat_archive`). The kind is read from the source itself, by the rules
//! every input follows (`host::input_kind`), and everything is opened and checked here,
//! before anything is mounted, so that a bad source is refused with a precise message instead of
//! leaving a half-working mount.
//!
//! Several archives are merged in order into one tree; the first archive to provide a
//! (key, arch) wins. For a directory or a HIPK binary, a later duplicate and an archive that
//! does not open are warnings naming the files (errors with `strict`): one broken file in an
//! install's `.kpack/` should not hide all the others, but a careful caller can ask to be told.
//!
//! A HIPK binary's archives are found with the loader's own path rules (`loader::search`), so the
//! mount shows what `kpack_load_code_object` would search, and only that binary's keys
//! (`kernel_name#<i>`).

use std::collections::HashSet;
use std::fmt;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::archive::Archive;
use crate::error::{Error, ErrorKind};
use crate::host::fatbin;
use crate::host::hipk::{self, HipkHost};
use crate::host::input_kind::{InputKind, input_kind};
use crate::host::target_id;
use crate::loader::{Event, Expansion, Loader, LoaderConfig, Silent, Trace};

use super::limits;
use crate::fs::tree::Duplicate;
use crate::fs::{FsOptions, KpackFs};

/// The kind of source, detected from the file system.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceKind {
    Archive,
    Directory,
    HipkBinary,
    FatBinary,
}

impl fmt::Display for SourceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SourceKind::Archive => "archive",
            SourceKind::Directory => "directory of archives",
            SourceKind::HipkBinary => "HIPK host binary",
            SourceKind::FatBinary => "fat host binary",
        })
    }
}

/// Why a source cannot be mounted; the class decides the exit code. An error of the core is
/// passed on with its own kind, which the caller classifies as it classifies every core error
/// (the CLI: `exit_for`), rather than being classified a second way here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceErrorKind {
    /// An archive did not open; the core's reason.
    Core(ErrorKind),
    /// Missing, unreadable, or an I/O error.
    Unreadable,
    /// Not a kpack archive / ELF / directory, corrupt, or (strict) a conflict.
    BadFormat,
    /// No archive to show (an empty directory, a binary whose search paths find nothing).
    NotFound,
    /// The process cannot hold the archives open (open-file limit).
    Resources,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceError {
    pub kind: SourceErrorKind,
    pub message: String,
}

impl SourceError {
    fn new(kind: SourceErrorKind, message: impl Into<String>) -> SourceError {
        SourceError {
            kind,
            message: message.into(),
        }
    }

    /// A core error while opening `path`, with its kind.
    fn archive(path: &Path, e: &Error) -> SourceError {
        let kind = SourceErrorKind::Core(e.kind());
        let text = e.to_string();
        // Core messages usually start with the path already.
        let message = if text.contains(&path.display().to_string()) {
            text
        } else {
            format!("{}: {text}", path.display())
        };
        SourceError::new(kind, message)
    }
}

impl fmt::Display for SourceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for SourceError {}

/// How to read a source.
#[derive(Debug, Clone, Default)]
pub struct SourceOptions {
    /// Refuse duplicates and archives that do not open (or, for a HIPK binary with pins, that
    /// it does not pin), instead of warning.
    pub strict: bool,
    /// Show a HIPK binary's unpinned archives too (`--no-pins`).
    pub no_pins: bool,
    /// Device ISAs given on the command line (`--gpu`): a HIPK binary's `@GFXARCH@` patterns
    /// expand for these as the loader expands them. Empty: every existing file that fits.
    pub gpus: Vec<String>,
    /// `ROCM_KPACK_PATH` / `ROCM_KPACK_PATH_PREFIX`, for HIPK binaries.
    pub loader: LoaderConfig,
    /// File descriptors the mount needs besides the archives (FUSE channels, logs), counted
    /// when checking that the open-file limit holds every archive.
    pub extra_fds: u64,
}

/// A source, opened: the archives to merge, in order, and which of their keys to show.
#[derive(Debug)]
pub struct Source {
    pub kind: SourceKind,
    /// The source as shown in `/proc/mounts` (its absolute path).
    pub path: PathBuf,
    pub archives: Vec<Arc<Archive>>,
    /// For a HIPK binary, its `kernel_name`: only keys `kernel_name#<digits>` are shown.
    pub kernel_name: Option<String>,
    /// Problems that did not stop the mount (already logged as warnings).
    pub warnings: Vec<String>,
}

/// Tells the kind of a source by the rules every input follows ([`input_kind`]). A fat binary is
/// mounted from its own device code; any other ELF file is taken as a HIPK binary (which refuses
/// it with its reason).
pub fn detect(path: &Path) -> Result<SourceKind, SourceError> {
    let kind = input_kind(path).map_err(|e| {
        SourceError::new(
            SourceErrorKind::Unreadable,
            crate::error::io_message(path, &e),
        )
    })?;
    match kind {
        InputKind::Directory => Ok(SourceKind::Directory),
        InputKind::Archive => Ok(SourceKind::Archive),
        InputKind::FatBinary(_) => Ok(SourceKind::FatBinary),
        InputKind::HipkBinary(_) | InputKind::OtherElf(_) => Ok(SourceKind::HipkBinary),
        InputKind::Other => Err(SourceError::new(
            SourceErrorKind::BadFormat,
            format!(
                "{}: not a kpack archive (magic KPAK), an ELF host binary or a directory",
                path.display()
            ),
        )),
    }
}

/// Detects and opens a source. A source of many archives needs a descriptor for each: raise
/// the open-file limit first ([`limits::raise_open_file_limit`]), or a limit too low for them
/// is an error.
pub fn open(path: &Path, opts: &SourceOptions) -> Result<Source, SourceError> {
    let kind = detect(path)?;
    let abs = std::fs::canonicalize(path).map_err(|e| {
        SourceError::new(
            SourceErrorKind::Unreadable,
            crate::error::io_message(path, &e),
        )
    })?;
    let mut source = Source {
        kind,
        path: abs.clone(),
        archives: Vec::new(),
        kernel_name: None,
        warnings: Vec::new(),
    };
    match kind {
        SourceKind::Archive => {
            let a = Archive::open(&abs).map_err(|e| SourceError::archive(&abs, &e))?;
            source.archives.push(Arc::new(a));
        }
        SourceKind::Directory => {
            let members = directory_members(&abs)?;
            if members.is_empty() {
                return Err(SourceError::new(
                    SourceErrorKind::NotFound,
                    format!(
                        "{}: no *.kpack archive and no fat binary below this directory",
                        abs.display()
                    ),
                ));
            }
            open_members(&mut source, &members, opts)?;
            if source.archives.is_empty() {
                return Err(SourceError::new(
                    SourceErrorKind::NotFound,
                    format!(
                        "{}: none of its {} *.kpack files and fat binaries opens",
                        abs.display(),
                        members.len()
                    ),
                ));
            }
        }
        SourceKind::HipkBinary => open_hipk(&mut source, opts)?,
        SourceKind::FatBinary => {
            // Keyed as `pack --from-fatbin` keys a binary given without a root.
            let name = abs.file_name().map(|n| n.to_string_lossy().into_owned());
            let a = fatbin::open_fat_archive(&abs, &name.unwrap_or_default())
                .map_err(|e| SourceError::archive(&abs, &e))?;
            source.archives.push(Arc::new(a));
        }
    }
    Ok(source)
}

/// What a directory source merges.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Member {
    Archive(PathBuf),
    /// A fat binary and its kernel name (its path below the directory).
    Fat(PathBuf, String),
}

impl Member {
    fn path(&self) -> &Path {
        match self {
            Member::Archive(p) | Member::Fat(p, _) => p,
        }
    }
}

/// Every `*.kpack` file below `dir` (symlinks to files followed) and every fat host binary
/// (regular files only: a symlinked library is the same code objects under another name), the
/// tree walked depth first in byte order of name, symlinked directories not followed. An
/// install tree whose libraries are fat and one split from it so give the same keys: the fat
/// binaries keyed by their paths below `dir`, as `split` keys their archives.
fn directory_members(dir: &Path) -> Result<Vec<Member>, SourceError> {
    let unreadable = |p: &Path, e: std::io::Error| {
        SourceError::new(SourceErrorKind::Unreadable, crate::error::io_message(p, &e))
    };
    let mut members = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let mut entries = std::fs::read_dir(&d)
            .and_then(|r| r.collect::<std::io::Result<Vec<_>>>())
            .map_err(|e| unreadable(&d, e))?;
        entries.sort_by(|a, b| a.file_name().as_bytes().cmp(b.file_name().as_bytes()));
        let mut subdirs = Vec::new();
        for e in entries {
            let path = e.path();
            let kind = e.file_type().map_err(|err| unreadable(&path, err))?;
            if kind.is_dir() {
                subdirs.push(path);
            } else if e.file_name().as_bytes().ends_with(b".kpack") {
                // A broken symlink or a member that cannot be stat'ed is left to
                // `open_members`, which reports it; only directories are quietly not members.
                if !std::fs::metadata(&path).is_ok_and(|m| m.is_dir()) {
                    members.push(Member::Archive(path));
                }
            } else if kind.is_file() && is_fat_binary(&path) {
                let rel = path.strip_prefix(dir).unwrap_or(&path);
                match fatbin::kernel_name_from_relative(rel) {
                    Ok(name) => members.push(Member::Fat(path, name)),
                    Err(why) => log::warn!("skipping {}: {why}", path.display()),
                }
            }
        }
        stack.extend(subdirs.into_iter().rev());
    }
    Ok(members)
}

/// Whether `path` is a fat host binary; a file that cannot be read or parsed is not one.
fn is_fat_binary(path: &Path) -> bool {
    matches!(input_kind(path), Ok(InputKind::FatBinary(_)))
}

/// Refuses a source that needs more open files than the limit allows: one per archive, beside
/// those the program holds. The program raised the limit as far as it goes at start-up.
fn check_open_files(needed: u64) -> Result<(), SourceError> {
    match limits::open_file_limit() {
        Some(limit) if limit < needed => Err(SourceError::new(
            SourceErrorKind::Resources,
            format!(
                "{needed} open files are needed but the open-file limit is {limit} \
                 (raise the hard limit, ulimit -Hn)"
            ),
        )),
        _ => Ok(()),
    }
}

/// Opens merge members in order. A member that does not open is a warning (strict: an error);
/// the same file reached twice (symlinks, repeated search paths) is opened once.
fn open_members(
    source: &mut Source,
    members: &[Member],
    opts: &SourceOptions,
) -> Result<(), SourceError> {
    // Descriptors already open (stdio and whatever the caller holds) plus one per archive.
    check_open_files(members.len() as u64 + opts.extra_fds + 16)?;
    let mut seen = HashSet::new();
    for member in members {
        let path = member.path();
        let canonical = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
        if !seen.insert(canonical.clone()) {
            continue;
        }
        let opened = match member {
            Member::Archive(_) => Archive::open(&canonical),
            Member::Fat(_, name) => fatbin::open_fat_archive(&canonical, name),
        };
        match opened {
            Ok(a) => source.archives.push(Arc::new(a)),
            Err(e) => {
                let err = SourceError::archive(path, &e);
                if opts.strict {
                    return Err(err);
                }
                let w = format!(
                    "skipping {}: {}",
                    path.display(),
                    strip_path(&err.message, path)
                );
                log::warn!("{w}");
                source.warnings.push(w);
            }
        }
    }
    Ok(())
}

/// `message` without a leading `path: ` (the warning names the path once).
fn strip_path(message: &str, path: &Path) -> String {
    let p = format!("{}: ", path.display());
    message.strip_prefix(&p).unwrap_or(message).to_owned()
}

/// Collects the archives the loader's open step skipped: those that did not open (path, error
/// code, reason), then those the binary does not pin (path, TOC digest); missing paths are only
/// logged at debug level, as the loader says nothing.
#[derive(Default)]
struct OpenFailures(Vec<(String, i32, String)>, Vec<(String, String)>);

impl Trace for OpenFailures {
    fn enabled(&self) -> bool {
        true
    }

    fn record(&mut self, event: Event) {
        match event {
            Event::ArchiveOpenFailed { path, code, reason } => self.0.push((path, code, reason)),
            Event::ArchiveMissing { path, reason } => log::debug!("{path}: {reason}, skipped"),
            Event::ArchiveNotPinned { path, toc_blake3 } => self.1.push((path, toc_blake3)),
            _ => {}
        }
    }
}

/// A HIPK binary: its metadata, its search paths resolved as the loader does, the archives that
/// exist on them, and its kernel name as the key filter.
fn open_hipk(source: &mut Source, opts: &SourceOptions) -> Result<(), SourceError> {
    let binary = source.path.clone();
    let bytes = std::fs::read(&binary).map_err(|e| {
        SourceError::new(
            SourceErrorKind::Unreadable,
            crate::error::io_message(&binary, &e),
        )
    })?;
    let host = HipkHost::read(&bytes).map_err(|e| {
        SourceError::new(
            SourceErrorKind::BadFormat,
            format!("{}: cannot mount this ELF file: {e}", binary.display()),
        )
    })?;
    let meta = &host.metadata;
    let arches: Vec<String> = opts
        .gpus
        .iter()
        .flat_map(|g| target_id::device_arch_list(g))
        .collect();
    let refs: Vec<Option<&str>> = arches.iter().map(|a| Some(a.as_str())).collect();
    let expansion = if opts.gpus.is_empty() {
        Expansion::Existing
    } else {
        Expansion::Targets(&refs)
    };
    // The loader's own step from search paths to opened archives, on a loader of our own: what
    // is shown is what `kpack_load_code_object` would search.
    let loader = Loader::new(opts.loader.clone());
    let paths = loader.search_paths(meta, &binary, expansion, &mut Silent);
    check_open_files(paths.len() as u64 + opts.extra_fds + 16)?;
    let mut failures = OpenFailures::default();
    let pins = meta.pins.as_deref().filter(|_| !opts.no_pins);
    let opened = loader.open_archives(&paths, pins, &mut failures);
    if let Some((path, code, reason)) = failures.0.first().filter(|_| opts.strict) {
        let kind =
            ErrorKind::from_code(*code).map_or(SourceErrorKind::BadFormat, SourceErrorKind::Core);
        return Err(SourceError::new(
            kind,
            format!("{path}: {}", strip_path(reason, Path::new(path))),
        ));
    }
    for (path, _, reason) in &failures.0 {
        let w = format!("skipping {path}: {}", strip_path(reason, Path::new(path)));
        log::warn!("{w}");
        source.warnings.push(w);
    }
    for (path, digest) in &failures.1 {
        let w = format!(
            "hiding {path}: {} does not pin it (toc blake3 {digest}; --no-pins shows it)",
            binary.display()
        );
        if opts.strict {
            return Err(SourceError::new(SourceErrorKind::BadFormat, w));
        }
        log::warn!("{w}");
        source.warnings.push(w);
    }
    // The loader keeps a file reached twice (symlinks, repeated search paths); the mount shows
    // it once.
    let mut seen = HashSet::new();
    for (canonical, archive) in opened.archives {
        if seen.insert(canonical) {
            source.archives.push(archive);
        }
    }
    if source.archives.is_empty() {
        let patterns: Vec<String> = meta
            .search_paths
            .iter()
            .map(|p| p.to_string_lossy().into_owned())
            .collect();
        return Err(SourceError::new(
            SourceErrorKind::NotFound,
            format!(
                "{}: no archive found for kernel {:?} (search paths {:?}{}; {} candidate paths)",
                binary.display(),
                meta.kernel_name,
                patterns,
                if opts.gpus.is_empty() {
                    String::new()
                } else {
                    format!(", GPUs {:?}", opts.gpus)
                },
                paths.len()
            ),
        ));
    }
    source.kernel_name = Some(meta.kernel_name.clone());
    Ok(())
}

/// Builds the filesystem over an opened source. Duplicates are warnings naming both archives,
/// or with `strict` an error.
pub fn build_fs(
    source: Source,
    fs_opts: &FsOptions,
    strict: bool,
) -> Result<(KpackFs, Vec<String>), SourceError> {
    let Source {
        archives,
        kernel_name,
        mut warnings,
        ..
    } = source;
    let paths: Vec<PathBuf> = archives.iter().map(|a| a.path().to_path_buf()).collect();
    let keep = |key: &str| {
        kernel_name
            .as_deref()
            .is_none_or(|k| hipk::is_code_object_key(k, key))
    };
    let (fs, duplicates) = KpackFs::with_keys(archives, fs_opts, &keep)
        .map_err(|e| SourceError::new(SourceErrorKind::BadFormat, e.to_string()))?;
    for d in &duplicates {
        let text = duplicate_message(d, &paths);
        if strict {
            // Nothing is shown at all, so the message does not say which copy would be.
            return Err(SourceError::new(
                SourceErrorKind::BadFormat,
                format!("conflict (--strict): {text}"),
            ));
        }
        let text = format!(
            "{text}; showing the one from {}",
            archive_name(d.kept, &paths)
        );
        log::warn!("{text}");
        warnings.push(text);
    }
    Ok((fs, warnings))
}

fn archive_name(i: u32, paths: &[PathBuf]) -> String {
    paths
        .get(i as usize)
        .map_or_else(|| format!("#{i}"), |p| p.display().to_string())
}

fn duplicate_message(d: &Duplicate, paths: &[PathBuf]) -> String {
    format!(
        "{} [{}] is in both {} and {}",
        d.key,
        d.arch,
        archive_name(d.kept, paths),
        archive_name(d.dropped, paths)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detects_kinds_from_content() {
        let d = tempfile::tempdir().unwrap();
        let f = |name: &str, bytes: &[u8]| {
            let p = d.path().join(name);
            std::fs::write(&p, bytes).unwrap();
            p
        };
        assert_eq!(detect(d.path()), Ok(SourceKind::Directory));
        assert_eq!(
            detect(&f("a.bin", b"KPAK\x01\0\0\0")),
            Ok(SourceKind::Archive)
        );
        assert_eq!(
            detect(&f("b.kpack", b"\x7fELF\x02\x01")),
            Ok(SourceKind::HipkBinary)
        );
        assert_eq!(
            detect(&f("c.kpack", b"KPA")).unwrap_err().kind,
            SourceErrorKind::BadFormat
        );
        assert_eq!(
            detect(&f("d", b"")).unwrap_err().kind,
            SourceErrorKind::BadFormat
        );
        assert_eq!(
            detect(&d.path().join("missing")).unwrap_err().kind,
            SourceErrorKind::Unreadable
        );
    }

    #[test]
    fn directory_members_are_kpack_files_in_byte_order() {
        let d = tempfile::tempdir().unwrap();
        for n in ["b.kpack", "B.kpack", "a.kpack", "a.kpack.bak", "notes.txt"] {
            std::fs::write(d.path().join(n), b"x").unwrap();
        }
        std::fs::create_dir(d.path().join("sub.kpack")).unwrap();
        let got: Vec<String> = directory_members(d.path())
            .unwrap()
            .iter()
            .map(|m| m.path().file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(got, ["B.kpack", "a.kpack", "b.kpack"]);
    }
}
