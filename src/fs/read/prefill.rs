//! The bytes of every kernel the store keeps, in pieces, for the adapter to put into the
//! mount's page cache before an `auto` mount turns to page-cache mode.

use crate::fs::tree::{Entry, Ino};
use crate::fs::{KpackFs, kernel_id};

/// The piece size of [`KpackFs::each_kept_kernel`].
pub const PREFILL_PIECE: u64 = 1 << 20;

impl KpackFs {
    /// Hands `put` the bytes of every kept kernel (those an open would find decoded), in
    /// pieces of at most [`PREFILL_PIECE`] bytes: `put(ino, offset, bytes)`. Inodes are taken
    /// in order from `from` on, then from the first: a reader walking the tree from there
    /// finds the files ahead of it done first. Stops at the first error of `put` or of a read.
    /// Returns the kernels and bytes handed.
    pub fn each_kept_kernel(
        &self,
        from: Ino,
        mut put: impl FnMut(Ino, u64, &[u8]) -> std::io::Result<()>,
    ) -> std::io::Result<(u64, u64)> {
        let (mut kernels, mut bytes) = (0, 0);
        let last = self.tree.len();
        let from = from.clamp(1, last.max(1));
        for ino in (from..=last).chain(1..from) {
            let Some(Entry::File(file)) = self.tree.entry(ino) else {
                continue;
            };
            let Some(body) = self.store.peek(kernel_id(file)) else {
                continue;
            };
            let mut offset = 0;
            while offset < body.len() {
                let end = offset.saturating_add(PREFILL_PIECE);
                let n = body.with_range(offset, end, |r| -> std::io::Result<u64> {
                    let piece = r.map_err(|e| std::io::Error::from_raw_os_error(e.0))?;
                    put(ino, offset, piece)?;
                    Ok(piece.len() as u64)
                })?;
                if n == 0 {
                    break;
                }
                offset += n;
            }
            kernels += 1;
            bytes += offset;
        }
        Ok((kernels, bytes))
    }
}
