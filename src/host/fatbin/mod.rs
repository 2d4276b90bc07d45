//! Fat host binaries read: a binary opened without reading its device code ([`HostFile`], in
//! `host_file`), what kind of ELF file it is (`kind`), its code objects keyed for the archives,
//! read, visited or indexed (`code_objects`), the binary seen as an archive for the mount
//! ([`open_fat_archive`], in `fat_archive`), the naming that importing and splitting share
//! (`naming`), and why reading fails (`error`).
//!
//! Writing archives is `tools::import`'s (and `tools::split`'s), on top of these functions.

mod code_objects;
mod error;
mod fat_archive;
mod host_file;
mod kind;
mod naming;

pub use code_objects::{
    CodeObject, IndexedCodeObject, code_objects, host_code_objects, index_host_code_objects,
    visit_host_code_objects,
};
pub use error::{FatbinError, StreamError};
pub use fat_archive::open_fat_archive;
pub use host_file::{HostFile, is_elf_file};
pub use kind::{HostKind, host_kind};
pub(crate) use naming::{KPACK_DIR, archive_file_name, kernel_name_below};
pub use naming::{
    METADATA_SUFFIX, default_prefix, kernel_name_from_relative, search_path, validate_prefix,
};
