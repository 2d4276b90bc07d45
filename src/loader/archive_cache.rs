//! Open archives shared by every load on one loader, keyed by canonical path.
//!
//! Each archive is opened at most once per cache, even when many threads ask for it at the same
//! time: the map hands out a per-path slot, and only the slot's lock is held while the file is
//! opened and validated, so loads of other archives (and decoding) never wait on it. A file that
//! fails to open is not remembered; the next load tries it again (a corrupt archive may be
//! replaced). Archives stay open until the cache is dropped.
//!
//! Search paths that have led to an archive are remembered as aliases of its slot, so a warm load
//! finds its archives without resolving the path again; paths that name nothing cost one `stat`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::trace::{Event, Trace, emit};
use crate::archive::Archive;
use crate::sync::lock;

/// One path's archive, filled by the first successful open.
#[derive(Default)]
struct Slot {
    archive: Mutex<Option<Arc<Archive>>>,
}

/// The archive cache of one loader.
#[derive(Default)]
pub struct ArchiveCache {
    /// Keyed by canonical path.
    slots: Mutex<HashMap<PathBuf, Arc<Slot>>>,
    /// Search paths as given that resolved to a filled slot, with that slot's canonical path.
    aliases: Mutex<HashMap<PathBuf, (PathBuf, Arc<Slot>)>>,
    opens: AtomicUsize,
}

impl ArchiveCache {
    pub fn new() -> ArchiveCache {
        ArchiveCache::default()
    }

    /// The archive at `path`, from the cache or freshly opened. Returns the canonical path (the
    /// cache key) with it, or `None` when `path` is not a regular file or does not open (both
    /// reported to `trace`).
    pub fn get_or_open(
        &self,
        path: &Path,
        trace: &mut dyn Trace,
    ) -> Option<(PathBuf, Arc<Archive>)> {
        if let Some((canonical, slot)) = lock(&self.aliases).get(path).cloned() {
            if let Some(archive) = lock(&slot.archive).as_ref() {
                emit(trace, || Event::ArchiveReused {
                    path: canonical.display().to_string(),
                });
                return Some((canonical, Arc::clone(archive)));
            }
        }
        if let Err(reason) = regular_file(path) {
            emit(trace, || Event::ArchiveMissing {
                path: path.display().to_string(),
                reason,
            });
            return None;
        }
        let canonical = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
        let slot = Arc::clone(lock(&self.slots).entry(canonical.clone()).or_default());
        // Only this path's slot is locked while the file is opened: concurrent first users of the
        // same archive wait here and then find it filled; other archives are not held up.
        let mut held = lock(&slot.archive);
        let archive = match held.as_ref() {
            Some(archive) => {
                emit(trace, || Event::ArchiveReused {
                    path: canonical.display().to_string(),
                });
                Arc::clone(archive)
            }
            None => match Archive::open(path) {
                Ok(archive) => {
                    let archive = Arc::new(archive);
                    *held = Some(Arc::clone(&archive));
                    self.opens.fetch_add(1, Ordering::Relaxed);
                    emit(trace, || Event::ArchiveOpened {
                        path: canonical.display().to_string(),
                        architectures: archive.architectures().to_vec(),
                    });
                    archive
                }
                Err(e) => {
                    emit(trace, || Event::ArchiveOpenFailed {
                        path: path.display().to_string(),
                        code: e.kind().code(),
                        reason: e.to_string(),
                    });
                    return None;
                }
            },
        };
        drop(held);
        lock(&self.aliases).insert(path.to_path_buf(), (canonical.clone(), Arc::clone(&slot)));
        Some((canonical, archive))
    }

    /// How many archives are held.
    pub fn len(&self) -> usize {
        let slots: Vec<Arc<Slot>> = lock(&self.slots).values().cloned().collect();
        slots.iter().filter(|s| lock(&s.archive).is_some()).count()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How many times an archive was opened successfully by this cache (equal to [`len`] unless
    /// an archive was opened twice, which must not happen).
    ///
    /// [`len`]: ArchiveCache::len
    pub fn open_count(&self) -> usize {
        self.opens.load(Ordering::Relaxed)
    }
}

/// Whether `path` names a regular file, following symlinks; if not, why not (`no such file`,
/// `not a regular file`, ...).
fn regular_file(path: &Path) -> Result<(), String> {
    match std::fs::metadata(path) {
        Ok(m) if m.is_file() => Ok(()),
        Ok(_) => Err("not a regular file".to_owned()),
        Err(e) => Err(crate::error::describe_io(&e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::loader::trace::{Recorder, Silent};

    fn assert_send_sync<T: Send + Sync>() {}

    fn fixture(name: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .join(name)
    }

    #[test]
    fn cache_is_send_and_sync() {
        assert_send_sync::<ArchiveCache>();
    }

    #[test]
    fn symlink_and_direct_path_share_one_entry() {
        let dir = tempfile::tempdir().unwrap();
        let link = dir.path().join("alias.kpack");
        std::os::unix::fs::symlink(fixture("test_noop.kpack"), &link).unwrap();
        let cache = ArchiveCache::new();
        let (a, _) = cache
            .get_or_open(&fixture("test_noop.kpack"), &mut Silent)
            .unwrap();
        let mut rec = Recorder::default();
        let (b, _) = cache.get_or_open(&link, &mut rec).unwrap();
        assert_eq!(a, b);
        assert_eq!(cache.len(), 1);
        assert_eq!(cache.open_count(), 1);
        assert!(matches!(rec.events[..], [Event::ArchiveReused { .. }]));
    }

    #[test]
    fn corrupt_archives_are_retried_and_missing_ones_not_cached() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.kpack");
        std::fs::write(&path, b"garbage!garbage!garbage").unwrap();
        let cache = ArchiveCache::new();
        let mut rec = Recorder::default();
        assert!(cache.get_or_open(&path, &mut rec).is_none());
        assert!(matches!(
            &rec.events[..],
            [Event::ArchiveOpenFailed { code: 3, .. }]
        ));
        std::fs::copy(fixture("test_zstd.kpack"), &path).unwrap();
        let (_, a) = cache.get_or_open(&path, &mut Silent).unwrap();
        assert_eq!(a.architectures(), ["gfx1100", "gfx1101"]);
        let mut rec = Recorder::default();
        assert!(
            cache
                .get_or_open(&dir.path().join("none.kpack"), &mut rec)
                .is_none()
        );
        assert!(cache.get_or_open(dir.path(), &mut rec).is_none());
        assert!(matches!(
            &rec.events[..],
            [Event::ArchiveMissing { .. }, Event::ArchiveMissing { .. }]
        ));
        assert_eq!(cache.len(), 1);
    }

    #[test]
    fn concurrent_first_use_opens_once() {
        let cache = ArchiveCache::new();
        let path = fixture("test_noop.kpack");
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    for _ in 0..50 {
                        assert!(cache.get_or_open(&path, &mut Silent).is_some());
                    }
                });
            }
        });
        assert_eq!(cache.open_count(), 1);
        assert_eq!(cache.len(), 1);
    }
}
