//! The commands that run the library's loader on a HIPK host binary: `resolve` (each step it
//! tries) and `load` (the code object it picks). `resolve.rs` also holds what both take: the
//! host binary and its device's ISA list.

pub mod load;
pub mod resolve;
