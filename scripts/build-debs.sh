#!/usr/bin/env bash
# Builds the Debian packages kpack-fuse (program, mount helper, man pages, systemd unit,
# examples), librocm-kpack0 (the shared library) and librocm-kpack-dev (headers, static library,
# pkg-config and CMake files) from this repository, and writes them to target/debian/ along with
# the .changes and .buildinfo files. It runs dpkg-buildpackage with debhelper (debian/) in a
# scratch copy of debian/ under target/debian/, so that nothing is written into the repository
# or its parent directory.
#
#   scripts/build-debs.sh                       # cargo build --release first
#   scripts/build-debs.sh --from target/release # package a finished release build
#
# Build dependencies are not checked (dpkg-buildpackage -d): the Rust toolchain usually comes
# from rustup, not from Debian packages. Needs dpkg-dev and debhelper.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"

die() { echo "build-debs: $*" >&2; exit 1; }

from=""
while [ $# -gt 0 ]; do
  case "$1" in
    --from) from="${2:?--from needs a directory}"; shift 2 ;;
    --from=*) from="${1#*=}"; shift ;;
    -h|--help) awk 'NR == 1 { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "$0"; exit 0 ;;
    *) die "unknown option: $1" ;;
  esac
done

command -v dpkg-buildpackage >/dev/null || die "dpkg-buildpackage not found (package dpkg-dev)"
command -v dh >/dev/null || die "dh not found (package debhelper)"

# The package version is the crate's: the changelog must agree.
version="$(sed -n 's/^version = "\(.*\)"$/\1/p' "$root/Cargo.toml" | head -n 1)"
changelog_version="$(dpkg-parsechangelog -l "$root/debian/changelog" -S Version)"
[ "$version" = "$changelog_version" ] \
  || die "debian/changelog is at $changelog_version, Cargo.toml at $version: add a changelog entry"

if [ -z "$from" ]; then
  (cd "$root" && cargo build --release --locked --lib --bin kpack-fuse)
  from="${CARGO_TARGET_DIR:-$root/target}/release"
fi
case "$from" in /*) ;; *) from="$(pwd)/$from" ;; esac
[ -f "$from/librocm_kpack.so" ] || die "$from/librocm_kpack.so not found"

out="$root/target/debian"
rm -rf -- "$out"
mkdir -p -- "$out/tree"
cp -r -- "$root/debian" "$out/tree/debian"
(cd "$out/tree" && KPACK_SRC="$root" KPACK_FROM="$from" dpkg-buildpackage -b --no-sign -d) \
  > "$out/build.log" 2>&1 || { tail -n 40 "$out/build.log" >&2; die "dpkg-buildpackage failed (log: $out/build.log)"; }
rm -rf -- "$out/tree"

arch="$(dpkg --print-architecture)"
for p in kpack-fuse librocm-kpack0 librocm-kpack-dev; do
  [ -f "$out/${p}_${version}_${arch}.deb" ] || die "${p}_${version}_${arch}.deb was not built"
  echo "$out/${p}_${version}_${arch}.deb"
done
