#!/bin/sh
# Fetches Debian's librocrand1 package (about 8 MB) and extracts librocrand.so.1.1, a real ROCm
# host library whose .hip_fatbin holds one offload bundle with seven device code objects.
# Prints the path of the extracted library on stdout (see fetch-debian-lib.sh).
set -eu
exec sh "$(cd "$(dirname "$0")" && pwd)/fetch-debian-lib.sh" librocrand1 rocrand \
    usr/lib/x86_64-linux-gnu/librocrand.so.1.1
