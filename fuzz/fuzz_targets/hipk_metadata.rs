//! libFuzzer entry for the `hipk_metadata` check (body and invariants in src/checks/hipk_metadata.rs).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = kpack_fuzz::checks::hipk_metadata::run(data);
});
