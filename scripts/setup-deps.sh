#!/usr/bin/env bash
# Installs what the tests and benchmarks need on a fresh Debian or Ubuntu machine, and nothing
# when it is already there (the list is in README.md): the apt packages below, the Python
# packages below (from apt; pip only for what the release does not package), and rust-src for the
# nightly toolchain (ThreadSanitizer). It never upgrades or replaces a Rust toolchain: an existing
# nightly only gets the rust-src component; nightly is installed only when there is none.
# Needs Rust >= 1.85 (rustup) and root, or sudo.
set -euo pipefail

APT_PACKAGES=(
  fuse3            # fusermount3 and mount.fuse3: --auto-unmount, mount -t fuse.kpack-fuse
  squashfuse       # squashfuse_ll, the comparison in the benchmark suite
  squashfs-tools   # mksquashfs for that comparison
  erofs-utils      # mkfs.erofs: the in-kernel EROFS comparison in the benchmark suite
  libzstd-dev      # zstd headers for C consumers
  zstd             # the zstd command line (tar --zstd in benchmarks)
  pkg-config       # C consumer test of rocm_kpack.pc
  cmake            # C consumer test of the CMake package
  gcc g++          # C ABI tests, built as C and C++
  valgrind         # memcheck of the C tests
  attr             # getfattr for looking at mount xattrs by hand
  binutils         # objcopy: scripts/install.sh strips what it installs
  mount            # mount(8)/umount(8): mount -t, mount -T fstab tests
  util-linux       # setpriv: the unprivileged-mount test
  python3-msgpack python3-zstandard  # the Python reference reader in tests/python
  python3-yaml     # Kubernetes manifest checks
  python3-pip      # only for what Debian does not package (PIP_PACKAGES)
  python3-venv     # the Python package's tests run in a venv (scripts/test-python.sh)
  nginx            # a real HTTP server with range requests for the http:// source tests
  openssl          # a test CA and server certificate for the https:// source test
  podman runc      # the container and kube play tests (tests/deploy/; runc: see its lib.sh)
  catatonit netavark  # podman's pod infra process and network stack (recommended, not required, by podman)
  iptables         # netavark's firewall driver: without it an image's RUN step fails (not a dependency of Debian's netavark)
  debootstrap      # their local Debian base image (scripts/container-base.sh)
  dpkg-dev debhelper lintian man-db  # the Debian packages (scripts/build-debs.sh, tests/deploy/debs.sh)
  e2fsprogs        # mkfs.ext4: the small loop-mounted file system of the full-disk cache test
  docker-registry  # the CNCF distribution registry the oci:// tests push to (on 127.0.0.1)
  skopeo           # reads pushed manifests back in the oci:// interop test
  apache2-utils    # htpasswd: the registry's basic-auth user file in the oci:// tests
)
# Installed with pip only if still missing after apt (an older release without the packages);
# moto[server]: the S3 server of the s3:// source tests (not packaged by Debian).
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
  # One line per package as it is set up: progress without apt's download chatter.
  if ! sudo_if_needed env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" |
    { grep --line-buffered '^Setting up ' || true; } | sed -u 's/^Setting up /setup-deps:   /'; then
    echo "setup-deps: apt-get install failed" >&2
    exit 1
  fi
fi

if ! python3 -c "import msgpack, zstandard, yaml, boto3, flask_cors, moto.server" 2>/dev/null; then
  echo "setup-deps: installing Python ${PIP_PACKAGES[*]}"
  python3 -m pip install -q "${PIP_PACKAGES[@]}" 2>/dev/null \
    || python3 -m pip install -q --break-system-packages "${PIP_PACKAGES[@]}"
fi

# FUSE needs its kernel module; on our machines it is built in, elsewhere load it.
grep -qw fuse /proc/filesystems || sudo_if_needed modprobe fuse || true

# The stable toolchain is the caller's: it is checked, never changed.
rust_version="$(rustc --version 2>/dev/null | sed -n 's/^rustc \([0-9]*\)\.\([0-9]*\)\..*/\1 \2/p')"
read -r rust_major rust_minor <<< "${rust_version:-0 0}"
if [ "$rust_major" -lt 1 ] || { [ "$rust_major" -eq 1 ] && [ "$rust_minor" -lt 85 ]; }; then
  echo "setup-deps: needs Rust 1.85 or newer (found: $(rustc --version 2>/dev/null || echo none));" \
    "install it with rustup (https://rustup.rs), then run this again" >&2
  exit 1
fi

# ThreadSanitizer (scripts/sanitizers.sh) rebuilds std, which needs nightly with rust-src. A
# nightly that is there is used as it is (adding a component does not update the toolchain);
# RUSTUP_AUTO_INSTALL=0 keeps rustup from installing one behind our back while we ask.
host="$(rustc -vV | sed -n 's/^host: //p')"
if ! RUSTUP_AUTO_INSTALL=0 rustup component list --toolchain nightly --installed 2>/dev/null |
    grep -q '^rust-src'; then
  if rustup toolchain list | grep -q "^nightly-${host}\b"; then
    echo "setup-deps: adding rust-src to the installed nightly toolchain (for ThreadSanitizer)"
    RUSTUP_AUTO_INSTALL=0 rustup component add --toolchain nightly rust-src
  else
    echo "setup-deps: installing nightly Rust with rust-src (for ThreadSanitizer): there is none"
    rustup toolchain install nightly --profile minimal --component rust-src
  fi
fi
