# Shared by the tests in tests/deploy/ (sourced): running the commands docs/deploy.md shows,
# podman's configuration for the test machine, and the kernels' expected checksums.
#
# The documented commands are the tests: a fenced block that follows a line
# `<!-- test: NAME -->` in docs/deploy.md is run as it stands by `run_doc NAME`, from the
# repository root, under bash -euo pipefail and a time limit, with the variables the document
# names (KPACK, SHARE, ...) set by the test.

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"

# The test's name in messages.
test_name="$(basename -- "$0" .sh)"

say() { echo "deploy/$test_name: $*" >&2; }
fail() { echo "deploy/$test_name: FAIL: $*" >&2; exit 1; }

# doc_block NAME: the text of the code block after `<!-- test: NAME -->` in docs/deploy.md.
doc_block() {
  local text
  # A block in a list item is indented: the marker and fence may be, and the fence's indentation
  # is taken off each line.
  text="$(awk -v want="<!-- test: $1 -->" '
    { line = $0; sub(/^ +/, "", line) }
    line == want { armed = 1; next }
    armed == 1 && line ~ /^```/ { inside = 1; armed = 2; indent = index($0, "`") - 1; next }
    inside && line ~ /^```/ { exit }
    inside { print substr($0, indent + 1) }
  ' docs/deploy.md)"
  [ -n "$text" ] || fail "docs/deploy.md has no block marked <!-- test: $1 -->"
  printf '%s\n' "$text"
}

# source_doc NAME: runs that block in the calling shell, for the variables it sets.
source_doc() {
  local block
  block="$(doc_block "$1")" || exit 1
  say "setting the documented variables '$1'"
  eval "$block" || fail "the commands of '$1' failed"
}

# run_doc NAME SECONDS: runs that block; its standard output is the caller's.
run_doc() {
  local block
  block="$(doc_block "$1")" || exit 1
  say "running the documented commands '$1'"
  timeout --kill-after=10 "$2" bash -euo pipefail -c "$block" \
    || fail "the commands of '$1' failed or took more than $2 s (status $?)"
}

# run_doc_failing NAME SECONDS STATUS TEXT: runs that block, which must exit with STATUS and
# print TEXT (a whole line) on its standard error.
run_doc_failing() {
  local block status=0
  block="$(doc_block "$1")" || exit 1
  say "running the documented commands '$1' (they must fail with status $3)"
  timeout --kill-after=10 "$2" bash -euo pipefail -c "$block" > /dev/null 2> "$work/$1.err" || status=$?
  [ "$status" -eq "$3" ] || { cat "$work/$1.err" >&2; fail "'$1' exited with $status, not $3"; }
  grep -qxF -- "$4" "$work/$1.err" || { cat "$work/$1.err" >&2; fail "'$1' did not print: $4"; }
}

# need_root_tools TOOL...: the tests mount and run containers: root, /dev/fuse and the tools.
need_root_tools() {
  [ "$(id -u)" -eq 0 ] || fail "needs root"
  [ -c /dev/fuse ] || fail "needs /dev/fuse"
  local t
  for t in "$@"; do command -v "$t" >/dev/null || fail "$t not found (scripts/setup-deps.sh installs it)"; done
}

# use_test_podman_config DIR: podman's configuration for these tests, in DIR/containers.conf.
# The containers' resource limits are the ones this process has: podman asks for more than the
# machine's hard limits by default, which a process without CAP_SYS_RESOURCE cannot grant. runc
# rather than crun, because crun refuses hosts whose cgroup v2 hierarchy has controllers next to
# v1 ones ("hybrid mode"). The machines have no systemd, which podman runs healthchecks with on a
# timer: DISABLE_HC_SYSTEMD keeps it from trying (and logging an error for each container); the
# tests run the checks themselves. None of this changes what the commands do.
use_test_podman_config() {
  local nproc
  nproc="$(ulimit -Hu)"
  [ "$nproc" = unlimited ] || [ "$nproc" -gt 32768 ] && nproc=32768
  cat > "$1/containers.conf" <<CONF
[containers]
default_ulimits = ["nofile=$(ulimit -Hn):$(ulimit -Hn)", "nproc=$nproc:$nproc"]

[engine]
runtime = "runc"
CONF
  export CONTAINERS_CONF="$1/containers.conf"
  export DISABLE_HC_SYSTEMD=true
}

# kernel_sums ARCHIVE DIR: what the documented commands print for ARCHIVE, made on the host by
# kpack-fuse extract into DIR: the SHA-256 of every kernel, by path, sorted.
kernel_sums() {
  "$root/target/release/kpack-fuse" extract "$1" "$2" >/dev/null \
    || fail "kpack-fuse extract $1 failed"
  (cd "$2" && find . -type f -name '*.hsaco' -exec sha256sum {} + | LC_ALL=C sort -k2)
}

# kernels_at DIR: the same listing as kernel_sums, read through DIR; fails where DIR cannot be read.
kernels_at() {
  (cd "$1" && find . -type f -name '*.hsaco' -exec sha256sum {} + | LC_ALL=C sort -k2)
}

# wait_serving DIR EXPECTED SECONDS WHAT: waits until DIR is one kpack-fuse mount (no dead one
# left beneath it) through which the kernels read as EXPECTED (kernel_sums).
wait_serving() {
  local i got=""
  for i in $(seq $(($3 * 5))); do
    if [ "$(findmnt -n -o FSTYPE "$1" 2>/dev/null)" = fuse.kpack-fuse ] \
        && got="$(kernels_at "$1" 2>/dev/null)" && [ "$got" = "$2" ]; then
      return 0
    fi
    sleep 0.2
  done
  findmnt "$1" >&2 || true
  fail "$4: $1 did not serve the kernels within $3 s"
}

# is_dead_mount DIR: whether DIR is a mount whose daemon is gone: listed in the mount table, and
# asking it fails with ENOTCONN.
is_dead_mount() {
  local err
  findmnt -n "$1" >/dev/null 2>&1 || return 1
  err="$(LC_ALL=C stat -f -- "$1" 2>&1 >/dev/null)" && return 1
  case "$err" in *'Transport endpoint is not connected'*) return 0 ;; *) return 1 ;; esac
}

# host_pid CONTAINER COMMAND: the host PID of the process named COMMAND in CONTAINER.
host_pid() {
  local pid
  pid="$(podman top "$1" hpid comm | awk -v c="$2" '$2 == c && !found { print $1; found = 1 }')"
  [ -n "$pid" ] || fail "no $2 process in $1"
  printf '%s\n' "$pid"
}

# wait_restarted CONTAINER COUNT SECONDS WHAT: waits until podman has restarted CONTAINER COUNT
# times and it runs.
wait_restarted() {
  local i state=""
  for i in $(seq $(($3 * 5))); do
    state="$(podman inspect -f '{{.RestartCount}} {{.State.Status}}' "$1" 2>/dev/null)" || state=""
    [ "$state" = "$2 running" ] && return 0
    sleep 0.2
  done
  podman logs "$1" >&2 || true
  fail "$4: $1 was not restarted within $3 s (restarts, state: $state)"
}

# logged CONTAINER TEXT WHAT: waits up to 10 s for the line TEXT in the container's log.
logged() {
  local i out=""
  for i in $(seq 50); do
    out="$(podman logs "$1" 2>&1)" || true
    grep -qxF -- "$2" <<<"$out" && return 0
    sleep 0.2
  done
  printf '%s\n' "$out" >&2
  fail "$3: $1 did not log: $2"
}

# same_text WHAT EXPECTED ACTUAL: fails with a diff unless the two texts are equal.
same_text() {
  if [ "$2" != "$3" ]; then
    diff <(printf '%s\n' "$2") <(printf '%s\n' "$3") >&2 || true
    fail "$1: not the expected bytes (diff above: < expected, > actual)"
  fi
}

# untested_doc_blocks: the code blocks of the Containers and Kubernetes sections of
# docs/deploy.md that no test runs: unmarked ones other than the Docker block (the machines have
# no Docker daemon), and marked ones whose name no test in tests/deploy/ passes to run_doc.
untested_doc_blocks() {
  local name
  awk '
    /^## / { in_scope = ($0 == "## Containers" || $0 == "## Kubernetes") }
    !in_scope { next }
    { line = $0; sub(/^ +/, "", line) }
    line ~ /^<!-- test: / { marked = 1; next }
    line ~ /^```/ && !inside { inside = 1; first = ""; next }
    inside && line ~ /^```/ {
      inside = 0
      if (!marked && first !~ /^docker build /) print "unmarked block: " first
      marked = 0
      next
    }
    inside && first == "" { first = line }
  ' docs/deploy.md
  for name in $(sed -n 's/^ *<!-- test: \(.*\) -->$/\1/p' docs/deploy.md); do
    grep -qE "(run_doc(_failing)?|source_doc) $name( |\$)" tests/deploy/*.sh || echo "block '$name' is run by no test"
  done
}
