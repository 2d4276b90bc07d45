//! `host_walk`: arbitrary bytes as a fat host binary whose offload bundles are walked, as
//! `import`, `pack --from-fatbin`, `verify --against` and `split` walk them: the file opened with
//! `HostFile` (device code left out of memory) and `.hip_fatbin` read one bundle or code object at
//! a time through positioned reads.
//!
//! Invariants: the walk reaches exactly what reading the whole file into memory and parsing its
//! section at once reaches (the same code objects, keys, arches and bytes, or the same kind of
//! refusal); a file read is never an error (the memfd does not change); every arch is usable as a
//! file name; keys count up per arch from 0; the progress callback adds up to at most the
//! section's size. The index read from the headers alone (`list`) keys, places and sizes the
//! same code objects, and the file's kind is a fat binary whenever the walk succeeds; opened as
//! an archive (as the mount opens it), a fat binary reads back each code object byte for byte.
//! Any other input opens as an archive or is refused, never a panic.

use std::cell::Cell;

use rocm_kpack::host::fatbin::{self, CodeObject, FatbinError, HostFile, HostKind, StreamError};
use rocm_kpack::names;

use super::archive::memfd_with;
use super::split_elf::fd_path;

const KERNEL_NAME: &str = "bin/fuzzapp";

pub fn run(data: &[u8]) {
    let whole = fatbin::host_code_objects(KERNEL_NAME, data);

    let file = memfd_with(data);
    let host = HostFile::open(fd_path(&file).as_ref()).expect("a memfd reads");
    let mut walked = Vec::new();
    let progressed = Cell::new(0u64);
    let streamed = fatbin::visit_host_code_objects(
        KERNEL_NAME,
        &host,
        |co| {
            walked.push(co);
            Ok::<(), std::convert::Infallible>(())
        },
        &|n| progressed.set(progressed.get() + n),
    );
    let streamed: Result<Vec<CodeObject>, FatbinError> = match streamed {
        Ok(()) => Ok(walked),
        Err(StreamError::Fatbin(e)) => Err(e),
        Err(StreamError::Read(e)) => panic!("reading the memfd failed: {e}"),
        Err(StreamError::Visit(never)) => match never {},
    };
    let section = host.fatbin().map_or(0, |r| r.len);
    assert!(progressed.get() <= section);
    let tables = HostFile::open_tables(fd_path(&file).as_ref()).expect("a memfd reads");
    let kind = fatbin::host_kind(tables.image());
    let index = fatbin::index_host_code_objects(KERNEL_NAME, &tables);
    // Whatever the bytes, opening them as the mount would is an answer, not a panic.
    let _ = fatbin::open_fat_archive(fd_path(&file).as_ref(), KERNEL_NAME);
    match (&whole, &streamed) {
        (Ok(a), Ok(b)) => {
            assert_eq!(a, b);
            check_keys(a);
            assert!(
                matches!(kind, Ok(HostKind::Fat | HostKind::SeparatedDebug)),
                "{kind:?}"
            );
            let index = index.expect("the index of a binary the walk read");
            assert_eq!(index.len(), a.len());
            // Mounted, the binary reads as an archive holding the same code objects.
            let archive = fatbin::open_fat_archive(fd_path(&file).as_ref(), KERNEL_NAME);
            if matches!(kind, Ok(HostKind::Fat)) {
                let archive = archive.expect("a fat binary the walk read opens as an archive");
                for co in a {
                    let got = archive.get_kernel(&co.key, &co.arch).expect("reads");
                    assert!(got == co.data, "{} [{}]", co.key, co.arch);
                }
            }
            for (i, co) in index.iter().zip(a) {
                assert_eq!(
                    (&i.key, &i.arch, &i.triple, i.index),
                    (&co.key, &co.arch, &co.triple, co.index)
                );
                assert_eq!(i.size, co.data.len() as u64);
            }
        }
        (Err(a), Err(b)) => assert_eq!(
            std::mem::discriminant(a),
            std::mem::discriminant(b),
            "{a} / {b}"
        ),
        _ => panic!(
            "whole file: {:?}; walked: {:?}",
            whole.as_ref().map(Vec::len),
            streamed.as_ref().map(Vec::len)
        ),
    }
}

fn check_keys(objects: &[CodeObject]) {
    let mut next: Vec<(&str, u32)> = Vec::new();
    for co in objects {
        names::check_arch(&co.arch).expect("a usable arch");
        let expected = match next.iter_mut().find(|(a, _)| *a == co.arch) {
            Some((_, n)) => {
                *n += 1;
                *n
            }
            None => {
                next.push((&co.arch, 0));
                0
            }
        };
        assert_eq!(co.index, expected);
        assert_eq!(co.key, format!("{KERNEL_NAME}#{expected}"));
    }
}
