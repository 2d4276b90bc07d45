//! `kpack-fuse man DIR` (hidden): writes the manual pages, generated from this very command-line
//! definition with `clap_mangen`, so they can never disagree with `--help`. `scripts/install.sh`
//! runs it and installs the pages under `share/man/man1`. A subcommand rather than a build
//! step: the pages come from the binary that gets installed, and building needs no extra tool.
//!
//! The SYNOPSIS is ours (`synopsis`): clap_mangen's leaves out option values (`[--threads]`
//! for `[--threads N]`). Subcommand pages carry the version for their footer only: the
//! subcommands have no `-V`, so their synopsis must not offer it.

use std::path::{Path, PathBuf};

use clap::CommandFactory;

use crate::cli::exit::{CliError, CliResult, Exit};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Directory to write kpack-fuse.1 and kpack-fuse-COMMAND.1 into (created if missing).
    pub dir: PathBuf,
}

/// The pages, as (file name, roff text): one for the program, one per visible subcommand.
pub fn pages() -> Vec<(String, Vec<u8>)> {
    let top = super::commands::Cli::command();
    let version = env!("CARGO_PKG_VERSION");
    let mut out = vec![("kpack-fuse.1".to_owned(), render(top.clone()))];
    for sub in top.get_subcommands().filter(|s| !s.is_hide_set()) {
        let name = format!("kpack-fuse-{}", sub.get_name());
        let cmd = sub
            .clone()
            .display_name(name.clone())
            .bin_name(format!("kpack-fuse {}", sub.get_name()))
            .version(version)
            .disable_version_flag(true);
        out.push((format!("{name}.1"), render(cmd)));
    }
    out
}

/// clap_mangen's page with our SYNOPSIS section in place of its own.
fn render(mut cmd: clap::Command) -> Vec<u8> {
    cmd.build();
    let man = clap_mangen::Man::new(cmd.clone());
    let mut pieces = vec![
        section(|w| man.render_title(w)),
        section(|w| man.render_name_section(w)),
        synopsis(&cmd).into_bytes(),
        section(|w| man.render_description_section(w)),
    ];
    if cmd.get_arguments().any(|a| !a.is_hide_set()) {
        pieces.push(section(|w| man.render_options_section(w)));
    }
    if cmd.get_subcommands().any(|s| !s.is_hide_set()) {
        pieces.push(section(|w| man.render_subcommands_section(w)));
    }
    if cmd.get_after_long_help().is_some() || cmd.get_after_help().is_some() {
        pieces.push(section(|w| man.render_extra_section(w)));
    }
    if cmd.get_version().is_some() {
        pieces.push(section(|w| man.render_version_section(w)));
    }
    let mut buf = pieces.remove(0);
    for piece in pieces {
        // Each clap_mangen call starts with the same preamble; the page needs it once.
        for line in String::from_utf8_lossy(&piece).lines() {
            if !line.starts_with(".ie \\n(.g .ds Aq") && !line.starts_with(".el .ds Aq") {
                buf.extend_from_slice(line.as_bytes());
                buf.push(b'\n');
            }
        }
    }
    buf
}

/// One clap_mangen section, rendered into memory.
fn section(render: impl FnOnce(&mut Vec<u8>) -> std::io::Result<()>) -> Vec<u8> {
    let mut buf = Vec::new();
    render(&mut buf).expect("rendering into memory cannot fail");
    buf
}

/// Text for roff: a backslash and a hyphen-minus are escaped (`-` alone may be typeset as a
/// hyphen, which cannot be copied into a shell).
fn roff_escape(s: &str) -> String {
    s.replace('\\', "\\e").replace('-', "\\-")
}

/// `.SH SYNOPSIS` and one line: the command, each visible option with its value placeholder
/// (`[--threads N]`, `...` when repeatable, no brackets when required), the positionals,
/// and the subcommand slot.
fn synopsis(cmd: &clap::Command) -> String {
    use clap::ArgAction;
    let bold = |s: &str| format!("\\fB{}\\fR", roff_escape(s));
    let italic = |s: &str| format!("\\fI{}\\fR", roff_escape(s));
    let value_names = |a: &clap::Arg| -> String {
        match a.get_value_names() {
            Some(names) => names
                .iter()
                .map(|n| italic(n.as_str()))
                .collect::<Vec<_>>()
                .join(" "),
            None => italic(&a.get_id().as_str().to_uppercase()),
        }
    };
    let repeated = |a: &clap::Arg| {
        matches!(a.get_action(), ArgAction::Append | ArgAction::Count)
            || a.get_num_args().is_some_and(|r| r.max_values() > 1)
    };
    let mut words = vec![bold(cmd.get_bin_name().unwrap_or(cmd.get_name()))];
    for a in cmd
        .get_arguments()
        .filter(|a| !a.is_positional() && !a.is_hide_set())
    {
        let mut flag = match (a.get_short(), a.get_long()) {
            (Some(s), Some(l)) => format!("{}|{}", bold(&format!("-{s}")), bold(&format!("--{l}"))),
            (Some(s), None) => bold(&format!("-{s}")),
            (None, Some(l)) => bold(&format!("--{l}")),
            (None, None) => continue,
        };
        if a.get_action().takes_values() {
            flag = format!("{flag} {}", value_names(a));
        }
        let mut word = if a.is_required_set() {
            flag
        } else {
            format!("[{flag}]")
        };
        if repeated(a) {
            word.push_str("...");
        }
        words.push(word);
    }
    for a in cmd.get_positionals().filter(|a| !a.is_hide_set()) {
        let mut word = value_names(a);
        if repeated(a) {
            word.push_str("...");
        }
        words.push(if a.is_required_set() {
            word
        } else {
            format!("[{word}]")
        });
    }
    if cmd.get_subcommands().any(|s| !s.is_hide_set()) {
        words.push(italic("COMMAND"));
    }
    format!(".SH SYNOPSIS\n{}\n", words.join(" "))
}

pub fn run(args: Args) -> CliResult {
    write_pages(&args.dir)
}

fn write_pages(dir: &Path) -> CliResult {
    let fail = |what: &Path, e: std::io::Error| CliError::io(Exit::Output, what, &e);
    std::fs::create_dir_all(dir).map_err(|e| fail(dir, e))?;
    for (name, text) in pages() {
        let path = dir.join(&name);
        std::fs::write(&path, text).map_err(|e| fail(&path, e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn one_page_per_visible_command() {
        let names: Vec<String> = super::pages().into_iter().map(|(n, _)| n).collect();
        assert_eq!(names[0], "kpack-fuse.1");
        for must in [
            "kpack-fuse-mount.1",
            "kpack-fuse-unmount.1",
            "kpack-fuse-list.1",
        ] {
            assert!(names.iter().any(|n| n == must), "{names:?}");
        }
        assert!(!names.iter().any(|n| n == "kpack-fuse-man.1"), "{names:?}");
        let (_, mount) = super::pages()
            .into_iter()
            .find(|(n, _)| n == "kpack-fuse-mount.1")
            .unwrap();
        let text = String::from_utf8(mount).unwrap();
        assert!(text.contains("\n.TH kpack-fuse-mount 1 "), "{text}");
        assert!(text.contains("\n\\fBkpack\\-fuse mount\\fR "), "{text}");
        assert!(text.contains("\\-\\-disk\\-cache\\-size"), "{text}");
        // The deprecated spellings still work, and are only named in a closing note.
        assert!(!text.contains("\\fB\\-\\-cache\\-size\\fR"), "{text}");
        assert!(!text.contains("\\fB\\-\\-cache\\-dir\\-size\\fR"), "{text}");
        assert!(
            text.contains(
                "Deprecated spellings, accepted with a warning for one more release: \
                 \\-\\-cache\\-size (\\-o cache_size) is \\-\\-memory\\-cache\\-size, and does \
                 nothing with disk backing; \\-\\-cache\\-dir\\-size (\\-o cache_dir_size) is \
                 \\-\\-disk\\-cache\\-size, and does nothing with \\-\\-backing memory."
            ),
            "{text}"
        );
        assert_eq!(text.matches(".ds Aq").count(), 2, "one preamble:\n{text}");
    }

    /// The synopsis shows each option's value and repetition, and no -V (subcommands have none).
    #[test]
    fn synopsis_shows_values_and_no_version_flag() {
        let page = |name: &str| {
            let (_, text) = super::pages().into_iter().find(|(n, _)| n == name).unwrap();
            let text = String::from_utf8(text).unwrap();
            let at = text.find(".SH SYNOPSIS\n").unwrap() + ".SH SYNOPSIS\n".len();
            text[at..].lines().next().unwrap().to_owned()
        };
        assert_eq!(
            page("kpack-fuse-mount.1"),
            "\\fBkpack\\-fuse mount\\fR [\\fB\\-\\-backing\\fR \\fIKIND\\fR] \
             [\\fB\\-\\-memory\\-cache\\-size\\fR \\fISIZE\\fR] \
             [\\fB\\-\\-disk\\-cache\\-size\\fR \\fISIZE\\fR] \
             [\\fB\\-\\-scratch\\-dir\\fR \\fIDIR\\fR] [\\fB\\-\\-cache\\-dir\\fR \\fIDIR\\fR] \
             [\\fB\\-\\-no\\-passthrough\\fR] [\\fB\\-\\-no\\-decode\\-ahead\\fR] [\\fB\\-\\-open\\-mode\\fR \\fIMODE\\fR] \
             [\\fB\\-\\-threads\\fR \\fIN\\fR] [\\fB\\-s\\fR] [\\fB\\-\\-gpu\\fR \\fIISA\\fR]... \
             [\\fB\\-f\\fR|\\fB\\-\\-foreground\\fR] [\\fB\\-\\-allow\\-other\\fR] \
             [\\fB\\-\\-allow\\-root\\fR] [\\fB\\-\\-auto\\-unmount\\fR] [\\fB\\-\\-strict\\fR] \
             [\\fB\\-\\-no\\-pins\\fR] [\\fB\\-\\-log\\-file\\fR \\fIPATH\\fR] [\\fB\\-v\\fR|\\fB\\-\\-verbose\\fR]... \
             [\\fB\\-q\\fR|\\fB\\-\\-quiet\\fR] [\\fB\\-o\\fR \\fIOPTIONS\\fR]... \
             [\\fB\\-\\-endpoint\\-url\\fR \\fIURL\\fR] \
             [\\fB\\-\\-remote\\-timeout\\fR \\fISECS\\fR] \
             [\\fB\\-\\-remote\\-connect\\-timeout\\fR \\fISECS\\fR] \
             [\\fB\\-\\-remote\\-retries\\fR \\fIN\\fR] \
             [\\fB\\-\\-remote\\-requests\\fR \\fIN\\fR] \
             [\\fB\\-\\-tls\\-verify\\fR \\fIBOOL\\fR] \
             [\\fB\\-h\\fR|\\fB\\-\\-help\\fR] \\fISOURCE\\fR \\fIMOUNTPOINT\\fR"
        );
        for (name, text) in super::pages() {
            let text = String::from_utf8(text).unwrap();
            let version_flag = text.contains("\\fB\\-V\\fR");
            assert_eq!(version_flag, name == "kpack-fuse.1", "{name}");
        }
        assert!(
            page("kpack-fuse-verify.1").starts_with(
                "\\fBkpack\\-fuse verify\\fR [\\fB\\-\\-against\\fR \\fIHOST\\fR]... "
            )
        );
    }
}
