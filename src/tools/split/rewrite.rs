//! The ELF rewrite itself. Design (why each step is needed):
//!
//! 1. Wrappers (`.hipFatBinSegment`, 24 bytes each) get magic `HIPK`, their `binary` pointer set
//!    to the marker, and their index in the low 32 bits of `reserved1`. The pointer is set in
//!    the file *and* in the dynamic relocation that fills it at load time (a `R_X86_64_64`
//!    against a symbol becomes a `R_X86_64_RELATIVE`, which needs no symbol). Any other
//!    relocation (or RELR slot) that points into `.hip_fatbin` makes us refuse the binary,
//!    because it would point at removed bytes.
//! 2. The device code leaves the file. `.hip_fatbin` usually sits in the middle of a read-only
//!    `PT_LOAD` (rocRAND: `.rodata .hip_fatbin .eh_frame_hdr …`), and a segment maps one
//!    contiguous file range, so that segment is split in two around the whole pages of the
//!    section; the file bytes of those pages are cut out. Everything after the cut moves down by
//!    a multiple of the largest segment alignment, so every segment keeps
//!    `p_offset ≡ p_vaddr (mod p_align)`; virtual addresses do not change, so no code or data
//!    needs relocating. The section becomes `SHT_NOBITS` (it keeps its address range, which is
//!    now a hole between the two halves, and the partial pages at its ends are zeroed).
//! 3. The split needs a program header more, and the marker needs a loaded home. The original
//!    table is followed by section data, so a new table is written into a new read-only
//!    `PT_LOAD` at the end of the file (after the last segment's memory, page aligned), right
//!    after the marker; `e_phoff` and `PT_PHDR` point at it. (For executables this relies on the
//!    kernel locating the table through the segment that maps it, which Linux does since 5.18.)
//! 4. A new `.rocm_kpack_ref` section header (appended, so no section index changes) describes
//!    the marker, and the section-name table is rewritten at the end with its name added.

use super::elf64::*;
use super::emit::{Rewrite, SplitResult};
use super::error::SplitError;
use super::relocs;
use crate::host::elf::{FATBIN_SEGMENT_SECTION, HIP_FATBIN_SECTION, KPACK_REF_SECTION};
use crate::host::hipk::wrapper::{self, HIPF_MAGIC, HIPK_MAGIC, WRAPPER_SIZE};

/// Largest segment alignment accepted (x86-64 binaries use 4 KiB to 2 MiB). The output pads the
/// new segment to it, in memory too, so it bounds what a hostile header can make us allocate.
const MAX_PAGE: u64 = 16 << 20;
/// Loaded segments end below this (x86-64 addresses have at most 57 bits), so addresses rounded
/// up to a page cannot overflow.
const MAX_VADDR: u64 = 1 << 62;

fn round_up(n: u64, a: u64) -> u64 {
    n.div_ceil(a) * a
}

fn round_down(n: u64, a: u64) -> u64 {
    n / a * a
}

/// The parsed parts of the input we work with.
struct Input<'a> {
    ehdr: Ehdr,
    phdrs: Vec<Phdr>,
    shdrs: Vec<Shdr>,
    shstrtab: &'a [u8],
}

impl<'a> Input<'a> {
    fn parse(bytes: &'a [u8]) -> Result<Input<'a>, SplitError> {
        let ehdr = Ehdr::parse(bytes)?;
        if ehdr.e_machine != EM_X86_64 {
            return Err(SplitError::Unsupported(format!(
                "machine {} (only x86-64 host binaries are rewritten)",
                ehdr.e_machine
            )));
        }
        if ehdr.e_type != ET_DYN && ehdr.e_type != ET_EXEC {
            return Err(SplitError::Unsupported(format!(
                "ELF type {} is neither an executable nor a shared object",
                ehdr.e_type
            )));
        }
        if ehdr.e_phentsize as usize != PHDR_SIZE || ehdr.e_shentsize as usize != SHDR_SIZE {
            return Err(SplitError::Malformed(
                "unexpected program or section header entry size".into(),
            ));
        }
        if ehdr.e_shnum == 0 || ehdr.e_shnum >= SHN_LORESERVE - 1 || ehdr.e_shstrndx >= ehdr.e_shnum
        {
            return Err(SplitError::Unsupported(
                "extended section numbering or no section headers".into(),
            ));
        }
        let phdrs = table(
            bytes,
            ehdr.e_phoff,
            ehdr.e_phnum,
            PHDR_SIZE,
            "program headers",
            Phdr::parse,
        )?;
        let shdrs = table(
            bytes,
            ehdr.e_shoff,
            ehdr.e_shnum,
            SHDR_SIZE,
            "section headers",
            Shdr::parse,
        )?;
        // Every table and section the layout is computed from lies inside the file, so no sum
        // of an offset and a size below can overflow.
        for (i, p) in phdrs.iter().enumerate() {
            range(
                bytes,
                p.p_offset,
                p.p_filesz,
                &format!("program header {i}"),
            )?;
            if p.p_vaddr
                .checked_add(p.p_memsz)
                .is_none_or(|end| end > MAX_VADDR)
            {
                return Err(SplitError::Malformed(format!(
                    "program header {i}: {:#x}+{:#x} is past the address space",
                    p.p_vaddr, p.p_memsz
                )));
            }
        }
        for (i, s) in shdrs.iter().enumerate() {
            range(bytes, s.sh_offset, s.file_size(), &format!("section {i}"))?;
        }
        let st = &shdrs[ehdr.e_shstrndx as usize];
        let shstrtab = &bytes[range(bytes, st.sh_offset, st.sh_size, "section name table")?];
        Ok(Input {
            ehdr,
            phdrs,
            shdrs,
            shstrtab,
        })
    }

    fn section(&self, name: &str) -> Option<usize> {
        self.shdrs
            .iter()
            .position(|s| name_at(self.shstrtab, s.sh_name) == name)
    }

    /// The file offset of `len` bytes at `vaddr`, through the loadable segments.
    fn file_offset_of(&self, vaddr: u64, len: u64) -> Option<u64> {
        self.phdrs
            .iter()
            .filter(|p| p.p_type == PT_LOAD)
            .find_map(|p| p.file_offset_of(vaddr, len))
    }
}

/// Whether the bytes have the marker section (are already split).
pub fn is_split(bytes: &[u8]) -> Result<bool, SplitError> {
    let input = Input::parse(bytes)?;
    Ok(input.section(KPACK_REF_SECTION).is_some())
}

/// Splits a binary held in memory: [`prepare`], then [`Prepared::finish`], then the output
/// assembled from `bytes`.
pub fn split_elf(bytes: &[u8], marker: &[u8]) -> Result<SplitResult, SplitError> {
    let rewrite = prepare(bytes)?.finish(marker);
    let out = rewrite.to_vec(bytes);
    Ok(rewrite.into_result(out))
}

/// A binary checked and planned for splitting; only the marker's bytes are still open (their
/// address is fixed, so the wrappers can already point at them).
pub struct Prepared {
    header: [u8; EHDR_SIZE],
    ehdr: Ehdr,
    phdrs: Vec<Phdr>,
    shdrs: Vec<Shdr>,
    shstrtab: Vec<u8>,
    layout: Layout,
    edits: Edits,
}

/// Phases 1 and 2: the layout and the in-place edits. Every refusal happens here, and only
/// the headers, the wrappers, the relocation and symbol tables and the words relocations point
/// at are read: the bytes of `.hip_fatbin` are not, so `bytes` may hold zeros there.
pub fn prepare(bytes: &[u8]) -> Result<Prepared, SplitError> {
    let inp = Input::parse(bytes)?;
    if inp.section(KPACK_REF_SECTION).is_some() {
        return Err(SplitError::AlreadySplit);
    }
    let layout = plan_layout(bytes, &inp)?;
    let edits = plan_edits(bytes, &inp, &layout)?;
    let mut header = [0u8; EHDR_SIZE];
    header.copy_from_slice(&bytes[..EHDR_SIZE]);
    Ok(Prepared {
        header,
        ehdr: inp.ehdr,
        phdrs: inp.phdrs,
        shdrs: inp.shdrs,
        shstrtab: inp.shstrtab.to_vec(),
        layout,
        edits,
    })
}

/// Phase 1: the page-aligned hole `[cut_lo, cut_hi)` and the new segment at the end.
struct Layout {
    fb_idx: usize,
    fb: Shdr,
    page: u64,
    seg_idx: usize,
    cut_lo: u64,
    cut_hi: u64,
    /// Input bytes past this (an old section header table ending the file) are dropped.
    keep_end: u64,
    new_seg_off: u64,
    new_seg_vaddr: u64,
    /// What the segment holding the device code becomes: the parts before and after the hole.
    split_parts: Vec<Phdr>,
    phnum: usize,
}

impl Layout {
    fn delta(&self) -> u64 {
        self.cut_hi - self.cut_lo
    }

    /// Where input offset `off` (outside the hole) lands in the output.
    fn shift(&self, off: u64) -> u64 {
        if off >= self.cut_hi {
            off - self.delta()
        } else {
            off
        }
    }
}

fn plan_layout(bytes: &[u8], inp: &Input<'_>) -> Result<Layout, SplitError> {
    let fb_idx = inp
        .section(HIP_FATBIN_SECTION)
        .ok_or(SplitError::NoDeviceCode)?;
    let fb = inp.shdrs[fb_idx];
    if fb.sh_type == SHT_NOBITS || fb.sh_flags & SHF_ALLOC == 0 {
        return Err(SplitError::Unsupported(format!(
            "{HIP_FATBIN_SECTION} is not a loaded section with contents"
        )));
    }
    range(bytes, fb.sh_offset, fb.sh_size, HIP_FATBIN_SECTION)?;
    let file_len = bytes.len() as u64;
    let loads: Vec<&Phdr> = inp.phdrs.iter().filter(|p| p.p_type == PT_LOAD).collect();
    let page = loads.iter().map(|p| p.p_align).max().unwrap_or(0).max(4096);
    if !page.is_power_of_two() {
        return Err(SplitError::Malformed(format!(
            "segment alignment {page} is not a power of two"
        )));
    }
    if page > MAX_PAGE {
        return Err(SplitError::Unsupported(format!(
            "segment alignment {page} is larger than {MAX_PAGE}"
        )));
    }
    let seg_idx = inp
        .phdrs
        .iter()
        .position(|p| p.p_type == PT_LOAD && p.holds_file_range(fb.sh_offset, fb.sh_size))
        .ok_or_else(|| {
            SplitError::Unsupported(format!(
                "{HIP_FATBIN_SECTION} is not inside one loadable segment"
            ))
        })?;
    let seg = inp.phdrs[seg_idx];
    let cut_lo = round_up(fb.sh_offset, page);
    let cut_hi = round_down(fb.sh_offset + fb.sh_size, page).max(cut_lo);
    let delta = cut_hi - cut_lo;
    for (i, p) in inp.phdrs.iter().enumerate() {
        let overlaps = p.p_filesz > 0 && p.p_offset < cut_hi && p.p_offset + p.p_filesz > cut_lo;
        if i != seg_idx && overlaps && delta > 0 {
            return Err(SplitError::Unsupported(format!(
                "program header {i} overlaps the device code pages"
            )));
        }
    }
    for (i, s) in inp.shdrs.iter().enumerate() {
        let overlaps =
            s.file_size() > 0 && s.sh_offset < cut_hi && s.sh_offset + s.file_size() > cut_lo;
        if i != fb_idx && overlaps && delta > 0 {
            return Err(SplitError::Unsupported(format!(
                "section {} shares the device code pages",
                name_at(inp.shstrtab, s.sh_name)
            )));
        }
    }
    // The old section header table (and nothing after it) is dropped when it ends the file.
    let data_end = inp
        .shdrs
        .iter()
        .map(|s| s.sh_offset + s.file_size())
        .chain(inp.phdrs.iter().map(|p| p.p_offset + p.p_filesz))
        .max()
        .unwrap_or(0);
    let old_sht_end = inp.ehdr.e_shoff + inp.ehdr.e_shnum as u64 * SHDR_SIZE as u64;
    let keep_end = if inp.ehdr.e_shoff >= data_end && old_sht_end == file_len {
        inp.ehdr.e_shoff
    } else {
        file_len
    };
    // With no whole page of device code to remove the hole is empty; it is put where it cannot
    // lie past the bytes kept (a short section near the end of the file rounds up past them).
    let (cut_lo, cut_hi) = if delta == 0 {
        let at = cut_lo.min(keep_end);
        (at, at)
    } else {
        (cut_lo, cut_hi)
    };
    let new_seg_off = round_up(keep_end - delta, page);
    let new_seg_vaddr = round_up(
        loads
            .iter()
            .map(|p| p.p_vaddr + p.p_memsz)
            .max()
            .unwrap_or(0),
        page,
    );
    let mut split_parts = Vec::new();
    if delta == 0 {
        split_parts.push(seg);
    } else {
        if cut_lo > seg.p_offset {
            let len = cut_lo - seg.p_offset;
            split_parts.push(Phdr {
                p_filesz: len,
                p_memsz: len,
                ..seg
            });
        }
        let skip = cut_hi - seg.p_offset;
        if seg.p_memsz > skip {
            split_parts.push(Phdr {
                p_offset: cut_hi - delta,
                p_vaddr: seg.p_vaddr + skip,
                p_paddr: seg.p_paddr + skip,
                p_filesz: seg.p_filesz.saturating_sub(skip),
                p_memsz: seg.p_memsz - skip,
                ..seg
            });
        }
    }
    let phnum = inp.phdrs.len() - 1 + split_parts.len() + 1;
    if phnum > u16::MAX as usize {
        return Err(SplitError::Unsupported("too many program headers".into()));
    }
    Ok(Layout {
        fb_idx,
        fb,
        page,
        seg_idx,
        cut_lo,
        cut_hi,
        keep_end,
        new_seg_off,
        new_seg_vaddr,
        split_parts,
        phnum,
    })
}

/// Phase 2 result: byte edits at input offsets, and what they changed.
struct Edits {
    patches: Vec<(u64, Vec<u8>)>,
    wrappers: usize,
    rewritten: usize,
}

/// Phase 2: wrappers become HIPK and point at the marker (the marker opens the new segment, so
/// its address is known now); the relocations that set their pointers follow; any other
/// pointer into the device code refuses the binary.
fn plan_edits(bytes: &[u8], inp: &Input<'_>, layout: &Layout) -> Result<Edits, SplitError> {
    let marker_vaddr = layout.new_seg_vaddr;
    let (fb_lo, fb_hi) = (layout.fb.sh_addr, layout.fb.sh_addr + layout.fb.sh_size);
    let points_into_fatbin = |a: u64| a >= fb_lo && a < fb_hi;
    let mut patches = Vec::new();
    let wr_idx = inp
        .section(FATBIN_SEGMENT_SECTION)
        .ok_or(SplitError::NoWrappers)?;
    let wr = inp.shdrs[wr_idx];
    let wr_range = range(bytes, wr.sh_offset, wr.file_size(), FATBIN_SEGMENT_SECTION)?;
    if wr.sh_size == 0 || wr.sh_size % WRAPPER_SIZE as u64 != 0 || wr.sh_type == SHT_NOBITS {
        return Err(SplitError::Malformed(format!(
            "{FATBIN_SEGMENT_SECTION} holds {} bytes, not whole 24-byte wrappers",
            wr.sh_size
        )));
    }
    let count = wr.sh_size as usize / WRAPPER_SIZE;
    let mut slots = Vec::with_capacity(count);
    for i in 0..count {
        let at = wr_range.start + i * WRAPPER_SIZE;
        let mut record = [0u8; WRAPPER_SIZE];
        record.copy_from_slice(&bytes[at..at + WRAPPER_SIZE]);
        let magic = wrapper::make_hipk(&mut record, marker_vaddr, i as u32);
        if magic != HIPF_MAGIC && magic != HIPK_MAGIC {
            return Err(SplitError::BadWrapper { index: i, magic });
        }
        patches.push((at as u64, record.to_vec()));
        slots.push(wr.sh_addr + (i * WRAPPER_SIZE) as u64 + 8);
    }

    let rel = relocs::collect(bytes, &inp.shdrs)?;
    let mut rewritten = 0usize;
    for (r, symtab) in &rel.rela {
        if slots.contains(&r.rela.r_offset) {
            let t = r.rela.r_type();
            if t != R_X86_64_RELATIVE && t != R_X86_64_64 {
                return Err(SplitError::Unsupported(format!(
                    "wrapper pointer at {:#x} is set by relocation type {t} (expected RELATIVE or 64)",
                    r.rela.r_offset
                )));
            }
            let new = Rela {
                r_offset: r.rela.r_offset,
                r_info: R_X86_64_RELATIVE as u64,
                r_addend: marker_vaddr as i64,
            };
            let mut record = vec![0u8; RELA_SIZE];
            new.store(&mut record, 0);
            patches.push((r.file_offset as u64, record));
            rewritten += 1;
        } else if let Some(target) = relocs::static_target(bytes, &inp.shdrs, r, *symtab)? {
            if points_into_fatbin(target) {
                return Err(SplitError::DanglingReloc {
                    at: r.rela.r_offset,
                    target,
                });
            }
        }
    }
    for &a in &rel.relr {
        if slots.contains(&a) {
            continue;
        }
        if let Some(off) = inp.file_offset_of(a, 8) {
            let target = u64_at(bytes, off as usize)?;
            if points_into_fatbin(target) {
                return Err(SplitError::DanglingReloc { at: a, target });
            }
        }
    }
    Ok(Edits {
        patches,
        wrappers: count,
        rewritten,
    })
}

impl Prepared {
    /// Where the marker will be loaded (before relocation by the load bias).
    pub fn marker_vaddr(&self) -> u64 {
        self.layout.new_seg_vaddr
    }

    /// Size of the original `.hip_fatbin` section.
    pub fn device_code(&self) -> u64 {
        self.layout.fb.sh_size
    }

    /// Phase 3: the output, as kept input ranges plus edits plus a new tail holding the marker,
    /// the program header table, the section names and the section header table.
    pub fn finish(&self, marker: &[u8]) -> Rewrite {
        let l = &self.layout;
        let delta = l.delta();
        // The marker opens the new segment and the program header table follows it: tools
        // that re-lay out files (objcopy, strip) expect a segment to start with its first
        // section.
        let table_len = (l.phnum * PHDR_SIZE) as u64;
        let marker_off = l.new_seg_off;
        let table_off = l.new_seg_off + round_up(marker.len() as u64, 8);
        let table_vaddr = l.new_seg_vaddr + (table_off - l.new_seg_off);
        let new_seg_len = table_off + table_len - l.new_seg_off;

        let copies = vec![
            (0, l.cut_lo, 0),
            (l.cut_hi, l.keep_end - l.cut_hi, l.cut_lo),
        ];
        let body_len = l.keep_end - delta;
        // The partial device code pages left at either end of the hole.
        let fb_end = l.fb.sh_offset + l.fb.sh_size;
        let mut zeros = Vec::new();
        if l.fb.sh_offset < l.cut_lo.min(fb_end) {
            zeros.push((l.fb.sh_offset, l.cut_lo.min(fb_end) - l.fb.sh_offset));
        }
        let hi_from = l.cut_hi.max(l.fb.sh_offset);
        if hi_from < fb_end {
            zeros.push((l.shift(hi_from), fb_end - hi_from));
        }

        let mut phdrs = Vec::with_capacity(l.phnum);
        let last_load = self
            .phdrs
            .iter()
            .rposition(|p| p.p_type == PT_LOAD)
            .expect("the fatbin segment is a load");
        let new_seg = Phdr {
            p_type: PT_LOAD,
            p_flags: PF_R,
            p_offset: l.new_seg_off,
            p_vaddr: l.new_seg_vaddr,
            p_paddr: l.new_seg_vaddr,
            p_filesz: new_seg_len,
            p_memsz: new_seg_len,
            p_align: l.page,
        };
        for (i, p) in self.phdrs.iter().enumerate() {
            if i == l.seg_idx {
                phdrs.extend_from_slice(&l.split_parts);
            } else if p.p_type == PT_PHDR {
                phdrs.push(Phdr {
                    p_offset: table_off,
                    p_vaddr: table_vaddr,
                    p_paddr: table_vaddr,
                    p_filesz: table_len,
                    p_memsz: table_len,
                    ..*p
                });
            } else {
                phdrs.push(Phdr {
                    p_offset: l.shift(p.p_offset),
                    ..*p
                });
            }
            if i == last_load {
                phdrs.push(new_seg);
            }
        }
        debug_assert_eq!(phdrs.len(), l.phnum);

        // The tail starts where the kept body ends; `at` tracks output offsets.
        let mut tail = vec![0u8; (l.new_seg_off - body_len) as usize];
        tail.extend_from_slice(marker);
        tail.resize((table_off - body_len) as usize, 0);
        for p in &phdrs {
            tail.extend_from_slice(&p.encode());
        }
        let mut names = self.shstrtab.clone();
        let marker_name = names.len() as u32;
        names.extend_from_slice(KPACK_REF_SECTION.as_bytes());
        names.push(0);
        let names_off = body_len + tail.len() as u64;
        tail.extend_from_slice(&names);
        let shoff = round_up(body_len + tail.len() as u64, 8);
        tail.resize((shoff - body_len) as usize, 0);
        for (i, s) in self.shdrs.iter().enumerate() {
            let s = if i == l.fb_idx {
                Shdr {
                    sh_type: SHT_NOBITS,
                    sh_offset: l.cut_lo.min(l.shift(s.sh_offset)),
                    ..*s
                }
            } else if i == self.ehdr.e_shstrndx as usize {
                Shdr {
                    sh_offset: names_off,
                    sh_size: names.len() as u64,
                    ..*s
                }
            } else if i == 0 {
                *s
            } else {
                Shdr {
                    sh_offset: l.shift(s.sh_offset),
                    ..*s
                }
            };
            tail.extend_from_slice(&s.encode());
        }
        let marker_shdr = Shdr {
            sh_name: marker_name,
            sh_type: SHT_PROGBITS,
            sh_flags: SHF_ALLOC,
            sh_addr: l.new_seg_vaddr,
            sh_offset: marker_off,
            sh_size: marker.len() as u64,
            sh_link: 0,
            sh_info: 0,
            sh_addralign: 1,
            sh_entsize: 0,
        };
        tail.extend_from_slice(&marker_shdr.encode());

        let mut header = self.header;
        Ehdr {
            e_phoff: table_off,
            e_phnum: l.phnum as u16,
            e_shoff: shoff,
            e_shnum: self.ehdr.e_shnum + 1,
            ..self.ehdr
        }
        .store(&mut header);
        Rewrite {
            copies,
            patches: self.edits.patches.clone(),
            zeros,
            tail_at: body_len,
            tail,
            header,
            wrappers: self.edits.wrappers,
            relocations_rewritten: self.edits.rewritten,
            removed: delta,
            device_code: l.fb.sh_size,
            marker_vaddr: l.new_seg_vaddr,
        }
    }
}

/// A header table of `count` entries of `size` bytes at `offset`, checked to lie in the file.
fn table<T>(
    bytes: &[u8],
    offset: u64,
    count: u16,
    size: usize,
    what: &str,
    parse: fn(&[u8], usize) -> Result<T, SplitError>,
) -> Result<Vec<T>, SplitError> {
    let r = range(bytes, offset, u64::from(count) * size as u64, what)?;
    (0..count as usize)
        .map(|i| parse(bytes, r.start + i * size))
        .collect()
}
