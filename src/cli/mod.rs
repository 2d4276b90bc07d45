//! The command line: one subcommand per job, each in its own file exposing `Args` and `run`.
//! Only this module and its children know clap.

mod exit;

mod cat;
mod extract;
mod import;
mod invocation;
mod list;
mod load;
mod man;
mod mem_limit;
mod mount;
mod mount_daemon;
mod mount_log;
mod mount_options;
mod pack;
mod pack_manifest;
mod progress;
mod resolve;
mod split;
mod umount;
mod verify;
mod words;

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
    /// List the kernels of an archive.
    List(list::Args),
    /// Write one kernel to standard output.
    Cat(cat::Args),
    /// Write every kernel of an archive into a directory tree.
    Extract(extract::Args),
    /// Decode every kernel and check its size; exit non-zero naming each bad entry.
    Verify(verify::Args),
    /// Mount an archive, a directory of archives or a HIPK binary's archives as a read-only tree.
    Mount(mount::MountArgs),
    /// Unmount a kpack-fuse mount point.
    Unmount(mount::UnmountArgs),
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
    let args = match invocation::translate(std::env::args_os().collect(), &names) {
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
        Command::Unmount(a) => mount::run_unmount(a),
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
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_consistent() {
        super::Cli::command().debug_assert();
    }
}
