//! The archive format layer: the `.kpack` byte layout and TOC ([`format`], [`msgpack`]), how a
//! kernel is stored ([`codec`]), where an archive's bytes come from ([`byte_source`]), reading
//! ([`reader`]) and writing ([`writer`]) archives, and the kernel index that lets a reader open
//! an archive without walking its frames ([`kernel_index`]). Pure Rust: nothing here knows C,
//! FUSE or the network.

pub mod byte_source;
pub mod codec;
pub mod format;
pub mod kernel_index;
pub mod msgpack;
pub mod reader;
pub mod writer;

pub use kernel_index::{KernelIndex, KernelIndexError, StoredKernel};
pub use reader::{Archive, KernelRef};
