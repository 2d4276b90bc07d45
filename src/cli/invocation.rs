//! The three ways the binary is started, turned into one ordinary command line before clap sees
//! it. Pure functions over the argument vector, so every form is unit-tested without mounting.
//!
//! * `kpack-fuse SUBCOMMAND ...`: the normal form, passed through unchanged.
//! * `kpack-fuse SRC DIR [-o OPTS]`: how `mount.fuse3` runs a filesystem of type
//!   `fuse.kpack-fuse` (it executes `'kpack-fuse' 'SRC' 'DIR' -o 'OPTS'` through `/bin/sh`). It
//!   is taken where it can be meant: the first argument is not a subcommand, exactly two
//!   operands come before any option, and the first is not a mistyped command (a word, not an
//!   existing path, that clap would correct to a command name). Then `mount` is inserted:
//!   `kpack-fuse mount SRC DIR -o OPTS`. Anything else goes to clap as it is, which says
//!   "unrecognized subcommand" with its suggestion.
//! * `mount.kpack-fuse SRC DIR [-sfnv] [-o OPTS] [-t TYPE]`: the native helper that mount(8)
//!   runs for type `kpack-fuse` (the binary installed under that name as a link). `-s` (sloppy)
//!   and `-n` (no mtab) are ignored: the `-o` rules are strict anyway, and there is no mtab to
//!   write. `-f` (fake) means do everything but the mount: exit 0 at once. `-v` (verbose) prints
//!   the equivalent `kpack-fuse mount` command line to stderr and passes `-v` (more logging) on. `-t` (which libmount adds for types
//!   with a subtype) must name our type. Several `-o` are joined with commas.
//!
//! The helper forms must not pass their flags on as they are: in `kpack-fuse mount`, `-f` means
//! foreground and `-s` single-threaded.

use std::ffi::{OsStr, OsString};
use std::path::Path;

/// The names under which the binary acts as mount(8)'s native helper.
pub const HELPER_NAMES: [&str; 2] = ["mount.kpack-fuse", "mount.fuse.kpack-fuse"];

/// File system types a helper accepts after `-t`.
const OUR_TYPES: [&str; 2] = ["kpack-fuse", "fuse.kpack-fuse"];

/// What to do with a command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Invocation {
    /// Parse these arguments (argv[0] first) with the normal command line.
    Run {
        args: Vec<OsString>,
        /// Print the command line to stderr first (`mount.kpack-fuse -v`).
        verbose: bool,
    },
    /// `mount.kpack-fuse -f`: do nothing, succeed.
    Fake,
}

/// A helper command line that cannot be understood; exit with usage status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HelperUsage(pub String);

/// Turns the process arguments into the command line to parse. `subcommands` are the names (and
/// aliases) that the first argument of the normal form may take; `mistyped` says whether a word
/// is a mistyped command rather than a mount source (it looks at the file system and at clap).
pub fn translate(
    argv: Vec<OsString>,
    subcommands: &[&str],
    mistyped: &dyn Fn(&str) -> bool,
) -> Result<Invocation, HelperUsage> {
    let name = argv
        .first()
        .map(|a| Path::new(a).file_name().unwrap_or(a.as_os_str()).to_owned())
        .unwrap_or_default();
    if HELPER_NAMES.iter().any(|h| name == OsStr::new(h)) {
        return native_helper(&argv[1..]);
    }
    match argv.get(1).map(|a| a.to_str()) {
        // Nothing, an option (`--help`, `--version`, `-h`) or a subcommand: the normal form.
        None => Ok(run(argv)),
        Some(Some(first)) if first.starts_with('-') || subcommands.contains(&first) => {
            Ok(run(argv))
        }
        // A source and a mount point (a non-UTF-8 source cannot be a subcommand either).
        Some(first) if is_helper_form(&argv, first, mistyped) => Ok(run(insert_mount(argv))),
        // A lone word, a third operand or a word like a command is a mistyped command: let
        // clap say so.
        Some(_) => Ok(run(argv)),
    }
}

/// `SRC DIR` then only options, as mount.fuse3 passes them, with a SRC that is not a mistyped
/// command: a plain word (letters, digits, `-`, `_`) that is no existing path.
fn is_helper_form(argv: &[OsString], first: Option<&str>, mistyped: &dyn Fn(&str) -> bool) -> bool {
    let operand = |i: usize| {
        argv.get(i)
            .is_some_and(|a| !a.to_string_lossy().starts_with('-'))
    };
    let word_like = |w: &str| {
        w.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    };
    operand(2) && !operand(3) && !first.is_some_and(|w| word_like(w) && mistyped(w))
}

fn run(args: Vec<OsString>) -> Invocation {
    Invocation::Run {
        args,
        verbose: false,
    }
}

/// The `SRC DIR -o OPTS` form comes from mount(8) through mount.fuse3, which passes on the `rw`
/// that mount(8) adds whenever `ro` is not given; it is dropped here (the mount is read-only in
/// any case), while `kpack-fuse mount -o rw` typed by a person is still refused.
fn insert_mount(mut argv: Vec<OsString>) -> Vec<OsString> {
    argv.insert(1, OsString::from("mount"));
    let mut i = 3;
    while i + 1 < argv.len() {
        if argv[i] == "-o" {
            if let Some(v) = argv[i + 1].to_str() {
                argv[i + 1] = OsString::from(without_rw(v));
            }
        }
        i += 1;
    }
    argv
}

/// Removes `rw` items from a comma-separated option list (a backslash escapes a comma).
fn without_rw(list: &str) -> String {
    let mut items: Vec<String> = Vec::new();
    let mut current = String::new();
    let mut chars = list.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                current.push(c);
                if let Some(next) = chars.next() {
                    current.push(next);
                }
            }
            ',' => items.push(std::mem::take(&mut current)),
            _ => current.push(c),
        }
    }
    items.push(current);
    items.retain(|item| item != "rw");
    items.join(",")
}

/// `SRC DIR [-sfnv] [-o OPTS] [-t TYPE]`, flags in any order and combination (`-sv`, `-oro`).
fn native_helper(rest: &[OsString]) -> Result<Invocation, HelperUsage> {
    let usage = |why: String| {
        HelperUsage(format!(
            "{why}\nusage: mount.kpack-fuse SOURCE MOUNTPOINT [-sfnv] [-o OPTIONS]"
        ))
    };
    let mut positional: Vec<OsString> = Vec::new();
    let mut options: Vec<String> = Vec::new();
    let (mut fake, mut verbose) = (false, false);
    let mut i = 0;
    while i < rest.len() {
        let arg = &rest[i];
        i += 1;
        let Some(text) = arg.to_str().filter(|t| t.starts_with('-') && t.len() > 1) else {
            positional.push(arg.clone());
            continue;
        };
        for (at, flag) in text[1..].char_indices() {
            match flag {
                's' | 'n' => {}
                'f' => fake = true,
                'v' => verbose = true,
                'o' | 't' => {
                    // The value is the rest of this argument, or the next argument.
                    let attached = &text[1 + at + 1..];
                    let value = if !attached.is_empty() {
                        attached.to_owned()
                    } else {
                        let next = rest
                            .get(i)
                            .ok_or_else(|| usage(format!("-{flag} needs a value")))?;
                        i += 1;
                        next.to_str()
                            .ok_or_else(|| usage(format!("-{flag}: the value is not UTF-8")))?
                            .to_owned()
                    };
                    if flag == 'o' {
                        // mount(8) adds `rw` unless `ro` was given; see `insert_mount`.
                        let value = without_rw(&value);
                        if !value.is_empty() {
                            options.push(value);
                        }
                    } else if !OUR_TYPES.contains(&value.as_str()) {
                        return Err(usage(format!(
                            "-t {value}: this helper mounts only type kpack-fuse"
                        )));
                    }
                    break;
                }
                other => return Err(usage(format!("unknown option -{other}"))),
            }
        }
    }
    if positional.len() != 2 {
        return Err(usage(format!(
            "expected SOURCE and MOUNTPOINT, got {}",
            super::plural::count_of(positional.len(), "argument", "arguments")
        )));
    }
    if fake {
        return Ok(Invocation::Fake);
    }
    let mut args = vec![OsString::from("kpack-fuse"), OsString::from("mount")];
    args.extend(positional);
    if !options.is_empty() {
        args.push(OsString::from("-o"));
        args.push(OsString::from(options.join(",")));
    }
    if verbose {
        args.push(OsString::from("-v"));
    }
    Ok(Invocation::Run { args, verbose })
}

/// The command line as a shell would need it quoted, for `-v`.
pub fn shell_words(args: &[OsString]) -> String {
    args.iter()
        .map(|a| {
            let s = a.to_string_lossy();
            let plain = !s.is_empty()
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_./=,:+@%".contains(c));
            if plain {
                s.into_owned()
            } else {
                format!("'{}'", s.replace('\'', "'\\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    const SUBS: &[&str] = &["mount", "unmount", "list", "help"];

    fn os(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    /// Words taken for mistyped commands in these tests (main asks clap and the file system).
    fn mistyped(w: &str) -> bool {
        ["lst", "mnt", "unmout"].contains(&w)
    }

    fn tr(v: &[&str]) -> Result<Invocation, HelperUsage> {
        translate(os(v), SUBS, &mistyped)
    }

    fn runs(v: &[&str], verbose: bool) -> Invocation {
        Invocation::Run {
            args: os(v),
            verbose,
        }
    }

    #[test]
    fn normal_form_passes_through() {
        for v in [
            &["kpack-fuse"][..],
            &["kpack-fuse", "--version"],
            &["kpack-fuse", "-h"],
            &["kpack-fuse", "list", "a.kpack"],
            &["/usr/bin/kpack-fuse", "mount", "a.kpack", "/mnt", "-f"],
            &["kpack-fuse", "help", "mount"],
            // Mistyped commands stay as they are, for clap's "unrecognized subcommand".
            &["kpack-fuse", "lsit"],
            &["kpack-fuse", "lsit", "--help"],
            &["kpack-fuse", "lst", "samples/rocrand-sample.kpack"],
            &["kpack-fuse", "unmout", "/mnt", "-o", "ro"],
            // A third operand: no mount.fuse3 line, whatever the first word is.
            &["kpack-fuse", "mnt", "a.kpack", "/mnt"],
            &["kpack-fuse", "a.kpack", "/mnt", "extra"],
            &["kpack-fuse", "a.kpack", "/mnt", "extra", "-o", "ro"],
        ] {
            assert_eq!(tr(v), Ok(runs(v, false)), "{v:?}");
        }
    }

    #[test]
    fn mount_fuse_form_becomes_mount() {
        assert_eq!(
            tr(&["kpack-fuse", "/opt/k.kpack", "/mnt/k", "-o", "ro,dev,suid"]),
            Ok(runs(
                &[
                    "kpack-fuse",
                    "mount",
                    "/opt/k.kpack",
                    "/mnt/k",
                    "-o",
                    "ro,dev,suid"
                ],
                false
            ))
        );
        // A plain word that is not a mistyped command (main: an existing path, or a word clap
        // corrects to no command) is a source.
        assert_eq!(
            tr(&["kpack-fuse", "kernels", "/mnt/k", "-o", "ro"]),
            Ok(runs(
                &["kpack-fuse", "mount", "kernels", "/mnt/k", "-o", "ro"],
                false
            ))
        );
        // Without options (mount.fuse3 leaves -o out when none remain).
        assert_eq!(
            tr(&["/usr/local/bin/kpack-fuse", "k.kpack", "mnt"]),
            Ok(runs(
                &["/usr/local/bin/kpack-fuse", "mount", "k.kpack", "mnt"],
                false
            ))
        );
    }

    #[test]
    fn non_utf8_source_is_a_mount_source() {
        use std::os::unix::ffi::OsStringExt;
        let src = OsString::from_vec(vec![b'/', 0xff, b'k']);
        let argv = vec![
            OsString::from("kpack-fuse"),
            src.clone(),
            OsString::from("/mnt"),
        ];
        assert_eq!(
            translate(argv, SUBS, &mistyped),
            Ok(Invocation::Run {
                args: vec!["kpack-fuse".into(), "mount".into(), src, "/mnt".into()],
                verbose: false
            })
        );
    }

    #[test]
    fn native_helper_table() {
        let base = ["kpack-fuse", "mount", "/k.kpack", "/mnt"];
        let with_o = |o: &str| {
            let mut v: Vec<&str> = base.to_vec();
            v.extend(["-o", o]);
            runs(&v, false)
        };
        let cases: Vec<(Vec<&str>, Result<Invocation, ()>)> = vec![
            (vec!["/k.kpack", "/mnt"], Ok(runs(&base, false))),
            (
                vec!["/k.kpack", "/mnt", "-o", "ro,nodev"],
                Ok(with_o("ro,nodev")),
            ),
            (vec!["/k.kpack", "/mnt", "-oro"], Ok(with_o("ro"))),
            (
                vec!["/k.kpack", "/mnt", "-o", "ro", "-o", "nosuid"],
                Ok(with_o("ro,nosuid")),
            ),
            (vec!["/k.kpack", "/mnt", "-o", ""], Ok(runs(&base, false))),
            (
                vec!["/k.kpack", "/mnt", "-s", "-n", "-o", "ro"],
                Ok(with_o("ro")),
            ),
            (vec!["/k.kpack", "/mnt", "-sn"], Ok(runs(&base, false))),
            (vec!["-n", "/k.kpack", "/mnt"], Ok(runs(&base, false))),
            (
                vec!["/k.kpack", "/mnt", "-v"],
                Ok(Invocation::Run {
                    args: os(&["kpack-fuse", "mount", "/k.kpack", "/mnt", "-v"]),
                    verbose: true,
                }),
            ),
            (
                vec!["/k.kpack", "/mnt", "-snvo", "ro"],
                Ok(Invocation::Run {
                    args: os(&["kpack-fuse", "mount", "/k.kpack", "/mnt", "-o", "ro", "-v"]),
                    verbose: true,
                }),
            ),
            (
                vec!["/k.kpack", "/mnt", "-t", "kpack-fuse"],
                Ok(runs(&base, false)),
            ),
            (
                vec!["/k.kpack", "/mnt", "-t", "fuse.kpack-fuse"],
                Ok(runs(&base, false)),
            ),
            (vec!["/k.kpack", "/mnt", "-f"], Ok(Invocation::Fake)),
            (
                vec!["/k.kpack", "/mnt", "-fv", "-o", "ro"],
                Ok(Invocation::Fake),
            ),
            (vec!["/k.kpack", "/mnt", "-t", "ext4"], Err(())),
            (vec!["/k.kpack", "/mnt", "-x"], Err(())),
            (vec!["/k.kpack", "/mnt", "-o"], Err(())),
            (vec!["/k.kpack"], Err(())),
            (vec!["/k.kpack", "/mnt", "extra"], Err(())),
            // Fake still checks the command line.
            (vec!["/k.kpack", "-f"], Err(())),
        ];
        for (args, want) in cases {
            for name in [
                "mount.kpack-fuse",
                "/sbin/mount.kpack-fuse",
                "mount.fuse.kpack-fuse",
            ] {
                let mut argv = vec![name];
                argv.extend(&args);
                let got = tr(&argv).map_err(|_| ());
                assert_eq!(got, want, "{argv:?}");
            }
        }
    }

    #[test]
    fn helper_usage_messages_name_the_problem() {
        let err = |v: &[&str]| tr(v).unwrap_err().0;
        assert!(err(&["mount.kpack-fuse", "a", "b", "-x"]).starts_with("unknown option -x\n"));
        assert!(
            err(&["mount.kpack-fuse", "a"])
                .starts_with("expected SOURCE and MOUNTPOINT, got 1 argument\n")
        );
        assert!(
            err(&["mount.kpack-fuse", "a", "b", "-t", "nfs"])
                .starts_with("-t nfs: this helper mounts only type kpack-fuse\n")
        );
        assert!(err(&["mount.kpack-fuse", "a", "b", "-o"]).starts_with("-o needs a value\n"));
    }

    #[test]
    fn rw_added_by_mount_is_dropped_in_helper_forms_only() {
        assert_eq!(without_rw("rw"), "");
        assert_eq!(without_rw("rw,nodev,ro\\,rw,x-rw"), "nodev,ro\\,rw,x-rw");
        assert_eq!(
            tr(&["kpack-fuse", "/k.kpack", "/mnt", "-o", "rw,nosuid"]),
            Ok(runs(
                &["kpack-fuse", "mount", "/k.kpack", "/mnt", "-o", "nosuid"],
                false
            ))
        );
        assert_eq!(
            tr(&["mount.kpack-fuse", "/k.kpack", "/mnt", "-o", "rw"]),
            Ok(runs(&["kpack-fuse", "mount", "/k.kpack", "/mnt"], false))
        );
        // Typed by a person, `rw` reaches the mount command, which refuses it.
        assert_eq!(
            tr(&["kpack-fuse", "mount", "/k.kpack", "/mnt", "-o", "rw"]),
            Ok(runs(
                &["kpack-fuse", "mount", "/k.kpack", "/mnt", "-o", "rw"],
                false
            ))
        );
    }

    #[test]
    fn shell_words_quotes_what_needs_it() {
        assert_eq!(
            shell_words(&os(&[
                "kpack-fuse",
                "mount",
                "/a b/k.kpack",
                "/mnt",
                "-o",
                "ro",
                "it's",
                ""
            ])),
            "kpack-fuse mount '/a b/k.kpack' /mnt -o ro 'it'\\''s' ''"
        );
    }
}
