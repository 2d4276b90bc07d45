//! libFuzzer entry for the `archive_mutate` check (body and invariants in src/checks/archive_mutate.rs).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = kpack_fuzz::checks::archive_mutate::run(data);
});
