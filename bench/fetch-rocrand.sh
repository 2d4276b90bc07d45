#!/bin/sh
# Fetches Debian's librocrand1 package (about 8 MB) with `apt-get download` and extracts
# librocrand.so.1.1, a real ROCm host library whose .hip_fatbin holds one offload bundle with
# seven device code objects. Prints the path of the extracted library on stdout (and nothing
# else there), so scripts and tests can capture it.
#
# Idempotent: an already extracted library, or an already downloaded .deb, is reused.
# Data goes to bench/data/ (git-ignored), or to $KPACK_BENCH_DATA if set.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
data=${KPACK_BENCH_DATA:-$here/data}
lib=$data/rocrand/usr/lib/x86_64-linux-gnu/librocrand.so.1.1

if [ -f "$lib" ]; then
    echo "$lib"
    exit 0
fi

mkdir -p "$data"
cd "$data"
# Two runs at once (tests and a benchmark) take turns instead of racing on the same files.
if command -v flock >/dev/null 2>&1; then
    exec 9>.fetch-rocrand.lock
    flock 9
    if [ -f "$lib" ]; then
        echo "$lib"
        exit 0
    fi
fi

deb=$(ls librocrand1_*_amd64.deb 2>/dev/null | head -n 1 || true)
if [ -z "$deb" ]; then
    command -v apt-get >/dev/null 2>&1 || { echo "fetch-rocrand: apt-get is not available on this system" >&2; exit 1; }
    # apt-get download writes progress on stdout; keep stdout for the result path. Fresh
    # machines (containers) often have no package lists yet: as root, fetch them once and retry.
    if ! apt-get download librocrand1 >&2 \
        && ! { [ "$(id -u)" -eq 0 ] && apt-get update -qq >&2 && apt-get download librocrand1 >&2; }; then
        echo "fetch-rocrand: 'apt-get download librocrand1' failed: no network access to the Debian" >&2
        echo "  archive, or stale package lists (try 'apt-get update' first)" >&2
        exit 1
    fi
    deb=$(ls librocrand1_*_amd64.deb 2>/dev/null | head -n 1 || true)
    [ -n "$deb" ] || { echo "fetch-rocrand: apt-get reported success but no librocrand1 .deb is in $data" >&2; exit 1; }
fi

# Extract into a temporary directory and rename, so an interrupted run leaves no partial tree.
rm -rf rocrand.tmp
dpkg-deb -x "$deb" rocrand.tmp
if [ ! -f "rocrand.tmp/usr/lib/x86_64-linux-gnu/librocrand.so.1.1" ]; then
    echo "fetch-rocrand: $deb does not contain usr/lib/x86_64-linux-gnu/librocrand.so.1.1" >&2
    rm -rf rocrand.tmp
    exit 1
fi
rm -rf rocrand
mv rocrand.tmp rocrand
echo "$lib"
