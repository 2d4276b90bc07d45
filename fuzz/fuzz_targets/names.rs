//! libFuzzer entry for the `names` check (body and invariants in src/checks/names.rs).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = kpack_fuzz::checks::names::run(data);
});
