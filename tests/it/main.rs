//! One integration-test crate (faster to link than one binary per file).

mod support;

mod cli;
mod interop;
mod open_matrix;
mod roundtrip;

mod abi;
mod alloc_bounds;
mod broken_pipe;
mod c_api;
mod c_valgrind;
mod cli_loader;
mod cli_wording;
mod deploy;
mod digests;
mod fatbin;
mod ffi_exports;
mod frame_digest;
mod fuzz_regressions;
mod golden;
mod host_list;
mod install;
mod kernel_index;
mod layers;
mod lazy_open;
mod loader;
mod mount;
mod oci;
mod path_safety;
mod pins;
mod progress;
mod readme;
mod remote;
mod source_faults;
mod split;
mod split_c;
mod split_cli;
mod split_memory;
mod split_tree;
mod tsan_check;
mod unaligned_elf;
