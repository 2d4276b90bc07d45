//! One integration-test crate (faster to link than one binary per file).

mod support;

mod open_matrix;
mod roundtrip;
mod interop;
mod cli;

mod abi;
mod c_api;
mod cli_loader;
mod golden;
mod mount;
mod fatbin;
mod deploy;
mod install;
mod loader;
mod split;
mod split_c;
mod split_cli;
mod alloc_bounds;
mod fuzz_regressions;
mod path_safety;
mod c_valgrind;
mod tsan_check;
