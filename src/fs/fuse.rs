//! The FUSE adapter: the only file that imports `fuser`. It translates kernel requests into
//! calls on [`KpackFs`] and its answers back into replies, carries out the decisions of the
//! open policy (`policy.rs`: which read path each open gets), and sets up the mount.
//!
//! * `init` asks the kernel for what the policy wants (opening without the daemon, passthrough
//!   where this daemon may register backing files) and tells the policy what was granted.
//! * An OPEN asks the policy first: answered ENOSYS in page-cache mode, else its file is made
//!   ready ([`KpackFs::open_start`]) and the policy says how the new handle is answered. A
//!   backing id is registered here, without the policy's lock, and reported back to it.
//! * Cold kernels decode on the decode pool (`pool.rs`), so request threads are never held by
//!   a decode. Opens and reads that must wait travel with the job as callbacks that own their
//!   replies (`fill.rs`).
//! * A READ with handle 0 is a file the kernel opened by itself (page-cache mode) and is served
//!   by inode; any other reads its handle's file.

use std::ffi::OsStr;
use std::io;
use std::mem::ManuallyDrop;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime};

use fuser::{
    AccessFlags, BackingId, BsdFileFlags, Config, Errno as FErrno, FileAttr, FileHandle, FileType,
    Filesystem, FopenFlags, Generation, INodeNo, InitFlags, KernelConfig, LockOwner, MountOption,
    Notifier, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory,
    ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, Session,
    SessionACL, TimeOrNow, WriteFlags,
};

use super::fill::OpenedFile;
use super::policy::{Granted, Handle, OpenPolicy, OpenStart, WARM_OPENS_TO_PAGE_CACHE};
use super::pool::Pool;
use super::{Attr, DirSink, Errno, FillJob, Kind, KpackFs, Lookup, OpenMode, TTL};
use crate::sync::lock;

/// The filesystem subtype: the mount shows as `fuse.kpack-fuse`.
pub const SUBTYPE: &str = "kpack-fuse";

fn errno(e: Errno) -> FErrno {
    FErrno::from_i32(e.0)
}

fn file_type(kind: Kind) -> FileType {
    match kind {
        Kind::Dir => FileType::Directory,
        Kind::File => FileType::RegularFile,
        Kind::Symlink => FileType::Symlink,
    }
}

fn file_attr(a: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(a.ino),
        size: a.size,
        blocks: a.blocks,
        atime: a.mtime,
        mtime: a.mtime,
        ctime: a.mtime,
        crtime: a.mtime,
        kind: file_type(a.kind),
        perm: a.perm,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: 0,
        blksize: a.blksize,
        flags: 0,
    }
}

/// A negative entry: inode 0 with a TTL makes the kernel cache "no such name".
fn negative_attr() -> FileAttr {
    FileAttr {
        ino: INodeNo(0),
        size: 0,
        blocks: 0,
        atime: SystemTime::UNIX_EPOCH,
        mtime: SystemTime::UNIX_EPOCH,
        ctime: SystemTime::UNIX_EPOCH,
        crtime: SystemTime::UNIX_EPOCH,
        kind: FileType::RegularFile,
        perm: 0,
        nlink: 0,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 0,
        flags: 0,
    }
}

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

/// The open policy, with the kernel's backing ids as its ids: shared with the stats lines.
type Policy = Arc<Mutex<OpenPolicy<Arc<BackingId>>>>;

/// What the adapter and the jobs it sends to the decode pool share.
struct Shared {
    fs: KpackFs,
    /// Which read path each open gets; its decisions are carried out here.
    policy: Policy,
    /// Sends notifications to the kernel; set once the session exists.
    notifier: OnceLock<Notifier>,
}

/// The adapter handed to fuser.
struct Adapter {
    shared: Arc<Shared>,
    decoders: Pool,
    /// Held at the end of the session, before the process lets go (tests make exits slow).
    exit_delay: Duration,
}

impl Shared {
    /// Replies to an open once its file is there, as the policy decides: passthrough with the
    /// inode's backing id (registered through `reply` when it has none), or read by the
    /// daemon.
    fn opened(&self, ino: u64, opened: Result<OpenedFile, Errno>, reply: ReplyOpen) {
        let opened = match opened {
            Ok(o) => o,
            Err(e) => return reply.error(errno(e)),
        };
        let new = self.fs.add_handle(opened);
        let fh = new.fh;
        let register = || match self.fs.backing_of(fh) {
            Some(file) => reply.open_backing(file.file()).map(Arc::new),
            None => Err(io::Error::other("no handle")),
        };
        let handle = OpenPolicy::answer(&self.policy, ino, fh, new.complete, new.warm, register);
        match handle {
            Handle::Passthrough(id) => {
                reply.opened_passthrough(FileHandle(fh), FopenFlags::empty(), &id)
            }
            // Direct I/O: the daemon answers from the part already decoded, and the kernel keeps
            // no second copy of pages that later opens pass through. Otherwise the page cache is
            // kept across opens (the warm cache of the daemon read path): the archive does not
            // change while mounted.
            Handle::Daemon { direct_io: true } => {
                reply.opened(FileHandle(fh), FopenFlags::FOPEN_DIRECT_IO)
            }
            Handle::Daemon { direct_io: false } | Handle::Register => {
                reply.opened(FileHandle(fh), FopenFlags::FOPEN_KEEP_CACHE)
            }
        }
    }

    /// Puts every kept kernel into the mount's page cache (FUSE's store notification) on a
    /// thread of its own, then lets the policy turn to page-cache mode: after the turn, warm
    /// reads of those files need no request at all, from the first pass on.
    /// Kernels from inode `from` on go first: a reader walking the tree is there.
    fn prefill(self: Arc<Self>, from: u64) {
        let spawned = std::thread::Builder::new()
            .name("kpack-prefill".into())
            .spawn({
                let shared = self.clone();
                move || {
                    if let Some(notifier) = shared.notifier.get() {
                        let store =
                            |ino, offset, bytes: &[u8]| notifier.store(INodeNo(ino), offset, bytes);
                        match shared.fs.each_kept_kernel(from, store) {
                            Ok((n, bytes)) => log::info!(
                                "a warm set: {n} kept kernels ({bytes} bytes) put into the \
                                 mount's page cache"
                            ),
                            Err(e) => log::warn!(
                                "cannot put kept kernels into the mount's page cache: {e}"
                            ),
                        }
                    }
                    lock(&shared.policy).prefilled();
                }
            });
        if let Err(e) = spawned {
            log::warn!("cannot start putting kept kernels into the page cache: {e}");
            lock(&self.policy).prefilled();
        }
    }

    fn release(&self, fh: u64) {
        // The last handle's backing id is closed in the kernel once the lock is released.
        let closed = lock(&self.policy).release(fh);
        drop(closed);
        self.fs.release(fh);
    }
}

impl Adapter {
    /// Runs `job` on the decode pool; the thread then goes on decoding ahead of a scan while
    /// there is one to decode ahead of and no other job waits for a thread.
    fn decode(&self, job: FillJob) {
        let shared = self.shared.clone();
        let queue = self.decoders.queue();
        self.decoders.run(move || {
            let mut next = Some(job);
            while let Some(job) = next {
                shared.fs.run_fill(job);
                next = if queue.has_waiting() {
                    None
                } else {
                    shared.fs.continue_ahead()
                };
            }
        });
    }

    /// A read without a handle (page-cache mode): answered at once for a stored kernel, else by
    /// the kernel's decode job (started on the decode pool when none runs), so request threads
    /// stay free for other files.
    fn read_ino(&self, ino: u64, offset: u64, size: u32, reply: ReplyData) {
        let done = Box::new(move |r: Result<&[u8], Errno>| match r {
            Ok(bytes) => reply.data(bytes),
            Err(e) => reply.error(errno(e)),
        });
        if let Some(job) = self.fs.read_ino_start(ino, offset, size, done) {
            self.decode(job);
        }
    }
}

struct Sink<'a>(&'a mut ReplyDirectory);

impl DirSink for Sink<'_> {
    fn add(&mut self, ino: u64, next_offset: u64, kind: Kind, name: &str) -> bool {
        self.0.add(INodeNo(ino), next_offset, file_type(kind), name)
    }
}

impl std::ops::Deref for Adapter {
    type Target = Shared;
    fn deref(&self) -> &Shared {
        &self.shared
    }
}

impl Filesystem for Adapter {
    fn destroy(&mut self) {
        if !self.exit_delay.is_zero() {
            std::thread::sleep(self.exit_delay);
        }
    }

    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        let wants = lock(&self.policy).wants();
        // Opening without the daemon needs a kernel that treats ENOSYS from OPEN as "no open
        // needed" (Linux 4.19+, which says so with FUSE_NO_OPEN_SUPPORT); on an older one every
        // open would fail, so the mount opens through the daemon instead.
        let no_open = wants.no_open
            && config
                .add_capabilities(InitFlags::FUSE_NO_OPEN_SUPPORT)
                .is_ok();
        if wants.no_open && !no_open {
            log::warn!(
                "the kernel cannot open files without the daemon (Linux 4.19+); \
                 every open goes through the daemon"
            );
        }
        let mut passthrough = false;
        // The kernel registers backing files only for a daemon with CAP_SYS_ADMIN: without it,
        // the read path is the daemon's from the start rather than after a first refusal.
        if wants.passthrough && !may_register_backing_files() {
            log::warn!(
                "FUSE passthrough needs CAP_SYS_ADMIN, which this daemon lacks; reads go through the daemon"
            );
        } else if wants.passthrough {
            match config.add_capabilities(InitFlags::FUSE_PASSTHROUGH) {
                // Depth 2: backing files may sit on a stacked filesystem (overlayfs, as in
                // containers).
                Ok(()) => passthrough = config.set_max_stack_depth(2).is_ok(),
                Err(_) => log::warn!(
                    "the kernel does not offer FUSE passthrough (Linux 6.9+ with \
                     CONFIG_FUSE_PASSTHROUGH); reads go through the daemon"
                ),
            }
        }
        // Files still decoding are opened for direct I/O (see `opened`); this keeps `mmap`
        // working on them (Linux 6.6+; older kernels allow only private mappings).
        let _ = config.add_capabilities(InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP);
        // More readahead requests in flight for the daemon read path (fuser's default is 16).
        let _ = config.set_max_background(64);
        let (page_cache, passthrough) = {
            let mut policy = lock(&self.policy);
            policy.granted(Granted {
                no_open,
                passthrough,
            });
            (policy.page_cache(), policy.passthrough())
        };
        if page_cache {
            // No open walks the files: there is no scan to decode ahead of.
            self.fs.set_decode_ahead(false);
        }
        log::info!(
            "open mode: {}; read path: {}; backing files: {}",
            if page_cache {
                "page-cache"
            } else {
                "passthrough"
            },
            if passthrough { "passthrough" } else { "daemon" },
            self.fs.store().kind()
        );
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match self.fs.lookup(parent.0, name.as_encoded_bytes()) {
            Ok(Lookup::Found(a)) => reply.entry(&TTL, &file_attr(&a), Generation(0)),
            Ok(Lookup::Missing) => reply.entry(&TTL, &negative_attr(), Generation(0)),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.fs.getattr(ino.0) {
            Ok(a) => reply.attr(&TTL, &file_attr(&a)),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.fs.readlink(ino.0) {
            Ok(target) => reply.data(&target),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let start = lock(&self.policy).open();
        let passthrough = match start {
            OpenStart::Open {
                passthrough,
                prefill,
            } => {
                if prefill {
                    self.shared.clone().prefill(ino.0);
                }
                passthrough
            }
            OpenStart::NoOpen { turned } => {
                if turned {
                    self.fs.set_decode_ahead(false);
                    log::info!(
                        "open mode: page-cache from now on ({WARM_OPENS_TO_PAGE_CACHE} opens in \
                         a row of kernels decoded and opened before: the kernel opens files \
                         without the daemon)"
                    );
                }
                return reply.error(errno(self.fs.refuse_open(ino.0, flags.0)));
            }
        };
        let shared = self.shared.clone();
        let done = Box::new(move |r| shared.opened(ino.0, r, reply));
        if let Some(job) = self.fs.open_start(ino.0, flags.0, passthrough, done) {
            self.decode(job);
        }
        // If this open continues a scan, decode threads left idle decode ahead of it.
        for ahead in self.fs.decode_ahead(ino.0, self.decoders.idle_workers()) {
            self.decode(ahead);
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        // Handles start at 1: handle 0 is a file the kernel opened by itself (page-cache mode).
        if fh.0 == 0 {
            return self.read_ino(ino.0, offset, size, reply);
        }
        let done = Box::new(move |r: Result<&[u8], Errno>| match r {
            Ok(bytes) => reply.data(bytes),
            Err(e) => reply.error(errno(e)),
        });
        self.fs.read_start(fh.0, offset, size, done);
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.shared.release(fh.0);
        reply.ok();
    }

    /// Sent on every close of a descriptor. Nothing is buffered, so there is nothing to do;
    /// answering ENOSYS makes the kernel stop sending it (close succeeds), which saves a round
    /// trip per close.
    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.error(FErrno::ENOSYS);
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.fs.getattr(ino.0) {
            Ok(a) if a.kind == Kind::Dir => reply.opened(
                FileHandle(0),
                FopenFlags::FOPEN_KEEP_CACHE | FopenFlags::FOPEN_CACHE_DIR,
            ),
            Ok(_) => reply.error(FErrno::ENOTDIR),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        match self.fs.readdir(ino.0, offset, &mut Sink(&mut reply)) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let s = self.fs.statfs();
        reply.statfs(s.blocks, 0, 0, s.files, 0, s.bsize, s.namelen, s.frsize);
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        xattr_reply(
            self.fs.getxattr(ino.0, name.as_encoded_bytes()),
            size,
            reply,
        );
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        xattr_reply(self.fs.listxattr(ino.0), size, reply);
    }

    fn access(&self, _req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        let (write, exec) = (
            mask.contains(AccessFlags::W_OK),
            mask.contains(AccessFlags::X_OK),
        );
        match self.fs.access(ino.0, write, exec) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(e)),
        }
    }

    // Everything that would change the tree is refused: the filesystem is read-only.

    fn setattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        _size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        reply.error(FErrno::EROFS);
    }

    fn mknod(
        &self,
        _r: &Request,
        _p: INodeNo,
        _n: &OsStr,
        _m: u32,
        _u: u32,
        _d: u32,
        reply: ReplyEntry,
    ) {
        reply.error(FErrno::EROFS);
    }

    fn mkdir(&self, _r: &Request, _p: INodeNo, _n: &OsStr, _m: u32, _u: u32, reply: ReplyEntry) {
        reply.error(FErrno::EROFS);
    }

    fn unlink(&self, _r: &Request, _p: INodeNo, _n: &OsStr, reply: ReplyEmpty) {
        reply.error(FErrno::EROFS);
    }

    fn rmdir(&self, _r: &Request, _p: INodeNo, _n: &OsStr, reply: ReplyEmpty) {
        reply.error(FErrno::EROFS);
    }

    fn symlink(&self, _r: &Request, _p: INodeNo, _n: &OsStr, _t: &Path, reply: ReplyEntry) {
        reply.error(FErrno::EROFS);
    }

    fn rename(
        &self,
        _r: &Request,
        _p: INodeNo,
        _n: &OsStr,
        _np: INodeNo,
        _nn: &OsStr,
        _f: RenameFlags,
        reply: ReplyEmpty,
    ) {
        reply.error(FErrno::EROFS);
    }

    fn link(&self, _r: &Request, _i: INodeNo, _np: INodeNo, _nn: &OsStr, reply: ReplyEntry) {
        reply.error(FErrno::EROFS);
    }

    fn write(
        &self,
        _r: &Request,
        _i: INodeNo,
        _fh: FileHandle,
        _o: u64,
        _d: &[u8],
        _wf: WriteFlags,
        _f: OpenFlags,
        _l: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        reply.error(FErrno::EROFS);
    }

    fn create(
        &self,
        _r: &Request,
        _p: INodeNo,
        _n: &OsStr,
        _m: u32,
        _u: u32,
        _f: i32,
        reply: ReplyCreate,
    ) {
        reply.error(FErrno::EROFS);
    }

    fn setxattr(
        &self,
        _r: &Request,
        _i: INodeNo,
        _n: &OsStr,
        _v: &[u8],
        _f: i32,
        _p: u32,
        reply: ReplyEmpty,
    ) {
        reply.error(FErrno::EROFS);
    }

    fn removexattr(&self, _r: &Request, _i: INodeNo, _n: &OsStr, reply: ReplyEmpty) {
        reply.error(FErrno::EROFS);
    }
}

/// `size == 0` asks for the length; a value that does not fit is ERANGE.
fn xattr_reply(value: Result<Vec<u8>, Errno>, size: u32, reply: ReplyXattr) {
    match value {
        Ok(v) if size == 0 => reply.size(v.len() as u32),
        Ok(v) if v.len() > size as usize => reply.error(FErrno::ERANGE),
        Ok(v) => reply.data(&v),
        Err(e) => reply.error(errno(e)),
    }
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
                super::mountinfo::mount_at(&self.mountpoint),
                Ok(Some(m)) if (m.major, m.minor) == self.device
            )
    }
}

/// Whether this process has CAP_SYS_ADMIN in its effective set, which the kernel asks of a
/// daemon that registers backing files for passthrough.
fn may_register_backing_files() -> bool {
    const CAP_SYS_ADMIN: u32 = 21;
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        // Unknown: try, and fall back on the first refusal.
        return true;
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .is_none_or(|caps| caps & (1 << CAP_SYS_ADMIN) != 0)
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

/// The adapter of `fs` for a mount configured by `cfg`; the open policy's state shows in
/// `user.kpack.stats`.
fn adapter(mut fs: KpackFs, cfg: &MountConfig) -> Adapter {
    let start = cfg.open_mode.start(fs.median_kernel_size());
    let policy: Policy = Arc::new(Mutex::new(OpenPolicy::new(start, cfg.passthrough)));
    let shown = policy.clone();
    fs.add_stats(Box::new(move || lock(&shown).stats_text()));
    Adapter {
        shared: Arc::new(Shared {
            fs,
            policy,
            notifier: OnceLock::new(),
        }),
        decoders: Pool::per_core("kpack-decode"),
        exit_delay: cfg.exit_delay,
    }
}

/// Mounts `fs` read-only at `mountpoint`. When this returns Ok the kernel has completed the
/// FUSE handshake: the mount is live and requests queue until [`Mounted::run`].
pub fn mount(fs: KpackFs, mountpoint: &Path, cfg: &MountConfig) -> io::Result<Mounted> {
    let adapter = adapter(fs, cfg);
    let shared = adapter.shared.clone();
    let session = Session::new(adapter, mountpoint, &fuser_config(cfg))?;
    let _ = shared.notifier.set(session.notifier());
    // The device comes from the mount table: a stat of the mount point would wait for the
    // session, which is not serving yet.
    let entry = super::mountinfo::mount_at(mountpoint).ok().flatten();
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
fn raise_readahead(m: &super::mountinfo::MountEntry) {
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
    let adapter = adapter(fs, cfg);
    let shared = adapter.shared.clone();
    let session = Session::from_fd(adapter, fd, acl, config)?;
    let _ = shared.notifier.set(session.notifier());
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
