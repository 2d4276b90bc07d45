//! `kpack-fuse stats MOUNTPOINT`: the mount's counters (the root's `user.kpack.stats`
//! attribute), as an aligned table or as one JSON object, and where its backing files take
//! disk (`user.kpack.backing_dir`, last, as `backing_dir`).

use std::path::{Path, PathBuf};

use crate::cli::exit::{CliError, CliResult, Exit};
use crate::cli::out::out;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The kpack-fuse mount point.
    pub mountpoint: PathBuf,
    /// Print one JSON object (`{"name": number, ..., "backing_dir": "PATH"}`, in the mount's
    /// order) instead of text.
    #[arg(long)]
    pub json: bool,
}

/// The attribute the mount's root answers with its counters.
const STATS_ATTR: &str = "user.kpack.stats";

/// The attribute the mount's root answers with the directory of its backing files (none with
/// memory backing).
const DIR_ATTR: &str = "user.kpack.backing_dir";

/// Counters whose value is a number of bytes; the table adds a readable size beside them.
const BYTE_COUNTERS: &[&str] = &["bytes_cached", "capacity", "backing_bytes"];

pub fn run(args: Args) -> CliResult {
    let text =
        read_attr(&args.mountpoint, STATS_ATTR)?.ok_or_else(|| not_ours(&args.mountpoint))?;
    let text = String::from_utf8(text).map_err(|_| {
        CliError::new(
            Exit::BadFormat,
            format!("{}: {STATS_ATTR} is not UTF-8", args.mountpoint.display()),
        )
    })?;
    let dir =
        read_attr(&args.mountpoint, DIR_ATTR)?.map(|d| String::from_utf8_lossy(&d).into_owned());
    let counters = parse(&text).map_err(|line| {
        CliError::new(
            Exit::BadFormat,
            format!(
                "{}: {STATS_ATTR} has a line that is not `name number`: {line:?}",
                args.mountpoint.display()
            ),
        )
    })?;
    out!(
        "{}",
        if args.json {
            json(&counters, dir.as_deref())
        } else {
            table(&counters, dir.as_deref())
        }
    )
}

fn not_ours(path: &Path) -> CliError {
    CliError::new(
        Exit::MountPoint,
        format!("{}: not the root of a kpack-fuse mount", path.display()),
    )
}

/// The attribute `name` of `path` (none when it has none), or an error saying why the path is
/// not a mount we can ask.
fn read_attr(path: &Path, name: &str) -> CliResult<Option<Vec<u8>>> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| CliError::new(Exit::Usage, "the mount point contains a NUL byte"))?;
    let name = std::ffi::CString::new(name).expect("no NUL in a constant");
    let mut buf = vec![0u8; 64 << 10];
    // SAFETY: both strings are NUL-terminated and live across the call; `buf` is writable for
    // its length.
    let n = unsafe {
        libc::getxattr(
            c.as_ptr(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if n < 0 {
        let e = std::io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::ENODATA) | Some(libc::ENOTSUP) => Ok(None),
            _ => Err(CliError::io(Exit::Unreadable, path, &e)),
        };
    }
    buf.truncate(n as usize);
    Ok(Some(buf))
}

/// `name value` lines into pairs, in order; the first line that is not one is the error.
fn parse(text: &str) -> Result<Vec<(&str, u64)>, &str> {
    text.lines()
        .filter(|l| !l.is_empty())
        .map(|line| {
            let (name, value) = line.split_once(' ').ok_or(line)?;
            Ok((name, value.parse().map_err(|_| line)?))
        })
        .collect()
}

/// The name of the backing directory's row.
const DIR_ROW: &str = "backing_dir";

fn table(counters: &[(&str, u64)], dir: Option<&str>) -> String {
    let width = counters
        .iter()
        .map(|(n, _)| n.len())
        .chain(dir.map(|_| DIR_ROW.len()))
        .max()
        .unwrap_or(0);
    let mut out = String::new();
    for (name, value) in counters {
        out.push_str(&format!("{name:<width$}  {value}"));
        if BYTE_COUNTERS.contains(name) && *value >= 1024 {
            out.push_str(&format!(" ({})", readable_size(*value)));
        }
        out.push('\n');
    }
    if let Some(dir) = dir {
        out.push_str(&format!("{DIR_ROW:<width$}  {dir}\n"));
    }
    out
}

/// Written by hand rather than through `serde_json::Map`, which would sort the names.
fn json(counters: &[(&str, u64)], dir: Option<&str>) -> String {
    let fields: Vec<String> = counters
        .iter()
        .map(|(name, value)| format!("{}:{value}", serde_json::Value::from(*name)))
        .chain(dir.map(|d| format!("\"{DIR_ROW}\":{}", serde_json::Value::from(d))))
        .collect();
    format!("{{{}}}\n", fields.join(","))
}

/// `n` bytes in the largest binary unit that keeps it at 1 or more, one decimal.
fn readable_size(n: u64) -> String {
    let mut value = n as f64;
    let mut unit = "B";
    for next in ["KiB", "MiB", "GiB", "TiB"] {
        if value < 1024.0 {
            break;
        }
        value /= 1024.0;
        unit = next;
    }
    format!("{value:.1} {unit}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints_in_order() {
        let c = parse("hits 12\ncapacity 10737418240\nbacking_bytes 512\n").unwrap();
        assert_eq!(
            c,
            vec![
                ("hits", 12),
                ("capacity", 10737418240),
                ("backing_bytes", 512)
            ]
        );
        assert_eq!(
            table(&c, None),
            "hits           12\ncapacity       10737418240 (10.0 GiB)\nbacking_bytes  512\n"
        );
        assert_eq!(
            json(&c, None),
            "{\"hits\":12,\"capacity\":10737418240,\"backing_bytes\":512}\n"
        );
        let dir = Some("/var/tmp/kpack-fuse.7-1f \"x\"");
        assert_eq!(
            table(&c[..1], dir),
            "hits         12\nbacking_dir  /var/tmp/kpack-fuse.7-1f \"x\"\n"
        );
        assert_eq!(
            json(&c[..1], dir),
            "{\"hits\":12,\"backing_dir\":\"/var/tmp/kpack-fuse.7-1f \\\"x\\\"\"}\n"
        );
    }

    #[test]
    fn refuses_a_line_that_is_not_a_counter() {
        assert_eq!(parse("hits 1\nhits\n"), Err("hits"));
        assert_eq!(parse("hits x\n"), Err("hits x"));
    }

    #[test]
    fn sizes_read_in_binary_units() {
        assert_eq!(readable_size(1023), "1023.0 B");
        assert_eq!(readable_size(1536), "1.5 KiB");
        assert_eq!(readable_size(5 << 20), "5.0 MiB");
    }
}
