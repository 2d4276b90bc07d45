//! The HIPK host-binary format, in one place, so that what `split` writes and what the loader,
//! the mount and `resolve` read can never drift apart:
//! - [`wrapper`]: the 24-byte `__CudaFatBinaryWrapper` records of `.hipFatBinSegment`, with the
//!   `HIPF` and `HIPK` magics, parsed and encoded;
//! - [`metadata`]: the msgpack marker in `.rocm_kpack_ref` (its key names, the encoder beside
//!   the decoder);
//! - [`host`]: both read from an ELF file;
//! - here: the TOC lookup key `kernel_name#N` and its inverse, and the `@GFXARCH@` token.

pub mod host;
pub mod metadata;
pub mod wrapper;

pub use host::HipkHost;
pub use metadata::HipkMetadata;
pub(crate) use wrapper::HIPF_MAGIC;
pub use wrapper::{HIPK_MAGIC, Wrapper};

/// The placeholder, in an embedded search path, that the loader replaces by each candidate
/// target ID (only its first occurrence).
pub(crate) const GFXARCH_TOKEN: &str = "@GFXARCH@";

/// The TOC key the loader looks up for code object `co_index`: always suffixed, decimal, no
/// padding (`lib/libfoo.so#0`).
pub fn lookup_key(kernel_name: &str, co_index: u32) -> String {
    format!("{kernel_name}#{co_index}")
}

/// The inverse of [`lookup_key`]: `(kernel_name, co_index)` for a key the loader can ask for,
/// `None` for any other key (no `#`, an empty or non-decimal index, a leading zero, or an index
/// past `u32`: the loader never forms those, so they can never be loaded).
pub fn split_lookup_key(key: &str) -> Option<(&str, u32)> {
    let (name, index) = key.rsplit_once('#')?;
    let canonical = !index.is_empty()
        && index.bytes().all(|b| b.is_ascii_digit())
        && (index == "0" || !index.starts_with('0'));
    if !canonical {
        return None;
    }
    Some((name, index.parse().ok()?))
}

/// Whether `key` is one of `kernel_name`'s code objects, as the loader would name it.
pub(crate) fn is_code_object_key(kernel_name: &str, key: &str) -> bool {
    split_lookup_key(key).is_some_and(|(name, _)| name == kernel_name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_keys_round_trip() {
        assert_eq!(lookup_key("lib/libfoo.so", 0), "lib/libfoo.so#0");
        assert_eq!(lookup_key("x", 57), "x#57");
        for (name, co) in [("lib/libfoo.so", 0), ("a#b", 7), ("", u32::MAX)] {
            assert_eq!(split_lookup_key(&lookup_key(name, co)), Some((name, co)));
        }
    }

    #[test]
    fn keys_the_loader_never_forms_have_no_inverse() {
        for bad in [
            "lib/x.so",
            "lib/x.so#",
            "lib/x.so#01",
            "lib/x.so#-1",
            "lib/x.so#+1",
            "lib/x.so# 1",
            "lib/x.so#1a",
            "lib/x.so#4294967296",
        ] {
            assert_eq!(split_lookup_key(bad), None, "{bad}");
        }
        assert!(is_code_object_key("lib/libx.so", "lib/libx.so#0"));
        assert!(is_code_object_key("lib/libx.so", "lib/libx.so#14"));
        for other in [
            "lib/libx.so",
            "lib/libx.so#",
            "lib/libx.so#a",
            "lib/libx.so#0/y",
            "x/lib/libx.so#0",
        ] {
            assert!(!is_code_object_key("lib/libx.so", other), "{other}");
        }
        assert!(!is_code_object_key("lib/libx.so", "lib/libx.so.1#0"));
        assert!(!is_code_object_key("lib/libx", "lib/libx.so#0"));
    }
}
