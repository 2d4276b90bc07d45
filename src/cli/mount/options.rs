//! `-o` option lists of `kpack-fuse mount`, as `mount(8)`, fstab and `mount.fuse` pass them.
//!
//! Pure: a list is split and applied to [`Settings`] (`settings.rs`) with no I/O, so the whole table of
//! accepted, ignored and refused options is unit-tested below.
//!
//! * Items are separated by commas; `\,` is a literal comma and `\\` a backslash (so a
//!   `log_file=` path may contain commas). Empty items are skipped.
//! * Our own options have the same meaning as the flags: `allow_other`, `allow_root`,
//!   `auto_unmount`, `strict`, `no_pins`, `memory_cache_size=SIZE`, `disk_cache_size=SIZE`,
//!   `threads=N`, `gpu=ISA` (repeatable), `log_file=PATH`, `backing=disk|memory`,
//!   `scratch_dir=DIR`, `cache_dir=DIR`, `no_passthrough` (and `passthrough`, its default),
//!   `no_decode_ahead` (and `decode_ahead`, its default),
//!   `open_mode=auto|daemon|page-cache` (and `passthrough`, the old name of `daemon`), and for remote
//!   sources `endpoint_url=URL`, `remote_timeout=SECS`, `remote_connect_timeout=SECS`,
//!   `remote_retries=N`, `remote_requests=N`, `tls_verify=true|false`. A `-` may stand
//!   for `_` in their names (`disk-cache-size=1G`). The deprecated spellings `cache_size=` and
//!   `cache_dir_size=` set the same bounds, marked as old (`bounds.rs` says what they mean).
//! * Standard options a read-only FUSE mount honours or already implies: `ro` (always),
//!   `default_permissions` (changes nothing: the daemon answers `access` from fixed modes),
//!   `nodev`, `nosuid` (always), `dev`, `suid` (appended by `mount.fuse` unless
//!   `nodev`/`nosuid` were given; accepted, but the mount stays `nodev,nosuid`: it holds neither
//!   devices nor set-id programs), `exec`, `noexec` (applied).
//! * Options meant for mount management are ignored: `defaults`, `auto`, `noauto`, `user`,
//!   `nouser`, `users`, `_netdev`, `nofail`, and every `x-*` (systemd and friends).
//! * `rw` and anything else are refused with a message naming the option.

use std::path::PathBuf;

use super::settings::{Bound, OpenModeSetting, Settings};

/// Splits an option list on unescaped commas, undoing `\,` and `\\`.
pub fn split(list: &str) -> Result<Vec<String>, String> {
    let mut items = Vec::new();
    let mut cur = String::new();
    let mut chars = list.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(e @ (',' | '\\')) => cur.push(e),
                Some(other) => {
                    return Err(format!(
                        "-o {list:?}: unknown escape \\{other} (only \\, and \\\\)"
                    ));
                }
                None => return Err(format!("-o {list:?}: ends with a lone backslash")),
            },
            ',' => items.push(std::mem::take(&mut cur)),
            c => cur.push(c),
        }
    }
    items.push(cur);
    Ok(items.into_iter().filter(|s| !s.is_empty()).collect())
}

/// Applies one `-o` list to `settings`, item by item (a later item overrides an earlier one).
pub fn apply(list: &str, settings: &mut Settings) -> Result<(), String> {
    for item in split(list)? {
        apply_one(&item, settings)?;
    }
    Ok(())
}

fn apply_one(item: &str, s: &mut Settings) -> Result<(), String> {
    if item.starts_with("x-") {
        return Ok(());
    }
    let (raw_name, value) = match item.split_once('=') {
        Some((n, v)) => (n, Some(v)),
        None => (item, None),
    };
    let name = if raw_name == "_netdev" {
        raw_name.to_owned()
    } else {
        raw_name.replace('-', "_")
    };
    let flag = |s: &mut Settings, set: fn(&mut Settings)| match value {
        None => {
            set(s);
            Ok(())
        }
        Some(_) => Err(format!("mount option {raw_name:?} takes no value")),
    };
    let needs = |what: &str| {
        value
            .filter(|v| !v.is_empty())
            .ok_or_else(|| format!("mount option {raw_name:?} needs a value ({raw_name}={what})"))
    };
    match name.as_str() {
        "allow_other" => flag(s, |s| s.allow_other = true),
        "allow_root" => flag(s, |s| s.allow_root = true),
        "auto_unmount" => flag(s, |s| s.auto_unmount = true),
        "strict" => flag(s, |s| s.strict = true),
        "no_pins" => flag(s, |s| s.no_pins = true),
        "noexec" => flag(s, |s| s.noexec = true),
        "exec" => flag(s, |s| s.noexec = false),
        "ro" | "default_permissions" | "dev" | "suid" | "nodev" | "nosuid" => flag(s, |_| {}),
        "defaults" | "auto" | "noauto" | "user" | "nouser" | "users" | "_netdev" | "nofail" => {
            flag(s, |_| {})
        }
        "rw" => {
            Err("mount option \"rw\": kpack-fuse mounts are read-only (use ro or nothing)".into())
        }
        "memory_cache_size" | "cache_size" | "disk_cache_size" | "cache_dir_size" => {
            let bytes =
                parse_size(needs("SIZE")?).map_err(|e| format!("mount option {raw_name}: {e}"))?;
            match name.as_str() {
                "memory_cache_size" => s.memory_cache_size = Some(Bound::new(bytes)),
                "cache_size" => s.memory_cache_size = Some(Bound::old(bytes)),
                "disk_cache_size" => s.disk_cache_size = Some(Bound::new(bytes)),
                _ => s.disk_cache_size = Some(Bound::old(bytes)),
            }
            Ok(())
        }
        "threads" => {
            let v = needs("N")?;
            match v.parse::<u32>() {
                Ok(n @ 1..=256) => {
                    s.threads = Some(n);
                    Ok(())
                }
                _ => Err(format!(
                    "mount option {raw_name}={v}: expected a number of threads from 1 to 256"
                )),
            }
        }
        "gpu" => {
            s.gpus.push(needs("ISA")?.to_owned());
            Ok(())
        }
        "log_file" => {
            s.log_file = Some(PathBuf::from(needs("PATH")?));
            Ok(())
        }
        "backing" => match needs("disk|memory")? {
            "disk" => {
                s.memory_backing = false;
                Ok(())
            }
            "memory" => {
                s.memory_backing = true;
                Ok(())
            }
            v => Err(format!(
                "mount option {raw_name}={v}: expected disk or memory"
            )),
        },
        "scratch_dir" => {
            s.scratch_dir = Some(PathBuf::from(needs("DIR")?));
            Ok(())
        }
        "cache_dir" => {
            s.cache_dir = Some(PathBuf::from(needs("DIR")?));
            Ok(())
        }
        "no_passthrough" => flag(s, |s| s.no_passthrough = true),
        "passthrough" => flag(s, |s| s.no_passthrough = false),
        "no_decode_ahead" => flag(s, |s| s.no_decode_ahead = true),
        "decode_ahead" => flag(s, |s| s.no_decode_ahead = false),
        "open_mode" => {
            let v = needs("auto|daemon|page-cache")?;
            s.open_mode = OpenModeSetting::parse(v).ok_or_else(|| {
                format!("mount option {raw_name}={v}: expected auto, daemon or page-cache")
            })?;
            Ok(())
        }
        other => s
            .remote
            .apply_option(other, value)
            .unwrap_or_else(|| Err(unknown(raw_name, other))),
    }
}

/// The current names `-o` takes (as matched above, with `_`), offered when an item is unknown;
/// `rw` and the deprecated spellings are left out, as nothing should be steered to them.
const NAMES: &[&str] = &[
    "allow_other",
    "allow_root",
    "auto_unmount",
    "strict",
    "no_pins",
    "noexec",
    "exec",
    "ro",
    "default_permissions",
    "dev",
    "suid",
    "nodev",
    "nosuid",
    "defaults",
    "auto",
    "noauto",
    "user",
    "nouser",
    "users",
    "_netdev",
    "nofail",
    "memory_cache_size",
    "disk_cache_size",
    "threads",
    "gpu",
    "log_file",
    "backing",
    "scratch_dir",
    "cache_dir",
    "no_passthrough",
    "passthrough",
    "no_decode_ahead",
    "decode_ahead",
    "open_mode",
    "endpoint_url",
    "remote_timeout",
    "remote_connect_timeout",
    "remote_retries",
    "remote_requests",
    "tls_verify",
];

/// An unknown item, with the known name it is most like when there is one.
fn unknown(raw_name: &str, name: &str) -> String {
    match crate::cli::suggest::similar(name, NAMES) {
        Some(near) => {
            format!("unknown mount option {raw_name:?}; a similar option exists: {near:?}")
        }
        None => format!("unknown mount option {raw_name:?}"),
    }
}

/// Parses `1048576`, `512K`, `256M`, `1G` (also `KiB`/`MiB`/`GiB`); units are powers of 1024.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a size (examples: 268435456, 512K, 256M, 1G)"))?;
    let shift = match unit.to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KB" | "KIB" => 10,
        "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        _ => return Err(format!("{s:?}: unknown unit {unit:?} (use K, M or G)")),
    };
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| format!("{s:?} is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(f: impl FnOnce(&mut Settings)) -> Settings {
        let mut s = Settings::default();
        f(&mut s);
        s
    }

    #[test]
    fn option_table() {
        let none = Settings::default();
        let ok: Vec<(&str, Settings)> = vec![
            ("", none.clone()),
            ("ro", none.clone()),
            (
                "ro,nodev,nosuid,allow_other,nofail",
                with(|s| s.allow_other = true),
            ),
            (
                "remote_timeout=2,remote-retries=0,endpoint_url=http://127.0.0.1:9000",
                with(|s| {
                    s.remote.remote_timeout = Some(2);
                    s.remote.remote_retries = Some(0);
                    s.remote.endpoint_url = Some("http://127.0.0.1:9000".into());
                }),
            ),
            ("allow_root", with(|s| s.allow_root = true)),
            ("auto_unmount", with(|s| s.auto_unmount = true)),
            (
                "auto-unmount,strict",
                with(|s| {
                    s.auto_unmount = true;
                    s.strict = true
                }),
            ),
            (
                "default_permissions,dev,suid,defaults,auto,noauto,user,nouser,users,_netdev",
                none.clone(),
            ),
            (
                "x-systemd.automount,x-systemd.idle-timeout=60,x-anything",
                none.clone(),
            ),
            ("noexec", with(|s| s.noexec = true)),
            ("noexec,exec", none.clone()),
            (
                "memory_cache_size=1G",
                with(|s| s.memory_cache_size = Some(Bound::new(1 << 30))),
            ),
            (
                "cache_size=1G",
                with(|s| s.memory_cache_size = Some(Bound::old(1 << 30))),
            ),
            (
                "cache-size=512K,memory-cache-size=2M",
                with(|s| s.memory_cache_size = Some(Bound::new(2 << 20))),
            ),
            (
                "memory_cache_size=512K,cache_size=2M",
                with(|s| s.memory_cache_size = Some(Bound::old(2 << 20))),
            ),
            ("threads=4", with(|s| s.threads = Some(4))),
            (
                "gpu=gfx942:xnack+,gpu=gfx90a",
                with(|s| s.gpus = vec!["gfx942:xnack+".into(), "gfx90a".into()]),
            ),
            (
                "log_file=/var/log/a\\,b\\\\c.log",
                with(|s| s.log_file = Some("/var/log/a,b\\c.log".into())),
            ),
            (",,ro,,", none.clone()),
            ("backing=memory", with(|s| s.memory_backing = true)),
            ("backing=memory,backing=disk", none.clone()),
            (
                "scratch-dir=/srv/s,cache_dir=/var/cache/k\\,p",
                with(|s| {
                    s.scratch_dir = Some("/srv/s".into());
                    s.cache_dir = Some("/var/cache/k,p".into())
                }),
            ),
            (
                "disk_cache_size=3G",
                with(|s| s.disk_cache_size = Some(Bound::new(3 << 30))),
            ),
            (
                "cache_dir_size=3G",
                with(|s| s.disk_cache_size = Some(Bound::old(3 << 30))),
            ),
            (
                "cache-dir-size=1G,disk-cache-size=2M,cache_size=1K",
                with(|s| {
                    s.disk_cache_size = Some(Bound::new(2 << 20));
                    s.memory_cache_size = Some(Bound::old(1 << 10));
                }),
            ),
            ("no_passthrough", with(|s| s.no_passthrough = true)),
            ("no-passthrough,passthrough", none.clone()),
            ("no_decode_ahead", with(|s| s.no_decode_ahead = true)),
            ("no-decode-ahead,decode_ahead", none.clone()),
            (
                "open_mode=page-cache",
                with(|s| s.open_mode = OpenModeSetting::parse("page-cache").unwrap()),
            ),
            (
                "open-mode=page_cache,open_mode=daemon",
                with(|s| s.open_mode = OpenModeSetting::parse("daemon").unwrap()),
            ),
            (
                "open_mode=passthrough",
                with(|s| s.open_mode = OpenModeSetting::parse("passthrough").unwrap()),
            ),
            ("open_mode=daemon,open_mode=auto", none.clone()),
        ];
        for (list, want) in ok {
            let mut got = Settings::default();
            apply(list, &mut got).unwrap_or_else(|e| panic!("{list:?}: {e}"));
            assert_eq!(got, want, "{list:?}");
        }
        let refused: &[(&str, &str)] = &[
            ("rw", "read-only"),
            ("ro,rw", "read-only"),
            ("bogus", "unknown mount option \"bogus\""),
            ("fsname=x", "unknown mount option \"fsname\""),
            ("ro=1", "takes no value"),
            ("cache_size", "needs a value"),
            ("cache_size=", "needs a value"),
            ("cache_size=12T", "unknown unit"),
            ("threads=0", "from 1 to 256"),
            ("threads=x", "from 1 to 256"),
            ("gpu=", "needs a value"),
            ("backing=tape", "expected disk or memory"),
            ("backing", "needs a value"),
            ("cache_dir=", "needs a value"),
            ("cache_dir_size=1X", "unknown unit"),
            ("memory_cache_size", "needs a value"),
            ("disk_cache_size=", "needs a value"),
            ("disk-cache-size=1Q", "unknown unit"),
            ("no_passthrough=1", "takes no value"),
            ("decode_ahead=yes", "takes no value"),
            ("open_mode", "needs a value"),
            ("open_mode=fast", "expected auto, daemon or page-cache"),
            ("a\\b", "unknown escape"),
            ("ro\\", "lone backslash"),
        ];
        for (list, why) in refused {
            let err = apply(list, &mut Settings::default()).expect_err(list);
            assert!(err.contains(why), "{list:?}: {err}");
        }
    }

    #[test]
    fn an_unknown_option_names_the_nearest_known_one() {
        let err = |list: &str| apply(list, &mut Settings::default()).unwrap_err();
        assert_eq!(
            err("ro,allow_othr"),
            "unknown mount option \"allow_othr\"; a similar option exists: \"allow_other\""
        );
        assert_eq!(
            err("disk-cache-sise=1G"),
            "unknown mount option \"disk-cache-sise\"; a similar option exists: \"disk_cache_size\""
        );
        assert_eq!(err("fsname=x"), "unknown mount option \"fsname\"");
    }

    #[test]
    fn every_suggested_name_is_taken() {
        for name in NAMES {
            match apply(name, &mut Settings::default()) {
                Ok(()) => {}
                Err(e) => assert!(
                    e.contains("needs a value"),
                    "{name}: suggested but refused: {e}"
                ),
            }
        }
    }

    #[test]
    fn splitting_honours_escapes() {
        assert_eq!(split("a,b\\,c,d\\\\").unwrap(), ["a", "b,c", "d\\"]);
        assert_eq!(split("").unwrap(), Vec::<String>::new());
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("256M"), Ok(256 << 20));
        assert_eq!(parse_size("512k"), Ok(512 << 10));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("2GiB"), Ok(2 << 30));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("0"), Ok(0));
        assert!(parse_size("").is_err());
        assert!(parse_size("12T").is_err());
        assert!(parse_size("M").is_err());
        assert!(parse_size("99999999999G").is_err());
    }
}
