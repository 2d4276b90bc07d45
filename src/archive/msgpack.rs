//! A bounded msgpack decoder for untrusted input: the archive TOC and HIPK metadata.
//!
//! Why our own instead of a serde decoder: the reference rejects any declared container, string,
//! binary or extension length larger than the bytes present, and HIPK metadata arrives as a pointer
//! with no length, so the parser must know where the first object ends without touching a byte
//! past it. Every length here is checked against the bytes that remain before anything is
//! allocated, nesting is capped, and values borrow from the input instead of copying it.
//! Encoding (the writer) uses `rmp`, whose output is the canonical minimal form.

use std::fmt;

/// Deepest nesting accepted. The TOC is five levels deep; this leaves room while keeping the
/// recursion far from the stack limit.
const MAX_DEPTH: usize = 128;

/// A decoded msgpack value, borrowing strings and binaries from the input.
#[derive(Debug, Clone, PartialEq)]
pub enum Value<'a> {
    Nil,
    Bool(bool),
    /// Non-negative integers (any width).
    Uint(u64),
    /// Negative integers.
    Int(i64),
    Float(f64),
    /// A msgpack `str`; the bytes may not be valid UTF-8.
    Str(&'a [u8]),
    Bin(&'a [u8]),
    Array(Vec<Value<'a>>),
    Map(Vec<(Value<'a>, Value<'a>)>),
    Ext(i8, &'a [u8]),
}

/// Why decoding failed, and at which byte.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeError {
    pub offset: usize,
    pub reason: String,
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (at byte {})", self.reason, self.offset)
    }
}

fn err<T>(offset: usize, reason: impl Into<String>) -> Result<T, DecodeError> {
    Err(DecodeError {
        offset,
        reason: reason.into(),
    })
}

impl<'a> Value<'a> {
    /// The string, when this is a msgpack `str` holding valid UTF-8. A `bin` is never a string.
    pub fn as_str(&self) -> Option<&'a str> {
        match self {
            Value::Str(b) => std::str::from_utf8(b).ok(),
            _ => None,
        }
    }

    /// Looks up `key` in a map, matching only `str` keys (as the reference does). With duplicate
    /// keys the first one wins, as in the reference's parser (TOC, TOC entries, HIPK metadata).
    pub fn get(&self, key: &str) -> Option<&Value<'a>> {
        match self {
            Value::Map(pairs) => pairs
                .iter()
                .find(|(k, _)| matches!(k, Value::Str(b) if *b == key.as_bytes()))
                .map(|(_, v)| v),
            _ => None,
        }
    }

    /// A short name of the value's type, for error messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::Nil => "nil",
            Value::Bool(_) => "bool",
            Value::Uint(_) => "unsigned integer",
            Value::Int(_) => "negative integer",
            Value::Float(_) => "float",
            Value::Str(_) => "string",
            Value::Bin(_) => "binary",
            Value::Array(_) => "array",
            Value::Map(_) => "map",
            Value::Ext(..) => "extension",
        }
    }

    /// An unsigned integer that fits in `u64`; anything else (negative, float, string) is a
    /// type error, as in the reference's `as<uint64_t>()`.
    pub fn as_u64(&self) -> Option<u64> {
        match self {
            Value::Uint(v) => Some(*v),
            _ => None,
        }
    }
}

/// Where the bytes come from. A slice knows its length; a raw pointer only knows a ceiling, so
/// the parser asks for bytes piece by piece and never beyond what the object needs.
pub trait Input<'a> {
    /// `n` bytes starting at `pos`, or `None` when they are not all available.
    fn bytes(&self, pos: usize, n: usize) -> Option<&'a [u8]>;
}

impl<'a> Input<'a> for &'a [u8] {
    fn bytes(&self, pos: usize, n: usize) -> Option<&'a [u8]> {
        let end = pos.checked_add(n)?;
        self.get(pos..end)
    }
}

/// Decodes the first msgpack object in `input`; bytes after it are ignored. Returns the value
/// and the number of bytes it spans.
pub fn decode<'a, I: Input<'a>>(input: &I) -> Result<(Value<'a>, usize), DecodeError> {
    let mut parser = Parser { input, pos: 0 };
    let value = parser.value(0)?;
    Ok((value, parser.pos))
}

/// A pull reader over a slice for large, regular documents (a TOC with 100,000 entries): maps
/// can be walked header by header instead of being built as trees, saving an allocation per map.
/// Every length check of [`decode`] applies.
pub struct Reader<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub fn new(data: &'a [u8]) -> Reader<'a> {
        Reader { data, pos: 0 }
    }

    /// Byte offset of the next value.
    pub fn position(&self) -> usize {
        self.pos
    }

    fn with<T>(
        &mut self,
        f: impl FnOnce(&mut Parser<'_, &'a [u8]>) -> Result<T, DecodeError>,
    ) -> Result<T, DecodeError> {
        let mut parser = Parser {
            input: &self.data,
            pos: self.pos,
        };
        let out = f(&mut parser);
        self.pos = parser.pos;
        out
    }

    /// When the next value is a map, consumes its header and returns its (checked) length;
    /// otherwise consumes nothing and returns `None`.
    pub(crate) fn map_header(&mut self) -> Result<Option<usize>, DecodeError> {
        self.with(|p| p.map_header())
    }

    /// When the next value is an array, consumes its header and returns its (checked) length;
    /// otherwise consumes nothing and returns `None`.
    pub(crate) fn array_header(&mut self) -> Result<Option<usize>, DecodeError> {
        self.with(|p| p.array_header())
    }

    /// Decodes the next value whole, `depth` levels below the document root.
    pub fn value(&mut self, depth: usize) -> Result<Value<'a>, DecodeError> {
        self.with(|p| p.value(depth))
    }
}

/// Decodes the first object of a slice.
pub fn decode_slice(data: &[u8]) -> Result<(Value<'_>, usize), DecodeError> {
    decode(&data)
}

struct Parser<'i, I> {
    input: &'i I,
    pos: usize,
}

impl<'a, I: Input<'a>> Parser<'_, I> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        match self.input.bytes(self.pos, n) {
            Some(b) => {
                self.pos += n;
                Ok(b)
            }
            None => err(self.pos, format!("truncated: {n} more bytes needed")),
        }
    }

    fn byte(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }

    fn be(&mut self, n: usize) -> Result<u64, DecodeError> {
        Ok(self
            .take(n)?
            .iter()
            .fold(0u64, |acc, b| (acc << 8) | u64::from(*b)))
    }

    /// A declared length must fit in the input: each item needs at least `min_bytes_each`.
    /// Checking before allocating is what keeps a 5-byte `array32` from reserving gigabytes.
    fn check_len(
        &self,
        at: usize,
        len: u64,
        min_bytes_each: u64,
        what: &str,
    ) -> Result<usize, DecodeError> {
        let need = len.saturating_mul(min_bytes_each);
        let ok = usize::try_from(need)
            .ok()
            .and_then(|need| {
                if need == 0 {
                    Some(&[][..])
                } else {
                    self.input.bytes(self.pos, need)
                }
            })
            .is_some();
        if !ok {
            return err(
                at,
                format!("{what} declares {len} items, more than the bytes present"),
            );
        }
        Ok(len as usize)
    }

    fn blob(&mut self, at: usize, len: u64, what: &str) -> Result<&'a [u8], DecodeError> {
        let Ok(n) = usize::try_from(len) else {
            return err(
                at,
                format!("{what} of {len} bytes is larger than the input"),
            );
        };
        match self.input.bytes(self.pos, n) {
            Some(b) => {
                self.pos += n;
                Ok(b)
            }
            None => err(
                at,
                format!("{what} of {len} bytes runs past the end of the input"),
            ),
        }
    }

    fn array(&mut self, at: usize, len: u64, depth: usize) -> Result<Value<'a>, DecodeError> {
        let n = self.check_len(at, len, 1, "array")?;
        let mut items = Vec::with_capacity(n.min(1024));
        for _ in 0..n {
            items.push(self.value(depth + 1)?);
        }
        Ok(Value::Array(items))
    }

    fn map(&mut self, at: usize, len: u64, depth: usize) -> Result<Value<'a>, DecodeError> {
        let n = self.check_len(at, len, 2, "map")?;
        let mut pairs = Vec::with_capacity(n.min(1024));
        for _ in 0..n {
            let k = self.value(depth + 1)?;
            let v = self.value(depth + 1)?;
            pairs.push((k, v));
        }
        Ok(Value::Map(pairs))
    }

    fn ext(&mut self, at: usize, len: u64) -> Result<Value<'a>, DecodeError> {
        let ty = self.byte()? as i8;
        Ok(Value::Ext(ty, self.blob(at, len, "extension")?))
    }

    fn map_header(&mut self) -> Result<Option<usize>, DecodeError> {
        self.container_header(0x80, [0xde, 0xdf], 2, "map")
    }

    fn array_header(&mut self) -> Result<Option<usize>, DecodeError> {
        self.container_header(0x90, [0xdc, 0xdd], 1, "array")
    }

    /// The element count of a map or array header at the cursor (`fix`: its fix-form tag with
    /// a zero count; `wide`: its 16- and 32-bit tags), checked against the bytes left at
    /// `per_item` bytes each; `None`, with the cursor unmoved, when another type is there.
    fn container_header(
        &mut self,
        fix: u8,
        wide: [u8; 2],
        per_item: u64,
        what: &str,
    ) -> Result<Option<usize>, DecodeError> {
        let at = self.pos;
        let Some(tag) = self.input.bytes(at, 1).map(|b| b[0]) else {
            return err(at, "truncated: 1 more bytes needed");
        };
        let len = if tag & 0xf0 == fix {
            self.pos += 1;
            u64::from(tag & 0x0f)
        } else if wide.contains(&tag) {
            self.pos += 1;
            self.be(if tag == wide[0] { 2 } else { 4 })?
        } else {
            return Ok(None);
        };
        self.check_len(at, len, per_item, what).map(Some)
    }

    fn value(&mut self, depth: usize) -> Result<Value<'a>, DecodeError> {
        let at = self.pos;
        if depth > MAX_DEPTH {
            return err(at, format!("nesting deeper than {MAX_DEPTH} levels"));
        }
        let tag = self.byte()?;
        Ok(match tag {
            0x00..=0x7f => Value::Uint(u64::from(tag)),
            0x80..=0x8f => return self.map(at, u64::from(tag & 0x0f), depth),
            0x90..=0x9f => return self.array(at, u64::from(tag & 0x0f), depth),
            0xa0..=0xbf => Value::Str(self.blob(at, u64::from(tag & 0x1f), "string")?),
            0xc0 => Value::Nil,
            0xc1 => return err(at, "reserved byte 0xc1"),
            0xc2 => Value::Bool(false),
            0xc3 => Value::Bool(true),
            0xc4..=0xc6 => {
                let len = self.be(1 << (tag - 0xc4))?;
                Value::Bin(self.blob(at, len, "binary")?)
            }
            0xc7..=0xc9 => {
                let len = self.be(1 << (tag - 0xc7))?;
                return self.ext(at, len);
            }
            0xca => Value::Float(f64::from(f32::from_bits(self.be(4)? as u32))),
            0xcb => Value::Float(f64::from_bits(self.be(8)?)),
            0xcc..=0xcf => Value::Uint(self.be(1 << (tag - 0xcc))?),
            0xd0..=0xd3 => {
                let width = 1usize << (tag - 0xd0);
                let raw = self.be(width)?;
                let shift = 64 - 8 * width as u32;
                let v = ((raw << shift) as i64) >> shift;
                if v >= 0 {
                    Value::Uint(v as u64)
                } else {
                    Value::Int(v)
                }
            }
            0xd4..=0xd8 => return self.ext(at, 1 << (tag - 0xd4)),
            0xd9..=0xdb => {
                let len = self.be(1 << (tag - 0xd9))?;
                Value::Str(self.blob(at, len, "string")?)
            }
            0xdc | 0xdd => {
                let len = self.be(if tag == 0xdc { 2 } else { 4 })?;
                return self.array(at, len, depth);
            }
            0xde | 0xdf => {
                let len = self.be(if tag == 0xde { 2 } else { 4 })?;
                return self.map(at, len, depth);
            }
            0xe0..=0xff => Value::Int(i64::from(tag as i8)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_scalars_and_containers() {
        let data = [
            0x82, 0xa1, b'a', 0x01, 0xa1, b'b', 0x92, 0xff, 0xcd, 0x01, 0x00, 0xc0,
        ];
        let (v, used) = decode_slice(&data).unwrap();
        assert_eq!(used, 11);
        assert_eq!(v.get("a"), Some(&Value::Uint(1)));
        assert_eq!(
            v.get("b"),
            Some(&Value::Array(vec![Value::Int(-1), Value::Uint(256)]))
        );
    }

    #[test]
    fn signed_widths_sign_extend() {
        assert_eq!(decode_slice(&[0xd0, 0x80]).unwrap().0, Value::Int(-128));
        assert_eq!(decode_slice(&[0xd1, 0xff, 0xfe]).unwrap().0, Value::Int(-2));
        assert_eq!(decode_slice(&[0xd0, 0x05]).unwrap().0, Value::Uint(5));
        assert_eq!(
            decode_slice(&[0xd3, 0x80, 0, 0, 0, 0, 0, 0, 0]).unwrap().0,
            Value::Int(i64::MIN)
        );
    }

    #[test]
    fn oversized_declarations_are_rejected_without_allocating() {
        for tag in [0xdd, 0xdf, 0xdb, 0xc6, 0xc9] {
            let data = [tag, 0xff, 0xff, 0xff, 0xff];
            assert!(decode_slice(&data).is_err(), "tag {tag:#x}");
        }
    }

    #[test]
    fn truncated_input_is_an_error() {
        assert!(decode_slice(&[]).is_err());
        assert!(decode_slice(&[0x92, 0x01]).is_err());
        assert!(decode_slice(&[0xcf, 0, 0]).is_err());
        assert!(decode_slice(&[0xa3, b'a']).is_err());
    }

    #[test]
    fn deep_nesting_is_capped() {
        let data = vec![0x91u8; 100_000];
        let e = decode_slice(&data).unwrap_err();
        assert!(e.reason.contains("nesting"), "{e}");
    }

    #[test]
    fn reader_walks_array_headers() {
        // [[1, 2], "x"] read as headers and values; a non-array consumes nothing.
        let data = [0x92, 0x92, 0x01, 0x02, 0xa1, b'x'];
        let mut r = Reader::new(&data);
        assert_eq!(r.array_header().unwrap(), Some(2));
        assert_eq!(r.array_header().unwrap(), Some(2));
        assert_eq!(r.value(2).unwrap(), Value::Uint(1));
        assert_eq!(r.value(2).unwrap(), Value::Uint(2));
        assert_eq!(r.array_header().unwrap(), None);
        assert_eq!(r.position(), 4);
        assert_eq!(r.value(1).unwrap(), Value::Str(b"x"));
        // A declared length the input cannot hold is an error, before anything is allocated.
        assert!(
            Reader::new(&[0xdd, 0xff, 0xff, 0xff, 0xff])
                .array_header()
                .is_err()
        );
    }

    #[test]
    fn bin_keys_never_match() {
        let data = [0x81, 0xc4, 0x01, b'a', 0x01];
        let (v, _) = decode_slice(&data).unwrap();
        assert_eq!(v.get("a"), None);
    }
}
