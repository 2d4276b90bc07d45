#!/usr/bin/env bash
# Installs what the tests and benchmarks need on a fresh Debian machine, and nothing when it is
# already there. Run as root (CI and our dev machines are root); otherwise it uses sudo.
set -euo pipefail

APT_PACKAGES=(
  fuse3            # fusermount3 and mount.fuse3: --auto-unmount, mount -t fuse.kpack-fuse
  squashfuse       # squashfuse_ll, the comparison in the benchmark suite
  squashfs-tools   # mksquashfs for that comparison
  libzstd-dev      # zstd headers for C consumers
  zstd             # the zstd command line (tar --zstd in benchmarks)
  pkg-config       # C consumer test of rocm_kpack.pc
  cmake            # C consumer test of the CMake package
  gcc g++          # C ABI tests, built as C and C++
  valgrind         # memcheck of the C tests
  attr             # getfattr for looking at mount xattrs by hand
  mount            # mount(8)/umount(8): mount -t, mount -T fstab tests
  util-linux       # setpriv: the unprivileged-mount test
  python3-pip
  nginx            # a real HTTP server with range requests for the http:// source tests
)
# pyyaml: Kubernetes manifest checks; moto[server]: the S3 server of the s3:// source tests
PIP_PACKAGES=(msgpack zstandard pyyaml "moto[server]")

sudo_if_needed() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "setup-deps: installing ${missing[*]}"
  sudo_if_needed apt-get update -qq
  sudo_if_needed env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if ! python3 -c "import msgpack, zstandard, yaml, boto3, flask_cors, moto.server" 2>/dev/null; then
  echo "setup-deps: installing Python ${PIP_PACKAGES[*]}"
  python3 -m pip install -q "${PIP_PACKAGES[@]}" 2>/dev/null \
    || python3 -m pip install -q --break-system-packages "${PIP_PACKAGES[@]}"
fi

# FUSE needs its kernel module; on our machines it is built in, elsewhere load it.
grep -qw fuse /proc/filesystems || sudo_if_needed modprobe fuse || true

# ThreadSanitizer (scripts/sanitizers.sh) rebuilds std, which needs nightly with rust-src.
if ! rustup component list --toolchain nightly --installed 2>/dev/null | grep -q '^rust-src'; then
  echo "setup-deps: installing nightly Rust with rust-src (for ThreadSanitizer)"
  rustup toolchain install nightly --profile minimal --component rust-src
fi
