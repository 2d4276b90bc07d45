//! libFuzzer entry for the `target_id` check (body and invariants in src/checks/target_id.rs).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = kpack_fuzz::checks::target_id::run(data);
});
