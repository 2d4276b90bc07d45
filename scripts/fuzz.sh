#!/usr/bin/env bash
# Runs one cargo-fuzz target for a fixed time at the lowest CPU priority, starting from the
# committed seeds, and prints libFuzzer's final statistics.
#
#   scripts/fuzz.sh TARGET [SECONDS]     # default 600 s; TARGET as in fuzz/Cargo.toml
#   scripts/fuzz.sh --list               # the targets
#   scripts/fuzz.sh --smoke [SECONDS]    # every target in turn, SECONDS each (default 10)
#
# Needs cargo-fuzz (`cargo install cargo-fuzz`) and a nightly toolchain; without nightly it
# sets RUSTC_BOOTSTRAP=1 on stable. The working corpus lives in fuzz/corpus/TARGET (not
# committed); new crashes land in fuzz/artifacts/TARGET/. To keep one: copy it into
# tests/fixtures/fuzz/TARGET/, where `cargo test` (fuzz_regressions) replays it on stable.
# The full log is kept in fuzz/logs/TARGET-<time>.log.
#
# Not meant for .ci/run, not even --smoke: the sanitizer build of the fuzz crate alone takes
# about ten minutes on the 2-core machine, and it needs nightly plus cargo-fuzz installed.
# `cargo test` (tests/it/fuzz_regressions.rs) already replays every committed input on stable.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root/fuzz"

targets=$(sed -n 's/^name = "\(.*\)"$/\1/p' Cargo.toml | grep -v '^kpack-fuzz$')
if [[ "${1:-}" == "--list" ]]; then
    echo "$targets"
    exit 0
fi
if [[ "${1:-}" == "--smoke" ]]; then
    status=0
    for t in $targets; do
        "$0" "$t" "${2:-10}" || status=1
    done
    exit "$status"
fi
target="${1:?usage: scripts/fuzz.sh TARGET [SECONDS] (see --list)}"
seconds="${2:-600}"
grep -qx "$target" <<<"$targets" || { echo "unknown target $target; one of:" $targets >&2; exit 2; }

toolchain=()
if cargo +nightly --version >/dev/null 2>&1; then
    toolchain=(+nightly)
else
    export RUSTC_BOOTSTRAP=1
fi

corpus="corpus/$target"
mkdir -p "$corpus" logs
cp -n "$root/tests/fixtures/fuzz/$target/"* "$corpus/" 2>/dev/null || true
log="logs/$target-$(date -u +%Y%m%dT%H%M%S).log"

# -rss_limit_mb: a single input that makes the process use 2 GiB counts as a finding (the
# default malloc limit follows it). -timeout: one input taking 10 s is a hang.
nice -n 19 cargo "${toolchain[@]}" fuzz run "$target" "$corpus" -- \
    -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 \
    >"$log" 2>&1 && status=0 || status=$?

grep -E '^(stat::|#[0-9]+\s+(INITED|DONE)|Done [0-9]+ runs)' "$log" || true
ls "artifacts/$target" 2>/dev/null | sed 's/^/artifact: /' || true
echo "log: fuzz/$log (exit $status)"
exit "$status"
