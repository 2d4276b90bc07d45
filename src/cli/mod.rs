//! The command line: `main` parses it and dispatches to the commands. The definition is in
//! `commands.rs`; each command is a file (or, for a family of commands, a folder) exposing its
//! clap `Args` and `run`: `mount/` (mount and unmount, and the daemon), `read/` (list, cat,
//! extract), `pack/`, `loader/` (resolve and load), `split.rs`, `verify.rs`, `stats.rs`, `push.rs`, `man.rs`;
//! `import/` is what `pack --from-fatbin` and `verify --against` share. Only this module and its
//! children know clap. Everything they print goes through `out.rs`, which turns a closed pipe
//! into a quiet exit instead of a panic.

// Print through `out.rs`: these macros panic when the reader of a stream has gone.
#![deny(clippy::print_stdout, clippy::print_stderr, clippy::explicit_write)]

mod commands;
mod exit;
mod out;

mod import;
mod invocation;
mod loader;
mod man;
mod mount;
mod pack;
mod plural;
mod progress;
mod push;
mod read;
mod remote_args;
mod split;
mod stats;
mod suggest;
mod verify;

use std::process::ExitCode;

use clap::Parser;

use commands::{Cli, Command};
use exit::Exit;
use out::errln;

/// Parses the command line, runs the command, and maps failures to exit codes.
pub fn main() -> ExitCode {
    use clap::CommandFactory;
    let top = Cli::command();
    let mut names: Vec<&str> = vec!["help"];
    for sub in top.get_subcommands() {
        names.push(sub.get_name());
        names.extend(sub.get_all_aliases());
    }
    // A mistyped command, not a mount source: a word that names no file and that clap corrects.
    let mistyped = |word: &str| {
        !std::path::Path::new(word).exists() && suggest::subcommand(Cli::command(), word).is_some()
    };
    let args = match invocation::translate(std::env::args_os().collect(), &names, &mistyped) {
        Ok(invocation::Invocation::Run { args, verbose }) => {
            if verbose {
                errln!("mount.kpack-fuse: {}", invocation::shell_words(&args));
            }
            args
        }
        Ok(invocation::Invocation::Fake) => return ExitCode::SUCCESS,
        Err(invocation::HelperUsage(message)) => {
            errln!("mount.kpack-fuse: {message}");
            return ExitCode::from(Exit::Usage as u8);
        }
    };
    let cli = Cli::parse_from(args);
    let result = match cli.command {
        Command::Pack(a) => pack::run(a),
        Command::List(a) => read::list::run(a),
        Command::Cat(a) => read::cat::run(a),
        Command::Extract(a) => read::extract::run(a),
        Command::Verify(a) => verify::run(a),
        Command::Mount(a) => mount::run_mount(a),
        Command::Unmount(a) => mount::unmount::run_unmount(a),
        Command::Stats(a) => stats::run(a),
        Command::Resolve(a) => loader::resolve::run(a),
        Command::Load(a) => loader::load::run(a),
        Command::Split(a) => split::run(a),
        Command::Push(a) => push::run(a),
        Command::Man(a) => man::run(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // The reader has what it wanted: no message, the status says it (docs/cli.md).
        Err(e) if e.exit == Exit::BrokenPipe => e.code(),
        Err(e) => {
            errln!("kpack-fuse: {e}");
            e.code()
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::{Args as _, CommandFactory};

    #[test]
    fn cli_definition_is_consistent() {
        super::commands::Cli::command().debug_assert();
    }

    /// The synopsis lines of `kpack-fuse NAME` in a document's code blocks: each line that
    /// starts the command, and the indented lines that continue it.
    fn synopsis(doc: &str, name: &str) -> String {
        let start = format!("kpack-fuse {name} ");
        let mut out = String::new();
        let mut inside = false;
        for line in doc.lines() {
            if line.starts_with(&start) {
                inside = true;
            } else if !(inside && line.starts_with(' ')) {
                inside = false;
            }
            if inside {
                out.push_str(line);
                out.push('\n');
            }
        }
        out
    }

    /// Each visible option as its long spelling, with its short one where it has one.
    fn options(cmd: &clap::Command) -> Vec<(String, Option<String>)> {
        cmd.get_arguments()
            .filter(|a| !a.is_hide_set())
            .filter_map(|a| Some((a.get_long()?, a.get_short())))
            .filter(|(l, _)| !matches!(*l, "help" | "version"))
            .map(|(l, s)| (format!("--{l}"), s.map(|s| format!("-{s}"))))
            .collect()
    }

    /// Every visible option of every command is in its synopsis in docs/cli.md (by either
    /// spelling), and every
    /// option of `mount` also in docs/mount.md's. The network flags of remote sources may
    /// stand there as `[REMOTE FLAGS]`, which docs/cli.md spells out once.
    #[test]
    fn documented_synopses_name_every_option() {
        let cli_md = include_str!("../../docs/cli.md");
        let mount_md = include_str!("../../docs/mount.md");
        let remote: Vec<String> = options(&super::remote_args::RemoteArgs::augment_args(
            clap::Command::new("remote"),
        ))
        .into_iter()
        .map(|(long, _)| long)
        .collect();
        for flag in &remote {
            assert!(cli_md.contains(flag), "docs/cli.md never names {flag}");
        }
        let top = super::commands::Cli::command();
        let mut missing = Vec::new();
        for sub in top.get_subcommands().filter(|s| !s.is_hide_set()) {
            let name = sub.get_name();
            let mut docs = vec![("docs/cli.md", synopsis(cli_md, name))];
            if name == "mount" || name == "unmount" {
                docs.push(("docs/mount.md", synopsis(mount_md, name)));
            }
            for (doc, text) in docs {
                if text.is_empty() {
                    missing.push(format!("{doc}: no synopsis of `kpack-fuse {name}`"));
                    continue;
                }
                for (flag, short) in options(sub) {
                    let named = |f: &str| {
                        [" ", "]", "\n", "=", "."]
                            .iter()
                            .any(|end| text.contains(&format!("{f}{end}")))
                    };
                    let covered = named(&flag)
                        || short.as_deref().is_some_and(named)
                        || (remote.contains(&flag) && text.contains("[REMOTE FLAGS]"));
                    if !covered {
                        missing.push(format!("{doc}: `kpack-fuse {name}` lacks {flag}"));
                    }
                }
            }
        }
        assert!(missing.is_empty(), "{}", missing.join("\n"));
    }
}
