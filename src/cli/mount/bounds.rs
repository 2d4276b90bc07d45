//! Where a mount keeps decoded kernels and how many bytes of them: `--backing`, `--cache-dir`,
//! `--scratch-dir`, `--memory-cache-size` and `--disk-cache-size` (and their deprecated
//! spellings) resolved into one [`Placement`] and the one byte bound in force there.
//!
//! Pure: no I/O, so every combination is unit-tested below with its exact warnings and
//! refusals. An option that bounds one place and is given for the other is refused when it is
//! a current name, and only warned about when it is a deprecated spelling that the mount used
//! to accept there (it did nothing then either).

use std::path::PathBuf;

use rocm_kpack::fs::store::{DEFAULT_SCRATCH_BASE, Placement};

use super::settings::{Bound, Settings};

/// Default `--memory-cache-size`: 256 MiB (less in a small cgroup: see `mod.rs`).
pub const DEFAULT_MEMORY_CACHE: u64 = 256 << 20;

/// The least default `--disk-cache-size` (see [`default_disk_cache`]).
pub const DISK_CACHE_FLOOR: u64 = 64 << 20;

/// Default `--disk-cache-size` on a file system of `size` bytes with `free` bytes free (for an
/// unprivileged user; a cache directory's own files count as free, since its bound removes
/// them): a quarter of the file system, at most half of what is free, and at least
/// [`DISK_CACHE_FLOOR`] or a quarter of the file system, whichever is less. The floor keeps a
/// few kernels on a nearly full disk, where the store evicts when the file system is full.
pub fn default_disk_cache(size: u64, free: u64) -> u64 {
    let quarter = size / 4;
    quarter.min(free / 2).max(DISK_CACHE_FLOOR.min(quarter))
}

/// What the mount keeps: where, the bound in force (the store's capacity, shown as `capacity`
/// in the stats), and the warnings to show before the mount goes to the background.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    pub placement: Placement,
    pub bound: u64,
    pub warnings: Vec<String>,
}

const LATER: &str = "it will be refused there in a later release";

const CACHE_SIZE_RENAMED: &str = "--cache-size (-o cache_size) is renamed --memory-cache-size \
     (-o memory_cache_size); the old name will be refused in a later release";
const CACHE_DIR_SIZE_RENAMED: &str = "--cache-dir-size (-o cache_dir_size) is renamed \
     --disk-cache-size (-o disk_cache_size); the old name will be refused in a later release";

/// Resolves the settings; `default_memory` gives the memory bound when none is given (it is
/// only asked with memory backing), `default_disk` the disk bound for the place files go to
/// (only asked with disk backing). An error is a usage error (exit 2), one line.
pub fn resolve(
    s: &Settings,
    default_memory: impl FnOnce() -> u64,
    default_disk: impl FnOnce(&Placement) -> u64,
) -> Result<Resolved, String> {
    let mut warnings = Vec::new();
    if s.memory_backing {
        if s.cache_dir.is_some() {
            return Err(
                "backing=memory and cache_dir are mutually exclusive: a cache directory is on disk"
                    .into(),
            );
        }
        match s.disk_cache_size {
            Some(Bound {
                old_name: false, ..
            }) => {
                return Err(
                    "--disk-cache-size (-o disk_cache_size) bounds decoded kernels on \
                     disk, and --backing memory keeps none there: use --memory-cache-size"
                        .into(),
                );
            }
            Some(Bound { old_name: true, .. }) => warnings.push(format!(
                "--cache-dir-size (-o cache_dir_size) does nothing with --backing memory: use \
                 --memory-cache-size to bound decoded kernels in memory; {LATER}"
            )),
            None => {}
        }
        if s.memory_cache_size.is_some_and(|b| b.old_name) {
            warnings.push(CACHE_SIZE_RENAMED.into());
        }
        if s.scratch_dir.is_some() {
            warnings.push(format!(
                "--scratch-dir (-o scratch_dir) does nothing with --backing memory, which writes \
                 nothing to disk; {LATER}"
            ));
        }
        if s.no_decode_ahead {
            warnings.push(format!(
                "--no-decode-ahead (-o no_decode_ahead) does nothing with --backing memory, which \
                 never decodes ahead; {LATER}"
            ));
        }
        let bound = match s.memory_cache_size {
            Some(b) => b.bytes,
            None => default_memory(),
        };
        return Ok(Resolved {
            placement: Placement::Memory,
            bound,
            warnings,
        });
    }
    match s.memory_cache_size {
        Some(Bound {
            old_name: false, ..
        }) => {
            return Err(
                "--memory-cache-size (-o memory_cache_size) bounds decoded kernels in \
                 memory, which only --backing memory keeps: use --disk-cache-size"
                    .into(),
            );
        }
        Some(Bound { old_name: true, .. }) => warnings.push(format!(
            "--cache-size (-o cache_size) does nothing with disk backing (the default): use \
             --disk-cache-size to bound decoded kernels on disk, or --backing memory to keep \
             them in memory; {LATER}"
        )),
        None => {}
    }
    if s.disk_cache_size.is_some_and(|b| b.old_name) {
        warnings.push(CACHE_DIR_SIZE_RENAMED.into());
    }
    let placement = match &s.cache_dir {
        Some(dir) => {
            if s.scratch_dir.is_some() {
                warnings.push(format!(
                    "--scratch-dir (-o scratch_dir) does nothing with --cache-dir, which \
                     replaces the per-mount directory; {LATER}"
                ));
            }
            Placement::CacheDir(dir.clone())
        }
        None => Placement::Scratch(
            s.scratch_dir
                .clone()
                .unwrap_or_else(|| PathBuf::from(DEFAULT_SCRATCH_BASE)),
        ),
    };
    let bound = match s.disk_cache_size {
        Some(b) => b.bytes,
        None => default_disk(&placement),
    };
    Ok(Resolved {
        placement,
        bound,
        warnings,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rocm_kpack::fs::OpenMode;

    /// The default memory bound the tests pass: not a size anyone gives, so a mix-up shows.
    const DEFAULT_MEM: u64 = 12_345;
    /// The same for the disk bound.
    const DEFAULT_DISK_CACHE: u64 = 67_890;

    fn resolved(f: impl FnOnce(&mut Settings)) -> Result<Resolved, String> {
        let mut s = Settings::default();
        f(&mut s);
        resolve(&s, || DEFAULT_MEM, |_| DEFAULT_DISK_CACHE)
    }

    fn ok(placement: Placement, bound: u64, warnings: &[&str]) -> Result<Resolved, String> {
        Ok(Resolved {
            placement,
            bound,
            warnings: warnings.iter().map(|w| w.to_string()).collect(),
        })
    }

    fn scratch(dir: &str) -> Placement {
        Placement::Scratch(dir.into())
    }

    const CACHE_SIZE_ON_DISK: &str = "--cache-size (-o cache_size) does nothing with disk \
         backing (the default): use --disk-cache-size to bound decoded kernels on disk, or \
         --backing memory to keep them in memory; it will be refused there in a later release";
    const CACHE_DIR_SIZE_IN_MEMORY: &str = "--cache-dir-size (-o cache_dir_size) does nothing \
         with --backing memory: use --memory-cache-size to bound decoded kernels in memory; it \
         will be refused there in a later release";
    const SCRATCH_IN_MEMORY: &str = "--scratch-dir (-o scratch_dir) does nothing with \
         --backing memory, which writes nothing to disk; it will be refused there in a later \
         release";
    const SCRATCH_WITH_CACHE_DIR: &str = "--scratch-dir (-o scratch_dir) does nothing with \
         --cache-dir, which replaces the per-mount directory; it will be refused there in a \
         later release";
    const NO_AHEAD_IN_MEMORY: &str = "--no-decode-ahead (-o no_decode_ahead) does nothing with \
         --backing memory, which never decodes ahead; it will be refused there in a later release";
    const RENAMED_MEMORY: &str = "--cache-size (-o cache_size) is renamed --memory-cache-size \
         (-o memory_cache_size); the old name will be refused in a later release";
    const RENAMED_DISK: &str = "--cache-dir-size (-o cache_dir_size) is renamed \
         --disk-cache-size (-o disk_cache_size); the old name will be refused in a later release";
    const DISK_SIZE_IN_MEMORY: &str = "--disk-cache-size (-o disk_cache_size) bounds decoded \
         kernels on disk, and --backing memory keeps none there: use --memory-cache-size";
    const MEMORY_SIZE_ON_DISK: &str = "--memory-cache-size (-o memory_cache_size) bounds \
         decoded kernels in memory, which only --backing memory keeps: use --disk-cache-size";

    #[test]
    fn disk_backing_in_the_per_mount_directory() {
        assert_eq!(
            resolved(|_| {}),
            ok(scratch("/var/tmp"), DEFAULT_DISK_CACHE, &[])
        );
        assert_eq!(
            resolved(|s| {
                s.scratch_dir = Some("/srv/s".into());
                s.disk_cache_size = Some(Bound::new(3 << 30));
            }),
            ok(scratch("/srv/s"), 3 << 30, &[])
        );
        assert_eq!(
            resolved(|s| s.disk_cache_size = Some(Bound::old(1 << 20))),
            ok(scratch("/var/tmp"), 1 << 20, &[RENAMED_DISK])
        );
        // The old memory bound did nothing here, and does nothing now: the disk bound stays.
        assert_eq!(
            resolved(|s| s.memory_cache_size = Some(Bound::old(1 << 30))),
            ok(
                scratch("/var/tmp"),
                DEFAULT_DISK_CACHE,
                &[CACHE_SIZE_ON_DISK]
            )
        );
        assert_eq!(
            resolved(|s| {
                s.memory_cache_size = Some(Bound::old(1 << 30));
                s.disk_cache_size = Some(Bound::old(5 << 20));
            }),
            ok(
                scratch("/var/tmp"),
                5 << 20,
                &[CACHE_SIZE_ON_DISK, RENAMED_DISK]
            )
        );
        assert_eq!(
            resolved(|s| s.memory_cache_size = Some(Bound::new(1 << 30))),
            Err(MEMORY_SIZE_ON_DISK.into())
        );
        assert_eq!(
            resolved(|s| {
                s.memory_cache_size = Some(Bound::new(1 << 30));
                s.disk_cache_size = Some(Bound::new(1 << 30));
            }),
            Err(MEMORY_SIZE_ON_DISK.into())
        );
    }

    #[test]
    fn disk_backing_in_a_cache_directory() {
        let dir = || Placement::CacheDir("/var/cache/k".into());
        let with_dir = |s: &mut Settings| s.cache_dir = Some("/var/cache/k".into());
        assert_eq!(resolved(with_dir), ok(dir(), DEFAULT_DISK_CACHE, &[]));
        assert_eq!(
            resolved(|s| {
                with_dir(s);
                s.disk_cache_size = Some(Bound::new(2 << 30));
            }),
            ok(dir(), 2 << 30, &[])
        );
        assert_eq!(
            resolved(|s| {
                with_dir(s);
                s.disk_cache_size = Some(Bound::old(2 << 30));
            }),
            ok(dir(), 2 << 30, &[RENAMED_DISK])
        );
        assert_eq!(
            resolved(|s| {
                with_dir(s);
                s.scratch_dir = Some("/srv/s".into());
                s.memory_cache_size = Some(Bound::old(64 << 10));
            }),
            ok(
                dir(),
                DEFAULT_DISK_CACHE,
                &[CACHE_SIZE_ON_DISK, SCRATCH_WITH_CACHE_DIR]
            )
        );
        assert_eq!(
            resolved(|s| {
                with_dir(s);
                s.memory_cache_size = Some(Bound::new(64 << 10));
            }),
            Err(MEMORY_SIZE_ON_DISK.into())
        );
    }

    #[test]
    fn memory_backing() {
        let memory = |s: &mut Settings| s.memory_backing = true;
        assert_eq!(resolved(memory), ok(Placement::Memory, DEFAULT_MEM, &[]));
        assert_eq!(
            resolved(|s| {
                memory(s);
                s.memory_cache_size = Some(Bound::new(64 << 10));
            }),
            ok(Placement::Memory, 64 << 10, &[])
        );
        assert_eq!(
            resolved(|s| {
                memory(s);
                s.memory_cache_size = Some(Bound::old(64 << 10));
            }),
            ok(Placement::Memory, 64 << 10, &[RENAMED_MEMORY])
        );
        assert_eq!(
            resolved(|s| {
                memory(s);
                s.disk_cache_size = Some(Bound::old(1 << 30));
                s.memory_cache_size = Some(Bound::old(1 << 20));
                s.scratch_dir = Some("/srv/s".into());
                s.no_decode_ahead = true;
            }),
            ok(
                Placement::Memory,
                1 << 20,
                &[
                    CACHE_DIR_SIZE_IN_MEMORY,
                    RENAMED_MEMORY,
                    SCRATCH_IN_MEMORY,
                    NO_AHEAD_IN_MEMORY
                ]
            )
        );
        assert_eq!(
            resolved(|s| {
                memory(s);
                s.disk_cache_size = Some(Bound::new(1 << 30));
            }),
            Err(DISK_SIZE_IN_MEMORY.into())
        );
        assert_eq!(
            resolved(|s| {
                memory(s);
                s.cache_dir = Some("/var/cache/k".into());
            }),
            Err(
                "backing=memory and cache_dir are mutually exclusive: a cache directory is on disk"
                    .into()
            )
        );
    }

    #[test]
    fn each_default_bound_is_asked_only_when_it_is_used() {
        let mut s = Settings::default();
        let asked = std::cell::RefCell::new(Vec::new());
        let disk = |p: &Placement| {
            asked.borrow_mut().push(p.clone());
            1
        };
        assert!(resolve(&s, || panic!("asked with disk backing"), disk).is_ok());
        s.cache_dir = Some("/var/cache/k".into());
        assert!(resolve(&s, || panic!("asked with disk backing"), disk).is_ok());
        s.disk_cache_size = Some(Bound::new(1));
        assert!(resolve(&s, || panic!("asked with disk backing"), disk).is_ok());
        assert_eq!(
            *asked.borrow(),
            [
                scratch("/var/tmp"),
                Placement::CacheDir("/var/cache/k".into())
            ],
            "the place the files go to, once per mount without a bound"
        );
        let s = Settings {
            memory_backing: true,
            memory_cache_size: Some(Bound::new(1)),
            ..Settings::default()
        };
        let never = |_: &Placement| panic!("asked with memory backing");
        assert!(resolve(&s, || panic!("asked with a bound given"), never).is_ok());
    }

    /// A quarter of the file system, at most half of its free space, at least 64 MiB or a
    /// quarter of it.
    #[test]
    fn the_default_disk_bound_follows_the_file_system() {
        const G: u64 = 1 << 30;
        const M: u64 = 1 << 20;
        // Plenty free: a quarter of the size.
        assert_eq!(default_disk_cache(400 * G, 300 * G), 100 * G);
        // Less free: half of it.
        assert_eq!(default_disk_cache(400 * G, 50 * G), 25 * G);
        // Nearly full: the floor.
        assert_eq!(default_disk_cache(400 * G, 10 * M), DISK_CACHE_FLOOR);
        assert_eq!(default_disk_cache(400 * G, 0), 64 * M);
        // A small file system: a quarter of it, whatever is free.
        assert_eq!(default_disk_cache(40 * M, 40 * M), 10 * M);
        assert_eq!(default_disk_cache(40 * M, 0), 10 * M);
        assert_eq!(default_disk_cache(200 * M, 100 * M), 50 * M);
        assert_eq!(default_disk_cache(G, 100 * M), DISK_CACHE_FLOOR);
        assert_eq!(default_disk_cache(0, 0), 0);
    }

    #[test]
    fn decode_ahead_switched_off_where_there_is_none() {
        let no_ahead = |s: &mut Settings| s.no_decode_ahead = true;
        assert_eq!(
            resolved(no_ahead),
            ok(scratch("/var/tmp"), DEFAULT_DISK_CACHE, &[])
        );
        assert_eq!(
            resolved(|s| {
                no_ahead(s);
                s.open_mode.mode = OpenMode::Daemon;
            }),
            ok(scratch("/var/tmp"), DEFAULT_DISK_CACHE, &[])
        );
        assert_eq!(
            resolved(|s| {
                no_ahead(s);
                s.open_mode.mode = OpenMode::PageCache;
            }),
            ok(scratch("/var/tmp"), DEFAULT_DISK_CACHE, &[]),
            "page-cache mode decodes ahead of first READs"
        );
    }
}
