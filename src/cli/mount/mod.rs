//! `kpack-fuse mount`: its arguments, and the command from them to a served mount; and, in
//! this folder, everything else of a mount's life, down to `kpack-fuse unmount` (`unmount.rs`).
//!
//! `mount` checks its options and claims the mount point (`claim.rs`: one mount at a mount
//! point), then, unless `-f`, forks into a daemon (`daemon.rs`) while it still has one thread.
//! The daemon opens the source, checks it (names in the tree), mounts, and tells the waiting
//! command when the mount is live, or why it failed; the command waits at most one limit for
//! the whole start. The daemon serves until the filesystem is unmounted (`serve.rs`), then
//! exits 0.
//!
//! The settings are plain data (`settings.rs`), filled from the flags here and from option
//! lists (`-o`) in `options.rs`; `bounds.rs` says where decoded kernels live (with the cgroup's
//! memory limit from `mem_limit.rs`), and `plan.rs` turns the settings into the file system's
//! options. Logging is set up in `logging.rs`. `umount.rs` is the `umount2` call, and
//! `daemon_lock.rs` how `unmount` knows that a daemon has let go of its mount.

mod bounds;
mod claim;
mod daemon;
mod daemon_lock;
mod logging;
mod mem_limit;
mod options;
mod plan;
mod serve;
mod settings;
mod umount;
pub mod unmount;

use std::io;
use std::os::fd::RawFd;
use std::path::{Path, PathBuf};

use rocm_kpack::fs::fuse;
use rocm_kpack::fs::setup::limits::raise_open_file_limit;
use rocm_kpack::fs::setup::source::{self, SourceOptions};
use rocm_kpack::fs::setup::{gpus, mountinfo};
use rocm_kpack::fs::store::{Placement, cache_dir_bytes, descriptor_budget, fs_space};
use rocm_kpack::loader::LoaderConfig;

use self::bounds::{DEFAULT_MEMORY_CACHE, DISK_CACHE_FLOOR};
use self::claim::Claim;
use self::logging::Verbosity;
use self::plan::Host;
use self::serve::{Target, fusermount_available};
use self::settings::{Bound, OPEN_MODES, OpenModeSetting, Settings};
use crate::cli::exit::{CliError, CliResult, Exit};
use crate::cli::remote_args::RemoteArgs;
use crate::remote;

/// `--memory-cache-size` when none is given: [`DEFAULT_MEMORY_CACHE`], or a quarter of the
/// memory limit of the mount's cgroup when that is smaller (memfds cannot be reclaimed, and
/// decodes in flight and the daemon itself need the rest).
fn default_memory_cache() -> u64 {
    match mem_limit::cgroup_memory_limit() {
        Some(limit) if limit / 4 < DEFAULT_MEMORY_CACHE => {
            log::info!(
                "--memory-cache-size defaults to {} bytes: a quarter of the cgroup's memory limit of {limit}",
                limit / 4
            );
            limit / 4
        }
        _ => DEFAULT_MEMORY_CACHE,
    }
}

/// `--disk-cache-size` when none is given: [`bounds::default_disk_cache`] of the file system
/// the files go to (the scratch directory's base, or the cache directory, or the nearest
/// directory above it that exists yet), counting a cache directory's own files as free.
fn default_disk_cache(placement: &Placement) -> u64 {
    let dir = match placement {
        Placement::Scratch(base) => base,
        Placement::CacheDir(dir) => dir,
        Placement::Memory => return DISK_CACHE_FLOOR,
    };
    let Some((size, free)) = dir.ancestors().find_map(fs_space) else {
        log::warn!(
            "cannot read the size of the file system of {}; --disk-cache-size defaults to {DISK_CACHE_FLOOR} bytes",
            dir.display()
        );
        return DISK_CACHE_FLOOR;
    };
    let own = match placement {
        Placement::CacheDir(dir) => cache_dir_bytes(dir),
        _ => 0,
    };
    let bound = bounds::default_disk_cache(size, free.saturating_add(own));
    log::info!(
        "--disk-cache-size defaults to {bound} bytes: a quarter of the {size}-byte file system \
         of {}, at most half of its {} bytes free (at least {DISK_CACHE_FLOOR} bytes or a quarter)",
        dir.display(),
        free.saturating_add(own)
    );
    bound
}

/// The deprecated spellings, for `--help` and the man page (hidden from the option list).
const DEPRECATED: &str = "Deprecated spellings, accepted with a warning for one more release: \
    --cache-size (-o cache_size) is --memory-cache-size, and does nothing with disk backing; \
    --cache-dir-size (-o cache_dir_size) is --disk-cache-size, and does nothing with --backing \
    memory.";

#[derive(Debug, clap::Args)]
#[command(after_long_help = DEPRECATED)]
pub struct MountArgs {
    /// What to show: a .kpack archive, a directory (every *.kpack and fat binary below it), a
    /// HIPK host binary (its
    /// archives are found as the loader finds them), a fat host binary (the code objects of its
    /// offload bundles, keyed as `pack --from-fatbin` keys them), or a remote archive: s3://BUCKET/KEY.kpack,
    /// s3://BUCKET/PREFIX/ (every *.kpack directly under it), http(s)://HOST/PATH.kpack, or a
    /// kernel pack in a container registry: oci://REGISTRY/REPOSITORY[:TAG|@sha256:DIGEST]
    /// (its archive layers; with --gpu only those for these GPUs).
    pub source: PathBuf,
    /// An existing directory to mount it on, or /dev/fd/N: an open /dev/fuse descriptor that a
    /// privileged launcher has already mounted.
    pub mountpoint: PathBuf,
    /// Where decoded kernels live while the mount uses them: disk (a directory of this mount
    /// under --scratch-dir, removed at unmount, or --cache-dir; the kernel can reclaim its
    /// pages) or memory (memfds, which cannot be reclaimed) [default: disk].
    #[arg(long, value_name = "KIND", value_parser = ["disk", "memory"])]
    pub backing: Option<String>,
    /// With --backing memory: bytes of decoded kernels kept in memory once no file has them
    /// open (suffixes K, M, G: powers of 1024) [default: 256M, or a quarter of the memory limit
    /// of the mount's cgroup when that is less]. Refused with disk backing.
    #[arg(long, value_name = "SIZE", value_parser = options::parse_size)]
    pub memory_cache_size: Option<u64>,
    /// With disk backing: bytes of decoded kernels kept on disk (in the per-mount directory or
    /// --cache-dir); least recently used files go first, and go too when the file system is
    /// full [default: a quarter of that file system, at most half its free space, at least
    /// 64M or a quarter]. Refused with --backing memory.
    #[arg(long, value_name = "SIZE", value_parser = options::parse_size)]
    pub disk_cache_size: Option<u64>,
    /// Where the per-mount directory of disk backing (kpack-fuse.PID-STAMP, PID the daemon's)
    /// is made [default: /var/tmp].
    #[arg(long, value_name = "DIR")]
    pub scratch_dir: Option<PathBuf>,
    /// Keep decoded kernels in DIR across mounts and restarts (may be shared by several
    /// mounts); replaces the per-mount directory.
    #[arg(long, value_name = "DIR", conflicts_with = "scratch_dir")]
    pub cache_dir: Option<PathBuf>,
    /// Deprecated spelling of --memory-cache-size (with disk backing it does nothing, with a
    /// warning).
    #[arg(long, value_name = "SIZE", value_parser = options::parse_size,
          hide = true, conflicts_with = "memory_cache_size")]
    pub cache_size: Option<u64>,
    /// Deprecated spelling of --disk-cache-size.
    #[arg(long, value_name = "SIZE", value_parser = options::parse_size,
          hide = true, conflicts_with = "disk_cache_size")]
    pub cache_dir_size: Option<u64>,
    /// Serve every read from the daemon, even where the kernel could read backing files itself
    /// (FUSE passthrough, Linux 6.9+, needs CAP_SYS_ADMIN).
    #[arg(long)]
    pub no_passthrough: bool,
    /// Never decode a kernel before it is opened (in page-cache mode, read). By default, when
    /// a reader walks the files in order (a copy or checksum of the tree), the decode threads
    /// that would idle decode the next files ahead of it, each reader's on its own.
    #[arg(long)]
    pub no_decode_ahead: bool,
    /// How files are opened: daemon (each open reaches the daemon, which hands the kernel the
    /// decoded file to read itself where passthrough is granted; best for large kernels),
    /// page-cache (the kernel opens files by itself and keeps their page cache; best for many
    /// small files), or auto: page-cache when the median kernel is at most 64 KiB, else daemon;
    /// decided once, at mount time [default: auto]. `passthrough` is the old name of daemon.
    #[arg(long, value_name = "MODE", value_parser = OPEN_MODES)]
    pub open_mode: Option<String>,
    /// Request-handling threads [default: the number of CPUs].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=256))]
    pub threads: Option<u32>,
    /// Handle requests on one thread (same as --threads 1).
    #[arg(short = 's', conflicts_with = "threads")]
    pub single_thread: bool,
    /// Device ISA (repeatable, first match wins; auto: this node's GPUs): for native.hsaco, for
    /// a HIPK binary the targets its @GFXARCH@ paths expand for, and for an oci:// artifact the
    /// only layers fetched (those with code for one of them) [default: the local GPUs from
    /// /sys/class/kfd for native.hsaco; every matching archive for @GFXARCH@; every layer].
    #[arg(long = "gpu", value_name = "ISA")]
    pub gpus: Vec<String>,
    /// Stay in the foreground instead of going to the background once mounted.
    #[arg(short = 'f', long)]
    pub foreground: bool,
    /// Let every user read the mount (non-root: needs user_allow_other in /etc/fuse.conf).
    #[arg(long)]
    pub allow_other: bool,
    /// Let root read the mount too.
    #[arg(long, conflicts_with = "allow_other")]
    pub allow_root: bool,
    /// Have fusermount3 unmount if the daemon dies (implies --allow-root unless --allow-other).
    #[arg(long)]
    pub auto_unmount: bool,
    /// Refuse (key, arch) conflicts and archives that do not open, instead of warning.
    #[arg(long)]
    pub strict: bool,
    /// For a HIPK binary with pins: show the entries of archives it does not pin too (by
    /// default they are hidden, with a warning).
    #[arg(long)]
    pub no_pins: bool,
    /// Log to this file (appending) once the source is read; in the background the default is
    /// syslog, in the foreground standard error.
    #[arg(long, value_name = "PATH")]
    pub log_file: Option<PathBuf>,
    /// More log output (repeat for more).
    #[arg(short = 'v', long = "verbose", action = clap::ArgAction::Count, conflicts_with = "quiet")]
    pub verbose: u8,
    /// Only log errors.
    #[arg(short = 'q', long)]
    pub quiet: bool,
    /// Comma-separated mount options (repeatable), as mount(8) and fstab pass them: the
    /// settings above by name (allow_other, disk_cache_size=SIZE, gpu=ISA, ...), plus ro, noexec and
    /// the standard options mount tools add (see docs/mount.md); rw and unknown options are refused.
    #[arg(short = 'o', value_name = "OPTIONS")]
    pub options: Vec<String>,
    #[command(flatten)]
    pub remote: RemoteArgs,
}

/// The mount point must exist, be a directory, and not already have a mount on it; it is
/// claimed for this mount (`claim.rs`), so that no other mount starts there meanwhile.
fn check_mountpoint(path: &Path) -> CliResult<(PathBuf, Claim)> {
    let bad = |why: String| CliError::new(Exit::MountPoint, format!("{}: {why}", path.display()));
    let meta = std::fs::metadata(path).map_err(|e| match e.kind() {
        io::ErrorKind::NotFound => bad("mount point does not exist".into()),
        // What a FUSE mount whose daemon died (SIGKILL, crash) leaves behind.
        _ if e.raw_os_error() == Some(libc::ENOTCONN) => bad(format!(
            "a mount whose daemon is gone is still there (transport endpoint is not connected); \
             remove it with `{}`",
            stale_mount_fix(path)
        )),
        _ => bad(format!(
            "cannot use as mount point: {}",
            rocm_kpack::error::describe_io(&e)
        )),
    })?;
    if !meta.is_dir() {
        return Err(bad("mount point is not a directory".into()));
    }
    let canonical = path
        .canonicalize()
        .map_err(|e| bad(format!("cannot resolve: {e}")))?;
    let mounted_at = |p: &Path| mountinfo::mount_at(p).ok().flatten().map(|m| m.fs_type);
    let claim =
        claim::claim(&canonical, claim::WAIT, mounted_at).map_err(|refused| match refused {
            claim::Refused::Mounted(fs_type) => bad(format!(
                "something is already mounted there ({fs_type}); unmount it first with `{}`, or \
             choose another mount point",
                unmount_command(&canonical, &fs_type, false)
            )),
            claim::Refused::Held => bad(format!(
                "another kpack-fuse mount has held this mount point for {} s without mounting; \
             wait for it, or choose another mount point",
                claim::WAIT.as_secs()
            )),
            claim::Refused::Io(e) => bad(format!(
                "cannot use as mount point: {}",
                rocm_kpack::error::describe_io(&e)
            )),
        })?;
    // Allowed (as by mount(8)), but what is there is hidden until the unmount.
    if let Ok(mut entries) = std::fs::read_dir(&canonical) {
        if entries.next().is_some() {
            log::warn!(
                "{} is not empty: its contents are hidden while kpack-fuse is mounted there",
                canonical.display()
            );
        }
    }
    Ok((canonical, claim))
}

/// The command that clears a dead mount at `path`: ours for a kpack-fuse mount, the FUSE
/// helper's for any other.
fn stale_mount_fix(path: &Path) -> String {
    let abs = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let ours = format!("fuse.{}", fuse::SUBTYPE);
    let fs_type = match mountinfo::mount_at(&abs) {
        Ok(Some(m)) => m.fs_type,
        _ => ours,
    };
    unmount_command(&abs, &fs_type, true)
}

/// The command that unmounts a mount of `fs_type` at `abs`: ours for a kpack-fuse mount, the
/// FUSE helper's for another FUSE mount (it also serves users other than root), else umount(8).
fn unmount_command(abs: &Path, fs_type: &str, lazy: bool) -> String {
    let path = abs.display();
    if fs_type == format!("fuse.{}", fuse::SUBTYPE) {
        let lazy = if lazy { " --lazy" } else { "" };
        format!("kpack-fuse unmount{lazy} {path}")
    } else if fs_type.starts_with("fuse") {
        format!("fusermount3 -u{} {path}", if lazy { "z" } else { "" })
    } else {
        format!("umount{} {path}", if lazy { " -l" } else { "" })
    }
}

/// The settings of the flags, then of each `-o` list in order.
pub fn settings(args: &MountArgs) -> CliResult<Settings> {
    let mut s = Settings {
        allow_other: args.allow_other,
        allow_root: args.allow_root,
        auto_unmount: args.auto_unmount,
        strict: args.strict,
        no_pins: args.no_pins,
        noexec: false,
        memory_cache_size: args
            .memory_cache_size
            .map(Bound::new)
            .or(args.cache_size.map(Bound::old)),
        disk_cache_size: args
            .disk_cache_size
            .map(Bound::new)
            .or(args.cache_dir_size.map(Bound::old)),
        threads: if args.single_thread {
            Some(1)
        } else {
            args.threads
        },
        gpus: args.gpus.clone(),
        log_file: args.log_file.clone(),
        memory_backing: args.backing.as_deref() == Some("memory"),
        scratch_dir: args.scratch_dir.clone(),
        cache_dir: args.cache_dir.clone(),
        no_passthrough: args.no_passthrough,
        no_decode_ahead: args.no_decode_ahead,
        open_mode: args
            .open_mode
            .as_deref()
            .and_then(OpenModeSetting::parse)
            .unwrap_or_default(),
        remote: args.remote.clone(),
    };
    for list in &args.options {
        options::apply(list, &mut s).map_err(|e| CliError::new(Exit::Usage, e))?;
    }
    if s.allow_other && s.allow_root {
        return Err(CliError::new(
            Exit::Usage,
            "allow_other and allow_root are mutually exclusive",
        ));
    }
    // `auto` is the node's GPUs, read once here: they pick an oci:// artifact's layers and
    // native.hsaco alike.
    if s.gpus.iter().any(|g| g == crate::oci::select::AUTO) {
        s.gpus = crate::oci::select::wanted_gpus(&s.gpus, Path::new(gpus::KFD_NODES))
            .map_err(|e| CliError::new(Exit::Usage, e))?
            .unwrap_or_default();
    }
    Ok(s)
}

/// A mount point `/dev/fd/N`: the descriptor must be open on `/dev/fuse`.
fn fuse_fd(path: &Path) -> CliResult<Option<RawFd>> {
    let Some(n) = path.to_str().and_then(|p| p.strip_prefix("/dev/fd/")) else {
        return Ok(None);
    };
    let bad = |why: String| CliError::new(Exit::MountPoint, format!("{}: {why}", path.display()));
    let fd: RawFd = n
        .parse()
        .map_err(|_| bad("not a descriptor number".into()))?;
    // SAFETY: fstat on any descriptor number is harmless; `st` is written by the call.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(bad(format!(
            "descriptor is not open: {}",
            io::Error::last_os_error()
        )));
    }
    // /dev/fuse is the character device 10:229.
    let is_fuse = (st.st_mode & libc::S_IFMT) == libc::S_IFCHR
        && libc::major(st.st_rdev) == 10
        && libc::minor(st.st_rdev) == 229;
    if !is_fuse {
        return Err(bad("descriptor is not an open /dev/fuse".into()));
    }
    Ok(Some(fd))
}

/// A directory backing files go in must exist (a cache directory is created) and be writable.
fn check_dir(dir: &Path, create: bool) -> CliResult<()> {
    let bad = |why: String| CliError::new(Exit::Output, format!("{}: {why}", dir.display()));
    if create {
        std::fs::create_dir_all(dir).map_err(|e| bad(format!("cannot create: {e}")))?;
    }
    let meta = std::fs::metadata(dir).map_err(|e| bad(format!("cannot use: {e}")))?;
    if !meta.is_dir() {
        return Err(bad("not a directory".into()));
    }
    let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes())
        .map_err(|_| bad("contains a NUL byte".into()))?;
    // SAFETY: a valid NUL-terminated path.
    if unsafe { libc::access(c.as_ptr(), libc::W_OK | libc::X_OK) } != 0 {
        return Err(bad(format!(
            "cannot write there: {}",
            io::Error::last_os_error()
        )));
    }
    Ok(())
}

pub fn run_mount(args: MountArgs) -> CliResult {
    limit_heap_growth();
    let verbosity = Verbosity {
        verbose: args.verbose,
        quiet: args.quiet,
    };
    logging::init(verbosity);
    let s = settings(&args)?;
    let bounds = bounds::resolve(&s, default_memory_cache, default_disk_cache)
        .map_err(|e| CliError::new(Exit::Usage, e))?;
    let remote_source = args.source.to_str().filter(|s| remote::is_remote(s));
    let unused_remote = match remote_source {
        Some(_) => Vec::new(),
        None => s.remote.unused_with_local_source(),
    };
    let renamed = settings::renamed(&s);
    // Before anything else can fail and before the fork, so that they reach the terminal.
    for w in renamed.iter().chain(&bounds.warnings).chain(&unused_remote) {
        log::warn!("{w}");
    }
    // The claim on the mount point is held from here until the daemon exits (the forked daemon
    // inherits it).
    let (target, _claim) = match fuse_fd(&args.mountpoint)? {
        Some(fd) => (Target::Fd(fd), None),
        None => {
            let (dir, claim) = check_mountpoint(&args.mountpoint)?;
            (Target::Dir(dir), Some(claim))
        }
    };
    if s.auto_unmount {
        if matches!(target, Target::Fd(_)) {
            return Err(CliError::new(
                Exit::Usage,
                "auto_unmount cannot apply to a /dev/fd/N mount point: its launcher owns the mount",
            ));
        }
        if !fusermount_available() {
            return Err(CliError::new(
                Exit::MountFailed,
                "auto_unmount needs fusermount3 (package fuse3) on PATH, in /sbin or /bin, or FUSERMOUNT_PATH",
            ));
        }
    }
    // Opened now, so that a bad path is reported here rather than lost in the background.
    let log_file = match &s.log_file {
        Some(p) => Some(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)
                .map_err(|e| {
                    CliError::new(
                        Exit::Output,
                        format!("{}: cannot open the log file: {e}", p.display()),
                    )
                })?,
        ),
        None => None,
    };
    // Process-wide, once, before any archive opens: a directory source holds each of its
    // archives open, and the store's budget of open backing files is half of this limit.
    let files_max = descriptor_budget(raise_open_file_limit());

    // In the foreground without --log-file the log is standard error, where the command
    // prints a failure itself: logging it too would show it twice.
    let log_failures = !args.foreground || log_file.is_some();
    // The fork comes before the source is opened: opening a remote source starts network
    // threads, and a process forks safely only while it has one thread. Everything after this
    // runs in the daemon, which reports its outcome to the waiting command, within the one
    // limit on the whole start (`daemon.rs`).
    let mut ready = None;
    if !args.foreground {
        let mp = match &target {
            Target::Dir(p) => Some(p.as_path()),
            Target::Fd(_) => None,
        };
        ready = Some(daemon::daemonize(mp)?);
    }
    let started = Started {
        args: &args,
        settings: &s,
        verbosity,
        files_max,
        ready: ready.as_mut(),
    };
    let mut logged = false;
    let result = started.open_and_serve(bounds, remote_source, target, log_file, &mut logged);
    if let (Some(r), Err(e)) = (ready.as_mut(), &result) {
        // Still waiting: the parent prints the message and exits with its code. Logged too
        // once the log has left the terminal.
        if logged {
            log::error!("{e}");
        }
        r.fail(e);
        std::process::exit(e.exit as i32);
    }
    if let (true, Err(e)) = (log_failures, &result) {
        log::error!("{e}");
    }
    result
}

/// What the mount goes on with once it is in the process that serves it.
struct Started<'a> {
    args: &'a MountArgs,
    settings: &'a Settings,
    verbosity: Verbosity,
    files_max: usize,
    /// The waiting command's pipe, in the background.
    ready: Option<&'a mut daemon::Ready>,
}

impl Started<'_> {
    /// Opens the source, builds the file system, moves the log where the daemon keeps it, and
    /// serves until unmounted. `logged` is set once the log has left standard error.
    fn open_and_serve(
        self,
        bounds: bounds::Resolved,
        remote_source: Option<&str>,
        target: Target,
        log_file: Option<std::fs::File>,
        logged: &mut bool,
    ) -> CliResult {
        let (args, s) = (self.args, self.settings);
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let threads = plan::threads(s, cores);
        let (src, remote_session) = match remote_source {
            Some(url) => {
                let oci = remote::OciOptions {
                    gpus: s.gpus.clone(),
                };
                let (src, session) =
                    remote::mount_source(url, &s.remote.settings(), &oci, s.strict)?;
                (src, Some(session))
            }
            None => (
                source::open(
                    &args.source,
                    &SourceOptions {
                        strict: s.strict,
                        no_pins: s.no_pins,
                        gpus: s.gpus.clone(),
                        loader: LoaderConfig::from_env(),
                        extra_fds: threads as u64 + 16,
                    },
                )?,
                None,
            ),
        };
        let (kind, source_path) = (src.kind, src.path.clone());
        match &bounds.placement {
            Placement::CacheDir(dir) => check_dir(dir, true)?,
            Placement::Scratch(base) => check_dir(base, false)?,
            Placement::Memory => {}
        }
        // SAFETY: plain libc calls without arguments; they cannot fail.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        let host = Host {
            cores,
            files_max: self.files_max,
            local_gpus: if s.gpus.is_empty() {
                gpus::local_gpus(Path::new(gpus::KFD_NODES))
            } else {
                Vec::new()
            },
            uid,
            gid,
            exit_delay: serve::test_exit_delay(),
        };
        let plan = plan::plan(s, bounds, &host, source_path.display().to_string());
        let (mut fs, _warnings) = source::build_fs(src, &plan.fs, s.strict)?;
        fs.set_decode_ahead(plan.decode_ahead);
        if let Some(session) = &remote_session {
            let stats = session.stats();
            fs.add_stats(Box::new(move || stats.to_text()));
        }
        if self.ready.is_some() {
            match log_file {
                Some(f) => logging::to_file(self.verbosity, f),
                None => logging::to_syslog(self.verbosity),
            }
            *logged = true;
            daemon::detach_stderr();
        } else if let Some(f) = log_file {
            logging::to_file(self.verbosity, f);
        }
        serve::serve(
            fs,
            target,
            &plan.mount,
            self.ready,
            &format!("{kind} {}", source_path.display()),
        )
    }
}

/// Decoded kernels are large (up to tens of MiB) and short-lived outside the cache. glibc raises
/// its mmap threshold each time such a block is freed, after which kernels land in the heap
/// arenas, where freed space fragments and is not returned, and the daemon's resident memory
/// grows well past `--memory-cache-size`. A fixed threshold keeps every kernel-sized block in its own
/// mapping, returned to the system as soon as the cache drops it.
fn limit_heap_growth() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator tuning; called before any thread exists.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 256 * 1024);
    }
}
