//! What a mount is made from, before any request: the archives a source names (`source.rs`),
//! the local GPUs for `native.hsaco` (`gpus.rs`), and the mount table (`mountinfo.rs`), which
//! the program and the adapter read to find their mounts.

pub mod gpus;
pub mod mountinfo;
pub mod source;
