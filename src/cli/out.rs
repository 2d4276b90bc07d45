//! Standard output and standard error for every command, without the panics of `println!` and
//! `eprintln!` (which panic when the stream's reader has gone: `kpack-fuse list | head`).
//!
//! A command's results go through [`outln!`], [`out!`] and [`bytes`], which return its
//! [`CliResult`]: a closed pipe is [`CliError::broken_pipe`], so the command stops at the first
//! write that meets it, its files are cleaned up as after any error, and `main` exits 141 without
//! a word (see [`Exit::BrokenPipe`]); any other write error (a full disk) is exit 7, naming
//! standard output. Lines for standard error go through [`errln!`], which ignores a closed
//! standard error: nothing better can be done with the message, and the exit status still says
//! what happened. `src/cli/mod.rs` denies `print!`, `println!`, `eprint!` and `eprintln!` under
//! clippy so that nothing bypasses these.

use std::fmt;
use std::io::{self, Write};

use crate::cli::exit::{CliError, CliResult, Exit};

/// Writes `args` to standard output and flushes it.
pub fn write_fmt(args: fmt::Arguments<'_>) -> CliResult {
    let mut out = io::stdout().lock();
    out.write_fmt(args)
        .and_then(|()| out.flush())
        .map_err(stdout_error)
}

/// Writes `data` to standard output and flushes it.
pub fn bytes(data: &[u8]) -> CliResult {
    let mut out = io::stdout().lock();
    out.write_all(data)
        .and_then(|()| out.flush())
        .map_err(stdout_error)
}

fn stdout_error(e: io::Error) -> CliError {
    if e.kind() == io::ErrorKind::BrokenPipe {
        CliError::broken_pipe()
    } else {
        CliError::new(Exit::Output, format!("standard output: {e}"))
    }
}

/// Writes `args` and a newline to standard error, ignoring a failure.
pub fn err_line(args: fmt::Arguments<'_>) {
    let _ = writeln!(io::stderr().lock(), "{args}");
}

/// `print!` that returns a [`CliResult`] instead of panicking.
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::cli::out::write_fmt(format_args!($($arg)*))
    };
}

/// `println!` that returns a [`CliResult`] instead of panicking.
macro_rules! outln {
    () => {
        $crate::cli::out::write_fmt(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::cli::out::write_fmt(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// `eprintln!` that ignores a closed standard error instead of panicking.
macro_rules! errln {
    ($($arg:tt)*) => {
        $crate::cli::out::err_line(format_args!($($arg)*))
    };
}

pub(crate) use {errln, out, outln};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_closed_pipe_is_quiet_and_other_errors_name_standard_output() {
        let closed = stdout_error(io::Error::from(io::ErrorKind::BrokenPipe));
        assert_eq!(
            (closed.exit, closed.message.as_str()),
            (Exit::BrokenPipe, "")
        );
        let full = stdout_error(io::Error::from_raw_os_error(libc::ENOSPC));
        assert_eq!(full.exit, Exit::Output);
        assert!(
            full.message
                .starts_with("standard output: No space left on device"),
            "{}",
            full.message
        );
    }
}
