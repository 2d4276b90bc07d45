//! A kept kernel's bytes, in pieces, for the adapter to put into the mount's page cache before
//! an `auto` mount turns to page-cache mode (see `policy/warm.rs`).

use crate::fs::tree::{Entry, Ino};
use crate::fs::{KpackFs, kernel_id};

/// The piece size of [`KpackFs::put_kept_kernel`].
pub const PREFILL_PIECE: u64 = 1 << 20;

impl KpackFs {
    /// Hands `put` the bytes of `ino`'s kernel, if the mount holds them (an open would find it
    /// decoded), in pieces of at most [`PREFILL_PIECE`] bytes: `put(offset, bytes)`. Returns
    /// whether every byte was handed; stops at the first error of `put` or of a read.
    pub fn put_kept_kernel(
        &self,
        ino: Ino,
        mut put: impl FnMut(u64, &[u8]) -> std::io::Result<()>,
    ) -> std::io::Result<bool> {
        let Some(Entry::File(file)) = self.tree.entry(ino) else {
            return Ok(false);
        };
        let Some(body) = self.store.peek(kernel_id(file)) else {
            return Ok(false);
        };
        let mut offset = 0;
        while offset < body.len() {
            let end = offset.saturating_add(PREFILL_PIECE);
            let n = body.with_range(offset, end, |r| -> std::io::Result<u64> {
                let piece = r.map_err(|e| std::io::Error::from_raw_os_error(e.0))?;
                put(offset, piece)?;
                Ok(piece.len() as u64)
            })?;
            if n == 0 {
                return Ok(false);
            }
            offset += n;
        }
        Ok(true)
    }
}
