//! Import: turns the device code of ROCm fat host binaries into kpack archive contents, and
//! computes the HIPK metadata those binaries will carry once split. Reading the binaries, and the
//! naming rules, are `host::fatbin`'s; this module groups code objects into
//! archives ([`ArchiveSet`]), submits them to the pack pipeline and checks what was written.
//! Callers read the binaries and write the archives (see `cli::import`); `split` reuses the same
//! functions.

mod archives;
mod check;
mod submit;
pub use archives::{ArchiveSet, FinishedArchive};
pub use check::check_host_code_objects;
pub use submit::{Tag, submit_host_code_objects};

#[cfg(test)]
mod tests;
