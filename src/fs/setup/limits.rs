//! The process's open-file limit: raised once, by the program at start-up, before any archive
//! opens ([`raise_open_file_limit`], which returns it: the program gives the store half of it
//! as its budget of backing files); read by the source, which needs a descriptor per archive
//! ([`open_file_limit`]).

/// Raises the process's open-file limit as far as it goes: the soft limit to the hard one (the
/// default soft limit, 1024, is small for large trees), and the hard one to the system's
/// ceiling (`fs.nr_open`) where the process may (root). Returns the soft limit now (256 when it
/// cannot be read).
pub fn raise_open_file_limit() -> u64 {
    let Some(mut lim) = get() else {
        return 256;
    };
    let ceiling = std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|s| s.trim().parse::<libc::rlim_t>().ok())
        .unwrap_or(0);
    for max in [ceiling.max(lim.rlim_max), lim.rlim_max] {
        if lim.rlim_cur >= max {
            break;
        }
        let raised = libc::rlimit {
            rlim_cur: max,
            rlim_max: max,
        };
        // Raising the hard limit needs CAP_SYS_RESOURCE; without it, the soft one still goes
        // up to the hard one.
        // SAFETY: a valid rlimit.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            lim = raised;
            break;
        }
    }
    lim.rlim_cur
}

/// The soft open-file limit in force (`None`: unlimited or unreadable, so no reason to refuse).
pub fn open_file_limit() -> Option<u64> {
    get()
        .map(|lim| lim.rlim_cur)
        .filter(|&soft| soft != libc::RLIM_INFINITY)
}

fn get() -> Option<libc::rlimit> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid rlimit to fill.
    (unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0).then_some(lim)
}
