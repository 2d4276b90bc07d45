//! Which file is mapped at an address: a parser for `/proc/self/maps` lines, and the lookup
//! behind `kpack_discover_binary_path`.
//!
//! A maps line reads `low-high perms offset dev inode    path`. The path is everything after the
//! whitespace that follows the inode, so a ` (deleted)` suffix stays part of it. Lines without a
//! path (anonymous memory) or with a pseudo-path such as `[heap]` are skipped. `dladdr` is not
//! used because it cannot name the file for addresses in data sections reliably.

use std::path::PathBuf;

use crate::error::{Error, Result};

/// One mapping of a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mapping<'a> {
    pub low: u64,
    pub high: u64,
    /// File offset of `low`.
    pub offset: u64,
    pub path: &'a [u8],
}

/// Parses one line (with or without its newline). `None` for malformed lines and for lines
/// that name no file.
pub fn parse_line(line: &[u8]) -> Option<Mapping<'_>> {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    let mut rest = line;
    let mut field = || -> Option<&[u8]> {
        let start = rest.iter().position(|b| !is_blank(*b))?;
        let trimmed = &rest[start..];
        let end = trimmed
            .iter()
            .position(|b| is_blank(*b))
            .unwrap_or(trimmed.len());
        let (f, r) = trimmed.split_at(end);
        rest = r;
        Some(f)
    };
    let range = field()?;
    let _perms = field()?;
    let offset = field()?;
    let _dev = field()?;
    let _inode = field()?;
    let start = rest.iter().position(|b| !is_blank(*b))?;
    let path = &rest[start..];
    if path.first() == Some(&b'[') {
        return None;
    }
    let dash = range.iter().position(|b| *b == b'-')?;
    let low = hex(&range[..dash])?;
    let high = hex(&range[dash + 1..])?;
    let offset = hex(offset)?;
    Some(Mapping {
        low,
        high,
        offset,
        path,
    })
}

fn is_blank(b: u8) -> bool {
    b == b' ' || b == b'\t'
}

fn hex(s: &[u8]) -> Option<u64> {
    u64::from_str_radix(std::str::from_utf8(s).ok()?, 16).ok()
}

/// The first file mapping in `maps` that contains `addr`: its path and the file offset of `addr`.
pub fn find(maps: &[u8], addr: u64) -> Option<(&[u8], u64)> {
    maps.split(|b| *b == b'\n')
        .filter_map(parse_line)
        .find(|m| m.low <= addr && addr < m.high)
        .map(|m| (m.path, m.offset.wrapping_add(addr - m.low)))
}

/// The file mapped at `addr` in this process, and the file offset of `addr`.
pub fn discover(addr: usize) -> Result<(PathBuf, u64)> {
    use std::os::unix::ffi::OsStrExt;
    let maps = std::fs::read("/proc/self/maps")
        .map_err(|e| Error::PathDiscovery(format!("cannot read /proc/self/maps: {e}")))?;
    let (path, offset) = find(&maps, addr as u64).ok_or_else(|| {
        Error::PathDiscovery(format!("no mapped file contains address {addr:#x}"))
    })?;
    Ok((PathBuf::from(std::ffi::OsStr::from_bytes(path)), offset))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &[u8] = b"\
55d0a0000000-55d0a0001000 r--p 00000000 08:01 1234                       /usr/bin/app\n\
55d0a0001000-55d0a0005000 r-xp 00001000 08:01 1234                       /usr/bin/app\n\
55d0a1000000-55d0a1021000 rw-p 00000000 00:00 0                          [heap]\n\
7f0000000000-7f0000002000 rw-p 00000000 00:00 0 \n\
7f0000002000-7f0000004000 r--p 00010000 08:01 99   /tmp/lib with space.so (deleted)\n";

    #[test]
    fn parses_fields_and_keeps_the_whole_path() {
        let m = parse_line(b"7f0000002000-7f0000004000 r--p 00010000 08:01 99   /tmp/lib with space.so (deleted)\n").unwrap();
        assert_eq!(
            (m.low, m.high, m.offset),
            (0x7f0000002000, 0x7f0000004000, 0x10000)
        );
        assert_eq!(m.path, b"/tmp/lib with space.so (deleted)");
        assert_eq!(
            parse_line(b"7f0000000000-7f0000002000 rw-p 00000000 00:00 0 "),
            None
        );
        assert_eq!(
            parse_line(b"55d0a1000000-55d0a1021000 rw-p 00000000 00:00 0   [heap]"),
            None
        );
        assert_eq!(parse_line(b"zz-10 r--p 0 08:01 1 /x"), None);
        assert_eq!(parse_line(b""), None);
    }

    #[test]
    fn finds_the_containing_mapping_and_offset() {
        assert_eq!(
            find(MAPS, 0x55d0a0001010),
            Some((&b"/usr/bin/app"[..], 0x1010))
        );
        assert_eq!(find(MAPS, 0x55d0a0000000), Some((&b"/usr/bin/app"[..], 0)));
        assert_eq!(
            find(MAPS, 0x7f0000003000),
            Some((&b"/tmp/lib with space.so (deleted)"[..], 0x11000))
        );
        // high is exclusive; heap and anonymous memory name no file.
        assert_eq!(find(MAPS, 0x55d0a0005000), None);
        assert_eq!(find(MAPS, 0x55d0a1000010), None);
        assert_eq!(find(MAPS, 0x7f0000000100), None);
    }

    #[test]
    fn discovers_this_test_binary() {
        static MARKER: u8 = 7;
        let (path, _) = discover(&MARKER as *const u8 as usize).unwrap();
        assert_eq!(
            std::fs::canonicalize(&path).unwrap(),
            std::fs::canonicalize(std::env::current_exe().unwrap()).unwrap()
        );
        assert_eq!(
            discover(0).unwrap_err().kind(),
            crate::ErrorKind::PathDiscoveryFailed
        );
    }
}
