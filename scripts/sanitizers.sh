#!/usr/bin/env bash
# Sanitizer runs (see docs/reliability.md, "Sanitizers"):
#
#   1. valgrind memcheck of the C test programs against a build without ASan: api.c, loader.c
#      (also part of `cargo test`), threads.c and hipk_host.c. Any error or definite leak fails.
#   2. ThreadSanitizer (nightly, std rebuilt with -Zbuild-std) over the Rust concurrency tests:
#      the cache's single-flight and the loader cache's open-once unit tests, the loader's
#      concurrent integration test, and the mount's concurrent-reader tests, where the daemon
#      is the TSan-built kpack-fuse binary. Any report fails.
#
# usage: scripts/sanitizers.sh [--quick | --full]
#   --quick   memcheck only (about 15 s once built; no nightly needed)
#   default   memcheck + TSan on the unit and loader tests and two mount tests
#   --full    also every mount concurrency/fault test under TSan (hand runs; longer)
#
# The TSan build goes to target/tsan (first build several minutes: std, dependencies, tests).
# Mount tests need root and /dev/fuse; without them they skip (as in `cargo test`).
set -euo pipefail
cd "$(dirname "$0")/.."

mode=${1:-default}
case "$mode" in --quick | default | --full) ;; *) echo "usage: $0 [--quick|--full]" >&2; exit 2 ;; esac

step() { printf '\n== %s ==\n' "$*"; }
start=$SECONDS

step "valgrind memcheck: api.c, loader.c, threads.c, hipk_host.c (no ASan)"
command -v valgrind >/dev/null || { echo "valgrind is not installed" >&2; exit 1; }
cargo test --test it -- --include-ignored --exact \
    c_api::c_api_suites_under_valgrind c_valgrind::memcheck_threads_and_hipk_host

if [[ $mode == --quick ]]; then
    echo "sanitizers (quick) passed in $((SECONDS - start)) s"
    exit 0
fi

step "ThreadSanitizer (nightly, -Zbuild-std)"
if ! rustup component list --toolchain nightly --installed 2>/dev/null | grep -q '^rust-src'; then
    echo "needs the nightly toolchain with rust-src: rustup component add rust-src --toolchain nightly" >&2
    exit 1
fi
host=$(rustc +nightly -vV | sed -n 's/^host: //p')
export RUSTFLAGS="-Zsanitizer=thread" RUSTDOCFLAGS="-Zsanitizer=thread" CARGO_TARGET_DIR=target/tsan
# Reports fail the process (exit 66), including the mount daemon, whose non-zero exit fails
# the mount test that stops it. Rust's std is instrumented (build-std), so no suppressions.
export TSAN_OPTIONS="exitcode=66 halt_on_error=0 second_deadlock_stack=1"
tsan() { cargo +nightly test -Zbuild-std --target "$host" "$@"; }

# The instrumented std and tests are built first, in the open: several minutes on a first run.
tsan --lib --test it --no-run

# Self-check first: a deliberate race must be reported, or a clean run below means nothing.
if out=$(tsan --test it -- --ignored --exact tsan_check::tsan_self_check_a_deliberate_race_is_reported 2>&1); then
    echo "$out" | tail -20
    echo "TSan did not report the deliberate race: the setup is broken" >&2
    exit 1
fi
grep -q "WARNING: ThreadSanitizer: data race" <<<"$out" || { echo "$out" | tail -20; exit 1; }
echo "self-check: the deliberate race was reported"

tsan --lib -q -- cache::tests:: loader::archive_cache::tests:: fs::tests::
mount_tests=(mount::eight_concurrent_readers mount::single_flight_one_decode_for_eight_cold_readers)
if [[ $mode == --full ]]; then
    mount_tests+=(mount::faults:: mount::kernel_larger_than_cache_decoded_once_in_small_chunks
        mount::sigterm_with_a_file_open_detaches_and_exits_after_release)
fi
# The RSS bound of the pressure test does not hold under TSan's shadow memory: skipped there.
deadline=300; [[ $mode == --full ]] && deadline=900  # 16 x 2,000 checked reads take ~5 min under TSan
KPACK_IT_DEADLINE_SECS=$deadline tsan --test it -- loader::concurrent_loads_open_each_archive_once "${mount_tests[@]}" \
    --skip tiny_cache_under_pressure

echo "sanitizers ($mode) passed in $((SECONDS - start)) s"
