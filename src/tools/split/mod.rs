//! Split: turn a fat ROCm host binary into a HIPK host binary (device code removed, wrappers
//! pointing at a `.rocm_kpack_ref` msgpack marker) plus the code objects for its kpack archives.
//!
//! Pure functions over bytes; the caller reads the input and writes the outputs (to a temporary
//! name, renamed into place). Only x86-64 ELF64 host binaries are rewritten, which is what ROCm
//! ships on Linux. The rewrite is described step by step in [`rewrite`].
//!
//! The parts: `error.rs` why a binary cannot be split, `elf64.rs` the raw records, `relocs.rs`
//! dynamic relocations, `rewrite.rs` the plan of the rewrite, `emit.rs` producing the file,
//! `binary.rs` one binary in memory with its marker, `tree.rs` a whole install tree in phases,
//! `stage.rs` all-or-nothing output, `check.rs` `verify --split` through the loader. This file
//! only names what the rest of the crate uses.

mod binary;
mod check;
mod elf64;
mod emit;
mod error;
mod relocs;
mod rewrite;
mod stage;
mod tree;

pub use binary::{SplitBinary, marker, split_binary};
pub use check::{SplitCheck, verify_split, verify_split_with_progress};
pub use emit::{Rewrite, SplitResult};
pub use error::SplitError;
pub use rewrite::{Prepared, is_split, prepare, split_elf};
pub use stage::{StageError, Staging};
pub use tree::{
    BinaryReport, Kept, Outcome, SplitReport, SplitRequest, TreeError, default_out_root,
    split_tree, split_tree_with_progress,
};

#[cfg(test)]
mod tests;
