#!/bin/sh
# Regenerates the HIPK sample in samples/hipk/ (see README.md here): a small host program whose
# device code is one real code object of samples/rocrand-sample.kpack, built as a fat ROCm host
# binary (a clang offload bundle in .hip_fatbin, one wrapper in .hipFatBinSegment) and split by
# `kpack-fuse split` into the HIPK program and its archive. Needs cargo and gcc; the same gcc
# gives the same bytes.
set -eu
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
arch=gfx1030
key='lib/x86_64-linux-gnu/librocrand.so.1.1#0'
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cargo build --quiet --bin kpack-fuse --example make_bundle
kpack=target/debug/kpack-fuse
"$kpack" cat samples/rocrand-sample.kpack "$key" "$arch" > "$work/$arch.hsaco"
target/debug/examples/make_bundle "$work/bundle" "$arch=$work/$arch.hsaco"
mkdir -p "$work/root/bin"
cat > "$work/hello-hipk.c" <<C
#include <stdio.h>
/* The device code, as a HIP compiler places it: an offload bundle in .hip_fatbin ... */
__asm__(".section .hip_fatbin,\"a\",@progbits\n.p2align 12\nhello_bundle:\n"
        ".incbin \"$work/bundle\"\n.previous\n");
extern const unsigned char hello_bundle[];
/* ... and the wrapper the HIP runtime registers (magic HIPF, version 1). */
struct wrapper { unsigned int magic, version; const void *binary; unsigned long long reserved1; };
__attribute__((section(".hipFatBinSegment"), used, aligned(8)))
static struct wrapper hello_wrapper = { 0x48495046u, 1u, hello_bundle, 0ull };
int main(void) {
    puts("hello-hipk: a HIPK host program; its device code is in ../.kpack/");
    return 0;
}
C
gcc -O2 -o "$work/root/bin/hello-hipk" "$work/hello-hipk.c"
"$kpack" split "$work/root/bin/hello-hipk" --root "$work/root" -o "$work/split" --level 19 >/dev/null
rm -rf samples/hipk
mkdir -p samples/hipk/bin samples/hipk/.kpack
cp "$work/split/bin/hello-hipk" samples/hipk/bin/
cp "$work/split/.kpack/hello-hipk_$arch.kpack" samples/hipk/.kpack/
ls -l samples/hipk/bin/hello-hipk "samples/hipk/.kpack/hello-hipk_$arch.kpack"
