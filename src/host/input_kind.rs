//! What a path given as an input is: a directory (of archives, or an install tree), a kpack
//! archive, a fat host binary, a HIPK host binary, another ELF file, or none of these. The one
//! set of rules by which the mount and the commands that take host binaries (`list`, `extract`)
//! tell their inputs apart; each decides what it does with each kind.
//!
//! A directory is told by its metadata, a file by its first four bytes (the archive magic
//! `KPAK`, or the ELF magic); an ELF file's kind by its section headers alone
//! ([`HostFile::open_tables`], [`host_kind`]): a `.rocm_kpack_ref` marker makes a HIPK binary,
//! a `.hip_fatbin` with contents a fat one.

use std::fs::File;
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use crate::archive::format::MAGIC;
use crate::host::elf::ELF_MAGIC;
use crate::host::fatbin::{FatbinError, HostFile, HostKind, host_kind};

/// The kind of an input. The ELF kinds carry the file opened with its headers read.
pub enum InputKind {
    /// A directory: of `*.kpack` archives, or an install tree (fat binaries, or split ones
    /// with their `.kpack/`).
    Directory,
    /// A file that starts with the archive magic `KPAK`.
    Archive,
    /// An ELF file whose `.hip_fatbin` holds its device code.
    FatBinary(HostFile),
    /// An ELF file with a `.rocm_kpack_ref` marker: its device code lives in kpack archives.
    HipkBinary(HostFile),
    /// Any other ELF file: why it has no device code to read ([`HostKind::SeparatedDebug`] or
    /// [`HostKind::NoDeviceCode`]), or why its headers do not parse.
    OtherElf(Result<HostKind, FatbinError>),
    /// Anything else: another magic, fewer than four bytes, a FIFO.
    Other,
}

/// Tells what `path` is. Fails only when it cannot be read (missing, permissions, I/O). A FIFO
/// is opened without waiting for a writer, and reads as empty ([`InputKind::Other`]).
pub fn input_kind(path: &Path) -> io::Result<InputKind> {
    if std::fs::metadata(path)?.is_dir() {
        return Ok(InputKind::Directory);
    }
    let mut file = File::options()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    let mut magic = [0u8; 4];
    let got = crate::bytes::read_full(&mut file, &mut magic)?;
    let magic = &magic[..got];
    if magic == MAGIC {
        return Ok(InputKind::Archive);
    }
    if magic != ELF_MAGIC {
        return Ok(InputKind::Other);
    }
    let host = HostFile::open_tables(path)?;
    Ok(match host_kind(host.image()) {
        Ok(HostKind::Fat) => InputKind::FatBinary(host),
        Ok(HostKind::Hipk) => InputKind::HipkBinary(host),
        other => InputKind::OtherElf(other),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(path: &Path) -> &'static str {
        match input_kind(path) {
            Ok(InputKind::Directory) => "directory",
            Ok(InputKind::Archive) => "archive",
            Ok(InputKind::FatBinary(_)) => "fat",
            Ok(InputKind::HipkBinary(_)) => "hipk",
            Ok(InputKind::OtherElf(Ok(HostKind::SeparatedDebug))) => "separated debug",
            Ok(InputKind::OtherElf(Ok(HostKind::NoDeviceCode))) => "no device code",
            Ok(InputKind::OtherElf(Ok(_))) => "unreachable",
            Ok(InputKind::OtherElf(Err(_))) => "bad elf",
            Ok(InputKind::Other) => "other",
            Err(_) => "unreadable",
        }
    }

    #[test]
    fn kinds_from_metadata_and_content() {
        let d = tempfile::tempdir().unwrap();
        let f = |name: &str, bytes: &[u8]| {
            let p = d.path().join(name);
            std::fs::write(&p, bytes).unwrap();
            p
        };
        assert_eq!(kind(d.path()), "directory");
        assert_eq!(kind(&f("a.bin", b"KPAK\x01\0\0\0")), "archive");
        // The name does not count, only the bytes.
        assert_eq!(kind(&f("b.kpack", b"\x7fELF\x02\x01")), "bad elf");
        assert_eq!(kind(&f("c.kpack", b"KPA")), "other");
        assert_eq!(kind(&f("d", b"")), "other");
        assert_eq!(kind(&f("e", b"#!/bin/sh\n")), "other");
        assert_eq!(kind(&d.path().join("missing")), "unreadable");
        let exe = std::env::current_exe().unwrap();
        assert_eq!(kind(&exe), "no device code");
    }

    /// A FIFO is told at once, as nothing to read, instead of waiting for a writer.
    #[test]
    fn a_fifo_does_not_block() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("fifo");
        let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid C string and mode.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || tx.send(kind(&path)));
        let got = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("input_kind on a FIFO blocked");
        assert_eq!(got, "other");
    }
}
