//! Kernel packs in container registries (`oci://REGISTRY[:PORT]/REPOSITORY[:TAG]`): the
//! artifact's manifest and annotations (`manifest`), references (`reference`), credentials and
//! registry authentication (`credentials`, `auth`), a small client of the distribution API on
//! reqwest (`registry`, with reads in `read` and uploads in `upload`), and `push`.
//!
//! Like `remote`, this module belongs to the `kpack-fuse` program only: the library
//! (`librocm_kpack`) never references it. docs/oci.md describes the artifact and the rules.

pub mod auth;
pub mod credentials;
#[cfg(test)]
mod fake;
#[allow(
    dead_code,
    reason = "the reader's view (Pack) serves the oci:// read side, built on this client"
)]
pub mod manifest;
pub mod push;
#[allow(
    dead_code,
    reason = "manifest, blob and range reads serve the oci:// read side, built on this client"
)]
pub mod read;
pub mod reference;
pub mod registry;
pub mod upload;
