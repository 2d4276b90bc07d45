//! What writes archives: the parallel encoding pipeline behind `pack`, `pack --from-fatbin` and
//! `split` ([`pack_pipeline`]), reading the device code of fat host binaries into archive
//! contents ([`import`]), and rewriting fat binaries into HIPK binaries ([`split`]). Built on
//! the archive and host-binary layers; the command line drives them.

pub mod import;
pub mod pack_pipeline;
pub mod split;
