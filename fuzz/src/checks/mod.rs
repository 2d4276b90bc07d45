//! What each fuzz target does with its input, and which invariants it asserts. A broken
//! invariant panics, which libFuzzer reports as a crash and `cargo test` as a failure.
//!
//! This directory is compiled twice: into the fuzz crate (nightly, sanitizers, libFuzzer) and,
//! through a `#[path]` include, into the stable integration tests that replay every saved input
//! under `tests/fixtures/fuzz/<target>/`. So it may use only `std` and the main package's own dependencies (`rocm_kpack`, `libc`,
//! `zstd`).

pub mod archive;
pub mod archive_mutate;
pub mod bundle;
pub mod hipk_host;
pub mod hipk_metadata;
pub mod host_walk;
pub mod maps;
pub mod names;
pub mod split_elf;
pub mod target_id;
pub mod toc;
pub mod zstd_index;

/// A fuzz target's body, its outcome discarded.
pub type Body = fn(&[u8]);

/// Every target by name with a body that discards its outcome, for replaying a directory of
/// inputs. The directory under `tests/fixtures/fuzz/` has the same name.
pub const TARGETS: &[(&str, Body)] = &[
    ("toc", |d| toc::run(d)),
    ("archive", |d| drop(archive::run(d))),
    ("archive_mutate", |d| drop(archive_mutate::run(d))),
    ("zstd_index", |d| drop(zstd_index::run(d))),
    ("target_id", |d| target_id::run(d)),
    ("names", |d| names::run(d)),
    ("hipk_metadata", |d| hipk_metadata::run(d)),
    ("bundle", |d| bundle::run(d)),
    ("maps", |d| maps::run(d)),
    ("split_elf", |d| split_elf::run(d)),
    ("hipk_host", |d| hipk_host::run(d)),
    ("host_walk", |d| host_walk::run(d)),
];
