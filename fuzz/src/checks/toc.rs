//! `toc`: arbitrary bytes as a TOC and as a msgpack document.
//!
//! Invariants:
//! - the decoder never asks for a byte past the end of the object it returns (HIPK metadata
//!   arrives as a pointer without a length, so reading further could fault);
//! - decoding the returned prefix alone gives the same value;
//! - `parse_toc` succeeds only on input the generic decoder also accepts, and then gives the
//!   same TOC from that prefix alone (trailing bytes are ignored);
//! - a parsed TOC has sorted, unique keys and unique arches per key;
//! - reading through windows of 16, 64 and 4096 bytes gives exactly what the default window
//!   gives (TOC, digest, or error with its offset), so the grow-and-retry path is fuzzed too.

use std::cell::Cell;

use rocm_kpack::archive::format::{TOC_WINDOW, parse_toc, read_toc_windowed};
use rocm_kpack::archive::msgpack::{self, Input};

/// A slice that remembers the furthest byte any request reached.
struct Watched<'a> {
    data: &'a [u8],
    furthest: Cell<usize>,
}

impl<'a> Input<'a> for Watched<'a> {
    fn bytes(&self, pos: usize, n: usize) -> Option<&'a [u8]> {
        let end = pos.checked_add(n)?;
        let got = self.data.get(pos..end)?;
        self.furthest.set(self.furthest.get().max(end));
        Some(got)
    }
}

pub fn run(data: &[u8]) {
    let watched = Watched {
        data,
        furthest: Cell::new(0),
    };
    let decoded = msgpack::decode(&watched);
    if let Ok((value, used)) = &decoded {
        assert!(
            *used >= 1 && *used <= data.len(),
            "used {used} of {}",
            data.len()
        );
        assert!(
            watched.furthest.get() <= *used,
            "decoder read byte {} of an object that ends at {used}",
            watched.furthest.get()
        );
        let (again, used_again) =
            msgpack::decode_slice(&data[..*used]).expect("the prefix decodes alone");
        assert_eq!(used_again, *used);
        // Compared through Debug, which shows floats exactly; `==` would call NaN unequal to
        // itself (the first fuzz finding was this harness bug, not a decoder one).
        assert_eq!(format!("{again:?}"), format!("{value:?}"));
    }

    let windowed = |window: usize| {
        let mut read = |at: u64, buf: &mut [u8]| -> std::io::Result<usize> {
            let at = (at as usize).min(data.len());
            let n = buf.len().min(data.len() - at);
            buf[..n].copy_from_slice(&data[at..at + n]);
            Ok(n)
        };
        // Shown as text: the error type has no `==`; every digest is kept so they compare too.
        format!(
            "{:?}",
            read_toc_windowed(data.len() as u64, &mut read, usize::MAX, window)
        )
    };
    let whole = windowed(TOC_WINDOW);
    for window in [16, 64, 4096] {
        assert_eq!(windowed(window), whole, "window of {window} bytes");
    }

    let Ok(toc) = parse_toc(data) else { return };
    let Ok((_, used)) = decoded else {
        panic!("parse_toc accepted bytes the decoder rejects: {decoded:?}");
    };
    assert_eq!(
        parse_toc(&data[..used]).as_ref(),
        Ok(&toc),
        "trailing bytes changed the TOC"
    );
    let binaries: Vec<_> = toc.kernels.binaries().collect();
    for pair in binaries.windows(2) {
        assert!(
            pair[0].key < pair[1].key,
            "keys not sorted and unique: {:?} {:?}",
            pair[0].key,
            pair[1].key
        );
    }
    for b in &binaries {
        assert!(!b.is_empty(), "binary {:?} without entries", b.key);
        let arches: Vec<_> = b.arches().collect();
        for (i, e) in arches.iter().enumerate() {
            assert!(
                arches[..i].iter().all(|x| x.arch != e.arch),
                "arch {:?} twice under {:?}",
                e.arch,
                b.key
            );
        }
    }
}
