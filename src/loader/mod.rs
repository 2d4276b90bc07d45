//! The HIPK code-object loader: given a host binary's HIPK metadata, its path, a code-object
//! index and the device's arch list, find and return the code object — what the HIP runtime asks
//! `kpack_load_code_object` for. Pure Rust; the C entry point in `ffi` only translates.
//!
//! Order of work (each step reported to a [`Trace`]):
//! 1. disabled by `ROCM_KPACK_DISABLE` → `Error::Disabled` (metadata is not even read);
//! 2. metadata parsed → `Error::InvalidMetadata` on any problem;
//! 3. search paths built ([`search`]) and archives opened through the cache ([`archive_cache`]);
//!    none usable → `Error::ArchiveNotFound`;
//! 4. for each arch in the list (in order), every (compatible target, archive) pair whose archive
//!    lists the target in `gfx_arches` — targets most specific first, archives in search order —
//!    is tried until one yields the kernel `kernel_name#co_index`. Any failure falls through to
//!    the next pair and then to the next arch; if all fail, the last failure is returned, and if
//!    no archive listed any target, `Error::ArchNotFound`.

pub mod archive_cache;
pub mod config;
pub mod maps;
pub mod search;
pub mod trace;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::archive::Archive;
use crate::archive::codec::KernelBuf;
use crate::error::{Error, Result};
use crate::host::target_id;

pub use crate::host::hipk::HipkMetadata;
use crate::host::hipk::metadata::Pin;
pub use archive_cache::ArchiveCache;
pub use config::LoaderConfig;
pub use search::Expansion;
pub use trace::{Event, Recorder, Silent, StderrLog, Trace};

use trace::emit;

/// What to load.
#[derive(Debug, Clone, Copy)]
pub struct LoadRequest<'a> {
    /// The host binary the metadata came from; relative search paths start at its directory.
    pub binary_path: &'a Path,
    /// The wrapper's translation-unit index (the `#N` of the TOC key).
    pub co_index: u32,
    /// Target ISAs in priority order; `None` entries are skipped.
    pub arch_list: &'a [Option<&'a str>],
}

/// A loaded code object and where it came from.
#[derive(Debug)]
pub struct Loaded<T> {
    pub data: T,
    pub archive: PathBuf,
    pub target: String,
}

/// A configuration plus the archives it has opened. Shared by every thread of a process.
pub struct Loader {
    config: LoaderConfig,
    cache: ArchiveCache,
}

impl Loader {
    pub fn new(config: LoaderConfig) -> Loader {
        Loader {
            config,
            cache: ArchiveCache::new(),
        }
    }

    pub fn config(&self) -> &LoaderConfig {
        &self.config
    }

    pub fn cache(&self) -> &ArchiveCache {
        &self.cache
    }

    /// The event describing this loader's creation (logged by `kpack_cache_create`).
    pub fn created_event(&self) -> Event {
        Event::CacheCreated {
            disabled: self.config.disabled,
            debug: self.config.debug,
            override_paths: self.config.path_override.len(),
            prefix_paths: self.config.path_prefix.len(),
        }
    }

    /// Loads a code object into a buffer from `alloc` (called with the exact size; `None` means
    /// out of memory). `metadata` is only called when the loader is enabled.
    pub fn load_code_object<T, M, A>(
        &self,
        metadata: M,
        request: &LoadRequest<'_>,
        mut alloc: A,
        trace: &mut dyn Trace,
    ) -> Result<Loaded<T>>
    where
        T: KernelBuf,
        M: FnOnce() -> Result<HipkMetadata>,
        A: FnMut(usize) -> Option<T>,
    {
        if self.config.disabled {
            emit(trace, || Event::Disabled);
            return Err(Error::Disabled);
        }
        let meta = metadata().inspect_err(|e| {
            emit(trace, || Event::MetadataInvalid {
                reason: e.to_string(),
            });
        })?;
        let key = meta.lookup_key(request.co_index);
        emit(trace, || Event::MetadataParsed {
            kernel_name: meta.kernel_name.clone(),
            co_index: request.co_index,
            lookup_key: key.clone(),
            search_paths: meta.search_paths.len(),
        });
        let archives = self.resolve_archives(&meta, request, trace)?;
        find_kernel(&archives, &key, request.arch_list, &mut alloc, trace)
    }

    /// Step 3 of the load: the archives on the search path that open, in search order
    /// (duplicates kept, as the reference keeps them); none is `Error::ArchiveNotFound`.
    pub fn resolve_archives(
        &self,
        meta: &HipkMetadata,
        request: &LoadRequest<'_>,
        trace: &mut dyn Trace,
    ) -> Result<Vec<(PathBuf, Arc<Archive>)>> {
        let paths = self.search_paths(
            meta,
            request.binary_path,
            Expansion::Targets(request.arch_list),
            trace,
        );
        let opened = self.open_archives(&paths, meta.pins.as_deref(), trace);
        if opened.archives.is_empty() {
            emit(trace, || Event::NoValidArchives { paths: paths.len() });
            return Err(Error::ArchiveNotFound {
                tried: paths,
                unpinned: opened.unpinned,
            });
        }
        Ok(opened.archives)
    }

    /// The archive paths to try for a binary, under this loader's configuration
    /// (`ROCM_KPACK_PATH`, `ROCM_KPACK_PATH_PREFIX`); see [`search`].
    pub fn search_paths(
        &self,
        meta: &HipkMetadata,
        binary_path: &Path,
        expansion: Expansion<'_>,
        trace: &mut dyn Trace,
    ) -> Vec<PathBuf> {
        search::build_search_paths(
            &self.config,
            binary_path,
            &meta.search_paths,
            expansion,
            trace,
        )
    }

    /// Opens, through this loader's archive cache, the paths that are regular files and valid
    /// archives, in order, with their canonical paths. Paths that are missing or do not open are
    /// skipped and reported to `trace` (`ArchiveMissing`, `ArchiveOpenFailed`). With `pins` (the
    /// binary's), an archive whose TOC digest is not one of them is skipped the same way
    /// (`ArchiveNotPinned`), whichever path named it, `ROCM_KPACK_PATH` included. This is the
    /// one "search paths to opened archives" step, shared by the loader and the mount.
    pub fn open_archives(
        &self,
        paths: &[PathBuf],
        pins: Option<&[Pin]>,
        trace: &mut dyn Trace,
    ) -> OpenedArchives {
        let mut out = OpenedArchives::default();
        for p in paths {
            if let Some((path, archive)) = self.cache.get_or_open(p, trace) {
                if pinned(pins, &path, &archive, trace) {
                    out.archives.push((path, archive));
                } else {
                    out.unpinned.push(path);
                }
            }
        }
        out
    }
}

/// What [`Loader::open_archives`] found.
#[derive(Debug, Default)]
pub struct OpenedArchives {
    /// (canonical path, archive) in search order, duplicates kept.
    pub archives: Vec<(PathBuf, Arc<Archive>)>,
    /// Archives that opened but are not pinned by the binary (canonical paths).
    pub unpinned: Vec<PathBuf>,
}

/// Whether `archive` may serve a binary with `pins`, reported to `trace` when the binary has any.
fn pinned(pins: Option<&[Pin]>, path: &Path, archive: &Archive, trace: &mut dyn Trace) -> bool {
    let Some(pins) = pins else {
        return true;
    };
    let digest = archive.toc_digest();
    let hex = || blake3::Hash::from(digest).to_hex().to_string();
    if pins.contains(&digest) {
        emit(trace, || Event::PinMatched {
            path: path.display().to_string(),
            toc_blake3: hex(),
        });
        true
    } else {
        emit(trace, || Event::ArchiveNotPinned {
            path: path.display().to_string(),
            toc_blake3: hex(),
        });
        false
    }
}

/// Step 4 of the load: the fall-through search over (arch, target, archive).
pub fn find_kernel<T, A>(
    archives: &[(PathBuf, Arc<Archive>)],
    key: &str,
    arch_list: &[Option<&str>],
    alloc: &mut A,
    trace: &mut dyn Trace,
) -> Result<Loaded<T>>
where
    T: KernelBuf,
    A: FnMut(usize) -> Option<T>,
{
    let mut last_error: Option<Error> = None;
    for arch in arch_list.iter().flatten() {
        emit(trace, || Event::TryingArchitecture {
            arch: (*arch).to_owned(),
        });
        for target in target_id::compatible_targets(arch) {
            for (path, archive) in archives.iter().filter(|(_, a)| a.has_architecture(&target)) {
                emit(trace, || Event::Candidate {
                    archive: path.display().to_string(),
                    target: target.clone(),
                });
                match archive.get_kernel_with(key, &target, &mut *alloc) {
                    Ok(data) => {
                        let size = data.size();
                        emit(trace, || Event::KernelFound { size: size as u64 });
                        emit(trace, || Event::Loaded {
                            size,
                            archive: path.display().to_string(),
                            target: target.clone(),
                        });
                        return Ok(Loaded {
                            data,
                            archive: path.clone(),
                            target,
                        });
                    }
                    Err(e) => {
                        emit(trace, || Event::KernelMissing {
                            code: e.kind().code(),
                            reason: e.to_string(),
                        });
                        last_error = Some(e);
                    }
                }
            }
        }
    }
    match last_error {
        Some(e) => {
            emit(trace, || Event::NotInAnyArchive {
                last_error: e.kind().code(),
            });
            Err(e)
        }
        None => {
            emit(trace, || Event::NoCompatibleArchive);
            Err(Error::ArchNotFound {
                key: key.to_owned(),
                arches: arch_list
                    .iter()
                    .flatten()
                    .map(|a| (*a).to_owned())
                    .collect(),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn loader_is_send_and_sync() {
        assert_send_sync::<Loader>();
    }
}
