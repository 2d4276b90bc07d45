//! Logging for `mount`: `log` records filtered by `env_logger` rules, written to standard error
//! while the command is attached to a terminal, and after daemonizing to `--log-file` or to
//! syslog, so that nothing is lost when the terminal goes away.
//!
//! `log` accepts one logger per process, but the destination changes after `fork`; so the
//! installed logger forwards to a replaceable inner one. The filter is `RUST_LOG` when it is set
//! and non-empty; otherwise `warn`, one step more per `-v` (info, debug, trace), `error` with
//! `-q`. fuser's warning that the mount is already gone at exit (the normal case after
//! `umount`) is kept quiet below `debug`.

use std::ffi::CString;
use std::fs::File;
use std::sync::RwLock;

use log::{Level, LevelFilter, Log, Metadata, Record};

/// How chatty to be.
#[derive(Debug, Clone, Copy, Default)]
pub struct Verbosity {
    pub verbose: u8,
    pub quiet: bool,
}

impl Verbosity {
    /// The `env_logger` filter string.
    pub fn filters(self) -> String {
        if let Ok(env) = std::env::var("RUST_LOG") {
            if !env.trim().is_empty() {
                return env;
            }
        }
        match (self.quiet, self.verbose) {
            (true, _) => "error".into(),
            (false, 0) => "warn,fuser::session=error".into(),
            (false, 1) => "info,fuser::session=error".into(),
            (false, 2) => "debug".into(),
            _ => "trace".into(),
        }
    }
}

fn env_logger(verbosity: Verbosity, target: env_logger::Target) -> env_logger::Logger {
    env_logger::Builder::new()
        .parse_filters(&verbosity.filters())
        .target(target)
        .format_timestamp_millis()
        .build()
}

/// Sends records to syslog (facility daemon, tagged `kpack-fuse[pid]`).
struct Syslog {
    filter: env_logger::Logger,
}

impl Log for Syslog {
    fn enabled(&self, m: &Metadata<'_>) -> bool {
        self.filter.enabled(m)
    }

    fn log(&self, record: &Record<'_>) {
        if !self.filter.matches(record) {
            return;
        }
        let priority = match record.level() {
            Level::Error => libc::LOG_ERR,
            Level::Warn => libc::LOG_WARNING,
            Level::Info => libc::LOG_INFO,
            Level::Debug | Level::Trace => libc::LOG_DEBUG,
        };
        let text =
            format!("{} {}: {}", record.level(), record.target(), record.args()).replace('\0', " ");
        if let Ok(c) = CString::new(text) {
            // SAFETY: a constant "%s" format with one valid C string argument.
            unsafe { libc::syslog(priority, c"%s".as_ptr(), c.as_ptr()) };
        }
    }

    fn flush(&self) {}
}

/// The installed logger: forwards to whatever [`to_file`] / [`to_syslog`] last chose.
struct Switch {
    inner: RwLock<Box<dyn Log>>,
}

static LOGGER: std::sync::OnceLock<&'static Switch> = std::sync::OnceLock::new();

impl Log for Switch {
    fn enabled(&self, m: &Metadata<'_>) -> bool {
        self.inner.read().map(|l| l.enabled(m)).unwrap_or(false)
    }

    fn log(&self, record: &Record<'_>) {
        if let Ok(l) = self.inner.read() {
            l.log(record);
        }
    }

    fn flush(&self) {
        if let Ok(l) = self.inner.read() {
            l.flush();
        }
    }
}

fn replace(logger: Box<dyn Log>, level: LevelFilter) {
    if let Some(sw) = LOGGER.get() {
        if let Ok(mut inner) = sw.inner.write() {
            *inner = logger;
        }
        log::set_max_level(level);
    }
}

/// Installs the logger, writing to standard error. Called once, first thing in `mount`.
pub fn init(verbosity: Verbosity) {
    let stderr = env_logger(verbosity, env_logger::Target::Stderr);
    let level = stderr.filter();
    let sw: &'static Switch = Box::leak(Box::new(Switch {
        inner: RwLock::new(Box::new(stderr)),
    }));
    if log::set_logger(sw).is_ok() {
        let _ = LOGGER.set(sw);
        log::set_max_level(level);
    }
}

/// From now on, log to `file` (appending).
pub fn to_file(verbosity: Verbosity, file: File) {
    let l = env_logger(verbosity, env_logger::Target::Pipe(Box::new(file)));
    let level = l.filter();
    replace(Box::new(l), level);
}

/// From now on, log to syslog.
pub fn to_syslog(verbosity: Verbosity) {
    // SAFETY: the identifier is a static C string, as openlog keeps the pointer.
    unsafe {
        libc::openlog(
            c"kpack-fuse".as_ptr(),
            libc::LOG_PID | libc::LOG_NDELAY,
            libc::LOG_DAEMON,
        )
    };
    let filter = env_logger(verbosity, env_logger::Target::Stderr);
    let level = filter.filter();
    replace(Box::new(Syslog { filter }), level);
}
