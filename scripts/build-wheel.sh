#!/usr/bin/env bash
# Builds the Python package's wheel, the one a user installs with pip alone (no Rust), into
# target/wheels/ (or the directory given with --out), and prints its path as the last line.
#
# The wheel is abi3 (one file for CPython 3.8 and newer) and tagged manylinux_2_28_x86_64: it
# needs glibc 2.28 or newer (RHEL 8 and every later distribution ROCm supports). A build on this
# machine's newer glibc would pick up newer symbol versions, so zig links the native module
# against glibc 2.28's symbols (maturin --zig), and maturin checks the result against the
# manylinux_2_28 policy (--auditwheel check: it fails on any library outside the policy rather
# than copying it into the wheel). The script then checks the module itself: no glibc symbol
# newer than 2.28.
#
# maturin and zig come from PyPI into a virtual environment of their own (target/wheel-tools/),
# pinned to the versions this was checked with. The build has a target directory of its own
# (target/wheel-build/): maturin points the C compiler and linker variables of the x86_64 target
# at zig, which must not reach the root package's release build that other tests reuse.
# Needs Rust 1.85 or newer, python3 with venv, binutils (objdump), network access to PyPI.
set -euo pipefail

usage() { echo "usage: scripts/build-wheel.sh [--out DIR] | --check WHEEL" >&2; exit 2; }
out=""
check=""
while [ $# -gt 0 ]; do
  case "$1" in
    --out) [ $# -ge 2 ] || usage; out="$(realpath -m -- "$2")"; shift 2 ;;
    --check) [ $# -ge 2 ] || usage; check="$(realpath -m -- "$2")"; shift 2 ;;
    *) usage ;;
  esac
done
cd "$(dirname "$0")/.."
out="${out:-$PWD/target/wheels}"

policy=manylinux_2_28
glibc_floor=2.28
tools="$PWD/target/wheel-tools"

# check_wheel WHEEL: fails unless the native module in WHEEL asks for no glibc symbol version
# newer than the floor; says what it found.
unpacked=""
check_wheel() {
  local module newest name
  unpacked="$(mktemp -d)"
  trap 'rm -rf -- "$unpacked"' EXIT
  python3 -m zipfile -e "$1" "$unpacked" 2>/dev/null \
    || { echo "build-wheel: $1: not a wheel (cannot unpack it)" >&2; exit 1; }
  module="$(cd "$unpacked" && find kpack_fuse -name '_native*.so')"
  [ -n "$module" ] && [ "$(wc -l <<< "$module")" -eq 1 ] \
    || { echo "build-wheel: $1 holds no single kpack_fuse/_native*.so" >&2; exit 1; }
  name="$module in $(basename -- "$1")"
  newest="$(objdump -T "$unpacked/$module" | grep -o 'GLIBC_[0-9.]*' | sed 's/^GLIBC_//' |
    sort -Vu | tail -n 1)"
  [ -n "$newest" ] || { echo "build-wheel: $name: no glibc symbol versions found" >&2; exit 1; }
  if [ "$(printf '%s\n%s\n' "$newest" "$glibc_floor" | sort -V | tail -n 1)" != "$glibc_floor" ]
  then
    echo "build-wheel: $name needs glibc $newest, newer than $glibc_floor:" >&2
    objdump -T "$unpacked/$module" | grep -F "(GLIBC_$newest)" >&2
    exit 1
  fi
  echo "build-wheel: $name: newest glibc symbol version $newest (limit $glibc_floor)," \
    "needs $(objdump -p "$unpacked/$module" | sed -n 's/^ *NEEDED *//p' | paste -sd' ')"
}

if [ -n "$check" ]; then
  check_wheel "$check"
  exit 0
fi

[ -x "$tools/bin/python" ] || python3 -m venv "$tools"
"$tools/bin/python" -m pip install -q --disable-pip-version-check \
  "maturin==1.16.0" "ziglang==0.17.1"

# Only this build's wheel is left in the output directory, so that the caller finds one file.
mkdir -p -- "$out"
rm -f -- "$out"/kpack_fuse-*.whl
# maturin runs zig as `python3 -m ziglang` when there is no `zig`: the python3 of the tools.
PATH="$tools/bin:$PATH" CARGO_TARGET_DIR="$PWD/target/wheel-build" \
  "$tools/bin/maturin" build --release --zig --compatibility "$policy" --auditwheel check \
  -m python/Cargo.toml -o "$out"

shopt -s nullglob
wheels=("$out"/kpack_fuse-*-cp38-abi3-"$policy"_x86_64.whl)
[ "${#wheels[@]}" -eq 1 ] || {
  echo "build-wheel: expected one kpack_fuse-*-cp38-abi3-${policy}_x86_64.whl in $out, found:" \
    "$(ls "$out")" >&2
  exit 1
}
check_wheel "${wheels[0]}"
echo "${wheels[0]}"
