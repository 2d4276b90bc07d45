//! The archive format layer: the `.kpack` byte layout and TOC ([`format`], [`msgpack`]), how a
//! kernel is stored ([`codec`]), where an archive's bytes come from ([`byte_source`]), reading
//! ([`reader`]) and writing ([`writer`]) archives. Pure Rust: nothing here knows C, FUSE or the
//! network.

pub mod byte_source;
pub mod codec;
pub mod format;
pub mod msgpack;
pub mod reader;
pub mod writer;

pub use reader::{Archive, KernelRef};
