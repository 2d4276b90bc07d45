#!/bin/sh
# Regenerates samples/rocrand-sample.kpack from Debian's librocrand1 package (see README.md here).
# The output is deterministic: the same .deb gives the same bytes.
set -eu
repo=$(cd "$(dirname "$0")/.." && pwd)
lib=$("$repo/bench/fetch-rocrand.sh")
root=${lib%/lib/x86_64-linux-gnu/librocrand.so.1.1}
cd "$repo"
cargo run --quiet --example make_sample -- "$root" "$lib" samples/rocrand-sample.kpack 19 \
    gfx1030 'gfx90a:xnack+' 'gfx90a:xnack-'
