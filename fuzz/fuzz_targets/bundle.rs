//! libFuzzer entry for the `bundle` check (body and invariants in src/checks/bundle.rs).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = kpack_fuzz::checks::bundle::run(data);
});
