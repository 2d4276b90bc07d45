//! libFuzzer entry for the `maps` check (body and invariants in src/checks/maps.rs).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = kpack_fuzz::checks::maps::run(data);
});
