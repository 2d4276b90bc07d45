//! One integration-test crate (faster to link than one binary per file).

mod support;

mod open_matrix;
mod roundtrip;
mod interop;
mod cli;

mod golden;

mod alloc_bounds;
mod fuzz_regressions;
