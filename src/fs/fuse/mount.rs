//! Mounting: mount options, mounting at a path or serving a descriptor a launcher mounted,
//! telling our mount from a later one at the same path, and serving until unmounted.

use std::io;
use std::mem::ManuallyDrop;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use fuser::{Config, MountOption, Session, SessionACL};

use super::adapter::{Adapter, adapter};
use crate::fs::KpackFs;
use crate::fs::policy::OpenMode;

/// The filesystem subtype: the mount shows as `fuse.kpack-fuse`.
pub const SUBTYPE: &str = "kpack-fuse";

/// Escapes `\` and `,` in a mount source name. fuser 0.18 passes the name unescaped: as the
/// `mount(2)` source on the direct (root) path, but inside the comma-separated option string
/// when it goes through fusermount, where a raw comma would start another option.
pub fn escape_fsname(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for c in name.chars() {
        if c == '\\' || c == ',' {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Who besides the mounting user may use the mount.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Access {
    /// Only the user who mounted (the FUSE default).
    #[default]
    Owner,
    /// That user and root (`allow_root`).
    OwnerAndRoot,
    /// Everyone (`allow_other`).
    All,
}

/// How to mount.
#[derive(Debug, Clone)]
pub struct MountConfig {
    /// Request-handling threads (1 = single-threaded).
    pub threads: usize,
    /// The source shown in `/proc/mounts` (escaped here).
    pub source: String,
    pub access: Access,
    /// Let `fusermount3` unmount when the process dies (fuser requires `access != Owner`).
    pub auto_unmount: bool,
    /// Mount `noexec`.
    pub noexec: bool,
    /// Ask the kernel to read backing files itself (FUSE passthrough) where it can.
    pub passthrough: bool,
    /// How files are opened; `Auto` is resolved against the mounted kernels' sizes.
    pub open_mode: OpenMode,
    /// How long the session's end is held before the daemon lets go of the mount (zero but in
    /// tests of the mount's life cycle, which need a slow exit).
    pub exit_delay: Duration,
}

/// A live mount whose requests are not served until [`Mounted::run`].
pub struct Mounted {
    session: Session<Adapter>,
    /// Our mount in the mount table, to tell it from a later mount at the same path.
    own: Option<OwnMount>,
}

/// This process's mount: its path, the device number of its FUSE connection, and a handle on
/// the connection. Device numbers are reused as soon as a mount is gone, so a mount at our path
/// with our device is ours only while our connection is alive.
#[derive(Debug, Clone)]
pub struct OwnMount {
    mountpoint: PathBuf,
    device: (u32, u32),
    connection: Arc<OwnedFd>,
}

impl OwnMount {
    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    /// The mount's device number (major, minor).
    pub fn device(&self) -> (u32, u32) {
        self.device
    }

    /// Whether the mount at our path is still ours.
    pub fn still_mounted(&self) -> bool {
        connection_alive(&self.connection)
            && matches!(
                crate::fs::setup::mountinfo::mount_at(&self.mountpoint),
                Ok(Some(m)) if (m.major, m.minor) == self.device
            )
    }
}

/// Whether a FUSE connection still stands: once it ended (unmounted, or aborted), polling its
/// device reports an error.
fn connection_alive(fd: &OwnedFd) -> bool {
    use std::os::fd::AsRawFd;
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: 0,
        revents: 0,
    };
    // SAFETY: one valid pollfd, a zero timeout.
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    !(n == 1 && p.revents & (libc::POLLERR | libc::POLLNVAL) != 0)
}

fn fuser_config(cfg: &MountConfig) -> Config {
    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::RO,
        MountOption::NoDev,
        MountOption::NoSuid,
        // No `default_permissions`: every mode here is readable by all and nothing is
        // writable, so the kernel's permission check of each path component would decide
        // nothing and only add work to every warm open. Who may use the mount at all is still the kernel's
        // check (`acl`), exec still needs an execute bit, and `access` is answered from the modes.
        MountOption::FSName(escape_fsname(&cfg.source)),
        // The root mount path ignores Subtype; the raw option makes the type fuse.kpack-fuse.
        MountOption::CUSTOM(format!("subtype={SUBTYPE}")),
    ];
    if cfg.noexec {
        config.mount_options.push(MountOption::NoExec);
    }
    if cfg.auto_unmount {
        config.mount_options.push(MountOption::AutoUnmount);
    }
    config.acl = match cfg.access {
        Access::Owner => SessionACL::Owner,
        Access::OwnerAndRoot => SessionACL::RootAndOwner,
        Access::All => SessionACL::All,
    };
    let threads = cfg.threads.max(1);
    config.n_threads = Some(threads);
    config.clone_fd = threads > 1;
    config
}

/// Mounts `fs` read-only at `mountpoint`. When this returns Ok the kernel has completed the
/// FUSE handshake: the mount is live and requests queue until [`Mounted::run`].
pub fn mount(fs: KpackFs, mountpoint: &Path, cfg: &MountConfig) -> io::Result<Mounted> {
    let session = Session::new(adapter(fs, cfg), mountpoint, &fuser_config(cfg))?;
    // The device comes from the mount table: a stat of the mount point would wait for the
    // session, which is not serving yet.
    let entry = crate::fs::setup::mountinfo::mount_at(mountpoint)
        .ok()
        .flatten();
    if let Some(m) = &entry {
        raise_readahead(m);
    }
    let connection = Arc::new(session.as_fd().try_clone_to_owned()?);
    Ok(Mounted {
        session,
        own: entry.map(|m| OwnMount {
            mountpoint: mountpoint.to_path_buf(),
            device: (m.major, m.minor),
            connection,
        }),
    })
}

/// Readahead of the mount, in KiB. The kernel offers FUSE filesystems 128 KiB and lets them only
/// lower it at init; the mount's backing device can raise it through sysfs (root only). With 1 MiB
/// the daemon read path gets READs as large as FUSE allows (256 pages) for sequential readers
/// with small buffers, i.e. fewer round trips. Passthrough reads do not use it.
const READAHEAD_KB: u32 = 1024;

/// Sets the mount's readahead; only logged when it cannot (not root, no sysfs).
fn raise_readahead(m: &crate::fs::setup::mountinfo::MountEntry) {
    let knob = format!("/sys/class/bdi/{}:{}/read_ahead_kb", m.major, m.minor);
    let current = std::fs::read_to_string(&knob)
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok());
    if current.is_some_and(|kb| kb >= READAHEAD_KB) {
        return;
    }
    if let Err(e) = std::fs::write(&knob, READAHEAD_KB.to_string()) {
        log::debug!("cannot raise readahead ({knob}): {e}");
    }
}

/// Serves `fs` over an already-mounted `/dev/fuse` descriptor (a `/dev/fd/N` mount point from
/// a privileged launcher, which did the `mount(2)` and owns the mount). Returns once the
/// handshake is done. Mount options are the launcher's; only access and threads apply here.
pub fn serve_fd(fs: KpackFs, fd: OwnedFd, cfg: &MountConfig) -> io::Result<Mounted> {
    let config = fuser_config(cfg);
    let acl = config.acl;
    let session = Session::from_fd(adapter(fs, cfg), fd, acl, config)?;
    Ok(Mounted { session, own: None })
}

impl Mounted {
    /// Our mount (`None` for a `/dev/fd/N` session, whose mount is the launcher's).
    pub fn own_mount(&self) -> Option<OwnMount> {
        self.own.clone()
    }

    /// Serves requests until the filesystem is unmounted (`umount`, `kpack-fuse unmount`, or
    /// a signal handler unmounting [`OwnMount`]).
    ///
    /// The session's end never unmounts anything: fuser unmounts its mount point by path when
    /// its mount handle is dropped, and its test of whether the connection already ended takes
    /// an ended one for live, so after an unmount from outside it would unmount whatever was
    /// mounted at that path since (a restart at the same path). The handle is therefore never
    /// dropped; the process exits soon after, which closes the device.
    pub fn run(self) -> io::Result<()> {
        let background = ManuallyDrop::new(self.session.spawn()?);
        // SAFETY: the join handle is read out of a value that is never dropped or used again,
        // so it is owned exactly once, here.
        let serving = unsafe { std::ptr::read(&background.guard) };
        serving
            .join()
            .unwrap_or_else(|_| Err(io::Error::other("the session thread panicked")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_commas_and_backslashes() {
        assert_eq!(escape_fsname("/a/b.kpack"), "/a/b.kpack");
        assert_eq!(escape_fsname("/a,b\\c.kpack"), "/a\\,b\\\\c.kpack");
    }
}
