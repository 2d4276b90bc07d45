//! kpack-fuse: read, write, load and mount ROCm `.kpack` kernel archives.
//!
//! The layers, each importing only those above it in this list:
//! - [`error`], [`names`], [`bytes`]: the error type, the naming rules for keys and arches, and
//!   bounded little-endian field readers, shared by everything;
//! - [`archive`]: the archive format (layout, TOC, codec, reader, writer);
//! - [`host`]: host binaries (ELF, offload bundles, HIPK, target IDs);
//! - [`tools`]: what writes archives (pack pipeline, import, split);
//! - [`loader`]: the loader algorithm of `kpack_load_code_object`;
//! - [`fs`]: the FUSE file system (the only place that knows fuser);
//! - [`ffi`]: the C ABI (the only place that exports symbols).
//!
//! The `kpack-fuse` program adds the command line and remote sources on top (`src/main.rs`).

pub mod archive;
pub mod atomic_file;
pub mod bytes;
pub mod error;
pub mod ffi;
pub mod fs;
pub mod host;
pub mod loader;
pub mod names;
mod sync;
pub mod tools;

pub use archive::byte_source::{ByteSource, LocalFile};
pub use archive::format::Scheme;
pub use archive::writer::{ArchiveWriter, Compression};
pub use archive::{Archive, KernelRef};
pub use error::{Error, ErrorKind, Result};
