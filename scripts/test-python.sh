#!/usr/bin/env bash
# The Python package's tests, on the two ways docs/python.md installs it, with the commands it
# shows (python/tests/doc_blocks.py finds them there):
#
# 1. The wheel: built by scripts/build-wheel.sh (manylinux_2_28, abi3), installed with pip alone
#    into a fresh virtual environment (target/python-venv/) whose PATH has no cargo or rustc,
#    which is checked; python/tests run against it there, with the debug build's kpack-fuse
#    program and librocm_kpack.so for the interoperability tests. Then a smoke run of the Python
#    benchmark (bench/python_api.py --quick: no verdicts).
# 2. From source: `pip install ./python` into another fresh environment (target/python-src-venv/),
#    with CARGO_TARGET_DIR=target/, reusing the crates the release build compiled; the document's
#    examples (python/tests/test_docs.py) run against that install.
#
# Needs Rust, python3 with venv, binutils and network access to PyPI (maturin, zig, pytest,
# msgpack, zstandard); scripts/setup-deps.sh installs python3-venv and binutils.
set -euo pipefail
cd "$(dirname "$0")/.."

repo="$PWD"
venv="$repo/target/python-venv"
src_venv="$repo/target/python-src-venv"

say() { echo "test-python: $*"; }
fail() { echo "test-python: FAIL: $*" >&2; exit 1; }

# doc_block NAME: the commands of block NAME of docs/python.md, run as they stand under bash in
# the current directory and environment, and timed.
doc_block() {
  local text start=$SECONDS
  text="$(python3 "$repo/python/tests/doc_blocks.py" "$1")" || exit 1
  say "running the documented commands '$1': $text"
  bash -euo pipefail -c "$text" || fail "the commands of '$1' in docs/python.md failed"
  say "'$1' took $((SECONDS - start)) s"
}

# PATH without its directories that hold cargo or rustc: what a machine without Rust has.
no_rust_path() {
  local dir kept=()
  IFS=: read -ra dirs <<< "$PATH"
  for dir in "${dirs[@]}"; do
    [ -e "$dir/cargo" ] || [ -e "$dir/rustc" ] || kept+=("$dir")
  done
  (IFS=:; echo "${kept[*]}")
}

# install_and_test BLOCK TESTS: in the environment of the caller's PATH, runs the install
# commands BLOCK of docs/python.md in the current directory, adds the tests' dependencies and runs
# pytest on TESTS from target/ (outside the source tree, so that `import kpack_fuse` finds the
# installed package).
install_and_test() {
  doc_block "$1"
  pip install -q --disable-pip-version-check pytest msgpack zstandard
  cd "$repo/target"
  python -c 'import kpack_fuse._native as m; print("test-python: testing", m.__file__)'
  python -m pytest -q -p no:cacheprovider "$2"
}

cargo build --bin kpack-fuse --lib
export KPACK_FUSE_BIN="$repo/target/debug/kpack-fuse"
export KPACK_FUSE_LIB="$repo/target/debug/librocm_kpack.so"

# 1. The wheel, with pip alone.
doc_block build-wheel
rm -rf -- "$venv"
python3 -m venv "$venv"
(
  export PATH="$venv/bin:$(no_rust_path)" VIRTUAL_ENV="$venv"
  unset CARGO_HOME RUSTUP_HOME RUSTUP_TOOLCHAIN
  for tool in cargo rustc; do
    ! command -v "$tool" >/dev/null || fail "$tool is still on PATH: $(command -v "$tool")"
  done
  say "no cargo or rustc on PATH: $PATH"
  cd "$repo/target/wheels"
  install_and_test install-wheel "$repo/python/tests"
  python "$repo/bench/python_api.py" --quick
)

# 2. From source, with Rust.
rm -rf -- "$src_venv"
python3 -m venv "$src_venv"
(
  export PATH="$src_venv/bin:$PATH" VIRTUAL_ENV="$src_venv" CARGO_TARGET_DIR="$repo/target"
  install_and_test install-source "$repo/python/tests/test_docs.py"

  # The source install's module is linked against this machine's glibc: where that is newer
  # than the wheel's floor (2.28), scripts/build-wheel.sh's check must refuse it.
  glibc="$(getconf GNU_LIBC_VERSION | sed 's/^glibc //')"
  if [ "$(printf '2.28\n%s\n' "$glibc" | sort -V | tail -n 1)" = 2.28 ]; then
    say "glibc $glibc is not newer than 2.28: the glibc check's refusal is not tested here"
  else
    tmp="$(mktemp -d)"
    trap 'rm -rf -- "$tmp"' EXIT
    site="$(python -c 'import kpack_fuse, pathlib; print(pathlib.Path(kpack_fuse.__file__).parent)')"
    (cd "$site/.." && python -m zipfile -c "$tmp/source-build.whl" kpack_fuse)
    status=0
    "$repo/scripts/build-wheel.sh" --check "$tmp/source-build.whl" 2> "$tmp/err" || status=$?
    want="^build-wheel: kpack_fuse/_native\.abi3\.so in source-build\.whl needs glibc 2\.[0-9]+,"
    [ "$status" = 1 ] && grep -qE "$want newer than 2\.28:\$" "$tmp/err" \
      || { cat "$tmp/err" >&2; fail "build-wheel.sh --check passed a module built on glibc $glibc"; }
    say "build-wheel.sh --check refuses the source install's module: $(head -n 1 "$tmp/err")"
  fi
)
