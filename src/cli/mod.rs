//! The command line: one subcommand per job, each in its own file exposing `Args` and `run`.
//! Only this module and its children know clap.

mod exit;

mod cat;
mod daemon_lock;
mod extract;
mod host_input;
mod import;
mod invocation;
mod list;
mod load;
mod man;
mod mem_limit;
mod mount;
mod mount_bounds;
mod mount_daemon;
mod mount_log;
mod mount_options;
mod mount_plan;
mod mount_serve;
mod mount_settings;
mod pack;
mod pack_manifest;
mod plural;
mod progress;
mod remote_args;
mod resolve;
mod split;
mod stats;
mod suggest;
mod umount;
mod unmount;
mod verify;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

pub use exit::{CliError, CliResult, Exit};

/// kpack-fuse: pack, inspect, load and mount ROCm .kpack kernel archives.
///
/// Also started as a mount helper: `kpack-fuse SOURCE MOUNTPOINT -o OPTIONS` (how mount.fuse3
/// runs type fuse.kpack-fuse) and `mount.kpack-fuse SOURCE MOUNTPOINT [-sfnv] [-o OPTIONS]` (the
/// native helper for type kpack-fuse) both mean `kpack-fuse mount`.
#[derive(Debug, Parser)]
#[command(name = "kpack-fuse", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Pack a tree laid out as <binary key>/<arch>.hsaco into one archive.
    Pack(pack::Args),
    /// List the kernels of an archive, or the code objects of a fat or HIPK host binary.
    List(list::Args),
    /// Write one kernel to standard output.
    Cat(cat::Args),
    /// Write every kernel of an archive or host binary into a directory tree.
    Extract(extract::Args),
    /// Decode every kernel and check its size; exit non-zero naming each bad entry.
    Verify(verify::Args),
    /// Mount an archive, a directory of archives, a HIPK binary's archives or a fat binary's
    /// code objects as a read-only tree.
    Mount(mount::MountArgs),
    /// Unmount a kpack-fuse mount point.
    Unmount(unmount::UnmountArgs),
    /// Show a mount's counters (cache, decodes, read path) as a table or as JSON.
    Stats(stats::Args),
    /// Show which paths, archives and targets the loader tries for a HIPK host binary.
    Resolve(resolve::Args),
    /// Load one code object the way kpack_load_code_object does, and write it to a file.
    Load(load::Args),
    /// Turn fat ROCm host binaries into HIPK host binaries plus per-arch kernel archives.
    Split(split::Args),
    /// Write the manual pages (generated from this command line) into a directory.
    #[command(hide = true)]
    Man(man::Args),
}

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
                eprintln!("mount.kpack-fuse: {}", invocation::shell_words(&args));
            }
            args
        }
        Ok(invocation::Invocation::Fake) => return ExitCode::SUCCESS,
        Err(invocation::HelperUsage(message)) => {
            eprintln!("mount.kpack-fuse: {message}");
            return ExitCode::from(Exit::Usage as u8);
        }
    };
    let cli = Cli::parse_from(args);
    let result = match cli.command {
        Command::Pack(a) => pack::run(a),
        Command::List(a) => list::run(a),
        Command::Cat(a) => cat::run(a),
        Command::Extract(a) => extract::run(a),
        Command::Verify(a) => verify::run(a),
        Command::Mount(a) => mount::run_mount(a),
        Command::Unmount(a) => unmount::run_unmount(a),
        Command::Stats(a) => stats::run(a),
        Command::Resolve(a) => resolve::run(a),
        Command::Load(a) => load::run(a),
        Command::Split(a) => split::run(a),
        Command::Man(a) => man::run(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kpack-fuse: {e}");
            e.code()
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::{Args as _, CommandFactory};

    #[test]
    fn cli_definition_is_consistent() {
        super::Cli::command().debug_assert();
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
        let top = super::Cli::command();
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
