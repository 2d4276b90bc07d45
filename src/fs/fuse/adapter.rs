//! The adapter proper: kernel requests in, calls on [`KpackFs`] and the open steps
//! (`fs/steps.rs`) out, answers back as replies; the decode pool.

use std::ffi::OsStr;
use std::io;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use fuser::{
    AccessFlags, BackingId, BsdFileFlags, Errno as FErrno, FileAttr, FileHandle, FileType,
    Filesystem, FopenFlags, Generation, INodeNo, InitFlags, IoctlFlags, KernelConfig, LockOwner,
    OpenFlags, PollEvents, PollFlags, PollNotifier, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyLseek, ReplyOpen, ReplyPoll,
    ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};

use super::mount::MountConfig;
use crate::fs::errno::Errno;
use crate::fs::policy::{Granted, Handle, OpenPolicy};
use crate::fs::read::fill::OpenedFile;
use crate::fs::read::pool::cores;
use crate::fs::steps::{self, Decoders};
use crate::fs::store::BackingFile;
use crate::fs::{Attr, DirSink, Kind, KpackFs, Lookup, TTL};

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

/// The open handles, with the kernel's backing ids as their ids.
type Policy = Mutex<OpenPolicy<Arc<BackingId>>>;

/// What the adapter and the jobs it sends to the decode pool share.
pub(super) struct Shared {
    fs: Arc<KpackFs>,
    /// Which read path each open gets; its decisions are carried out by `fs/steps.rs`.
    policy: Policy,
}

/// The adapter handed to fuser.
pub(super) struct Adapter {
    shared: Arc<Shared>,
    decoders: Decoders,
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
        let register = |file: &BackingFile| reply.open_backing(file.file()).map(Arc::new);
        let (new, handle) = steps::answer(&self.fs, &self.policy, ino, opened, register);
        let fh = new.fh;
        match handle {
            Handle::Passthrough(id) => {
                reply.opened_passthrough(FileHandle(fh), FopenFlags::empty(), &id)
            }
            // The page cache is kept across opens (the warm cache of the daemon read path): the
            // archive does not change while mounted.
            Handle::Daemon | Handle::Register => {
                reply.opened(FileHandle(fh), FopenFlags::FOPEN_KEEP_CACHE)
            }
        }
    }
}

impl Adapter {
    /// A read without a handle (page-cache mode): answered at once for a stored kernel, else by
    /// the kernel's decode job (started on the decode pool when none runs), so request threads
    /// stay free for other files.
    fn read_ino(&self, ino: u64, offset: u64, size: u32, reply: ReplyData) {
        let done = Box::new(move |r: Result<&[u8], Errno>| match r {
            Ok(bytes) => reply.data(bytes),
            Err(e) => reply.error(errno(e)),
        });
        steps::read_ino(&self.decoders, ino, offset, size, done);
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
        let wants = self.fs.mode().wants();
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
        // More readahead requests in flight for the daemon read path (fuser's default is 16).
        let _ = config.set_max_background(64);
        let granted = Granted {
            no_open,
            passthrough,
        };
        let (page_cache, passthrough) = steps::granted(&self.fs, granted);
        log::info!(
            "open mode: {}; read path: {}; backing files: {}",
            if page_cache { "page-cache" } else { "daemon" },
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
        let shared = self.shared.clone();
        let done = Box::new(move |r| shared.opened(ino.0, r, reply));
        steps::open(&self.decoders, ino.0, flags.0, done);
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
        steps::release(&self.fs, &self.policy, fh.0);
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

    /// Python's `open` asks every file whether it is a terminal (`TCGETS`), and `lsattr` asks
    /// for flags: the kernel forwards every ioctl on a file, and has no way to stop asking. No
    /// ioctl means anything here; ENOTTY is a regular file's answer, given without a log line
    /// (fuser's default logs a warning per call, one per Python open).
    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        reply.error(FErrno::ENOTTY);
    }

    /// A read-only file is always in sync. ENOSYS makes the kernel answer later calls itself
    /// (with success), as `flush` above; fuser's default would log a warning first.
    fn fsync(&self, _req: &Request, _i: INodeNo, _fh: FileHandle, _d: bool, reply: ReplyEmpty) {
        reply.error(FErrno::ENOSYS);
    }

    fn fsyncdir(&self, _req: &Request, _i: INodeNo, _fh: FileHandle, _d: bool, reply: ReplyEmpty) {
        reply.error(FErrno::ENOSYS);
    }

    /// `SEEK_DATA` and `SEEK_HOLE`: kernels have no holes, which is what the kernel's own
    /// answer assumes once ENOSYS tells it to stop asking.
    fn lseek(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _offset: i64,
        _whence: i32,
        reply: ReplyLseek,
    ) {
        reply.error(FErrno::ENOSYS);
    }

    /// `poll` and `select` on a file: always readable, which the kernel answers itself after
    /// ENOSYS.
    fn poll(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _ph: PollNotifier,
        _events: PollEvents,
        _flags: PollFlags,
        reply: ReplyPoll,
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

/// The adapter of `fs` for a mount configured by `cfg`, whose open mode it plans.
pub(super) fn adapter(mut fs: KpackFs, cfg: &MountConfig) -> Adapter {
    fs.plan_open_mode(cfg.open_mode, cfg.passthrough);
    let policy = Mutex::new(OpenPolicy::default());
    let fs = Arc::new(fs);
    Adapter {
        decoders: Decoders::new(fs.clone(), cores()),
        shared: Arc::new(Shared { fs, policy }),
        exit_delay: cfg.exit_delay,
    }
}
