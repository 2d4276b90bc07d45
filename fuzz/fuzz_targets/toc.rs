//! libFuzzer entry for the `toc` check (body and invariants in src/checks/toc.rs).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = kpack_fuzz::checks::toc::run(data);
});
