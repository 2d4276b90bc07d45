//! libFuzzer entry for the `hipk_host` check (body and invariants in src/checks/hipk_host.rs).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    kpack_fuzz::checks::hipk_host::run(data);
});
