//! kpack-fuse: read, write, load and mount ROCm `.kpack` kernel archives.
//!
//! The core (`format`, `msgpack`, `codec`, `archive`, `writer`, `arch`) is pure Rust with no C
//! or FUSE types; the C ABI lives only in `ffi`, the FUSE adapter only in `fs`, and the command
//! line only in `cli`.

pub mod arch;
pub mod archive;
pub mod bundle;
pub mod byte_source;
pub mod bytes;
pub mod codec;
pub mod elf;
pub mod error;
pub mod ffi;
pub mod format;
pub mod fs;
pub mod hipk;
pub mod import;
pub mod kernel_cache;
pub mod loader;
pub mod msgpack;
pub mod names;
pub mod pack_pipeline;
pub mod split;
mod sync;
pub mod writer;

pub use archive::{Archive, KernelRef};
pub use byte_source::{ByteSource, LocalFile};
pub use error::{Error, ErrorKind, Result};
pub use format::Scheme;
pub use writer::{ArchiveWriter, Compression};
