//! The one error type of the core. Each variant carries what a person needs to fix the problem
//! (file, key, arch, offset) and maps to exactly one [`ErrorKind`], whose values are the C
//! library's `kpack_error_t` codes. Adapters (C ABI, FUSE, CLI) translate kinds; they never
//! inspect messages.

use std::fmt;
use std::io;
use std::path::PathBuf;

/// The reference library's error codes, with their fixed values. Several [`Error`] variants may
/// share one kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(i32)]
pub enum ErrorKind {
    InvalidArgument = 1,
    FileNotFound = 2,
    InvalidFormat = 3,
    UnsupportedVersion = 4,
    KernelNotFound = 5,
    DecompressionFailed = 6,
    OutOfMemory = 7,
    NotImplemented = 8,
    IoError = 9,
    MsgpackParseFailed = 10,
    PathDiscoveryFailed = 11,
    InvalidMetadata = 12,
    ArchiveNotFound = 13,
    ArchNotFound = 14,
}

impl ErrorKind {
    /// The numeric `kpack_error_t` value.
    pub fn code(self) -> i32 {
        self as i32
    }

    /// The kind whose `kpack_error_t` value is `code`, if any.
    pub fn from_code(code: i32) -> Option<ErrorKind> {
        use ErrorKind::*;
        [
            InvalidArgument,
            FileNotFound,
            InvalidFormat,
            UnsupportedVersion,
            KernelNotFound,
            DecompressionFailed,
            OutOfMemory,
            NotImplemented,
            IoError,
            MsgpackParseFailed,
            PathDiscoveryFailed,
            InvalidMetadata,
            ArchiveNotFound,
            ArchNotFound,
        ]
        .into_iter()
        .find(|k| k.code() == code)
    }

    /// The enumerator name used in the C header, for messages and logs.
    pub fn name(self) -> &'static str {
        match self {
            ErrorKind::InvalidArgument => "KPACK_ERROR_INVALID_ARGUMENT",
            ErrorKind::FileNotFound => "KPACK_ERROR_FILE_NOT_FOUND",
            ErrorKind::InvalidFormat => "KPACK_ERROR_INVALID_FORMAT",
            ErrorKind::UnsupportedVersion => "KPACK_ERROR_UNSUPPORTED_VERSION",
            ErrorKind::KernelNotFound => "KPACK_ERROR_KERNEL_NOT_FOUND",
            ErrorKind::DecompressionFailed => "KPACK_ERROR_DECOMPRESSION_FAILED",
            ErrorKind::OutOfMemory => "KPACK_ERROR_OUT_OF_MEMORY",
            ErrorKind::NotImplemented => "KPACK_ERROR_NOT_IMPLEMENTED",
            ErrorKind::IoError => "KPACK_ERROR_IO_ERROR",
            ErrorKind::MsgpackParseFailed => "KPACK_ERROR_MSGPACK_PARSE_FAILED",
            ErrorKind::PathDiscoveryFailed => "KPACK_ERROR_PATH_DISCOVERY_FAILED",
            ErrorKind::InvalidMetadata => "KPACK_ERROR_INVALID_METADATA",
            ErrorKind::ArchiveNotFound => "KPACK_ERROR_ARCHIVE_NOT_FOUND",
            ErrorKind::ArchNotFound => "KPACK_ERROR_ARCH_NOT_FOUND",
        }
    }
}

/// Everything that can go wrong in the core.
#[derive(Debug)]
pub enum Error {
    /// A caller passed something unusable (a bad index, an empty list, a bad option).
    InvalidArgument(String),
    /// The archive file does not exist.
    FileNotFound { path: PathBuf },
    /// An I/O call failed.
    Io {
        path: PathBuf,
        what: String,
        source: io::Error,
    },
    /// The file has zero bytes.
    EmptyFile { path: PathBuf },
    /// Fewer than 16 header bytes could be read (also what a directory gives).
    TruncatedHeader { path: PathBuf, len: u64 },
    /// The first four bytes are not `KPAK`.
    BadMagic { path: PathBuf, found: [u8; 4] },
    /// The header's version is not 1.
    UnsupportedVersion { path: PathBuf, version: u32 },
    /// The TOC offset does not point inside the file.
    TocOffsetOutOfRange {
        path: PathBuf,
        toc_offset: u64,
        file_len: u64,
    },
    /// The TOC is not well-formed msgpack of the expected shape.
    TocParse {
        path: PathBuf,
        offset: u64,
        reason: String,
    },
    /// The zstd blob's frame index is malformed.
    ZstdIndex {
        path: PathBuf,
        offset: u64,
        reason: String,
    },
    /// The archive is not the one its kernel index describes (its TOC or its stored kernels'
    /// places or digests differ): the index belongs to other bytes.
    KernelIndexMismatch { path: PathBuf, reason: String },
    /// A stored kernel runs past the end of the file.
    BlobOutOfBounds {
        path: PathBuf,
        key: String,
        arch: String,
        offset: u64,
        size: u64,
        file_len: u64,
    },
    /// No entry for this key and arch (or no blob for its ordinal).
    KernelNotFound {
        path: PathBuf,
        key: String,
        arch: String,
        reason: String,
    },
    /// A zstd frame did not decode to exactly `original_size` bytes.
    Decompress {
        path: PathBuf,
        key: String,
        arch: String,
        offset: u64,
        reason: String,
    },
    /// A kernel decoded to bytes, or its zstd frame read as bytes, whose BLAKE3 digest is not
    /// the one the archive records: the archive was altered after it was written. The bytes are
    /// never handed out.
    DigestMismatch {
        path: PathBuf,
        key: String,
        arch: String,
        /// The digest compared is `frame_blake3` (of the compressed frame, checked before
        /// decoding), not `blake3` (of the decoded bytes).
        of_frame: bool,
        /// Boxed: two digests inline would make every `Result` of the crate larger.
        recorded: Box<[u8; 32]>,
        actual: Box<[u8; 32]>,
    },
    /// An allocation the caller asked for failed.
    OutOfMemory { bytes: usize },
    /// The loader was switched off with `ROCM_KPACK_DISABLE`.
    Disabled,
    /// The binary holding an address could not be found.
    PathDiscovery(String),
    /// HIPK metadata is missing, malformed or of the wrong shape.
    InvalidMetadata(String),
    /// None of the search paths named a readable archive (that the binary pins, if it has
    /// pins: `unpinned` are the archives skipped because it does not).
    ArchiveNotFound {
        tried: Vec<PathBuf>,
        unpinned: Vec<PathBuf>,
    },
    /// No archive on the search path holds any requested arch.
    ArchNotFound { key: String, arches: Vec<String> },
}

pub type Result<T> = std::result::Result<T, Error>;

/// What went wrong with a file operation, in the words every command and the mount use: a missing
/// file is always "no such file" (as [`Error::FileNotFound`] says), and the OS's "(os error N)"
/// suffix, which means nothing to a reader, is left out.
pub fn describe_io(e: &io::Error) -> String {
    match e.kind() {
        io::ErrorKind::NotFound => "no such file".to_owned(),
        io::ErrorKind::PermissionDenied => "permission denied".to_owned(),
        _ => {
            let text = e.to_string();
            match text.rfind(" (os error ") {
                Some(at) if text.ends_with(')') => text[..at].to_owned(),
                _ => text,
            }
        }
    }
}

/// `PATH: <what went wrong>`, for an I/O error on `path` (see [`describe_io`]).
pub fn io_message(path: &std::path::Path, e: &io::Error) -> String {
    format!("{}: {}", path.display(), describe_io(e))
}

/// Four magic bytes for a message: quoted when they are printable ASCII, as hex bytes otherwise
/// (a lossy UTF-8 rendering would show replacement characters instead of what is in the file).
fn show_magic(found: &[u8; 4]) -> String {
    if found.iter().all(|b| b.is_ascii_graphic() || *b == b' ') {
        format!("{:?}", String::from_utf8_lossy(found))
    } else {
        let hex: Vec<String> = found.iter().map(|b| format!("{b:02x}")).collect();
        format!("{} (hex)", hex.join(" "))
    }
}

impl Error {
    /// The C error code this error maps to.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::InvalidArgument(_) => ErrorKind::InvalidArgument,
            Error::FileNotFound { .. } => ErrorKind::FileNotFound,
            Error::Io { .. } | Error::EmptyFile { .. } | Error::BlobOutOfBounds { .. } => {
                ErrorKind::IoError
            }
            Error::TruncatedHeader { .. }
            | Error::BadMagic { .. }
            | Error::TocOffsetOutOfRange { .. }
            | Error::ZstdIndex { .. }
            | Error::KernelIndexMismatch { .. } => ErrorKind::InvalidFormat,
            Error::UnsupportedVersion { .. } => ErrorKind::UnsupportedVersion,
            Error::TocParse { .. } => ErrorKind::MsgpackParseFailed,
            Error::KernelNotFound { .. } => ErrorKind::KernelNotFound,
            Error::Decompress { .. } | Error::DigestMismatch { .. } => {
                ErrorKind::DecompressionFailed
            }
            Error::OutOfMemory { .. } => ErrorKind::OutOfMemory,
            Error::Disabled => ErrorKind::NotImplemented,
            Error::PathDiscovery(_) => ErrorKind::PathDiscoveryFailed,
            Error::InvalidMetadata(_) => ErrorKind::InvalidMetadata,
            Error::ArchiveNotFound { .. } => ErrorKind::ArchiveNotFound,
            Error::ArchNotFound { .. } => ErrorKind::ArchNotFound,
        }
    }

    /// The message without the archive, key and arch it names, for a caller that prints those
    /// once itself (`verify`'s `BAD ARCHIVE: KEY [ARCH]: REASON`). Errors that name no kernel read
    /// as their full message.
    pub fn reason(&self) -> String {
        match self {
            Error::Io { what, source, .. } => format!("{what}: {}", describe_io(source)),
            Error::BlobOutOfBounds {
                offset,
                size,
                file_len,
                ..
            } => format!(
                "claims bytes {offset}..{} but the file has {file_len}",
                offset.saturating_add(*size)
            ),
            Error::KernelNotFound { reason, .. } => format!("not found: {reason}"),
            Error::Decompress { offset, reason, .. } => {
                format!("frame at byte {offset} failed to decode: {reason}")
            }
            Error::DigestMismatch {
                recorded,
                actual,
                of_frame,
                ..
            } => digest_reason(*of_frame, recorded, actual),
            other => other.to_string(),
        }
    }

    /// Wraps an I/O error, naming the file and the operation.
    pub fn io(path: impl Into<PathBuf>, what: impl Into<String>, source: io::Error) -> Error {
        Error::Io {
            path: path.into(),
            what: what.into(),
            source,
        }
    }
}

fn digest_reason(of_frame: bool, recorded: &[u8; 32], actual: &[u8; 32]) -> String {
    format!(
        "BLAKE3 digest mismatch: the {} hash to {}, the archive records {} \
         (the archive was modified after it was written)",
        if of_frame {
            "compressed frame's bytes"
        } else {
            "decoded bytes"
        },
        hex(actual),
        hex(recorded)
    )
}

/// Lower-case hex of a digest, as `list --json` and the mount show it.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::InvalidArgument(msg) => write!(f, "invalid argument: {msg}"),
            Error::FileNotFound { path } => write!(f, "{}: no such file", path.display()),
            Error::Io { path, what, source } => {
                write!(f, "{}: {what}: {}", path.display(), describe_io(source))
            }
            Error::EmptyFile { path } => write!(f, "{}: file is empty", path.display()),
            Error::TruncatedHeader { path, len } => write!(
                f,
                "{}: not a kpack archive: only {len} of the 16 header bytes could be read",
                path.display()
            ),
            Error::BadMagic { path, found } => write!(
                f,
                "{}: not a kpack archive: magic is {}, expected \"KPAK\"",
                path.display(),
                show_magic(found)
            ),
            Error::UnsupportedVersion { path, version } => write!(
                f,
                "{}: unsupported kpack format version {version} (this build reads version 1)",
                path.display()
            ),
            Error::TocOffsetOutOfRange {
                path,
                toc_offset,
                file_len,
            } => write!(
                f,
                "{}: TOC offset {toc_offset} is not inside the {file_len}-byte file",
                path.display()
            ),
            Error::TocParse {
                path,
                offset,
                reason,
            } => {
                write!(f, "{}: bad TOC at byte {offset}: {reason}", path.display())
            }
            Error::ZstdIndex {
                path,
                offset,
                reason,
            } => {
                write!(
                    f,
                    "{}: bad zstd blob at byte {offset}: {reason}",
                    path.display()
                )
            }
            Error::KernelIndexMismatch { path, reason } => {
                write!(f, "{}: {reason}", path.display())
            }
            Error::BlobOutOfBounds {
                path,
                key,
                arch,
                offset,
                size,
                file_len,
            } => write!(
                f,
                "{}: kernel {key} [{arch}] claims bytes {offset}..{} but the file has {file_len}",
                path.display(),
                offset.saturating_add(*size)
            ),
            Error::KernelNotFound {
                path,
                key,
                arch,
                reason,
            } => {
                write!(f, "{}: no kernel {key} [{arch}]: {reason}", path.display())
            }
            Error::DigestMismatch {
                path,
                key,
                arch,
                of_frame,
                recorded,
                actual,
            } => write!(
                f,
                "{}: kernel {key} [{arch}]: {}",
                path.display(),
                digest_reason(*of_frame, recorded, actual)
            ),
            Error::Decompress {
                path,
                key,
                arch,
                offset,
                reason,
            } => write!(
                f,
                "{}: kernel {key} [{arch}] (frame at byte {offset}) failed to decode: {reason}",
                path.display()
            ),
            Error::OutOfMemory { bytes } => write!(f, "out of memory allocating {bytes} bytes"),
            Error::Disabled => write!(f, "kpack loading is disabled by ROCM_KPACK_DISABLE"),
            Error::PathDiscovery(msg) => write!(f, "binary path discovery failed: {msg}"),
            Error::InvalidMetadata(msg) => write!(f, "invalid HIPK metadata: {msg}"),
            Error::ArchiveNotFound { tried, unpinned } => {
                write!(
                    f,
                    "no readable kpack archive found (tried {} paths",
                    tried.len()
                )?;
                for p in tried.iter().take(8) {
                    write!(f, "; {}", p.display())?;
                }
                write!(f, ")")?;
                if !unpinned.is_empty() {
                    write!(f, "; not pinned by the binary, so not used:")?;
                    for p in unpinned.iter().take(8) {
                        write!(f, " {}", p.display())?;
                    }
                }
                Ok(())
            }
            Error::ArchNotFound { key, arches } => write!(
                f,
                "no archive holds {key} for any of the architectures [{}]",
                arches.join(", ")
            ),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_magic_is_quoted_when_printable_and_hex_otherwise() {
        let bad = |found: [u8; 4]| {
            Error::BadMagic {
                path: "/a.kpack".into(),
                found,
            }
            .to_string()
        };
        assert_eq!(
            bad(*b"XPAK"),
            "/a.kpack: not a kpack archive: magic is \"XPAK\", expected \"KPAK\""
        );
        assert_eq!(
            bad([0xff, 0xfe, 0x00, 0x01]),
            "/a.kpack: not a kpack archive: magic is ff fe 00 01 (hex), expected \"KPAK\""
        );
        assert_eq!(
            bad(*b"\x7fELF"),
            "/a.kpack: not a kpack archive: magic is 7f 45 4c 46 (hex), expected \"KPAK\""
        );
    }

    #[test]
    fn every_code_maps_back_to_its_kind() {
        for code in 1..=14 {
            assert_eq!(ErrorKind::from_code(code).map(ErrorKind::code), Some(code));
        }
        assert_eq!(ErrorKind::from_code(0), None);
        assert_eq!(ErrorKind::from_code(15), None);
    }

    #[test]
    fn reason_leaves_out_what_the_caller_already_names() {
        let e = Error::Decompress {
            path: "/a.kpack".into(),
            key: "k#0".into(),
            arch: "gfx900".into(),
            offset: 64,
            reason: "bad frame".into(),
        };
        assert_eq!(
            e.to_string(),
            "/a.kpack: kernel k#0 [gfx900] (frame at byte 64) failed to decode: bad frame"
        );
        assert_eq!(e.reason(), "frame at byte 64 failed to decode: bad frame");
        let e = Error::KernelNotFound {
            path: "/a.kpack".into(),
            key: "k#0".into(),
            arch: "gfx900".into(),
            reason: "no blob for ordinal 7".into(),
        };
        assert_eq!(e.reason(), "not found: no blob for ordinal 7");
        let e = Error::BlobOutOfBounds {
            path: "/a.kpack".into(),
            key: "k#0".into(),
            arch: "gfx900".into(),
            offset: 10,
            size: 5,
            file_len: 12,
        };
        assert_eq!(e.reason(), "claims bytes 10..15 but the file has 12");
    }

    #[test]
    fn io_errors_read_the_same_everywhere() {
        let p = std::path::Path::new("/x");
        let missing = io::Error::from_raw_os_error(libc::ENOENT);
        assert_eq!(io_message(p, &missing), "/x: no such file");
        assert_eq!(
            Error::io(p, "cannot open", missing).to_string(),
            "/x: cannot open: no such file"
        );
        let denied = io::Error::from_raw_os_error(libc::EACCES);
        assert_eq!(io_message(p, &denied), "/x: permission denied");
        let busy = io::Error::from_raw_os_error(libc::EBUSY);
        assert_eq!(describe_io(&busy), "Device or resource busy");
        assert_eq!(describe_io(&io::Error::other("custom text")), "custom text");
    }
}
