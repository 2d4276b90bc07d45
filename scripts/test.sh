#!/usr/bin/env bash
# The project's test command: installs what the tests need, then runs every test (unit,
# integration, C ABI under sanitizers, real FUSE mounts) and a short smoke run of each benchmark
# so they cannot rot. Long benchmarks and fuzzing run by hand (docs/benchmarks.md,
# docs/reliability.md).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup-deps.sh

cargo build --all-targets
cargo test --no-fail-fast
cargo bench --bench core -- --quick
cargo bench --bench capi -- --quick
cargo bench --bench split -- --quick
cargo bench --bench suite -- --quick
