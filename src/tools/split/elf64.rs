//! The few ELF64 little-endian records the split rewrites: file header, program headers,
//! section headers, RELA relocations and symbols. Reading is bounds-checked against the input
//! and never panics; writing produces the exact on-disk encoding.

use super::error::SplitError;
use crate::bytes;

pub const EHDR_SIZE: usize = 64;
pub const PHDR_SIZE: usize = 56;
pub const SHDR_SIZE: usize = 64;
pub const RELA_SIZE: usize = 24;
pub const SYM_SIZE: usize = 24;

pub const ET_EXEC: u16 = 2;
pub const ET_DYN: u16 = 3;
pub const EM_X86_64: u16 = 62;

pub const PT_LOAD: u32 = 1;
pub const PT_PHDR: u32 = 6;
pub const PF_R: u32 = 4;

pub const SHT_PROGBITS: u32 = 1;
pub const SHT_RELA: u32 = 4;
pub const SHT_NOBITS: u32 = 8;
pub const SHT_RELR: u32 = 19;
pub const SHF_ALLOC: u64 = 2;

pub const R_X86_64_64: u32 = 1;
pub const R_X86_64_RELATIVE: u32 = 8;

/// Section indices at or above this are special (SHN_LORESERVE); a file needing them for its
/// section count uses extended numbering, which we do not rewrite.
pub const SHN_LORESERVE: u16 = 0xff00;

fn truncated(n: usize, at: usize) -> SplitError {
    SplitError::Malformed(format!(
        "truncated: {n} bytes at offset {at} are past the end"
    ))
}

pub fn u16_at(b: &[u8], at: usize) -> Result<u16, SplitError> {
    bytes::le_u16(b, at).ok_or_else(|| truncated(2, at))
}

pub fn u32_at(b: &[u8], at: usize) -> Result<u32, SplitError> {
    bytes::le_u32(b, at).ok_or_else(|| truncated(4, at))
}

pub fn u64_at(b: &[u8], at: usize) -> Result<u64, SplitError> {
    bytes::le_u64(b, at).ok_or_else(|| truncated(8, at))
}

pub fn put_u16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_le_bytes());
}

pub fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

pub fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// A byte range of the input, checked to lie inside it.
pub fn range(
    b: &[u8],
    offset: u64,
    size: u64,
    what: &str,
) -> Result<std::ops::Range<usize>, SplitError> {
    let end = offset
        .checked_add(size)
        .filter(|e| *e <= b.len() as u64)
        .ok_or_else(|| {
            SplitError::Malformed(format!(
                "{what}: bytes {offset}+{size} run past the {}-byte file",
                b.len()
            ))
        })?;
    Ok(offset as usize..end as usize)
}

/// The fields of the file header the split reads or changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ehdr {
    pub e_type: u16,
    pub e_machine: u16,
    pub e_phoff: u64,
    pub e_shoff: u64,
    pub e_phentsize: u16,
    pub e_phnum: u16,
    pub e_shentsize: u16,
    pub e_shnum: u16,
    pub e_shstrndx: u16,
}

impl Ehdr {
    pub fn parse(b: &[u8]) -> Result<Ehdr, SplitError> {
        if !b.starts_with(b"\x7fELF") {
            return Err(SplitError::NotElf64("not an ELF file".into()));
        }
        if b.len() < EHDR_SIZE {
            return Err(SplitError::NotElf64("truncated ELF header".into()));
        }
        if b[4] != 2 || b[5] != 1 {
            return Err(SplitError::NotElf64(format!(
                "only 64-bit little-endian ELF is rewritten (class {}, data {})",
                b[4], b[5]
            )));
        }
        Ok(Ehdr {
            e_type: u16_at(b, 16)?,
            e_machine: u16_at(b, 18)?,
            e_phoff: u64_at(b, 32)?,
            e_shoff: u64_at(b, 40)?,
            e_phentsize: u16_at(b, 54)?,
            e_phnum: u16_at(b, 56)?,
            e_shentsize: u16_at(b, 58)?,
            e_shnum: u16_at(b, 60)?,
            e_shstrndx: u16_at(b, 62)?,
        })
    }

    /// Writes the changeable fields back into a header at the start of `b`.
    pub fn store(&self, b: &mut [u8]) {
        put_u64(b, 32, self.e_phoff);
        put_u64(b, 40, self.e_shoff);
        put_u16(b, 56, self.e_phnum);
        put_u16(b, 60, self.e_shnum);
        put_u16(b, 62, self.e_shstrndx);
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Phdr {
    pub p_type: u32,
    pub p_flags: u32,
    pub p_offset: u64,
    pub p_vaddr: u64,
    pub p_paddr: u64,
    pub p_filesz: u64,
    pub p_memsz: u64,
    pub p_align: u64,
}

impl Phdr {
    pub fn parse(b: &[u8], at: usize) -> Result<Phdr, SplitError> {
        Ok(Phdr {
            p_type: u32_at(b, at)?,
            p_flags: u32_at(b, at + 4)?,
            p_offset: u64_at(b, at + 8)?,
            p_vaddr: u64_at(b, at + 16)?,
            p_paddr: u64_at(b, at + 24)?,
            p_filesz: u64_at(b, at + 32)?,
            p_memsz: u64_at(b, at + 40)?,
            p_align: u64_at(b, at + 48)?,
        })
    }

    pub fn encode(&self) -> [u8; PHDR_SIZE] {
        let mut o = [0u8; PHDR_SIZE];
        put_u32(&mut o, 0, self.p_type);
        put_u32(&mut o, 4, self.p_flags);
        put_u64(&mut o, 8, self.p_offset);
        put_u64(&mut o, 16, self.p_vaddr);
        put_u64(&mut o, 24, self.p_paddr);
        put_u64(&mut o, 32, self.p_filesz);
        put_u64(&mut o, 40, self.p_memsz);
        put_u64(&mut o, 48, self.p_align);
        o
    }

    /// Whether the segment's file image contains the file bytes `[offset, offset+len)`.
    pub fn holds_file_range(&self, offset: u64, len: u64) -> bool {
        self.p_offset <= offset
            && offset.saturating_add(len) <= self.p_offset.saturating_add(self.p_filesz)
    }

    /// The file offset of a virtual address inside this segment's file image.
    pub fn file_offset_of(&self, vaddr: u64, len: u64) -> Option<u64> {
        let rel = vaddr.checked_sub(self.p_vaddr)?;
        (rel.checked_add(len)? <= self.p_filesz).then(|| self.p_offset + rel)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shdr {
    pub sh_name: u32,
    pub sh_type: u32,
    pub sh_flags: u64,
    pub sh_addr: u64,
    pub sh_offset: u64,
    pub sh_size: u64,
    pub sh_link: u32,
    pub sh_info: u32,
    pub sh_addralign: u64,
    pub sh_entsize: u64,
}

impl Shdr {
    pub fn parse(b: &[u8], at: usize) -> Result<Shdr, SplitError> {
        Ok(Shdr {
            sh_name: u32_at(b, at)?,
            sh_type: u32_at(b, at + 4)?,
            sh_flags: u64_at(b, at + 8)?,
            sh_addr: u64_at(b, at + 16)?,
            sh_offset: u64_at(b, at + 24)?,
            sh_size: u64_at(b, at + 32)?,
            sh_link: u32_at(b, at + 40)?,
            sh_info: u32_at(b, at + 44)?,
            sh_addralign: u64_at(b, at + 48)?,
            sh_entsize: u64_at(b, at + 56)?,
        })
    }

    pub fn encode(&self) -> [u8; SHDR_SIZE] {
        let mut o = [0u8; SHDR_SIZE];
        put_u32(&mut o, 0, self.sh_name);
        put_u32(&mut o, 4, self.sh_type);
        put_u64(&mut o, 8, self.sh_flags);
        put_u64(&mut o, 16, self.sh_addr);
        put_u64(&mut o, 24, self.sh_offset);
        put_u64(&mut o, 32, self.sh_size);
        put_u32(&mut o, 40, self.sh_link);
        put_u32(&mut o, 44, self.sh_info);
        put_u64(&mut o, 48, self.sh_addralign);
        put_u64(&mut o, 56, self.sh_entsize);
        o
    }

    /// Bytes the section occupies in the file (none for `SHT_NOBITS`).
    pub fn file_size(&self) -> u64 {
        if self.sh_type == SHT_NOBITS {
            0
        } else {
            self.sh_size
        }
    }
}

/// The section name at `offset` in the section-name string table.
pub fn name_at(strtab: &[u8], offset: u32) -> &str {
    let rest = strtab.get(offset as usize..).unwrap_or(&[]);
    let end = rest.iter().position(|&c| c == 0).unwrap_or(rest.len());
    std::str::from_utf8(&rest[..end]).unwrap_or("")
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rela {
    pub r_offset: u64,
    pub r_info: u64,
    pub r_addend: i64,
}

impl Rela {
    pub fn parse(b: &[u8], at: usize) -> Result<Rela, SplitError> {
        Ok(Rela {
            r_offset: u64_at(b, at)?,
            r_info: u64_at(b, at + 8)?,
            r_addend: u64_at(b, at + 16)? as i64,
        })
    }

    pub fn r_type(&self) -> u32 {
        self.r_info as u32
    }

    pub fn r_sym(&self) -> u32 {
        (self.r_info >> 32) as u32
    }

    pub fn store(&self, b: &mut [u8], at: usize) {
        put_u64(b, at, self.r_offset);
        put_u64(b, at + 8, self.r_info);
        put_u64(b, at + 16, self.r_addend as u64);
    }
}

/// A symbol's section index and value (all the split needs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sym {
    pub st_shndx: u16,
    pub st_value: u64,
}

impl Sym {
    pub fn parse(b: &[u8], at: usize) -> Result<Sym, SplitError> {
        Ok(Sym {
            st_shndx: u16_at(b, at + 6)?,
            st_value: u64_at(b, at + 8)?,
        })
    }
}
