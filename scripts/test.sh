#!/usr/bin/env bash
# The project's test command: installs what the tests need, then runs every test (unit,
# integration, C ABI under ASan/UBSan, real FUSE mounts; valgrind memcheck and ThreadSanitizer
# runs) and a short smoke run of each benchmark
# so they cannot rot. Long benchmarks and fuzzing run by hand (docs/benchmarks.md,
# docs/reliability.md).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup-deps.sh

cargo build --all-targets
cargo test --no-fail-fast
scripts/sanitizers.sh
cargo bench --bench core -- --quick
cargo bench --bench capi -- --quick
cargo bench --bench split -- --quick
cargo bench --bench suite -- --quick
