//! Kernel packs in container registries (`oci://REGISTRY[:PORT]/REPOSITORY[:TAG]`): the
//! artifact's manifest and annotations (`manifest`), references (`reference`), credentials and
//! registry authentication (`credentials`, `auth`), a small client of the distribution API on
//! reqwest (`registry`, with reads in `read` and uploads in `upload`), `push`, and the read side:
//! an artifact opened as archives (`source`, over lazily read blobs: `blob`) for the GPUs asked
//! for (`select`).
//!
//! Like `remote`, this module belongs to the `kpack-fuse` program only: the library
//! (`librocm_kpack`) never references it. docs/oci.md describes the artifact and the rules.

pub mod auth;
mod blob;
pub mod credentials;
#[cfg(test)]
mod fake;
#[cfg(test)]
mod hostile_tests;
pub mod manifest;
pub mod push;
pub mod read;
pub mod reference;
pub mod registry;
pub mod select;
pub mod source;
pub mod upload;

/// Whether a source argument names a registry artifact (`oci://`).
pub fn is_oci(source: &str) -> bool {
    source
        .get(..6)
        .is_some_and(|p| p.eq_ignore_ascii_case("oci://"))
}
