//! Finding every pointer the dynamic loader will write: RELA entries (`R_X86_64_RELATIVE`,
//! `R_X86_64_64` and friends) and packed RELR entries. The split rewrites the ones that set a
//! wrapper's `binary` pointer and refuses a binary in which anything else points into the
//! device code it is about to remove.

use super::elf64::*;
use super::error::SplitError;

/// One RELA entry and where it sits in the file.
#[derive(Debug, Clone, Copy)]
pub struct RelaAt {
    pub file_offset: usize,
    pub rela: Rela,
}

/// The dynamic (allocated) RELA entries, with the symbol table each refers to.
pub struct DynRelocs {
    pub rela: Vec<(RelaAt, Option<usize>)>,
    /// Addresses whose in-place value gets the load bias added (RELR).
    pub relr: Vec<u64>,
}

/// Reads the relocations of every allocated `SHT_RELA` and `SHT_RELR` section.
pub fn collect(b: &[u8], shdrs: &[Shdr]) -> Result<DynRelocs, SplitError> {
    let mut rela = Vec::new();
    let mut relr = Vec::new();
    for (i, s) in shdrs.iter().enumerate() {
        if s.sh_flags & SHF_ALLOC == 0 {
            continue;
        }
        match s.sh_type {
            SHT_RELA => {
                let r = range(
                    b,
                    s.sh_offset,
                    s.sh_size,
                    &format!("relocation section {i}"),
                )?;
                let symtab = (s.sh_link != 0).then_some(s.sh_link as usize);
                for at in r
                    .clone()
                    .step_by(RELA_SIZE)
                    .take_while(|at| at + RELA_SIZE <= r.end)
                {
                    rela.push((
                        RelaAt {
                            file_offset: at,
                            rela: Rela::parse(b, at)?,
                        },
                        symtab,
                    ));
                }
            }
            SHT_RELR => {
                let r = range(b, s.sh_offset, s.sh_size, &format!("RELR section {i}"))?;
                decode_relr(&b[r], &mut relr)?;
            }
            _ => {}
        }
    }
    Ok(DynRelocs { rela, relr })
}

/// RELR: an even word is an address (relocate it, then continue after it); an odd word is a
/// bitmap of the 63 words that follow the last position.
fn decode_relr(data: &[u8], out: &mut Vec<u64>) -> Result<(), SplitError> {
    let mut next: u64 = 0;
    for chunk in data.chunks_exact(8) {
        let word = crate::bytes::le_u64(chunk, 0).expect("8-byte chunk");
        if word & 1 == 0 {
            out.push(word);
            next = word.wrapping_add(8);
        } else {
            for bit in 1..64u64 {
                if word >> bit & 1 == 1 {
                    out.push(next.wrapping_add((bit - 1) * 8));
                }
            }
            next = next.wrapping_add(63 * 8);
        }
        if out.len() > data.len() * 64 {
            return Err(SplitError::Malformed(
                "RELR table expands implausibly".into(),
            ));
        }
    }
    Ok(())
}

/// The address a RELA entry makes its slot point at, when that is known statically: the addend
/// for `RELATIVE`, symbol value plus addend for symbol relocations against a defined symbol.
pub fn static_target(
    b: &[u8],
    shdrs: &[Shdr],
    r: &RelaAt,
    symtab: Option<usize>,
) -> Result<Option<u64>, SplitError> {
    let rela = r.rela;
    if rela.r_type() == R_X86_64_RELATIVE {
        return Ok(Some(rela.r_addend as u64));
    }
    let (Some(t), sym) = (symtab, rela.r_sym()) else {
        return Ok(None);
    };
    if sym == 0 {
        return Ok(None);
    }
    let table = shdrs.get(t).ok_or_else(|| {
        SplitError::Malformed(format!(
            "relocation names symbol table {t}, which does not exist"
        ))
    })?;
    let at = (sym as u64)
        .checked_mul(SYM_SIZE as u64)
        .filter(|o| o + SYM_SIZE as u64 <= table.sh_size)
        .ok_or_else(|| {
            SplitError::Malformed(format!(
                "relocation at {:#x} names symbol {sym}, past its table",
                rela.r_offset
            ))
        })?;
    let s = Sym::parse(
        b,
        range(b, table.sh_offset + at, SYM_SIZE as u64, "symbol")?.start,
    )?;
    Ok((s.st_shndx != 0).then(|| s.st_value.wrapping_add(rela.r_addend as u64)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relr_addresses_and_bitmaps() {
        let mut words = Vec::new();
        words.extend_from_slice(&0x1000u64.to_le_bytes());
        // Bitmap: bit 1 -> 0x1008, bit 3 -> 0x1018, bit 63 -> 0x1008 + 62*8.
        words.extend_from_slice(&((1u64 << 1) | (1 << 3) | (1 << 63) | 1).to_le_bytes());
        words.extend_from_slice(&0x2000u64.to_le_bytes());
        let mut out = Vec::new();
        decode_relr(&words, &mut out).unwrap();
        assert_eq!(out, vec![0x1000, 0x1008, 0x1018, 0x1008 + 62 * 8, 0x2000]);
    }
}
