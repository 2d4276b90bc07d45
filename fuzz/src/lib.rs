//! Fuzz target bodies for kpack-fuse. The `checks` module holds no libFuzzer code so the stable
//! regression replay (tests/it/fuzz_regressions.rs) can include it verbatim.

pub mod checks;
