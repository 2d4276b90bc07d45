//! Checking a split tree against the original one, through the loader.
//!
//! For every rewritten binary below the output root (a file with a `.rocm_kpack_ref` section),
//! every wrapper must be HIPK, point at the marker and carry its index; then, for each wrapper
//! and each arch the original binary has a code object for at that index, the code object is
//! loaded the way `kpack_load_code_object` loads it — HIPK metadata parsed from the marker's
//! bytes, search paths resolved against the rewritten binary's directory, archives opened and
//! searched by [`Loader::load_code_object`] — and must be byte-identical to the original's.
//!
//! Nothing is read whole: a rewritten binary is read without any device code it might still
//! have, and the original through positioned reads, one code object at a time, handed to
//! worker threads that load the archived copy and compare while the next is being read (see
//! [`import::check_host_code_objects`]). Memory stays bounded whatever the binaries' size.
//!
//! The loader runs with a default configuration: `ROCM_KPACK_PATH*` and `ROCM_KPACK_DISABLE`
//! in the caller's environment are ignored, since the point is what the binary itself carries.
//! One loader serves the whole run, so each archive is opened once.

use std::path::{Path, PathBuf};

use crate::host::elf::{ELF_MAGIC, ElfFile, FATBIN_SEGMENT_SECTION, KPACK_REF_SECTION};
use crate::host::fatbin::{self, HostFile, KPACK_DIR, StreamError};
use crate::host::hipk::wrapper::{HIPK_MAGIC, Wrapper, parse_wrappers};
use crate::loader::{HipkMetadata, LoadRequest, Loader, LoaderConfig, Silent};
use crate::tools::import;

/// What `verify_split` found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SplitCheck {
    /// Rewritten binaries checked.
    pub binaries: usize,
    /// (wrapper, arch) code objects loaded and compared.
    pub code_objects: usize,
    /// One line per problem, naming the binary.
    pub problems: Vec<String>,
}

/// Checks every split binary below `out_root` against the binary at the same relative path
/// below `original_root`. I/O errors walking `out_root` are returned; everything about a single
/// binary (unreadable, malformed, missing original, load failure, different bytes) is a problem
/// line.
pub fn verify_split(out_root: &Path, original_root: &Path) -> std::io::Result<SplitCheck> {
    verify_split_with_progress(out_root, original_root, &mut |_| {}, &|_| {})
}

/// [`verify_split`], reporting progress in bytes of the original binaries: `total` is called
/// once, before any is read, with the size of every original a file below `out_root` has;
/// `progress` then receives each original's bytes as it is read (all of them once it is done,
/// or skipped).
pub fn verify_split_with_progress(
    out_root: &Path,
    original_root: &Path,
    total: &mut dyn FnMut(u64),
    progress: &dyn Fn(u64),
) -> std::io::Result<SplitCheck> {
    let mut check = SplitCheck::default();
    let loader = Loader::new(LoaderConfig::default());
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let files = files_below(out_root)?;
    let sizes: Vec<u64> = files
        .iter()
        .map(|rel| std::fs::metadata(original_root.join(rel)).map_or(0, |m| m.len()))
        .collect();
    total(sizes.iter().sum());
    for (rel, size) in files.iter().zip(sizes) {
        let given = std::cell::Cell::new(0u64);
        let tick = |n: u64| {
            given.set(given.get() + n);
            progress(n);
        };
        check_file(
            &mut check,
            &loader,
            out_root,
            original_root,
            rel,
            threads,
            &tick,
        );
        progress(size.saturating_sub(given.get()));
    }
    Ok(check)
}

/// Checks one file below the output root (nothing if it is not a split binary).
fn check_file(
    check: &mut SplitCheck,
    loader: &Loader,
    out_root: &Path,
    original_root: &Path,
    rel: &Path,
    threads: usize,
    progress: &dyn Fn(u64),
) {
    let path = out_root.join(rel);
    let cannot_read = |check: &mut SplitCheck, e: std::io::Error| {
        check
            .problems
            .push(format!("{}: cannot read: {e}", path.display()))
    };
    // Files that are not ELF (data, scripts) are not binaries; an ELF file that does not
    // parse is a problem, never silently "not split". Whether it is split is seen from its
    // section tables alone, so the many binaries a tree holds unchanged are never read.
    let tables =
        match is_elf(&path).and_then(|elf| elf.then(|| HostFile::open_tables(&path)).transpose()) {
            Ok(Some(tables)) => tables,
            Ok(None) => return,
            Err(e) => return cannot_read(check, e),
        };
    match ElfFile::parse(tables.image()) {
        Ok(elf) if elf.section(KPACK_REF_SECTION).is_none() => return,
        Ok(_) => {}
        Err(e) => {
            check.problems.push(format!("{}: {e}", path.display()));
            return;
        }
    }
    drop(tables);
    // A split binary: read it (it holds no device code any more) for the marker and wrappers.
    let host = match HostFile::open(&path) {
        Ok(host) => host,
        Err(e) => return cannot_read(check, e),
    };
    let elf = match ElfFile::parse(host.image()) {
        Ok(elf) => elf,
        Err(e) => {
            check.problems.push(format!("{}: {e}", path.display()));
            return;
        }
    };
    let Some(marker) = elf.section(KPACK_REF_SECTION) else {
        return;
    };
    check.binaries += 1;
    let mut problems = Vec::new();
    let binary = Binary {
        loader,
        path: &path,
        elf: &elf,
        marker: marker.data,
        marker_address: marker.address,
    };
    check.code_objects += binary.verify(&original_root.join(rel), threads, &mut problems, progress);
    check.problems.extend(
        problems
            .into_iter()
            .map(|m| format!("{}: {m}", path.display())),
    );
}

/// Whether the file starts with the ELF magic (reading only that).
fn is_elf(path: &Path) -> std::io::Result<bool> {
    use std::io::Read;
    let mut magic = [0u8; 4];
    let mut file = std::fs::File::open(path)?;
    let mut got = 0;
    while got < magic.len() {
        match file.read(&mut magic[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(magic[..got].starts_with(ELF_MAGIC) && got == magic.len())
}

/// One rewritten binary being checked.
struct Binary<'a> {
    loader: &'a Loader,
    path: &'a Path,
    elf: &'a ElfFile<'a>,
    marker: &'a [u8],
    marker_address: u64,
}

/// What checking one original code object found.
struct Checked {
    /// No HIPK wrapper carries its index.
    unwrapped: Option<String>,
    /// Load problems, by position of the wrapper they came through.
    loads: Vec<(usize, String)>,
    compared: usize,
}

impl Binary<'_> {
    /// Checks the binary against `original`; returns the number of code objects loaded and
    /// compared. Problems come in a fixed order: the wrappers', then each original code object
    /// no wrapper carries, then load failures by wrapper and code object.
    fn verify(
        &self,
        original: &Path,
        threads: usize,
        problems: &mut Vec<String>,
        progress: &dyn Fn(u64),
    ) -> usize {
        let metadata = match HipkMetadata::parse(self.marker) {
            Ok(m) => m,
            Err(e) => {
                problems.push(format!("marker: {e}"));
                return 0;
            }
        };
        let Some(seg) = self.elf.section(FATBIN_SEGMENT_SECTION) else {
            problems.push(format!("has a marker but no {FATBIN_SEGMENT_SECTION}"));
            return 0;
        };
        let wrappers = parse_wrappers(seg.data, true);
        for (i, w) in wrappers.iter().enumerate() {
            if w.magic != HIPK_MAGIC {
                problems.push(format!("wrapper {i} has magic {:#010x}, not HIPK", w.magic));
            }
            if w.pointer != self.marker_address {
                problems.push(format!(
                    "wrapper {i} points at {:#x}, not at the marker ({:#x})",
                    w.pointer, self.marker_address
                ));
            }
        }
        let checked = HostFile::open(original)
            .map_err(|e| crate::error::describe_io(&e))
            .and_then(|host| {
                import::check_host_code_objects(
                    &metadata.kernel_name,
                    &host,
                    threads,
                    |co, scratch| self.check_one(&metadata, &wrappers, co, scratch),
                    progress,
                )
                .map_err(|e| match e {
                    StreamError::Fatbin(e) => e.to_string(),
                    StreamError::Read(e) => crate::error::describe_io(&e),
                    StreamError::Visit(never) => match never {},
                })
            });
        let checked = match checked {
            Ok(c) => c,
            Err(e) => {
                problems.push(format!("original {}: {e}", original.display()));
                return 0;
            }
        };
        problems.extend(checked.iter().filter_map(|c| c.unwrapped.clone()));
        let mut loads: Vec<&(usize, String)> = checked.iter().flat_map(|c| &c.loads).collect();
        // Stable: code objects stay in order under each wrapper.
        loads.sort_by_key(|(w, _)| *w);
        problems.extend(loads.into_iter().map(|(_, m)| m.clone()));
        checked.iter().map(|c| c.compared).sum()
    }

    /// Loads one original code object through every HIPK wrapper carrying its index, into the
    /// worker's `scratch` buffer (kept from one load to the next: no allocation, and no zeroing
    /// of bytes the load overwrites anyway).
    fn check_one(
        &self,
        metadata: &HipkMetadata,
        wrappers: &[Wrapper],
        co: &fatbin::CodeObject,
        scratch: &mut Vec<u8>,
    ) -> Checked {
        let mut checked = Checked {
            unwrapped: None,
            loads: Vec::new(),
            compared: 0,
        };
        let carrying = wrappers
            .iter()
            .enumerate()
            .filter(|(_, w)| w.magic == HIPK_MAGIC && w.co_index == co.index);
        for (at, w) in carrying {
            checked.compared += 1;
            let arch_list = [Some(co.arch.as_str())];
            let request = LoadRequest {
                binary_path: self.path,
                co_index: w.co_index,
                arch_list: &arch_list,
            };
            // The loader asks again after a candidate fails: later asks get a fresh buffer.
            let mut spare = Some(std::mem::take(scratch));
            let alloc = |n: usize| {
                let mut buf = spare.take().unwrap_or_default();
                if n > buf.len() {
                    buf.try_reserve_exact(n - buf.len()).ok()?;
                }
                buf.resize(n, 0);
                Some(buf)
            };
            let loaded =
                self.loader
                    .load_code_object(|| Ok(metadata.clone()), &request, alloc, &mut Silent);
            let problem = match &loaded {
                Ok(l) if l.data == co.data && l.target == co.arch => None,
                Ok(l) if l.data == co.data => Some(format!(
                    "{} [{}]: loaded as target {} from {}, not as {}",
                    co.key,
                    co.arch,
                    l.target,
                    l.archive.display(),
                    co.arch
                )),
                Ok(l) => Some(format!(
                    "{} [{}]: {} holds {} bytes that differ from the original's {}",
                    co.key,
                    co.arch,
                    l.archive.display(),
                    l.data.len(),
                    co.data.len()
                )),
                Err(e) => Some(format!(
                    "{} [{}]: does not load: {} ({e})",
                    co.key,
                    co.arch,
                    e.kind().name()
                )),
            };
            if let Ok(l) = loaded {
                *scratch = l.data;
            }
            if let Some(problem) = problem {
                checked.loads.push((at, problem));
            }
        }
        if checked.compared == 0 {
            checked.unwrapped = Some(format!(
                "{} [{}]: no HIPK wrapper carries index {}",
                co.key, co.arch, co.index
            ));
        }
        checked
    }
}

/// Regular files below `root` (relative paths, sorted), skipping the archive folder.
fn files_below(root: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        for entry in std::fs::read_dir(root.join(&rel))? {
            let entry = entry?;
            let kind = entry.file_type()?;
            let child = rel.join(entry.file_name());
            if kind.is_dir() && entry.file_name() != KPACK_DIR {
                stack.push(child);
            } else if kind.is_file() {
                out.push(child);
            }
        }
    }
    out.sort();
    Ok(out)
}
