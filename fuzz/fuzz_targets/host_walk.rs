//! libFuzzer entry for the `host_walk` check (body and invariants in src/checks/host_walk.rs).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    kpack_fuzz::checks::host_walk::run(data);
});
