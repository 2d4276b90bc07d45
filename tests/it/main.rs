//! One integration-test crate (faster to link than one binary per file).

mod support;

mod golden;
mod mount;
