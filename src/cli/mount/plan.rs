//! The step from a mount's settings to what the file system and the FUSE session are made with:
//! pure, so that every setting's effect is unit-tested below. What the program learns from the
//! machine (cores, the open-file budget, local GPUs, who it runs as) comes in as [`Host`].

use std::time::Duration;

use rocm_kpack::fs::FsOptions;
use rocm_kpack::fs::fuse::{Access, MountConfig};

use super::bounds::Resolved;
use super::settings::Settings;

/// What the program learned from the machine.
#[derive(Debug, Clone)]
pub struct Host {
    /// The cores the process may run on.
    pub cores: usize,
    /// Backing files kept open at most (see `store::descriptor_budget`).
    pub files_max: usize,
    /// The local GPUs' ISAs, in order (used when no `--gpu` is given).
    pub local_gpus: Vec<String>,
    pub uid: u32,
    pub gid: u32,
    /// The delay a test of the mount's life cycle asks for at the session's end.
    pub exit_delay: Duration,
}

/// The file system's options and the session's, and whether files are decoded ahead of scans.
#[derive(Debug, Clone)]
pub struct Plan {
    pub fs: FsOptions,
    pub mount: MountConfig,
    pub decode_ahead: bool,
}

/// Request-handling threads: `-s` or `--threads`, else one per core.
pub fn threads(s: &Settings, cores: usize) -> usize {
    s.threads.map_or(cores.max(1), |n| n as usize)
}

/// The plan of a mount with settings `s`, its bounds resolved as `bounds`, showing `source` in
/// the mount table.
pub fn plan(s: &Settings, bounds: Resolved, host: &Host, source: String) -> Plan {
    let gpus = if s.gpus.is_empty() {
        host.local_gpus.clone()
    } else {
        s.gpus.clone()
    };
    let access = if s.allow_other {
        Access::All
    } else if s.allow_root || s.auto_unmount {
        // fuser refuses auto_unmount for the owner alone.
        Access::OwnerAndRoot
    } else {
        Access::Owner
    };
    Plan {
        fs: FsOptions {
            cache_size: bounds.bound,
            backing: bounds.placement,
            files_max: host.files_max,
            gpus,
            uid: host.uid,
            gid: host.gid,
        },
        mount: MountConfig {
            threads: threads(s, host.cores),
            source,
            access,
            auto_unmount: s.auto_unmount,
            noexec: s.noexec,
            passthrough: !s.no_passthrough,
            open_mode: s.open_mode.mode,
            exit_delay: host.exit_delay,
        },
        decode_ahead: !s.no_decode_ahead,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::mount::settings::OpenModeSetting;
    use rocm_kpack::fs::OpenMode;
    use rocm_kpack::fs::store::Placement;

    fn host() -> Host {
        Host {
            cores: 8,
            files_max: 500,
            local_gpus: vec!["gfx942".into()],
            uid: 1000,
            gid: 100,
            exit_delay: Duration::ZERO,
        }
    }

    fn bounds() -> Resolved {
        Resolved {
            placement: Placement::Scratch("/var/tmp".into()),
            bound: 1 << 30,
            warnings: Vec::new(),
        }
    }

    fn planned(set: impl FnOnce(&mut Settings)) -> Plan {
        let mut s = Settings::default();
        set(&mut s);
        plan(&s, bounds(), &host(), "/a.kpack".into())
    }

    #[test]
    fn defaults() {
        let p = planned(|_| {});
        assert_eq!(p.fs.cache_size, 1 << 30);
        assert_eq!(p.fs.backing, Placement::Scratch("/var/tmp".into()));
        assert_eq!(
            (p.fs.files_max, p.fs.gpus.as_slice(), p.fs.uid, p.fs.gid),
            (500, &["gfx942".to_owned()][..], 1000, 100)
        );
        let m = &p.mount;
        assert_eq!((m.threads, m.source.as_str()), (8, "/a.kpack"));
        assert_eq!(m.access, Access::Owner);
        assert!(!m.auto_unmount && !m.noexec);
        assert!(m.passthrough);
        assert_eq!(m.open_mode, OpenMode::Auto);
        assert!(p.decode_ahead);
    }

    #[test]
    fn each_setting_reaches_its_option() {
        let p = planned(|s| {
            s.gpus = vec!["gfx90a".into(), "gfx1100".into()];
            s.threads = Some(1);
            s.noexec = true;
            s.no_passthrough = true;
            s.no_decode_ahead = true;
            s.open_mode = OpenModeSetting::parse("page-cache").unwrap();
        });
        assert_eq!(p.fs.gpus, ["gfx90a", "gfx1100"]);
        assert_eq!(p.mount.threads, 1);
        assert!(p.mount.noexec && !p.mount.passthrough && !p.decode_ahead);
        assert_eq!(p.mount.open_mode, OpenMode::PageCache);
        let old = planned(|s| s.open_mode = OpenModeSetting::parse("passthrough").unwrap());
        assert_eq!(old.mount.open_mode, OpenMode::Daemon);
    }

    #[test]
    fn who_may_use_the_mount() {
        assert_eq!(planned(|s| s.allow_other = true).mount.access, Access::All);
        assert_eq!(
            planned(|s| s.allow_root = true).mount.access,
            Access::OwnerAndRoot
        );
        let p = planned(|s| s.auto_unmount = true);
        assert_eq!(p.mount.access, Access::OwnerAndRoot, "fuser's rule");
        assert!(p.mount.auto_unmount);
        let p = planned(|s| {
            s.auto_unmount = true;
            s.allow_other = true;
        });
        assert_eq!(p.mount.access, Access::All);
    }

    #[test]
    fn threads_default_to_the_cores() {
        let mut s = Settings::default();
        assert_eq!(threads(&s, 16), 16);
        assert_eq!(threads(&s, 0), 1);
        s.threads = Some(3);
        assert_eq!(threads(&s, 16), 3);
    }
}
