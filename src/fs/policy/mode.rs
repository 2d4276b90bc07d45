//! The mount's open mode: the one owner of whether opens reach the daemon or the mount is in
//! page-cache mode, and of whether the kernel may pass reads through. Planned at mount from
//! `--open-mode` and the kernels' sizes ([`Mode::plan`]), settled once at `init` from what the
//! kernel granted ([`Mode::settle`]), and read by every open and READ after that. Passthrough
//! is the one thing that changes afterwards: it is turned off for good by the first backing
//! file the kernel refuses.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

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

    /// Whether a mount in this mode, whose median decoded kernel size is `median_kernel_size`
    /// (`None`: no kernels), asks for page-cache mode.
    fn page_cache(self, median_kernel_size: Option<u64>) -> bool {
        match self {
            OpenMode::PageCache => true,
            OpenMode::Daemon => false,
            OpenMode::Auto => median_kernel_size.is_none_or(|m| m <= PAGE_CACHE_MEDIAN_MAX),
        }
    }
}

/// `auto` picks page-cache mode when the median decoded kernel is at most this large. Below
/// it the two round trips of an open and a close cost more than reading the file from page
/// cache, so skipping them is what brings warm reads to local-disk speed. Above it,
/// passthrough's cold reads without daemon copies win.
pub const PAGE_CACHE_MEDIAN_MAX: u64 = 64 << 10;

/// What the kernel granted at `init`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Granted {
    /// The kernel treats ENOSYS from OPEN as "no open needed" (`FUSE_NO_OPEN_SUPPORT`).
    pub no_open: bool,
    /// The kernel accepts backing ids (`FUSE_PASSTHROUGH`, and a daemon allowed to register).
    pub passthrough: bool,
}

/// What to ask the kernel for at `init`: opening without the daemon in page-cache mode, and
/// passthrough where opens go through the daemon.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wants {
    pub no_open: bool,
    pub passthrough: bool,
}

/// The mount's open mode (see the module's text).
#[derive(Debug)]
pub struct Mode {
    wants: Wants,
    /// Page-cache mode, once settled.
    page_cache: OnceLock<bool>,
    /// Backing ids are registered: asked for, granted at `init`, none refused since.
    passthrough: AtomicBool,
}

impl Default for Mode {
    /// Opens through the daemon, without passthrough (a file system that no mount planned).
    fn default() -> Self {
        Mode::plan(OpenMode::Daemon, None, false)
    }
}

impl Mode {
    /// The mode a mount asks for: `open_mode` over kernels of median decoded size
    /// `median_kernel_size`, with passthrough asked for or not.
    pub fn plan(open_mode: OpenMode, median_kernel_size: Option<u64>, passthrough: bool) -> Mode {
        let page_cache = open_mode.page_cache(median_kernel_size);
        Mode {
            wants: Wants {
                no_open: page_cache,
                passthrough: passthrough && !page_cache,
            },
            page_cache: OnceLock::new(),
            passthrough: AtomicBool::new(false),
        }
    }

    /// What to ask the kernel for at `init`.
    pub fn wants(&self) -> Wants {
        self.wants
    }

    /// Settles the mode from what `init` granted (only what was asked for counts): a kernel
    /// that cannot open files without the daemon keeps every open through it. Returns
    /// (page-cache mode, passthrough). Settled once: a second call changes nothing.
    pub fn settle(&self, granted: Granted) -> (bool, bool) {
        let mut first = false;
        let page_cache = *self.page_cache.get_or_init(|| {
            first = true;
            self.wants.no_open && granted.no_open
        });
        if first {
            let passthrough = self.wants.passthrough && granted.passthrough;
            self.passthrough.store(passthrough, Ordering::Relaxed);
        }
        (page_cache, self.passthrough())
    }

    /// Whether the mount is in page-cache mode: OPEN is answered ENOSYS and the kernel reads
    /// files by inode. False until settled.
    pub fn page_cache(&self) -> bool {
        self.page_cache.get().copied().unwrap_or(false)
    }

    /// Whether the kernel reads complete files itself (FUSE passthrough).
    pub fn passthrough(&self) -> bool {
        self.passthrough.load(Ordering::Relaxed)
    }

    /// The kernel refused a backing id: the daemon reads from now on. Returns whether this is
    /// the first refusal (to be said once in the log).
    pub fn refuse_passthrough(&self) -> bool {
        self.passthrough.swap(false, Ordering::Relaxed)
    }

    /// `name value` lines for `user.kpack.stats`: the read path.
    pub fn stats_text(&self) -> String {
        format!(
            "passthrough {}\npage_cache_mode {}\n",
            u8::from(self.passthrough()),
            u8::from(self.page_cache()),
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

    #[test]
    fn auto_asks_for_page_cache_mode_from_the_median_size() {
        let page_cache = |mode: OpenMode, median| Mode::plan(mode, median, true).wants().no_open;
        assert!(page_cache(OpenMode::Auto, None));
        assert!(page_cache(OpenMode::Auto, Some(PAGE_CACHE_MEDIAN_MAX)));
        assert!(!page_cache(OpenMode::Auto, Some(PAGE_CACHE_MEDIAN_MAX + 1)));
        assert!(!page_cache(OpenMode::Daemon, Some(1)));
        assert!(page_cache(OpenMode::PageCache, Some(u64::MAX)));
        for (s, m) in [
            ("auto", OpenMode::Auto),
            ("daemon", OpenMode::Daemon),
            ("page-cache", OpenMode::PageCache),
            ("page_cache", OpenMode::PageCache),
        ] {
            assert_eq!(OpenMode::parse(s), Some(m));
            assert_eq!(OpenMode::parse(m.name()), Some(m));
        }
        assert_eq!(OpenMode::parse("fast"), None);
    }

    #[test]
    fn what_init_asks_for_and_what_it_grants() {
        let wants = |mode, passthrough| Mode::plan(mode, None, passthrough).wants();
        assert_eq!(
            wants(OpenMode::PageCache, true),
            Wants {
                no_open: true,
                passthrough: false
            }
        );
        assert_eq!(
            wants(OpenMode::Daemon, false),
            Wants {
                no_open: false,
                passthrough: false
            }
        );
        assert_eq!(
            wants(OpenMode::Daemon, true),
            Wants {
                no_open: false,
                passthrough: true
            }
        );
        let m = Mode::plan(OpenMode::Daemon, None, true);
        assert!(!m.page_cache() && !m.passthrough(), "nothing before init");
        assert_eq!(
            m.settle(Granted {
                no_open: false,
                passthrough: false,
            }),
            (false, false)
        );
        // Settled once: a second init changes nothing.
        assert_eq!(m.settle(GRANT_ALL), (false, false));

        // A kernel that cannot open without the daemon keeps page-cache mounts opening.
        let m = Mode::plan(OpenMode::PageCache, None, true);
        assert_eq!(
            m.settle(Granted {
                no_open: false,
                passthrough: true,
            }),
            (false, false),
            "passthrough was not asked for"
        );
        assert_eq!(m.stats_text(), "passthrough 0\npage_cache_mode 0\n");
    }

    #[test]
    fn page_cache_mode_and_passthrough_as_granted() {
        let m = Mode::plan(OpenMode::PageCache, None, true);
        assert_eq!(m.settle(GRANT_ALL), (true, false));
        assert!(m.page_cache());
        assert_eq!(m.stats_text(), "passthrough 0\npage_cache_mode 1\n");
        let m = Mode::plan(OpenMode::Daemon, None, true);
        assert_eq!(m.settle(GRANT_ALL), (false, true));
        assert_eq!(m.stats_text(), "passthrough 1\npage_cache_mode 0\n");
    }

    #[test]
    fn a_refused_id_turns_passthrough_off_once() {
        let m = Mode::plan(OpenMode::Daemon, None, true);
        m.settle(GRANT_ALL);
        assert!(m.refuse_passthrough(), "the first refusal");
        assert!(!m.passthrough());
        assert!(!m.refuse_passthrough(), "said once");
        assert_eq!(m.stats_text(), "passthrough 0\npage_cache_mode 0\n");
    }
}
