//! `maps`: arbitrary bytes as `/proc/self/maps` text, line by line and as a whole.
//!
//! Invariants: a parsed line's path is non-empty, is the tail of the line, and is not a
//! `[pseudo]` name; `low..high` and the offset come from the line's hex fields. `find` for an
//! address taken from the input returns a mapping that really contains it, with the file offset
//! `offset + (addr - low)` (wrapping, as the kernel's own figures cannot overflow), and returns
//! nothing when no parsed line contains the address.

use rocm_kpack::loader::maps;

pub fn run(data: &[u8]) {
    let addr = data
        .get(..8)
        .map_or(0, |b| u64::from_le_bytes(b.try_into().unwrap()));
    let text = data.get(8..).unwrap_or(&[]);
    let mut containing = None;
    for line in text.split(|b| *b == b'\n') {
        let Some(m) = maps::parse_line(line) else {
            continue;
        };
        assert!(!m.path.is_empty() && m.path[0] != b'[', "{m:?}");
        assert!(line.ends_with(m.path), "path is not the tail of the line");
        assert!(!m.path.starts_with(b" ") && !m.path.starts_with(b"\t"));
        if containing.is_none() && m.low <= addr && addr < m.high {
            containing = Some((m.path, m.offset.wrapping_add(addr - m.low)));
        }
    }
    assert_eq!(maps::find(text, addr), containing);
}
