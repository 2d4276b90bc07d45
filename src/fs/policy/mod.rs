//! The open policy: which read path each open of a kernel file gets. Plain state and decisions,
//! with no FUSE types and no lock of its own: the adapter keeps it behind one mutex, feeds it
//! the events (what `init` granted, an open starting, an open's file ready, a backing id
//! registered or refused, a release) and carries out what it returns (`fs/steps.rs`).
//!
//! The read paths:
//! * **passthrough**: the kernel reads the decoded file itself through a backing id. Linux
//!   wants one id per inode for all its open handles, so the id lives here with the inode and
//!   goes when the inode's last passthrough handle is released.
//! * **daemon**: the daemon answers every READ of the handle, and the kernel keeps its pages
//!   cached across opens. With passthrough on, an open waits for its complete file, so this is
//!   the path of inodes that have a daemon handle already, and of mounts where passthrough is
//!   not granted or an id was refused.
//! * **page cache**: OPEN is answered ENOSYS, after which the kernel opens every file of the
//!   mount without the daemon, keeps its page cache, and sends READs with handle 0.
//!
//! Whether opens go through the daemon or the mount is in page-cache mode is decided once, at
//! `init`, and never changes. The invariant Linux enforces, and this type keeps: an inode never
//! has passthrough handles and daemon handles open at once (the kernel fails the second kind of
//! open with EIO).

use std::collections::HashMap;

use super::tree::Ino;

/// How the mount opens files, as asked with `--open-mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OpenMode {
    /// Page cache when the mounted kernels are small (median decoded size at most
    /// [`PAGE_CACHE_MEDIAN_MAX`]); otherwise every open through the daemon.
    #[default]
    Auto,
    /// Every open reaches the daemon, which hands the kernel the decoded file (passthrough)
    /// where it is granted, or else serves the reads itself; best for large kernels, whose
    /// cold reads then never cross into the daemon.
    Daemon,
    /// The kernel opens files itself; best for many small files.
    PageCache,
}

impl OpenMode {
    /// The spelling of `--open-mode` and `-o open_mode=`.
    pub fn parse(s: &str) -> Option<OpenMode> {
        match s {
            "auto" => Some(OpenMode::Auto),
            "daemon" => Some(OpenMode::Daemon),
            "page-cache" | "page_cache" => Some(OpenMode::PageCache),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            OpenMode::Auto => "auto",
            OpenMode::Daemon => "daemon",
            OpenMode::PageCache => "page-cache",
        }
    }

    /// Where a mount starts, given the median decoded size of its kernels (`None`: no
    /// kernels).
    pub fn start(self, median_kernel_size: Option<u64>) -> Start {
        match self {
            OpenMode::PageCache => Start::PageCache,
            OpenMode::Daemon => Start::Opens,
            OpenMode::Auto => match median_kernel_size {
                Some(m) if m > PAGE_CACHE_MEDIAN_MAX => Start::Opens,
                _ => Start::PageCache,
            },
        }
    }
}

/// `auto` picks page-cache mode when the median decoded kernel is at most this large. Below
/// it the two round trips of an open and a close cost more than reading the file from page
/// cache, so skipping them is what brings warm reads to local-disk speed. Above it,
/// passthrough's cold reads without daemon copies win.
pub const PAGE_CACHE_MEDIAN_MAX: u64 = 64 << 10;

/// How a mount starts (see [`OpenMode::start`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// Opens answered ENOSYS from the first.
    PageCache,
    /// Every open through the daemon.
    Opens,
}

/// What the kernel granted at `init`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Granted {
    /// The kernel treats ENOSYS from OPEN as "no open needed" (`FUSE_NO_OPEN_SUPPORT`).
    pub no_open: bool,
    /// The kernel accepts backing ids (`FUSE_PASSTHROUGH`, and a daemon allowed to register).
    pub passthrough: bool,
}

/// What to ask the kernel for at `init`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wants {
    pub no_open: bool,
    pub passthrough: bool,
}

/// The answer to an OPEN before anything is decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpenStart {
    /// Answer ENOSYS (after the checks any open gets): the kernel opens files itself.
    NoOpen,
    /// Open through the daemon: make sure the file exists, then ask [`OpenPolicy::opened`].
    Open {
        /// The handle would be passed through if its file is complete when it is answered
        /// (only a complete file can be). The read side decides from this whether an open
        /// waits for the complete file rather than the first decoded bytes
        /// (`KpackFs::open_start`).
        passthrough: bool,
    },
}

/// How a new handle is answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Handle<B> {
    /// Passthrough with the inode's backing id.
    Passthrough(B),
    /// Register a backing id for the handle's file (without holding the policy's lock), then
    /// report it with [`OpenPolicy::registered`] or [`OpenPolicy::refused`].
    Register,
    /// Read by the daemon.
    Daemon,
}

/// What an open handle reads through, as recorded for its release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Path {
    Passthrough,
    Daemon,
    /// Waiting for its backing id.
    Registering,
}

/// One inode's open handles, and its backing id while passthrough handles have it.
#[derive(Debug)]
struct Inode<B> {
    backing: Option<B>,
    passthrough: u32,
    daemon: u32,
    registering: u32,
}

impl<B> Default for Inode<B> {
    fn default() -> Self {
        Inode {
            backing: None,
            passthrough: 0,
            daemon: 0,
            registering: 0,
        }
    }
}

impl<B> Inode<B> {
    fn is_idle(&self) -> bool {
        self.passthrough == 0 && self.daemon == 0 && self.registering == 0
    }
}

/// The open policy of one mount (see the module documentation). `B` is the kernel's backing
/// id; the policy only keeps, clones and gives it back.
#[derive(Debug)]
pub struct OpenPolicy<B> {
    start: Start,
    want_passthrough: bool,
    /// Opens are answered ENOSYS.
    page_cache: bool,
    /// Backing ids are registered: asked for, granted at `init`, none refused since.
    passthrough: bool,
    inodes: HashMap<Ino, Inode<B>>,
    handles: HashMap<u64, (Ino, Path)>,
}

impl<B: Clone> OpenPolicy<B> {
    /// A mount that starts as `start`, with passthrough asked for or not.
    pub fn new(start: Start, want_passthrough: bool) -> Self {
        OpenPolicy {
            start,
            want_passthrough,
            page_cache: start == Start::PageCache,
            passthrough: false,
            inodes: HashMap::new(),
            handles: HashMap::new(),
        }
    }

    /// What to ask the kernel for at `init`: opening without the daemon in page-cache mode,
    /// and passthrough where opens go through the daemon.
    pub fn wants(&self) -> Wants {
        Wants {
            no_open: self.start == Start::PageCache,
            passthrough: self.want_passthrough && self.start == Start::Opens,
        }
    }

    /// Records what `init` granted. A kernel that cannot open files without the daemon keeps
    /// every open through it.
    pub fn granted(&mut self, granted: Granted) {
        // Only what was asked for counts as granted.
        let asked = self.wants();
        self.passthrough = granted.passthrough && asked.passthrough;
        if !granted.no_open {
            self.start = Start::Opens;
            self.page_cache = false;
        }
    }

    /// Whether the kernel reads open files itself (FUSE passthrough).
    pub fn passthrough(&self) -> bool {
        self.passthrough
    }

    /// Whether opens are answered ENOSYS (page-cache mode).
    pub fn page_cache(&self) -> bool {
        self.page_cache
    }

    /// An OPEN arrives.
    pub fn open(&self) -> OpenStart {
        if self.page_cache {
            return OpenStart::NoOpen;
        }
        OpenStart::Open {
            passthrough: self.passthrough,
        }
    }

    /// An open of `ino` has its file as handle `fh`: `complete` when every byte is decoded.
    pub fn opened(&mut self, ino: Ino, fh: u64, complete: bool) -> Handle<B> {
        // An inode with a backing id opens every handle with it: its file holds the same
        // bytes, and Linux refuses an open without it meanwhile.
        if let Some(id) = self.join_backing(ino, fh) {
            return Handle::Passthrough(id);
        }
        if self.passthrough && complete && self.passthrough_allowed(ino) {
            self.inodes.entry(ino).or_default().registering += 1;
            self.handles.insert(fh, (ino, Path::Registering));
            return Handle::Register;
        }
        self.add_daemon_handle(ino, fh);
        Handle::Daemon
    }

    /// A new passthrough handle `fh` of `ino` with the inode's backing id, if it has one.
    fn join_backing(&mut self, ino: Ino, fh: u64) -> Option<B> {
        let inode = self.inodes.get_mut(&ino)?;
        let id = inode.backing.clone()?;
        inode.passthrough += 1;
        self.handles.insert(fh, (ino, Path::Passthrough));
        Some(id)
    }

    /// Linux refuses a passthrough open of an inode with daemon handles open.
    fn passthrough_allowed(&self, ino: Ino) -> bool {
        self.inodes.get(&ino).is_none_or(|i| i.daemon == 0)
    }

    fn add_daemon_handle(&mut self, ino: Ino, fh: u64) {
        self.inodes.entry(ino).or_default().daemon += 1;
        self.handles.insert(fh, (ino, Path::Daemon));
    }

    /// Handle `fh` got backing id `id`. Returns the answer, and an id to close (without the
    /// lock) when another one is used instead or the handle is read by the daemon after all.
    pub fn registered(&mut self, fh: u64, id: B) -> (Handle<B>, Option<B>) {
        let Some(ino) = self.stop_registering(fh) else {
            return (Handle::Daemon, Some(id));
        };
        // Another open of the inode registered first.
        if let Some(theirs) = self.join_backing(ino, fh) {
            return (Handle::Passthrough(theirs), Some(id));
        }
        // A daemon handle of the inode was opened meanwhile: a passthrough open now would fail.
        if !self.passthrough_allowed(ino) {
            self.add_daemon_handle(ino, fh);
            return (Handle::Daemon, Some(id));
        }
        let inode = self.inodes.entry(ino).or_default();
        inode.backing = Some(id.clone());
        inode.passthrough += 1;
        self.handles.insert(fh, (ino, Path::Passthrough));
        (Handle::Passthrough(id), None)
    }

    /// The kernel refused a backing id for handle `fh`: the daemon reads from now on. Returns
    /// the answer, and whether this is the first refusal (to be said once in the log). An
    /// inode that got an id from another open meanwhile is opened with it: Linux fails an open
    /// without one beside a handle that has one.
    pub fn refused(&mut self, fh: u64) -> (Handle<B>, bool) {
        let first = std::mem::replace(&mut self.passthrough, false);
        let daemon = Handle::Daemon;
        let Some(ino) = self.stop_registering(fh) else {
            return (daemon, first);
        };
        if let Some(id) = self.join_backing(ino, fh) {
            return (Handle::Passthrough(id), first);
        }
        self.add_daemon_handle(ino, fh);
        (daemon, first)
    }

    fn stop_registering(&mut self, fh: u64) -> Option<Ino> {
        let (ino, path) = self.handles.remove(&fh)?;
        debug_assert_eq!(path, Path::Registering);
        if let Some(inode) = self.inodes.get_mut(&ino) {
            inode.registering = inode.registering.saturating_sub(1);
        }
        Some(ino)
    }

    /// Handle `fh` is released. Returns the inode's backing id when this was its last
    /// passthrough handle, to be closed without the lock.
    pub fn release(&mut self, fh: u64) -> Option<B> {
        let (ino, path) = self.handles.remove(&fh)?;
        let inode = self.inodes.get_mut(&ino)?;
        let mut closed = None;
        match path {
            Path::Passthrough => {
                inode.passthrough -= 1;
                if inode.passthrough == 0 {
                    closed = inode.backing.take();
                }
            }
            Path::Daemon => inode.daemon -= 1,
            Path::Registering => inode.registering -= 1,
        }
        if inode.is_idle() {
            self.inodes.remove(&ino);
        }
        closed
    }

    /// Open handles of `ino`: (passthrough, daemon).
    #[cfg(test)]
    pub fn handles_of(&self, ino: Ino) -> (u32, u32) {
        self.inodes
            .get(&ino)
            .map_or((0, 0), |i| (i.passthrough, i.daemon))
    }

    /// Whether `ino` has a backing id now.
    #[cfg(test)]
    pub fn has_backing(&self, ino: Ino) -> bool {
        self.inodes.get(&ino).is_some_and(|i| i.backing.is_some())
    }

    /// `name value` lines for `user.kpack.stats`: the read path.
    pub fn stats_text(&self) -> String {
        format!(
            "passthrough {}\npage_cache_mode {}\n",
            u8::from(self.passthrough),
            u8::from(self.page_cache),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GRANT_ALL: Granted = Granted {
        no_open: true,
        passthrough: true,
    };

    const OPEN: OpenStart = OpenStart::Open { passthrough: true };

    /// An open through the daemon with passthrough off.
    const OPEN_NO_PASSTHROUGH: OpenStart = OpenStart::Open { passthrough: false };

    fn passthrough_mount() -> OpenPolicy<u32> {
        let mut p = OpenPolicy::new(Start::Opens, true);
        p.granted(GRANT_ALL);
        p
    }

    #[test]
    fn auto_starts_from_the_median_size() {
        assert_eq!(OpenMode::Auto.start(None), Start::PageCache);
        assert_eq!(
            OpenMode::Auto.start(Some(PAGE_CACHE_MEDIAN_MAX)),
            Start::PageCache
        );
        assert_eq!(
            OpenMode::Auto.start(Some(PAGE_CACHE_MEDIAN_MAX + 1)),
            Start::Opens
        );
        assert_eq!(OpenMode::Daemon.start(Some(1)), Start::Opens);
        assert_eq!(OpenMode::PageCache.start(Some(u64::MAX)), Start::PageCache);
        for (s, m) in [
            ("auto", OpenMode::Auto),
            ("daemon", OpenMode::Daemon),
            ("page-cache", OpenMode::PageCache),
            ("page_cache", OpenMode::PageCache),
        ] {
            assert_eq!(OpenMode::parse(s), Some(m));
        }
        assert_eq!(OpenMode::parse("fast"), None);
    }

    #[test]
    fn what_init_asks_for_and_what_it_grants() {
        let p: OpenPolicy<u32> = OpenPolicy::new(Start::PageCache, true);
        assert_eq!(
            p.wants(),
            Wants {
                no_open: true,
                passthrough: false
            }
        );
        let p: OpenPolicy<u32> = OpenPolicy::new(Start::Opens, false);
        assert_eq!(
            p.wants(),
            Wants {
                no_open: false,
                passthrough: false
            }
        );
        let mut p: OpenPolicy<u32> = OpenPolicy::new(Start::Opens, true);
        assert_eq!(
            p.wants(),
            Wants {
                no_open: false,
                passthrough: true
            }
        );
        p.granted(Granted {
            no_open: false,
            passthrough: false,
        });
        assert!(!p.passthrough());
        assert_eq!(p.open(), OPEN_NO_PASSTHROUGH);

        // A kernel that cannot open without the daemon keeps page-cache mounts opening.
        let mut p: OpenPolicy<u32> = OpenPolicy::new(Start::PageCache, true);
        assert!(p.page_cache());
        p.granted(Granted {
            no_open: false,
            passthrough: true,
        });
        assert!(!p.page_cache());
        assert_eq!(p.open(), OPEN_NO_PASSTHROUGH);
        assert_eq!(p.stats_text(), "passthrough 0\npage_cache_mode 0\n");
    }

    #[test]
    fn page_cache_mode_refuses_every_open() {
        let mut p: OpenPolicy<u32> = OpenPolicy::new(Start::PageCache, true);
        p.granted(GRANT_ALL);
        assert!(!p.passthrough());
        assert_eq!(p.open(), OpenStart::NoOpen);
        assert_eq!(p.stats_text(), "passthrough 0\npage_cache_mode 1\n");
    }

    #[test]
    fn one_backing_id_per_inode_closed_with_its_last_handle() {
        let mut p = passthrough_mount();
        assert_eq!(p.open(), OPEN);
        assert_eq!(p.opened(5, 1, true), Handle::Register);
        assert_eq!(p.registered(1, 50), (Handle::Passthrough(50), None));
        // A second open reuses the id without registering.
        assert_eq!(p.opened(5, 2, true), Handle::Passthrough(50));
        assert_eq!(p.handles_of(5), (2, 0));
        assert_eq!(p.release(1), None);
        assert!(p.has_backing(5));
        assert_eq!(p.release(2), Some(50));
        assert!(!p.has_backing(5));
        assert_eq!(
            p.release(2),
            None,
            "a second release of a handle is ignored"
        );
    }

    #[test]
    fn racing_registrations_keep_the_first_id() {
        let mut p = passthrough_mount();
        assert_eq!(p.opened(5, 1, true), Handle::Register);
        assert_eq!(p.opened(5, 2, true), Handle::Register);
        assert_eq!(p.registered(2, 20), (Handle::Passthrough(20), None));
        assert_eq!(p.registered(1, 10), (Handle::Passthrough(20), Some(10)));
        assert_eq!(p.handles_of(5), (2, 0));
        assert_eq!(p.release(2), None);
        assert_eq!(p.release(1), Some(20));
    }

    #[test]
    fn a_file_still_decoding_is_read_by_the_daemon_and_blocks_passthrough() {
        let mut p = passthrough_mount();
        assert_eq!(p.opened(5, 1, false), Handle::Daemon);
        // Complete now, but the inode has a daemon handle: Linux would refuse passthrough.
        assert_eq!(p.opened(5, 2, true), Handle::Daemon);
        assert_eq!(p.handles_of(5), (0, 2));
        p.release(1);
        p.release(2);
        assert_eq!(p.opened(5, 3, true), Handle::Register);
    }

    #[test]
    fn a_daemon_handle_opened_during_registration_wins() {
        let mut p = passthrough_mount();
        assert_eq!(p.opened(5, 1, true), Handle::Register);
        assert_eq!(p.opened(5, 2, false), Handle::Daemon);
        assert_eq!(p.registered(1, 10), (Handle::Daemon, Some(10)));
        assert_eq!(p.handles_of(5), (0, 2));
    }

    #[test]
    fn a_refused_id_turns_passthrough_off_once() {
        let mut p = passthrough_mount();
        assert_eq!(p.opened(5, 1, true), Handle::Register);
        assert_eq!(p.opened(6, 2, true), Handle::Register);
        assert_eq!(p.refused(1), (Handle::Daemon, true));
        assert!(!p.passthrough());
        assert_eq!(p.refused(2), (Handle::Daemon, false), "said once");
        assert_eq!(p.handles_of(5), (0, 1));
        assert_eq!(p.open(), OPEN_NO_PASSTHROUGH);
        assert_eq!(p.opened(7, 3, false), Handle::Daemon);
        assert_eq!(p.stats_text(), "passthrough 0\npage_cache_mode 0\n");
    }

    /// Two opens of one inode register at once; the kernel takes one id and refuses the
    /// other: the refused open joins the id, since a daemon handle beside it would fail.
    #[test]
    fn a_refused_open_joins_an_id_registered_meanwhile() {
        let mut p = passthrough_mount();
        assert_eq!(p.opened(5, 1, true), Handle::Register);
        assert_eq!(p.opened(5, 2, true), Handle::Register);
        assert_eq!(p.registered(1, 10), (Handle::Passthrough(10), None));
        assert_eq!(p.refused(2), (Handle::Passthrough(10), true));
        assert!(!p.passthrough());
        assert_eq!(p.handles_of(5), (2, 0));
    }
}
