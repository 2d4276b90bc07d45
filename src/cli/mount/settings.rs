//! The settings of `kpack-fuse mount` as given (flags, then `-o` lists): plain data that
//! `options.rs` fills from `-o`, `bounds.rs` resolves into where decoded kernels live and
//! `plan.rs` turns into the file system's options. The spellings of `--open-mode`, the old
//! one included, are read here.

use std::path::PathBuf;

use rocm_kpack::fs::OpenMode;

/// Every mount setting that can come from a flag or from `-o`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Settings {
    pub allow_other: bool,
    pub allow_root: bool,
    pub auto_unmount: bool,
    pub strict: bool,
    pub no_pins: bool,
    pub noexec: bool,
    /// Bytes of decoded kernels kept in memory (`--backing memory`).
    pub memory_cache_size: Option<Bound>,
    /// Bytes of decoded kernels kept on disk (disk backing).
    pub disk_cache_size: Option<Bound>,
    pub threads: Option<u32>,
    pub gpus: Vec<String>,
    pub log_file: Option<PathBuf>,
    /// Backing files in memory (memfd) instead of on disk.
    pub memory_backing: bool,
    pub scratch_dir: Option<PathBuf>,
    pub cache_dir: Option<PathBuf>,
    pub no_passthrough: bool,
    pub no_decode_ahead: bool,
    pub open_mode: OpenModeSetting,
    /// Network settings of `s3://`, `http(s)://` and `oci://` sources (`endpoint_url=`,
    /// `remote_*=`, `tls_verify=`).
    pub remote: crate::cli::remote_args::RemoteArgs,
}

/// A byte bound as given, and whether by its deprecated name (`--cache-size` for the memory
/// bound, `--cache-dir-size` for the disk bound).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bound {
    pub bytes: u64,
    pub old_name: bool,
}

impl Bound {
    pub fn new(bytes: u64) -> Bound {
        Bound {
            bytes,
            old_name: false,
        }
    }

    pub fn old(bytes: u64) -> Bound {
        Bound {
            bytes,
            old_name: true,
        }
    }
}

/// `--open-mode` as given, and whether by its old name (`passthrough` for `daemon`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OpenModeSetting {
    pub mode: OpenMode,
    pub old_name: bool,
}

/// The values `--open-mode` accepts, the old one last.
pub const OPEN_MODES: [&str; 4] = ["auto", "daemon", "page-cache", "passthrough"];

impl OpenModeSetting {
    /// A spelling of `--open-mode` or `-o open_mode=`.
    pub fn parse(s: &str) -> Option<OpenModeSetting> {
        if s == "passthrough" {
            return Some(OpenModeSetting {
                mode: OpenMode::Daemon,
                old_name: true,
            });
        }
        OpenMode::parse(s).map(|mode| OpenModeSetting {
            mode,
            old_name: false,
        })
    }
}

/// Said when `--open-mode passthrough` is given.
pub const OPEN_MODE_RENAMED: &str = "--open-mode passthrough (-o open_mode=passthrough) is \
     renamed --open-mode daemon (-o open_mode=daemon): passthrough names only how files opened \
     through the daemon are read (--no-passthrough turns it off); the old name will be refused \
     in a later release";

/// Warnings about the settings' spellings that are not about the bounds (those are
/// `bounds.rs`), to show before the mount goes to the background.
pub fn renamed(s: &Settings) -> Vec<String> {
    let mut warnings = Vec::new();
    if s.open_mode.old_name {
        warnings.push(OPEN_MODE_RENAMED.to_owned());
    }
    warnings
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_mode_spellings_and_the_old_name_warned_about() {
        let new = |mode| {
            Some(OpenModeSetting {
                mode,
                old_name: false,
            })
        };
        assert_eq!(OpenModeSetting::parse("auto"), new(OpenMode::Auto));
        assert_eq!(OpenModeSetting::parse("daemon"), new(OpenMode::Daemon));
        assert_eq!(
            OpenModeSetting::parse("page-cache"),
            new(OpenMode::PageCache)
        );
        assert_eq!(
            OpenModeSetting::parse("page_cache"),
            new(OpenMode::PageCache)
        );
        assert_eq!(OpenModeSetting::parse("fast"), None);
        let old = OpenModeSetting::parse("passthrough").unwrap();
        assert_eq!(
            old,
            OpenModeSetting {
                mode: OpenMode::Daemon,
                old_name: true
            }
        );
        for v in OPEN_MODES {
            assert!(OpenModeSetting::parse(v).is_some(), "{v}");
        }
        let mut s = Settings::default();
        assert!(renamed(&s).is_empty());
        s.open_mode = old;
        assert_eq!(
            renamed(&s),
            [
                "--open-mode passthrough (-o open_mode=passthrough) is renamed --open-mode daemon \
              (-o open_mode=daemon): passthrough names only how files opened through the daemon \
              are read (--no-passthrough turns it off); the old name will be refused in a later \
              release"
            ]
        );
    }
}
