//! The `kpack-fuse` command.

mod cli;
mod remote;

fn main() -> std::process::ExitCode {
    cli::main()
}
