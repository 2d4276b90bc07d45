//! A host binary opened for import or split without reading its device code into memory.
//!
//! The section headers are read first (small positioned reads) to find `.hip_fatbin`; then the
//! rest of the file is read into an image as long as the file, in which the device code's range
//! is left as it was allocated: zero pages that were never written, which the kernel does not
//! back with memory. Everything that parses ELF structures (the `object` crate for import, the
//! split's own reader for the rewrite) works on that image unchanged, since none of them reads
//! inside `.hip_fatbin`; the device code itself is read through [`HostFile::fatbin`] one bundle
//! or code object at a time. Memory held is the host part of the binary, whatever the size of
//! its device code.
//!
//! A file whose headers cannot be read this way (not little-endian ELF64, tables outside the
//! file) is read whole: the parsers then refuse it with their precise message.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

use crate::host::bundle::FileRange;
use crate::host::elf::HIP_FATBIN_SECTION;

/// Reads go through pieces of this size, so a short read is retried close to where it stopped.
const READ_CHUNK: usize = 8 << 20;

pub struct HostFile {
    file: File,
    /// The file's bytes, except that the device code range reads as zeros.
    image: Vec<u8>,
    /// `(offset, size)` of `.hip_fatbin` in the file, when there is one with contents.
    fatbin: Option<(u64, u64)>,
}

/// Opens `path`: the file, its length, and a zeroed image of that length for the parts read.
fn blank_image(path: &Path) -> io::Result<(File, u64, Vec<u8>)> {
    let file = File::open(path)?;
    let len = file.metadata()?.len();
    let len_usize = usize::try_from(len)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "file too large"))?;
    Ok((file, len, vec![0u8; len_usize]))
}

impl HostFile {
    pub fn open(path: &Path) -> io::Result<HostFile> {
        let (file, len, mut image) = blank_image(path)?;
        let fatbin = locate_fatbin(&file, &mut image)?;
        let (skip_lo, skip_hi) = fatbin.map_or((len, len), |(o, n)| (o, o + n));
        fill(&file, &mut image, 0, skip_lo)?;
        fill(&file, &mut image, skip_hi, len)?;
        Ok(HostFile {
            file,
            image,
            fatbin,
        })
    }

    /// Opens `path` reading only the tables that list its sections: the ELF header, the program
    /// and section header tables and the section-name table; everything else reads as zeros.
    /// Enough to parse the file, see which sections it has (not to read their contents) and
    /// index its device code through [`fatbin`](Self::fatbin), at the cost of a few small reads
    /// whatever the file's size. A file whose tables cannot be read this way is read whole, so
    /// that the parser reports what is wrong with it.
    pub fn open_tables(path: &Path) -> io::Result<HostFile> {
        let (file, len, mut image) = blank_image(path)?;
        let fatbin = if read_tables(&file, &mut image)? {
            find_fatbin(&image)
        } else {
            fill(&file, &mut image, 0, len)?;
            None
        };
        Ok(HostFile {
            file,
            image,
            fatbin,
        })
    }

    /// The whole file as bytes, with the device code range zeroed.
    pub fn image(&self) -> &[u8] {
        &self.image
    }

    pub fn file(&self) -> &File {
        &self.file
    }

    pub fn len(&self) -> u64 {
        self.image.len() as u64
    }

    pub fn is_empty(&self) -> bool {
        self.image.is_empty()
    }

    /// The `.hip_fatbin` section, to be read with positioned reads.
    pub fn fatbin(&self) -> Option<FileRange<'_>> {
        self.fatbin.map(|(offset, len)| FileRange {
            file: &self.file,
            offset,
            len,
        })
    }
}

/// Whether the file at `path` starts with the ELF magic (a directory does not).
pub fn is_elf_file(path: &Path) -> io::Result<bool> {
    let mut f = File::open(path)?;
    if f.metadata()?.is_dir() {
        return Ok(false);
    }
    let mut magic = [0u8; 4];
    let got = crate::bytes::read_full(&mut f, &mut magic)?;
    Ok(magic[..got] == crate::host::elf::ELF_MAGIC[..])
}

/// Reads `[from, to)` of the file into the same range of `image`.
fn fill(file: &File, image: &mut [u8], from: u64, to: u64) -> io::Result<()> {
    let mut at = from as usize;
    while at < to as usize {
        let end = (to as usize).min(at + READ_CHUNK);
        file.read_exact_at(&mut image[at..end], at as u64)
            .map_err(|e| match e.kind() {
                io::ErrorKind::UnexpectedEof => {
                    io::Error::new(e.kind(), "the file became shorter while being read")
                }
                _ => e,
            })?;
        at = end;
    }
    Ok(())
}

/// Finds `.hip_fatbin` from the ELF64 section headers, reading them (and the section name
/// table) into `image`. `None` when the file is not little-endian ELF64 with in-bounds tables
/// or has no such section with file contents.
fn locate_fatbin(file: &File, image: &mut [u8]) -> io::Result<Option<(u64, u64)>> {
    Ok(if read_tables(file, image)? {
        find_fatbin(image)
    } else {
        None
    })
}

/// [`locate_fatbin`] in an image whose tables [`read_tables`] read.
fn find_fatbin(image: &[u8]) -> Option<(u64, u64)> {
    // `read_tables` read, and checked the bounds of, everything looked at here.
    let le16 = |b: &[u8], at: usize| u64::from(crate::bytes::le_u16(b, at).expect("read"));
    let le32 = |b: &[u8], at: usize| crate::bytes::le_u32(b, at).expect("read");
    let le64 = |b: &[u8], at: usize| crate::bytes::le_u64(b, at).expect("read");
    let (shoff, shnum, shstrndx) = (le64(image, 40), le16(image, 60), le16(image, 62));
    let shdr = |image: &[u8], i: u64| -> (u32, u32, u64, u64) {
        let at = (shoff + i * 64) as usize;
        (
            le32(image, at),
            le32(image, at + 4),
            le64(image, at + 24),
            le64(image, at + 32),
        )
    };
    let (_, _, names_off, names_len) = shdr(image, shstrndx);
    let names = &image[names_off as usize..(names_off + names_len) as usize];
    let wanted = HIP_FATBIN_SECTION.as_bytes();
    let len = image.len() as u64;
    for i in 0..shnum {
        let (name, kind, offset, size) = shdr(image, i);
        let named = names
            .get(name as usize..)
            .is_some_and(|n| n.starts_with(wanted) && n.get(wanted.len()) == Some(&0));
        if named {
            let inside = offset.checked_add(size).is_some_and(|end| end <= len);
            return (kind != SHT_NOBITS && inside && size > 0).then_some((offset, size));
        }
    }
    None
}

const SHT_NOBITS: u32 = 8;

/// Reads the ELF64 header, program header table, section header table and section-name table
/// into `image`; false (with part of them read) when the file is not little-endian ELF64 with
/// those tables inside it.
fn read_tables(file: &File, image: &mut [u8]) -> io::Result<bool> {
    let len = image.len() as u64;
    let read = |image: &mut [u8], at: u64, n: u64| -> io::Result<bool> {
        match at.checked_add(n).filter(|end| *end <= len) {
            Some(end) => fill(file, image, at, end).map(|_| true),
            None => Ok(false),
        }
    };
    if !read(image, 0, 64)? || &image[..4] != b"\x7fELF" || image[4] != 2 || image[5] != 1 {
        return Ok(false);
    }
    // Only called on bytes `read` has just filled.
    let le16 = |b: &[u8], at: usize| u64::from(crate::bytes::le_u16(b, at).expect("read above"));
    let le32 = |b: &[u8], at: usize| crate::bytes::le_u32(b, at).expect("read above");
    let le64 = |b: &[u8], at: usize| crate::bytes::le_u64(b, at).expect("read above");
    let (phoff, phentsize, phnum) = (le64(image, 32), le16(image, 54), le16(image, 56));
    let (shoff, shentsize, shnum, shstrndx) = (
        le64(image, 40),
        le16(image, 58),
        le16(image, 60),
        le16(image, 62),
    );
    if phnum != 0 && !read(image, phoff, phentsize * phnum)? {
        return Ok(false);
    }
    if shentsize != 64 || shnum == 0 || shstrndx >= shnum || !read(image, shoff, shnum * 64)? {
        return Ok(false);
    }
    let at = (shoff + shstrndx * 64) as usize;
    let (names_type, names_off, names_len) = (
        le32(image, at + 4),
        le64(image, at + 24),
        le64(image, at + 32),
    );
    Ok(names_type != SHT_NOBITS && read(image, names_off, names_len)?)
}
