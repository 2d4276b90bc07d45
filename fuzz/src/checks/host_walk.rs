//! `host_walk`: arbitrary bytes as a fat host binary whose offload bundles are walked, as
//! `import`, `pack --from-fatbin`, `verify --against` and `split` walk them: the file opened with
//! `HostFile` (device code left out of memory) and `.hip_fatbin` read one bundle or code object at
//! a time through positioned reads.
//!
//! Invariants: the walk reaches exactly what reading the whole file into memory and parsing its
//! section at once reaches (the same code objects, keys, arches and bytes, or the same kind of
//! refusal); a file read is never an error (the memfd does not change); every arch is usable as a
//! file name; keys count up per arch from 0; the progress callback adds up to at most the
//! section's size.

use std::cell::Cell;

use rocm_kpack::names;
use rocm_kpack::tools::import::{self, CodeObject, HostFile, ImportError, StreamError};

use super::archive::memfd_with;
use super::split_elf::fd_path;

const KERNEL_NAME: &str = "bin/fuzzapp";

pub fn run(data: &[u8]) {
    let whole = import::host_code_objects(KERNEL_NAME, data);

    let file = memfd_with(data);
    let host = HostFile::open(fd_path(&file).as_ref()).expect("a memfd reads");
    let mut walked = Vec::new();
    let progressed = Cell::new(0u64);
    let streamed = import::visit_host_code_objects(
        KERNEL_NAME,
        &host,
        |co| {
            walked.push(co);
            Ok::<(), std::convert::Infallible>(())
        },
        &|n| progressed.set(progressed.get() + n),
    );
    let streamed: Result<Vec<CodeObject>, ImportError> = match streamed {
        Ok(()) => Ok(walked),
        Err(StreamError::Import(e)) => Err(e),
        Err(StreamError::Read(e)) => panic!("reading the memfd failed: {e}"),
        Err(StreamError::Visit(never)) => match never {},
    };
    let section = host.fatbin().map_or(0, |r| r.len);
    assert!(progressed.get() <= section);
    match (&whole, &streamed) {
        (Ok(a), Ok(b)) => {
            assert_eq!(a, b);
            check_keys(a);
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
