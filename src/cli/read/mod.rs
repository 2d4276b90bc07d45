//! The commands that read the kernels of an archive or a host binary: `list` (what is in it),
//! `cat` (one kernel) and `extract` (every kernel into a tree). `input.rs` is what `list` and
//! `extract` were given: their shared arguments, and whether the file is an archive, a fat
//! binary or a HIPK binary.

pub mod cat;
pub mod extract;
mod input;
pub mod list;
