//! One integration-test crate (faster to link than one binary per file).

mod support;

mod abi;
mod c_api;
mod cli_loader;
mod golden;
mod install;
