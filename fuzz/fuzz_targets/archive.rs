//! libFuzzer entry for the `archive` check (body and invariants in src/checks/archive.rs).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = kpack_fuzz::checks::archive::run(data);
});
