#!/bin/sh
# Fetches a Debian package with `apt-get download` and extracts it, for tests and benchmarks
# that need a real ROCm host library. Usage: fetch-debian-lib.sh PACKAGE NAME LIBRARY, where
# NAME names the extracted tree in the data directory and LIBRARY is the library's path inside
# the package (for example librocrand1 rocrand usr/lib/x86_64-linux-gnu/librocrand.so.1.1).
# Prints the path of the extracted library on stdout (and nothing else there), so scripts and
# tests can capture it.
#
# Idempotent: an already extracted library, or an already downloaded .deb, is reused.
# Data goes to bench/data/ (git-ignored), or to $KPACK_BENCH_DATA if set.
set -eu

[ $# -eq 3 ] || { echo "usage: fetch-debian-lib.sh PACKAGE NAME LIBRARY" >&2; exit 2; }
pkg=$1
name=$2
rel=$3
here=$(cd "$(dirname "$0")" && pwd)
data=${KPACK_BENCH_DATA:-$here/data}
lib=$data/$name/$rel

if [ -f "$lib" ]; then
    echo "$lib"
    exit 0
fi

mkdir -p "$data"
cd "$data"
# Two runs at once (tests and a benchmark) take turns instead of racing on the same files.
if command -v flock >/dev/null 2>&1; then
    exec 9>".fetch-$name.lock"
    flock 9
    if [ -f "$lib" ]; then
        echo "$lib"
        exit 0
    fi
fi

deb=$(ls "${pkg}"_*_amd64.deb 2>/dev/null | head -n 1 || true)
if [ -z "$deb" ]; then
    command -v apt-get >/dev/null 2>&1 || { echo "fetch-debian-lib: apt-get is not available on this system" >&2; exit 1; }
    # apt-get download writes progress on stdout; keep stdout for the result path. Fresh
    # machines (containers) often have no package lists yet: as root, fetch them once and retry.
    if ! apt-get download "$pkg" >&2 \
        && ! { [ "$(id -u)" -eq 0 ] && apt-get update -qq >&2 && apt-get download "$pkg" >&2; }; then
        echo "fetch-debian-lib: 'apt-get download $pkg' failed: no network access to the Debian" >&2
        echo "  archive, or stale package lists (try 'apt-get update' first)" >&2
        exit 1
    fi
    deb=$(ls "${pkg}"_*_amd64.deb 2>/dev/null | head -n 1 || true)
    [ -n "$deb" ] || { echo "fetch-debian-lib: apt-get reported success but no $pkg .deb is in $data" >&2; exit 1; }
fi

# Extract into a temporary directory and rename, so an interrupted run leaves no partial tree.
rm -rf "$name.tmp"
dpkg-deb -x "$deb" "$name.tmp"
if [ ! -f "$name.tmp/$rel" ]; then
    echo "fetch-debian-lib: $deb does not contain $rel" >&2
    rm -rf "$name.tmp"
    exit 1
fi
rm -rf "$name"
mv "$name.tmp" "$name"
echo "$lib"
