//! Reading `/proc/self/mountinfo`: whether a path is a mount point, what type it is, and the
//! FUSE connection number (the device minor) needed to abort a hung connection through
//! `/sys/fs/fuse/connections/<n>/abort`.

use std::path::{Path, PathBuf};

/// One line of mountinfo.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    pub major: u32,
    pub minor: u32,
    pub mount_point: PathBuf,
    pub fs_type: String,
    /// The source, with the kernel's octal escapes undone.
    pub source: String,
}

/// Undoes the kernel's `\ooo` escapes (space, tab, newline, backslash).
pub fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && bytes[i + 1..i + 4]
                .iter()
                .all(|b| (b'0'..=b'7').contains(b))
        {
            let v = (bytes[i + 1] - b'0') * 64 + (bytes[i + 2] - b'0') * 8 + (bytes[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Parses one mountinfo line.
pub fn parse_line(line: &str) -> Option<MountEntry> {
    let (left, right) = line.split_once(" - ")?;
    let fields: Vec<&str> = left.split(' ').collect();
    let (major, minor) = fields.get(2)?.split_once(':')?;
    let mount_point = PathBuf::from(unescape(fields.get(4)?));
    let mut rest = right.split(' ');
    let fs_type = rest.next()?.to_owned();
    let source = unescape(rest.next()?);
    Some(MountEntry {
        major: major.parse().ok()?,
        minor: minor.parse().ok()?,
        mount_point,
        fs_type,
        source,
    })
}

/// Every mount of this process's namespace, in mount order.
pub fn mounts() -> std::io::Result<Vec<MountEntry>> {
    let text = std::fs::read_to_string("/proc/self/mountinfo")?;
    Ok(text.lines().filter_map(parse_line).collect())
}

/// The topmost mount at exactly `path` (which should be canonical), if any.
pub fn mount_at(path: &Path) -> std::io::Result<Option<MountEntry>> {
    Ok(mounts()?.into_iter().rev().find(|m| m.mount_point == path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_fuse_line() {
        let line = "812 29 0:93 / /tmp/m\\040x rw,nosuid,nodev,relatime shared:1 - fuse.kpack-fuse /a\\134,b.kpack ro,user_id=0,group_id=0";
        let m = parse_line(line).unwrap();
        assert_eq!((m.major, m.minor), (0, 93));
        assert_eq!(m.mount_point, PathBuf::from("/tmp/m x"));
        assert_eq!(m.fs_type, "fuse.kpack-fuse");
        assert_eq!(m.source, "/a\\,b.kpack");
        assert_eq!(parse_line("garbage"), None);
    }
}
