//! What a mount is made from, before any request: the archives a source names (`source.rs`),
//! the local GPUs for `native.hsaco` (`gpus.rs`), the mount table (`mountinfo.rs`), which
//! the program and the adapter read to find their mounts, and the open-file limit, raised once
//! at start-up (`limits.rs`).

pub mod gpus;
pub mod limits;
pub mod mountinfo;
pub mod source;
