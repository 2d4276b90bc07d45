#!/usr/bin/env bash
# Makes the Debian base image the Dockerfile's runtime stage starts from (debian:RELEASE-slim)
# without a container registry: a minimal debootstrap of RELEASE (variant minbase) from the Debian
# archive, imported into podman under the name a registry would give it. The root file system is
# kept as a tarball in the user's cache directory, so later runs only import it. An image of that
# name that is already there is left alone.
#
#   scripts/container-base.sh [RELEASE]     # default: the Dockerfile's DEBIAN_RELEASE
#
# Environment: KPACK_DEBIAN_MIRROR (default http://deb.debian.org/debian), XDG_CACHE_HOME.
# Needs root, debootstrap and podman.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"

die() { echo "container-base: $*" >&2; exit 1; }

release="${1:-$(sed -n 's/^ARG DEBIAN_RELEASE=//p' "$root/Dockerfile")}"
[ -n "$release" ] || die "no release given and none in the Dockerfile"
case "$release" in *[!a-z0-9-]*) die "not a release name: $release" ;; esac
image="docker.io/library/debian:${release}-slim"
mirror="${KPACK_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/kpack-fuse"
tarball="$cache/debian-${release}-minbase.tar"

if podman image exists "$image"; then
  echo "container-base: $image is there"
  exit 0
fi

if [ ! -f "$tarball" ]; then
  command -v debootstrap >/dev/null || die "debootstrap not found (package debootstrap)"
  mkdir -p -- "$cache"
  work="$(mktemp -d "$cache/debootstrap.XXXXXX")"
  trap 'rm -rf -- "$work"' EXIT
  echo "container-base: debootstrap --variant=minbase $release from $mirror (once; cached in $tarball)"
  debootstrap --variant=minbase "$release" "$work/root" "$mirror" > "$work/log" 2>&1 \
    || { tail -n 20 "$work/log" >&2; die "debootstrap failed"; }
  # What the image does not need: downloaded packages and index files (apt-get update fetches
  # them again), and the debootstrap log.
  rm -rf -- "$work/root/var/cache/apt/archives/"*.deb "$work/root/var/lib/apt/lists/"* \
    "$work/root/debootstrap"
  tar --numeric-owner --xattrs -C "$work/root" -cf "$work/root.tar" .
  mv -- "$work/root.tar" "$tarball"
fi

# The configuration a registry's image carries: its PATH (podman run supplies one when an image
# has none, podman kube play does not) and its command.
podman import -q --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'CMD ["bash"]' "$tarball" "$image" >/dev/null
echo "container-base: imported $tarball as $image"
