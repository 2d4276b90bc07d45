//! kpack-fuse: read, write, load and mount ROCm `.kpack` kernel archives.
//!
//! The layers, from the bottom; each imports only the layers below it (docs/architecture.md
//! draws the same stack, and `tests/it/layers.rs` checks it):
//! - [`error`], [`names`], [`bytes`], [`atomic_file`]: the error type, the naming rules for keys
//!   and arches, bounded little-endian field readers, and writing a file by renaming a finished
//!   temporary one into place, shared by everything;
//! - [`archive`]: the archive format (layout, TOC, codec, reader, writer);
//! - [`host`]: host binaries (ELF, offload bundles, fat binaries, HIPK, target IDs);
//! - [`loader`]: the loader algorithm of `kpack_load_code_object`;
//! - three layers that never import each other: [`tools`] (what writes archives: pack
//!   pipeline, import, split), [`fs`] (the FUSE file system; only `fs/fuse/` knows fuser) and
//!   [`ffi`] (the C ABI, the only place that exports symbols).
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
pub use archive::{Archive, KernelIndex, KernelRef};
pub use error::{Error, ErrorKind, Result};
