//! The code objects of a fat binary's `.hip_fatbin` section, keyed for its archives: read
//! ([`code_objects`], [`host_code_objects`]), visited one at a time ([`visit_code_objects`],
//! [`visit_host_code_objects`]) or located without being read ([`index_code_objects`],
//! [`index_host_code_objects`]). The key is `<kernel_name>#<i>`, where `i` counts one binary's
//! code objects *per arch*, in bundle order (with one bundle per translation unit this equals
//! the wrapper index the runtime passes).

use super::kind::check_fat;
use super::{FatbinError, HostFile, StreamError};
use crate::host::bundle;
use crate::host::elf::{self, ElfFile};
use crate::host::hipk;
use crate::names;

/// One device code object of a host binary, with its archive key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CodeObject {
    /// `<kernel_name>#<index>`.
    pub key: String,
    pub arch: String,
    /// The bundler triple it came from.
    pub triple: String,
    /// Its position among this binary's code objects for `arch`.
    pub index: u32,
    pub data: Vec<u8>,
}

/// Keys the code objects of one `.hip_fatbin` section: per-arch counters in bundle order.
pub fn code_objects(kernel_name: &str, fatbin: &[u8]) -> Result<Vec<CodeObject>, FatbinError> {
    let mut out = Vec::new();
    visit_code_objects(
        kernel_name,
        fatbin,
        |co| {
            out.push(co);
            Ok::<(), std::convert::Infallible>(())
        },
        &|_| {},
    )
    .map_err(|e| match e {
        StreamError::Fatbin(e) => e,
        StreamError::Read(e) => FatbinError::NotElf(e.to_string()),
        StreamError::Visit(never) => match never {},
    })?;
    Ok(out)
}

/// Visits the code objects of a `.hip_fatbin` section in order, keyed as [`code_objects`] keys
/// them, holding one code object (or one decompressed CCOB bundle) at a time. `progress`
/// receives the section bytes of each bundle once its code objects were visited.
fn visit_code_objects<S, E>(
    kernel_name: &str,
    fatbin: &S,
    mut visit: impl FnMut(CodeObject) -> Result<(), E>,
    progress: &dyn Fn(u64),
) -> Result<(), StreamError<E>>
where
    S: bundle::Source + ?Sized,
{
    let mut counters = Counters::default();
    bundle::walk_fatbin(fatbin, |event| {
        let e = match event {
            bundle::Event::Entry(e) => e,
            bundle::Event::End(head) => {
                progress(head.len);
                return Ok(());
            }
        };
        let index = counters
            .next(&e.arch, &e.triple)
            .map_err(StreamError::Fatbin)?;
        visit(CodeObject {
            key: hipk::lookup_key(kernel_name, index),
            arch: e.arch,
            triple: e.triple,
            index,
            data: e.data.into_owned(),
        })
        .map_err(StreamError::Visit)
    })
    .map_err(|e| match e {
        bundle::WalkError::Bundle(e) => StreamError::Fatbin(FatbinError::Bundle(e)),
        bundle::WalkError::Read(e) => StreamError::Read(e),
        bundle::WalkError::Visit(e) => e,
    })
}

/// Numbers one binary's code objects per arch, in bundle order, checking each arch.
#[derive(Default)]
struct Counters(Vec<(String, u32)>);

impl Counters {
    /// The index of the next code object for `arch` (from `triple`).
    fn next(&mut self, arch: &str, triple: &str) -> Result<u32, FatbinError> {
        // The arch names an archive file and a tree's `<arch>.hsaco`: the same rule as `pack`.
        if let Err(reason) = names::check_arch(arch) {
            return Err(FatbinError::BadArch {
                triple: triple.to_owned(),
                reason,
            });
        }
        Ok(match self.0.iter_mut().find(|(a, _)| a == arch) {
            Some((_, n)) => {
                *n += 1;
                *n
            }
            None => {
                self.0.push((arch.to_owned(), 0));
                0
            }
        })
    }
}

/// One code object of a fat binary, keyed as `visit_code_objects` keys it, with where it
/// lies instead of its bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexedCodeObject {
    pub key: String,
    pub arch: String,
    pub triple: String,
    pub index: u32,
    pub size: u64,
    /// The bundle it is in, and its offset in that bundle's uncompressed form.
    pub bundle: bundle::BundleHead,
    pub offset: u64,
}

/// The code objects of a `.hip_fatbin` section, keyed as [`visit_code_objects`] keys them,
/// found without reading them (see [`bundle::index_fatbin`]).
fn index_code_objects<S>(
    kernel_name: &str,
    fatbin: &S,
) -> Result<Vec<IndexedCodeObject>, StreamError<std::convert::Infallible>>
where
    S: bundle::Source + ?Sized,
{
    let located = bundle::index_fatbin(fatbin).map_err(|e| match e {
        bundle::WalkError::Bundle(e) => StreamError::Fatbin(FatbinError::Bundle(e)),
        bundle::WalkError::Read(e) => StreamError::Read(e),
        bundle::WalkError::Visit(never) => match never {},
    })?;
    let mut counters = Counters::default();
    located
        .into_iter()
        .map(|l| {
            let index = counters
                .next(&l.arch, &l.triple)
                .map_err(StreamError::Fatbin)?;
            Ok(IndexedCodeObject {
                key: hipk::lookup_key(kernel_name, index),
                arch: l.arch,
                triple: l.triple,
                index,
                size: l.size,
                bundle: l.bundle,
                offset: l.offset,
            })
        })
        .collect()
}

/// `index_code_objects` of a host binary opened with [`HostFile`] (only its headers need
/// be read: [`HostFile::open_headers`]). Binaries already split are refused, as by
/// [`host_code_objects`].
pub fn index_host_code_objects(
    kernel_name: &str,
    host: &HostFile,
) -> Result<Vec<IndexedCodeObject>, StreamError<std::convert::Infallible>> {
    check_fat(host).map_err(StreamError::Fatbin)?;
    match host.fatbin() {
        Some(range) => index_code_objects(kernel_name, &range),
        None => Ok(Vec::new()),
    }
}

/// Visits the code objects of a host binary opened with [`HostFile`], reading its device code
/// through positioned reads. Binaries already split are refused, as by [`host_code_objects`].
/// `progress` receives section bytes as bundles are read (see `visit_code_objects`).
pub fn visit_host_code_objects<E>(
    kernel_name: &str,
    host: &HostFile,
    visit: impl FnMut(CodeObject) -> Result<(), E>,
    progress: &dyn Fn(u64),
) -> Result<(), StreamError<E>> {
    check_fat(host).map_err(StreamError::Fatbin)?;
    match host.fatbin() {
        Some(range) => visit_code_objects(kernel_name, &range, visit, progress),
        // A section without file contents holds no bundles.
        None => Ok(()),
    }
}

/// Reads the device code of an ELF host binary. Binaries already split are refused.
pub fn host_code_objects(
    kernel_name: &str,
    elf_bytes: &[u8],
) -> Result<Vec<CodeObject>, FatbinError> {
    let file = ElfFile::parse(elf_bytes).map_err(FatbinError::NotElf)?;
    if file.section(elf::KPACK_REF_SECTION).is_some() {
        return Err(FatbinError::AlreadySplit);
    }
    let section = file
        .section(elf::HIP_FATBIN_SECTION)
        .ok_or(FatbinError::NoDeviceCode)?;
    code_objects(kernel_name, section.data)
}
