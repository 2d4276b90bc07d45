//! HIPK metadata: the msgpack map a HIPK host binary carries in `.rocm_kpack_ref`.
//!
//! Shape: `{"kernel_name": str, "kpack_search_paths": [str, ...]}` in any key order, extra keys
//! allowed. Ours may add `"kpack_toc_pins": [bin32, ...]`, the TOC digests of the archives the
//! binary was split into ([`KEY_PINS`]; the reference loader ignores unknown keys). `kernel_name` must be a msgpack `str` (a `bin` is rejected); the search-path array
//! must hold at least one `str` entry after non-`str` entries are skipped. Only the first msgpack
//! object is read; bytes after it are ignored.
//!
//! The C entry point receives the metadata as a bare pointer with no length. `PointerInput`
//! lets the bounded decoder pull bytes from such a pointer: it only hands out bytes the decoder
//! asks for while walking the first object, and never any at or past [`MAX_METADATA_BYTES`].

use std::ffi::OsString;
use std::marker::PhantomData;
use std::os::unix::ffi::{OsStrExt, OsStringExt};

use crate::archive::msgpack::{self, Input, Value};
use crate::error::{Error, Result};

/// Key of the binary's name in the archives' TOC (a msgpack `str`).
const KEY_KERNEL_NAME: &str = "kernel_name";
/// Key of the array of archive paths or `@GFXARCH@` patterns.
const KEY_SEARCH_PATHS: &str = "kpack_search_paths";

/// Key of the pins: an array of 32-byte msgpack `bin`s, each the BLAKE3 digest of one archive's
/// TOC (`Archive::toc_digest`). Written by `split` and `pack --from-fatbin --emit-metadata`
/// unless told not to; a binary with pins only takes code objects from those archives.
const KEY_PINS: &str = "kpack_toc_pins";

/// A TOC digest.
pub type Pin = [u8; 32];

/// The most metadata bytes ever examined from a length-less pointer.
pub const MAX_METADATA_BYTES: usize = 64 * 1024;

/// Parsed HIPK metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HipkMetadata {
    /// The binary's name in the archives' TOC, without the `#N` code-object suffix.
    pub kernel_name: String,
    /// Archive paths or patterns (with `@GFXARCH@`), relative to the binary's directory unless
    /// absolute; in metadata order, non-string entries dropped. Never empty.
    pub search_paths: Vec<OsString>,
    /// The TOC digests this binary's code objects may come from; `None` (no pins key, as in
    /// everything the reference tooling writes): any archive.
    pub pins: Option<Vec<Pin>>,
}

impl HipkMetadata {
    /// Parses the first msgpack object of `bytes`.
    pub fn parse(bytes: &[u8]) -> Result<HipkMetadata> {
        let limit = &bytes[..bytes.len().min(MAX_METADATA_BYTES)];
        let (value, _) =
            msgpack::decode_slice(limit).map_err(|e| Error::InvalidMetadata(e.to_string()))?;
        HipkMetadata::from_value(&value)
    }

    /// Parses metadata that starts at `ptr`, whose length is unknown.
    ///
    /// # Safety
    /// Every byte of the first msgpack object at `ptr` must be readable (or, when the object is
    /// longer than [`MAX_METADATA_BYTES`], the first `MAX_METADATA_BYTES` bytes must be).
    pub unsafe fn parse_pointer(ptr: *const u8) -> Result<HipkMetadata> {
        // SAFETY: forwarded to the caller.
        let input = unsafe { PointerInput::new(ptr, MAX_METADATA_BYTES) };
        let (value, _) =
            msgpack::decode(&input).map_err(|e| Error::InvalidMetadata(e.to_string()))?;
        HipkMetadata::from_value(&value)
    }

    /// Checks the decoded value's shape and copies out what the loader needs.
    fn from_value(value: &Value<'_>) -> Result<HipkMetadata> {
        if !matches!(value, Value::Map(_)) {
            return Err(Error::InvalidMetadata(format!(
                "expected a map, found {}",
                value.type_name()
            )));
        }
        let kernel_name = match value.get(KEY_KERNEL_NAME) {
            None => return Err(Error::InvalidMetadata("no \"kernel_name\" key".into())),
            Some(Value::Str(bytes)) => std::str::from_utf8(bytes)
                .map_err(|_| Error::InvalidMetadata("\"kernel_name\" is not valid UTF-8".into()))?
                .to_owned(),
            Some(other) => {
                return Err(Error::InvalidMetadata(format!(
                    "\"kernel_name\" is a {}, expected a string",
                    other.type_name()
                )));
            }
        };
        let search_paths: Vec<OsString> = match value.get(KEY_SEARCH_PATHS) {
            None => {
                return Err(Error::InvalidMetadata(
                    "no \"kpack_search_paths\" key".into(),
                ));
            }
            Some(Value::Array(items)) => items
                .iter()
                .filter_map(|item| match item {
                    Value::Str(bytes) => Some(OsString::from_vec(bytes.to_vec())),
                    _ => None,
                })
                .collect(),
            Some(other) => {
                return Err(Error::InvalidMetadata(format!(
                    "\"kpack_search_paths\" is a {}, expected an array",
                    other.type_name()
                )));
            }
        };
        if search_paths.is_empty() {
            return Err(Error::InvalidMetadata(
                "\"kpack_search_paths\" holds no string".into(),
            ));
        }
        let pins = match value.get(KEY_PINS) {
            None => None,
            Some(v) => Some(parse_pins(v)?),
        };
        Ok(HipkMetadata {
            kernel_name,
            search_paths,
            pins,
        })
    }

    /// The TOC key of code object `co_index`: `kernel_name#co_index`, always suffixed.
    pub fn lookup_key(&self, co_index: u32) -> String {
        super::lookup_key(&self.kernel_name, co_index)
    }

    /// The metadata's bytes (see [`encode_pinned`]); without pins, exactly the reference's.
    pub fn encode(&self) -> Vec<u8> {
        let paths: Vec<&[u8]> = self.search_paths.iter().map(|p| p.as_bytes()).collect();
        encode_raw(&paths, self.kernel_name.as_bytes(), self.pins.as_deref())
    }

    /// Whether an archive with this TOC digest may be used: always without pins.
    pub fn allows(&self, toc_digest: &Pin) -> bool {
        self.pins.as_ref().is_none_or(|p| p.contains(toc_digest))
    }
}

/// A pins value must be a non-empty array of 32-byte `bin`s: a binary that carries the key but
/// not a usable set is refused rather than loaded unpinned (the key is only ever written by us,
/// so a bad one means the binary was altered).
fn parse_pins(value: &Value<'_>) -> Result<Vec<Pin>> {
    let bad = |why: String| Error::InvalidMetadata(format!("\"{KEY_PINS}\" {why}"));
    let Value::Array(items) = value else {
        return Err(bad(format!(
            "is a {}, expected an array",
            value.type_name()
        )));
    };
    if items.is_empty() {
        return Err(bad("is empty".into()));
    }
    items
        .iter()
        .enumerate()
        .map(|(i, item)| match item {
            Value::Bin(b) => <Pin>::try_from(&b[..])
                .map_err(|_| bad(format!("entry {i} holds {} bytes, expected 32", b.len()))),
            other => Err(bad(format!(
                "entry {i} is a {}, expected 32 bytes",
                other.type_name()
            ))),
        })
        .collect()
}

/// HIPK metadata encoded as the reference tooling writes it (Python msgpack with
/// `use_bin_type=True`): a map with `kpack_search_paths` first, then `kernel_name`, every string
/// a msgpack `str` in its shortest form. [`HipkMetadata::parse`] reads it back.
pub fn encode(search_paths: &[String], kernel_name: &str) -> Vec<u8> {
    let paths: Vec<&[u8]> = search_paths.iter().map(|p| p.as_bytes()).collect();
    encode_raw(&paths, kernel_name.as_bytes(), None)
}

/// [`encode`] plus, when `pins` is given, a third key [`KEY_PINS`] after the reference's two
/// (so the reference's bytes are a prefix of the map's entries and its reader never notices).
pub fn encode_pinned(search_paths: &[String], kernel_name: &str, pins: Option<&[Pin]>) -> Vec<u8> {
    let paths: Vec<&[u8]> = search_paths.iter().map(|p| p.as_bytes()).collect();
    encode_raw(&paths, kernel_name.as_bytes(), pins)
}

fn encode_raw(search_paths: &[&[u8]], kernel_name: &[u8], pins: Option<&[Pin]>) -> Vec<u8> {
    use rmp::encode as e;
    let mut out = Vec::new();
    e::write_map_len(&mut out, if pins.is_some() { 3 } else { 2 }).expect("vec write");
    write_str(&mut out, KEY_SEARCH_PATHS.as_bytes());
    e::write_array_len(&mut out, search_paths.len() as u32).expect("vec write");
    for p in search_paths {
        write_str(&mut out, p);
    }
    write_str(&mut out, KEY_KERNEL_NAME.as_bytes());
    write_str(&mut out, kernel_name);
    if let Some(pins) = pins {
        write_str(&mut out, KEY_PINS.as_bytes());
        e::write_array_len(&mut out, pins.len() as u32).expect("vec write");
        for pin in pins {
            e::write_bin(&mut out, pin).expect("vec write");
        }
    }
    out
}

/// A msgpack `str` header and the bytes (paths need not be UTF-8; the loader reads them raw).
fn write_str(out: &mut Vec<u8>, s: &[u8]) {
    rmp::encode::write_str_len(out, s.len() as u32).expect("vec write");
    out.extend_from_slice(s);
}

/// Bytes behind a raw pointer, served on demand and capped at `cap`.
struct PointerInput<'a> {
    base: *const u8,
    cap: usize,
    _borrow: PhantomData<&'a [u8]>,
}

impl<'a> PointerInput<'a> {
    /// # Safety
    /// Any range `[pos, pos + n)` with `pos + n <= cap` that the decoder asks for must be
    /// readable for `'a`. The decoder only asks for bytes inside the object it is decoding.
    pub unsafe fn new(base: *const u8, cap: usize) -> PointerInput<'a> {
        PointerInput {
            base,
            cap,
            _borrow: PhantomData,
        }
    }
}

impl<'a> Input<'a> for PointerInput<'a> {
    fn bytes(&self, pos: usize, n: usize) -> Option<&'a [u8]> {
        let end = pos.checked_add(n)?;
        if end > self.cap {
            return None;
        }
        // SAFETY: the range is below the cap and was requested by the decoder, which the
        // constructor's contract covers.
        Some(unsafe { std::slice::from_raw_parts(self.base.add(pos), n) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn build(body: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
        let mut buf = Vec::new();
        body(&mut buf);
        buf
    }

    fn meta(name: &str, paths: &[&str]) -> Vec<u8> {
        build(|b| {
            rmp::encode::write_map_len(b, 2).unwrap();
            rmp::encode::write_str(b, "kpack_search_paths").unwrap();
            rmp::encode::write_array_len(b, paths.len() as u32).unwrap();
            for p in paths {
                rmp::encode::write_str(b, p).unwrap();
            }
            rmp::encode::write_str(b, "kernel_name").unwrap();
            rmp::encode::write_str(b, name).unwrap();
        })
    }

    fn kind(bytes: &[u8]) -> crate::ErrorKind {
        HipkMetadata::parse(bytes).unwrap_err().kind()
    }

    #[test]
    fn parses_writer_order_and_ignores_trailing_bytes() {
        let mut bytes = meta("lib/libfoo.so", &["../.kpack/foo_@GFXARCH@.kpack"]);
        bytes.extend_from_slice(b"\xc1junk");
        let m = HipkMetadata::parse(&bytes).unwrap();
        assert_eq!(m.kernel_name, "lib/libfoo.so");
        assert_eq!(
            m.search_paths,
            [OsString::from("../.kpack/foo_@GFXARCH@.kpack")]
        );
        assert_eq!(m.lookup_key(0), "lib/libfoo.so#0");
        assert_eq!(m.lookup_key(57), "lib/libfoo.so#57");
    }

    #[test]
    fn encoder_matches_the_reference_bytes_and_the_decoder() {
        let bytes = encode(&["../.kpack/foo_@GFXARCH@.kpack".into()], "lib/libfoo.so");
        assert_eq!(
            bytes,
            meta("lib/libfoo.so", &["../.kpack/foo_@GFXARCH@.kpack"])
        );
        let m = HipkMetadata::parse(&bytes).unwrap();
        assert_eq!(m.encode(), bytes);
        // Fixed bytes: map of 2, fixstr keys, array of 1.
        assert_eq!(
            encode(&["a".into()], "k"),
            b"\x82\xb2kpack_search_paths\x91\xa1a\xabkernel_name\xa1k"
        );
    }

    #[test]
    fn metadata_bytes_match_python_msgpack() {
        // Expected bytes produced by Python: msgpack.packb({"kpack_search_paths":
        // ["../.kpack/rocrand_@GFXARCH@.kpack"], "kernel_name": "lib/librocrand.so.1.1"},
        // use_bin_type=True).hex()
        let expected = "82b26b7061636b5f7365617263685f706174687391d9212e2e2f2e6b7061636b2f726f6372616e645f4047\
                        465841524348402e6b7061636bab6b65726e656c5f6e616d65b56c69622f6c6962726f6372616e642e73\
                        6f2e312e31";
        let got = encode(
            &["../.kpack/rocrand_@GFXARCH@.kpack".into()],
            "lib/librocrand.so.1.1",
        );
        let hex: String = got.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, expected);
    }

    /// The reference's parser keeps the first occurrence of a repeated key; so do we.
    #[test]
    fn repeated_keys_first_wins() {
        let bytes = build(|b| {
            rmp::encode::write_map_len(b, 4).unwrap();
            rmp::encode::write_str(b, "kernel_name").unwrap();
            rmp::encode::write_str(b, "first").unwrap();
            rmp::encode::write_str(b, "kpack_search_paths").unwrap();
            rmp::encode::write_array_len(b, 1).unwrap();
            rmp::encode::write_str(b, "a.kpack").unwrap();
            rmp::encode::write_str(b, "kernel_name").unwrap();
            rmp::encode::write_str(b, "second").unwrap();
            rmp::encode::write_str(b, "kpack_search_paths").unwrap();
            rmp::encode::write_u32(b, 7).unwrap();
        });
        let m = HipkMetadata::parse(&bytes).unwrap();
        assert_eq!(m.kernel_name, "first");
        assert_eq!(m.search_paths, [OsString::from("a.kpack")]);
        // A bad first occurrence is not rescued by a good later one.
        let bytes = build(|b| {
            rmp::encode::write_map_len(b, 3).unwrap();
            rmp::encode::write_str(b, "kernel_name").unwrap();
            rmp::encode::write_u32(b, 1).unwrap();
            rmp::encode::write_str(b, "kernel_name").unwrap();
            rmp::encode::write_str(b, "k").unwrap();
            rmp::encode::write_str(b, "kpack_search_paths").unwrap();
            rmp::encode::write_array_len(b, 1).unwrap();
            rmp::encode::write_str(b, "a.kpack").unwrap();
        });
        assert_eq!(
            HipkMetadata::parse(&bytes).unwrap_err().to_string(),
            "invalid HIPK metadata: \"kernel_name\" is a unsigned integer, expected a string"
        );
    }

    #[test]
    fn pins_round_trip_and_bad_pins_are_refused() {
        let pins = [[1u8; 32], [2u8; 32]];
        let bytes = encode_pinned(&["a.kpack".into()], "k", Some(&pins));
        // The reference's two entries, then ours: map of 3, ..., fixstr key, array of 2, bin8 32.
        let plain = encode(&["a.kpack".into()], "k");
        assert_eq!(bytes[0], 0x83);
        assert_eq!(bytes[1..plain.len()], plain[1..]);
        let mut tail = vec![0xae];
        tail.extend_from_slice(b"kpack_toc_pins");
        tail.push(0x92);
        for p in &pins {
            tail.extend_from_slice(&[0xc4, 32]);
            tail.extend_from_slice(p);
        }
        assert_eq!(bytes[plain.len()..], tail[..]);
        let m = HipkMetadata::parse(&bytes).unwrap();
        assert_eq!(m.pins.as_deref(), Some(&pins[..]));
        assert_eq!(m.encode(), bytes);
        assert!(m.allows(&[2u8; 32]));
        assert!(!m.allows(&[3u8; 32]));
        let unpinned = HipkMetadata::parse(&plain).unwrap();
        assert_eq!(unpinned.pins, None);
        assert!(unpinned.allows(&[3u8; 32]));
        assert_eq!(unpinned.encode(), plain);

        let with_pins = |build_pins: &dyn Fn(&mut Vec<u8>)| {
            build(|b| {
                rmp::encode::write_map_len(b, 3).unwrap();
                rmp::encode::write_str(b, "kernel_name").unwrap();
                rmp::encode::write_str(b, "k").unwrap();
                rmp::encode::write_str(b, "kpack_search_paths").unwrap();
                rmp::encode::write_array_len(b, 1).unwrap();
                rmp::encode::write_str(b, "a.kpack").unwrap();
                rmp::encode::write_str(b, "kpack_toc_pins").unwrap();
                build_pins(b);
            })
        };
        for (pins, why) in [
            (
                with_pins(&|b| rmp::encode::write_bin(b, &[0; 32]).unwrap()),
                "\"kpack_toc_pins\" is a binary, expected an array",
            ),
            (
                with_pins(&|b| {
                    rmp::encode::write_array_len(b, 0).unwrap();
                }),
                "\"kpack_toc_pins\" is empty",
            ),
            (
                with_pins(&|b| {
                    rmp::encode::write_array_len(b, 1).unwrap();
                    rmp::encode::write_bin(b, &[0; 31]).unwrap();
                }),
                "\"kpack_toc_pins\" entry 0 holds 31 bytes, expected 32",
            ),
            (
                with_pins(&|b| {
                    rmp::encode::write_array_len(b, 1).unwrap();
                    rmp::encode::write_str(b, "x").unwrap();
                }),
                "\"kpack_toc_pins\" entry 0 is a string, expected 32 bytes",
            ),
        ] {
            let e = HipkMetadata::parse(&pins).unwrap_err();
            assert_eq!(e.to_string(), format!("invalid HIPK metadata: {why}"));
        }
    }

    #[test]
    fn skips_non_string_paths_and_extra_keys() {
        let bytes = build(|b| {
            rmp::encode::write_map_len(b, 3).unwrap();
            rmp::encode::write_str(b, "extra").unwrap();
            rmp::encode::write_u32(b, 7).unwrap();
            rmp::encode::write_str(b, "kernel_name").unwrap();
            rmp::encode::write_str(b, "k").unwrap();
            rmp::encode::write_str(b, "kpack_search_paths").unwrap();
            rmp::encode::write_array_len(b, 3).unwrap();
            rmp::encode::write_u32(b, 1).unwrap();
            rmp::encode::write_str(b, "a.kpack").unwrap();
            rmp::encode::write_bin(b, b"b.kpack").unwrap();
        });
        let m = HipkMetadata::parse(&bytes).unwrap();
        assert_eq!(m.search_paths, [OsString::from("a.kpack")]);
    }

    #[test]
    fn rejects_every_malformed_shape() {
        use crate::ErrorKind::InvalidMetadata as Bad;
        assert_eq!(kind(b"this is not valid msgpack data!"), Bad);
        assert_eq!(kind(&[0x92, 0x01, 0x02]), Bad);
        assert_eq!(kind(&[]), Bad);
        assert_eq!(kind(&meta("k", &[])), Bad);
        let missing_name = build(|b| {
            rmp::encode::write_map_len(b, 1).unwrap();
            rmp::encode::write_str(b, "kpack_search_paths").unwrap();
            rmp::encode::write_array_len(b, 1).unwrap();
            rmp::encode::write_str(b, "x").unwrap();
        });
        assert_eq!(kind(&missing_name), Bad);
        let missing_paths = build(|b| {
            rmp::encode::write_map_len(b, 1).unwrap();
            rmp::encode::write_str(b, "kernel_name").unwrap();
            rmp::encode::write_str(b, "k").unwrap();
        });
        assert_eq!(kind(&missing_paths), Bad);
        let int_name = build(|b| {
            rmp::encode::write_map_len(b, 2).unwrap();
            rmp::encode::write_str(b, "kernel_name").unwrap();
            rmp::encode::write_u32(b, 12345).unwrap();
            rmp::encode::write_str(b, "kpack_search_paths").unwrap();
            rmp::encode::write_array_len(b, 1).unwrap();
            rmp::encode::write_str(b, "x").unwrap();
        });
        assert_eq!(kind(&int_name), Bad);
        let bin_name = build(|b| {
            rmp::encode::write_map_len(b, 2).unwrap();
            rmp::encode::write_str(b, "kernel_name").unwrap();
            rmp::encode::write_bin(b, b"k").unwrap();
            rmp::encode::write_str(b, "kpack_search_paths").unwrap();
            rmp::encode::write_array_len(b, 1).unwrap();
            rmp::encode::write_str(b, "x").unwrap();
        });
        assert_eq!(kind(&bin_name), Bad);
        let str_paths = build(|b| {
            rmp::encode::write_map_len(b, 2).unwrap();
            rmp::encode::write_str(b, "kernel_name").unwrap();
            rmp::encode::write_str(b, "k").unwrap();
            rmp::encode::write_str(b, "kpack_search_paths").unwrap();
            rmp::encode::write_str(b, "x").unwrap();
        });
        assert_eq!(kind(&str_paths), Bad);
        let bin_keys = build(|b| {
            rmp::encode::write_map_len(b, 2).unwrap();
            rmp::encode::write_bin(b, b"kernel_name").unwrap();
            rmp::encode::write_str(b, "k").unwrap();
            rmp::encode::write_bin(b, b"kpack_search_paths").unwrap();
            rmp::encode::write_array_len(b, 1).unwrap();
            rmp::encode::write_str(b, "x").unwrap();
        });
        assert_eq!(kind(&bin_keys), Bad);
    }

    /// Places the metadata so that it ends exactly where an inaccessible page begins: a read of
    /// even one byte past the object would crash the test.
    #[test]
    fn pointer_input_never_reads_past_the_object() {
        let bytes = meta("k", &["p.kpack"]);
        unsafe {
            let page = libc::sysconf(libc::_SC_PAGESIZE) as usize;
            let base = libc::mmap(
                std::ptr::null_mut(),
                2 * page,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert_ne!(base, libc::MAP_FAILED);
            let base = base as *mut u8;
            assert_eq!(
                libc::mprotect(base.add(page) as *mut _, page, libc::PROT_NONE),
                0
            );
            let start = base.add(page - bytes.len());
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), start, bytes.len());
            let m = HipkMetadata::parse_pointer(start);
            libc::munmap(base as *mut _, 2 * page);
            let m = m.unwrap();
            assert_eq!(m.kernel_name, "k");
            assert_eq!(m.search_paths, [OsString::from("p.kpack")]);
        }
    }

    #[test]
    fn pointer_input_caps_at_limit() {
        // A str32 claiming 100 KiB: the decoder must give up at the cap, not read on.
        let mut bytes = vec![0xdb, 0x00, 0x01, 0x90, 0x00];
        bytes.resize(MAX_METADATA_BYTES + 64 * 1024, b'a');
        let err = unsafe { HipkMetadata::parse_pointer(bytes.as_ptr()) }.unwrap_err();
        assert_eq!(err.kind(), crate::ErrorKind::InvalidMetadata);
        let input = unsafe { PointerInput::new(bytes.as_ptr(), 8) };
        assert!(input.bytes(4, 4).is_some());
        assert!(input.bytes(4, 5).is_none());
        assert!(input.bytes(usize::MAX, 2).is_none());
    }
}
