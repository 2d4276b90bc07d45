#!/usr/bin/env bash
# The project's test command: installs what the tests need (scripts/setup-deps.sh; README.md
# lists what that is), then runs every test (unit, integration, C ABI under ASan/UBSan, real FUSE
# mounts; valgrind memcheck and ThreadSanitizer runs), a short smoke run of each benchmark so they
# cannot rot (smoke runs print no verdicts: they are not measurements), checks the size of a
# stripped release install, and builds and runs the container image, the Kubernetes manifests
# (podman) and the Debian packages (tests/deploy/). Long benchmarks and fuzzing run by hand
# (docs/benchmarks.md, docs/reliability.md).
#
# Every step runs even when an earlier one failed; the last line counts them
# ("test.sh: N passed, N failed") and the exit status is non-zero when any failed.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup-deps.sh

passed=()
failed=()

# step NAME COMMAND...: runs one step, says when it starts and how it ended, and records it.
step() {
  local name="$1" start=$SECONDS
  shift
  echo "==> test.sh: $name"
  if "$@"; then
    passed+=("$name")
    echo "<== test.sh: $name: passed in $((SECONDS - start)) s"
  else
    failed+=("$name")
    echo "<== test.sh: $name: FAILED after $((SECONDS - start)) s"
  fi
}

# The installed program and library of a release build, stripped by scripts/install.sh, stay
# within the limits below (the program is about 11 MB, the library about 1 MB), so that a change
# that pulls in a large dependency is noticed.
release_install_sizes() {
  local tmp status=0
  tmp="$(mktemp -d)"
  scripts/install.sh --profile release --prefix "$tmp/prefix" --sbindir none >/dev/null || status=1
  if [ "$status" = 0 ]; then
    local program lib
    program="$(stat -c %s "$tmp/prefix/bin/kpack-fuse")"
    lib="$(stat -c %s "$tmp/prefix/lib/librocm_kpack.so.0."*)"
    echo "installed kpack-fuse: $program bytes (limit 12 MiB); librocm_kpack.so: $lib bytes (limit 8 MiB)"
    [ "$program" -lt $((12 << 20)) ] || { echo "kpack-fuse is too large" >&2; status=1; }
    [ "$lib" -lt $((8 << 20)) ] || { echo "librocm_kpack.so is too large" >&2; status=1; }
  fi
  rm -rf -- "$tmp"
  return "$status"
}

step "build" cargo build --all-targets
# -q: a dot per passed test instead of a line each; failures are printed in full.
step "cargo test" cargo test --no-fail-fast -q
step "sanitizers" scripts/sanitizers.sh
step "bench core --quick" cargo bench --bench core -- --quick
step "bench capi --quick" cargo bench --bench capi -- --quick
step "bench split --quick" cargo bench --bench split -- --quick
step "bench suite --quick" cargo bench --bench suite -- --quick
step "bench mount_scale --quick" cargo bench --bench mount_scale -- --quick
step "bench remote --quick" cargo bench --bench remote -- --quick
step "python" scripts/test-python.sh
step "release install sizes" release_install_sizes
# After the release build above, which they reuse (tests/deploy/: root, /dev/fuse, podman).
step "container image (podman)" tests/deploy/container.sh
step "kubernetes manifests (podman kube play)" tests/deploy/kube.sh
step "kernel packs from a registry (podman, kube play)" tests/deploy/kube-oci.sh
step "debian packages" tests/deploy/debs.sh

if [ "${#failed[@]}" -gt 0 ]; then
  printf 'test.sh: failed: %s\n' "$(IFS=,; echo "${failed[*]}" | sed 's/,/, /g')"
fi
echo "test.sh: ${#passed[@]} passed, ${#failed[@]} failed"
[ "${#failed[@]}" -eq 0 ]
