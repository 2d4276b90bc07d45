//! The host-binary layer: what ROCm host binaries carry and how it is read. ELF sections
//! ([`elf`]), clang offload bundles of fat binaries ([`bundle`]), the HIPK marker and wrappers of
//! split binaries ([`hipk`]), and target IDs, the names of the GPUs code is built for and how a
//! device picks among them ([`target_id`]), fat binaries' code objects read from their files
//! ([`fatbin`]), and what kind of input a path is, for the mount and the commands
//! ([`input_kind`]). Pure functions over bytes and names, but for reading those files.

pub mod bundle;
pub mod elf;
pub mod fatbin;
pub mod hipk;
pub mod input_kind;
pub mod target_id;
