//! libFuzzer entry for the `zstd_index` check (body and invariants in src/checks/zstd_index.rs).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = kpack_fuzz::checks::zstd_index::run(data);
});
