#!/bin/sh
# Makes the real rocSPARSE kernel set for bench/python_api.py: fetches Debian's librocsparse0
# package (about 94 MB; the library is 1.3 GB) with `apt-get download`, extracts the library,
# and unpacks the device code objects of its .hip_fatbin into a tree of
# <binary key>/<arch>.hsaco files with `kpack-fuse pack --from-fatbin --single` and `extract`.
# Prints the tree's path on stdout (and nothing else there).
#
# usage: fetch-rocsparse.sh [KPACK_FUSE]   (default: target/release/kpack-fuse)
# Idempotent: an existing tree, library or .deb is reused. Data goes to bench/data/
# (git-ignored), or to $KPACK_BENCH_DATA if set.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
data=${KPACK_BENCH_DATA:-$here/data}
tool=${1:-$here/../target/release/kpack-fuse}
tree=$data/rocsparse-tree
lib=$data/rocsparse/usr/lib/x86_64-linux-gnu/librocsparse.so.0.1

[ -x "$tool" ] || { echo "fetch-rocsparse: $tool is not there: build it (cargo build --release)" >&2; exit 1; }
tool=$(cd "$(dirname "$tool")" && pwd)/$(basename "$tool")

if [ -d "$tree" ]; then
    echo "$tree"
    exit 0
fi
mkdir -p "$data"
cd "$data"
if [ ! -f "$lib" ]; then
    deb=$(ls librocsparse0_*_amd64.deb 2>/dev/null | head -n 1 || true)
    if [ -z "$deb" ]; then
        apt-get download librocsparse0 >&2 || {
            echo "fetch-rocsparse: 'apt-get download librocsparse0' failed (try 'apt-get update')" >&2
            exit 1
        }
        deb=$(ls librocsparse0_*_amd64.deb | head -n 1)
    fi
    rm -rf rocsparse.tmp
    dpkg-deb -x "$deb" rocsparse.tmp
    rm -rf rocsparse
    mv rocsparse.tmp rocsparse
fi
rm -rf rocsparse-pack.tmp rocsparse-tree.tmp
"$tool" pack --from-fatbin "$lib" --root rocsparse/usr --single --compression none --reference-layout \
    -o rocsparse-pack.tmp >&2
"$tool" extract rocsparse-pack.tmp/*.kpack rocsparse-tree.tmp >&2
rm -rf rocsparse-pack.tmp
mv rocsparse-tree.tmp rocsparse-tree
echo "$tree"
