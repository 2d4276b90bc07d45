#!/usr/bin/env bash
# The Python package's tests: builds the abi3 wheel of python/ with maturin (release), installs it
# into a fresh virtual environment with pytest, and runs python/tests against it, with the debug
# build's kpack-fuse program and librocm_kpack.so for the interoperability tests. Then a smoke
# run of the Python benchmark (bench/python_api.py --quick: no verdicts).
#
# The wheel's build shares target/ with the root package, so the core and its dependencies are
# compiled once for both. Needs python3 with venv and network access to PyPI (maturin, pytest,
# msgpack, zstandard); scripts/setup-deps.sh installs python3-venv.
set -euo pipefail
cd "$(dirname "$0")/.."

repo="$PWD"
venv="$repo/target/python-venv"
wheels="$repo/target/wheels"

cargo build --bin kpack-fuse --lib
rm -rf "$venv" "$wheels"
python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip
"$venv/bin/python" -m pip install -q "maturin>=1.5,<2" pytest msgpack zstandard
CARGO_TARGET_DIR="$repo/target" "$venv/bin/maturin" build --release -q \
  -m python/Cargo.toml -o "$wheels"
"$venv/bin/python" -m pip install -q "$wheels"/kpack_fuse-*.whl

export KPACK_FUSE_BIN="$repo/target/debug/kpack-fuse"
export KPACK_FUSE_LIB="$repo/target/debug/librocm_kpack.so"
# From outside the source tree, so that `import kpack_fuse` finds the installed wheel.
cd "$repo/target"
"$venv/bin/python" -m pytest -q -p no:cacheprovider "$repo/python/tests"
"$venv/bin/python" "$repo/bench/python_api.py" --quick
