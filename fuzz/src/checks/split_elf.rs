//! `split_elf`: arbitrary bytes as a host binary given to `split`, which reads its ELF headers,
//! wrappers and relocations and rewrites it.
//!
//! The rewrite is planned twice, from the bytes in memory (`split_elf`) and as `split` does it on
//! a tree (read through `HostFile`, the device code never read, written file to file); both must
//! reach the same refusal or the same bytes. The commands (`split_binary`, and `split` on a tree,
//! whose code-object walk `host_walk` checks against the in-memory one) rewrite a binary only
//! when import's ELF reader accepts it too; whatever they write must come out as a HIPK binary
//! that every reader of split binaries accepts: `split`'s own reader (already split), the mount's
//! and `resolve`'s (`HipkHost`, metadata equal to the marker, one HIPK wrapper per wrapper
//! rewritten, indices in order, the marker where the result says) and import's (refused as
//! already split). So a refusal never leaves a broken output, and an output is never broken.

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;

use rocm_kpack::host::elf::{ElfFile, KPACK_REF_SECTION};
use rocm_kpack::host::fatbin::{self, FatbinError, HostFile};
use rocm_kpack::host::hipk::{HipkHost, HipkMetadata};
use rocm_kpack::tools::split::{self, SplitError, SplitResult};

use super::archive::memfd_with;

pub const KERNEL_NAME: &str = "lib/libfuzz.so";
pub const PREFIX: &str = "fuzz";

/// The `/proc/self/fd` path of an open file, so path-taking readers read it.
pub fn fd_path(file: &File) -> String {
    format!("/proc/self/fd/{}", file.as_raw_fd())
}

pub fn run(data: &[u8]) {
    let marker = split::marker(KERNEL_NAME, PREFIX, None);
    let direct = split::split_elf(data, &marker);

    let input = memfd_with(data);
    let host = HostFile::open(fd_path(&input).as_ref()).expect("a memfd reads");
    assert_eq!(host.len(), data.len() as u64);
    let planned = split::prepare(host.image()).map(|p| p.finish(&marker));
    match (&direct, &planned) {
        (Ok(r), Ok(rewrite)) => {
            assert_eq!(rewrite.len(), r.bytes.len() as u64);
            let out = memfd_with(&[]);
            rewrite.write_file(&input, &out).expect("write to a memfd");
            let mut written = Vec::new();
            let mut reader = &out;
            reader.read_to_end(&mut written).expect("read the memfd");
            assert!(
                written == r.bytes,
                "file-to-file output differs from the in-memory one"
            );
        }
        (Err(a), Err(b)) => assert_eq!(a, b),
        _ => panic!(
            "in memory: {:?}; through HostFile: {:?}",
            direct.as_ref().map(|r| r.bytes.len()),
            planned.as_ref().map(|r| r.len())
        ),
    }
    // `split_elf` alone trusts the headers `split` reads and may accept a binary whose other
    // tables are broken; the commands also read its device code with import's reader, and
    // refuse what that reader refuses.
    match (split::split_binary(data, KERNEL_NAME, PREFIX), &direct) {
        (Ok(b), Ok(r)) => {
            assert!(b.result == *r, "split_binary and split_elf differ");
            check_output(data, &marker, r);
        }
        (Ok(_), Err(e)) => panic!("split_binary rewrote what split_elf refuses: {e}"),
        (Err(_), _) => {}
    }
    // The file was only read.
    let mut again = vec![0u8; data.len()];
    input.read_exact_at(&mut again, 0).expect("re-read");
    assert!(again == data);
}

/// What every reader of a split binary must find in `split`'s output.
fn check_output(data: &[u8], marker: &[u8], r: &SplitResult) {
    let out = &r.bytes;
    assert!(r.removed <= data.len() as u64 && r.device_code <= data.len() as u64);
    assert_eq!(split::is_split(out), Ok(true));
    assert_eq!(
        split::prepare(out).map(|_| ()).unwrap_err(),
        SplitError::AlreadySplit
    );
    let elf = ElfFile::parse(out).expect("the output parses as ELF");
    let marker_section = elf.section(KPACK_REF_SECTION).expect("marker section");
    assert!(
        marker_section.data == marker,
        "marker section holds other bytes"
    );
    assert_eq!(marker_section.address, r.marker_vaddr);
    let host = HipkHost::read(out).expect("the mount reads the output");
    assert_eq!(host.metadata, HipkMetadata::parse(marker).expect("marker"));
    assert_eq!(host.wrappers.len(), r.wrappers);
    let indices: Vec<u32> = (0..r.wrappers as u32).collect();
    assert_eq!(host.hipk_code_objects(), indices);
    assert_eq!(
        fatbin::host_code_objects(KERNEL_NAME, out),
        Err(FatbinError::AlreadySplit)
    );
}
