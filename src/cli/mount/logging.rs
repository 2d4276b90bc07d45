//! Logging for `mount`: `log` records filtered by `env_logger` rules, written to standard error
//! while the command is attached to a terminal, and after daemonizing to `--log-file` or to
//! syslog, so that nothing is lost when the terminal goes away.
//!
//! `log` accepts one logger per process, but the destination changes after `fork`; so the
//! installed logger forwards to a replaceable inner one. The filter is `RUST_LOG` when it is set
//! and non-empty; otherwise `warn`, one step more per `-v` (info, debug, trace), `error` with
//! `-q`. fuser's warning that the mount is already gone at exit (the normal case after
//! `umount`) and its note that /dev/fuse is missing (the command says so itself) are kept quiet
//! below `debug`.
//!
//! On standard error a record reads like the command's own errors (`kpack-fuse: warning: ...`)
//! unless `-v` or `RUST_LOG` asks for more; then, and in log files, it carries the time, level
//! and module (`[2026-01-01T00:00:00.000Z WARN rocm_kpack::fs] ...`).

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

/// fuser's module that opens /dev/fuse: its only record, that the device is missing, is what
/// the command's own refusal says with the fix (`mount_refused`), so it is kept below `-vv`.
const FUSER_DEVICE: &str = "fuser::mnt::fuse_pure";

/// `RUST_LOG`, when it is set and not empty.
fn rust_log() -> Option<String> {
    std::env::var("RUST_LOG")
        .ok()
        .filter(|env| !env.trim().is_empty())
}

impl Verbosity {
    /// The `env_logger` filter string.
    pub fn filters(self) -> String {
        if let Some(env) = rust_log() {
            return env;
        }
        match (self.quiet, self.verbose) {
            (true, _) => format!("error,{FUSER_DEVICE}=off"),
            (false, 0) => format!("warn,fuser::session=error,{FUSER_DEVICE}=off"),
            (false, 1) => format!("info,fuser::session=error,{FUSER_DEVICE}=off"),
            (false, 2) => "debug".into(),
            _ => "trace".into(),
        }
    }

    /// Whether records on standard error carry time, level and module (`-v`, `RUST_LOG`).
    fn detailed(self) -> bool {
        self.verbose > 0 || rust_log().is_some()
    }
}

/// Where a logger writes, which decides how a record looks.
enum Sink {
    /// What the person at the command line reads.
    Stderr,
    /// A log file.
    File(File),
}

fn env_logger(verbosity: Verbosity, sink: Sink) -> env_logger::Logger {
    let mut b = env_logger::Builder::new();
    b.parse_filters(&verbosity.filters());
    match sink {
        Sink::Stderr if !verbosity.detailed() => {
            b.target(env_logger::Target::Stderr).format(|out, record| {
                use std::io::Write;
                writeln!(
                    out,
                    "kpack-fuse: {}{}",
                    plain_level(record.level()),
                    record.args()
                )
            });
        }
        Sink::Stderr => {
            b.target(env_logger::Target::Stderr)
                .format_timestamp_millis();
        }
        Sink::File(f) => {
            b.target(env_logger::Target::Pipe(Box::new(f)))
                .format_timestamp_millis();
        }
    }
    b.build()
}

/// The word before a plain record: none for an error, as for the command's own errors.
fn plain_level(level: Level) -> &'static str {
    match level {
        Level::Error => "",
        Level::Warn => "warning: ",
        Level::Info => "info: ",
        Level::Debug => "debug: ",
        Level::Trace => "trace: ",
    }
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
    let stderr = env_logger(verbosity, Sink::Stderr);
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
    let l = env_logger(verbosity, Sink::File(file));
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
    let filter = env_logger(verbosity, Sink::Stderr);
    let level = filter.filter();
    replace(Box::new(Syslog { filter }), level);
}
