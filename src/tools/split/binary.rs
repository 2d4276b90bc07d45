//! One host binary split in memory ([`split_binary`]): the rewritten binary and the code
//! objects for its archives, and the marker ([`marker`]) a split binary carries, which
//! [`split_tree`](super::tree::split_tree) pins to the archives it writes.

use super::emit::SplitResult;
use super::error::SplitError;
use super::rewrite::{is_split, split_elf};
use crate::host::fatbin::{self, CodeObject};
use crate::host::hipk;

/// A split binary: the new host binary and the code objects for its archives.
#[derive(Debug, Clone)]
pub struct SplitBinary {
    pub result: SplitResult,
    pub metadata: Vec<u8>,
    pub code_objects: Vec<CodeObject>,
}

/// The HIPK metadata a binary split for archives `<prefix>_<arch>.kpack` carries, pinned to
/// the TOC digests `pins` when given (without, byte-identical to the reference tooling's).
pub fn marker(kernel_name: &str, prefix: &str, pins: Option<&[hipk::metadata::Pin]>) -> Vec<u8> {
    hipk::metadata::encode_pinned(
        &[fatbin::search_path(kernel_name, prefix, false)],
        kernel_name,
        pins,
    )
}

/// Splits one host binary whose path below the install root is `kernel_name`, for archives
/// named `<prefix>_<arch>.kpack` in `<root>/.kpack/`. The archives do not exist yet, so the
/// marker carries no pins ([`split_tree`](super::tree::split_tree) pins what it writes).
pub fn split_binary(
    bytes: &[u8],
    kernel_name: &str,
    prefix: &str,
) -> Result<SplitBinary, SplitError> {
    if is_split(bytes)? {
        return Err(SplitError::AlreadySplit);
    }
    let code_objects =
        fatbin::host_code_objects(kernel_name, bytes).map_err(SplitError::from_fatbin)?;
    let metadata = marker(kernel_name, prefix, None);
    let result = split_elf(bytes, &metadata)?;
    Ok(SplitBinary {
        result,
        metadata,
        code_objects,
    })
}
