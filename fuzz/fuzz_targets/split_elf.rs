//! libFuzzer entry for the `split_elf` check (body and invariants in src/checks/split_elf.rs).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    kpack_fuzz::checks::split_elf::run(data);
});
