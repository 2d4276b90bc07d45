//! The command line's definition: the top-level parser and one subcommand per command, each
//! variant holding that command's clap `Args`. `man.rs` renders the same definition.

use clap::{Parser, Subcommand};

use super::loader::{load, resolve};
use super::mount::{self, unmount};
use super::read::{cat, extract, list};
use super::{man, pack, push, split, stats, verify};

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
    /// Push archives to a container registry as one kernel-pack artifact (oci://).
    Push(push::Args),
    /// Write the manual pages (generated from this command line) into a directory.
    #[command(hide = true)]
    Man(man::Args),
}
