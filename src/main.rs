//! The `kpack-fuse` command.

mod cli;
mod oci;
mod remote;

fn main() -> std::process::ExitCode {
    cli::main()
}
