//! The exit codes of every command, and the error type commands return. One table for the whole
//! binary (documented in docs/cli.md), so scripts can tell a missing file from a corrupt one, and
//! one place that maps errors to it: core errors by kind (`exit_for`), and the mount's source
//! errors and remote sources' errors, whose core errors go through the same `exit_for`.

use std::fmt;
use std::process::ExitCode;

use rocm_kpack::fs::setup::source::{SourceError, SourceErrorKind};
use rocm_kpack::{Error, ErrorKind};

use crate::oci::push::{PushError, PushErrorKind};
use crate::remote::{RemoteError, RemoteErrorKind};

/// Why a command failed, as an exit status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Exit {
    /// Something unexpected (a bug, or an error with no better class).
    Failure = 1,
    /// Bad command line: unknown option, bad value, conflicting flags.
    Usage = 2,
    /// An input could not be read: missing file, permission, I/O error.
    Unreadable = 3,
    /// An input is not what it claims: not a kpack, corrupt TOC, bad metadata or ELF.
    BadFormat = 4,
    /// The requested binary, arch, kernel or archive does not exist.
    NotFound = 5,
    /// `verify` found bad entries, or a kernel failed to decode.
    Corrupt = 6,
    /// An output could not be written, or a path would escape its destination.
    Output = 7,
    /// The mount point is missing, not a directory, or already in use.
    MountPoint = 8,
    /// The kernel refused the mount, or the daemon failed before the mount was live.
    MountFailed = 9,
    /// Standard output was closed by its reader (`kpack-fuse list | head`): the command stopped
    /// there without a word. 128 + SIGPIPE, what a shell reports for `cat` in the same place.
    BrokenPipe = 141,
}

/// A failed command: the exit status and a message naming the file and the problem.
#[derive(Debug)]
pub struct CliError {
    pub exit: Exit,
    pub message: String,
}

pub type CliResult<T = ()> = Result<T, CliError>;

impl CliError {
    pub fn new(exit: Exit, message: impl Into<String>) -> CliError {
        CliError {
            exit,
            message: message.into(),
        }
    }

    /// Standard output was closed by its reader: said by the exit status alone.
    pub fn broken_pipe() -> CliError {
        CliError::new(Exit::BrokenPipe, "")
    }

    /// An I/O error on `path`, worded as everywhere else (`PATH: no such file`).
    pub fn io(exit: Exit, path: impl AsRef<std::path::Path>, e: &std::io::Error) -> CliError {
        CliError::new(exit, rocm_kpack::error::io_message(path.as_ref(), e))
    }

    pub fn code(&self) -> ExitCode {
        ExitCode::from(self.exit as u8)
    }
}

impl From<std::convert::Infallible> for CliError {
    fn from(never: std::convert::Infallible) -> CliError {
        match never {}
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// The exit class of a core error.
pub fn exit_for(kind: ErrorKind) -> Exit {
    match kind {
        ErrorKind::InvalidArgument => Exit::Usage,
        ErrorKind::FileNotFound | ErrorKind::IoError => Exit::Unreadable,
        ErrorKind::InvalidFormat
        | ErrorKind::UnsupportedVersion
        | ErrorKind::MsgpackParseFailed
        | ErrorKind::InvalidMetadata => Exit::BadFormat,
        ErrorKind::KernelNotFound | ErrorKind::ArchiveNotFound | ErrorKind::ArchNotFound => {
            Exit::NotFound
        }
        ErrorKind::DecompressionFailed => Exit::Corrupt,
        ErrorKind::OutOfMemory | ErrorKind::NotImplemented | ErrorKind::PathDiscoveryFailed => {
            Exit::Failure
        }
    }
}

impl From<Error> for CliError {
    fn from(e: Error) -> CliError {
        CliError::new(exit_for(e.kind()), e.to_string())
    }
}

impl From<SourceError> for CliError {
    fn from(e: SourceError) -> CliError {
        let exit = match e.kind {
            SourceErrorKind::Core(kind) => exit_for(kind),
            SourceErrorKind::Unreadable => Exit::Unreadable,
            SourceErrorKind::BadFormat => Exit::BadFormat,
            SourceErrorKind::NotFound => Exit::NotFound,
            SourceErrorKind::Resources => Exit::Failure,
        };
        CliError::new(exit, e.message)
    }
}

impl From<RemoteError> for CliError {
    fn from(e: RemoteError) -> CliError {
        let exit = match e.kind {
            RemoteErrorKind::BadUrl => Exit::Usage,
            RemoteErrorKind::Unreachable => Exit::Unreadable,
            RemoteErrorKind::Archive(kind) => exit_for(kind),
            RemoteErrorKind::NoArchives => Exit::NotFound,
            RemoteErrorKind::NotAPack => Exit::BadFormat,
        };
        CliError::new(exit, e.message)
    }
}

impl From<PushError> for CliError {
    fn from(e: PushError) -> CliError {
        let exit = match e.kind {
            PushErrorKind::Usage => Exit::Usage,
            PushErrorKind::Unreadable | PushErrorKind::Registry => Exit::Unreadable,
            PushErrorKind::NoArchives => Exit::NotFound,
            PushErrorKind::Archive(kind) => exit_for(kind),
        };
        CliError::new(exit, e.message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A core error reaches the same exit code whether a command returns it directly, the
    /// mount's source reading passes it on, or a remote source met it.
    #[test]
    fn core_errors_classify_once() {
        for code in 1..=14 {
            let kind = ErrorKind::from_code(code).unwrap();
            let via_source = CliError::from(SourceError {
                kind: SourceErrorKind::Core(kind),
                message: String::new(),
            });
            assert_eq!(via_source.exit, exit_for(kind), "{kind:?}");
            let via_remote = CliError::from(RemoteError {
                kind: RemoteErrorKind::Archive(kind),
                message: String::new(),
            });
            assert_eq!(via_remote.exit, exit_for(kind), "{kind:?}");
        }
        assert_eq!(exit_for(ErrorKind::DecompressionFailed), Exit::Corrupt);
        assert_eq!(exit_for(ErrorKind::FileNotFound), Exit::Unreadable);
        assert_eq!(exit_for(ErrorKind::MsgpackParseFailed), Exit::BadFormat);
        assert_eq!(exit_for(ErrorKind::ArchNotFound), Exit::NotFound);
    }
}
