#!/usr/bin/env bash
# The container image, built and run with podman as docs/deploy.md shows: the Dockerfile built
# from a local Debian base and the host's release build; a container mounting a pack with its
# entrypoint and reading every kernel; and the shared-mount pattern, one container mounting under
# a host directory with rshared propagation and another reading through it; and recovery, the
# mounting container's daemon killed (the container must exit and its restart policy bring it back
# serving) and then the whole container killed (the dead mount it leaves on the host must be
# detached by the next start). Each read is checked against the kernels kpack-fuse extract writes
# on the host, byte for byte (SHA-256 of each file). Containers and mounts are removed on every
# exit.
#
# Needs root, /dev/fuse, podman, runc, debootstrap (scripts/setup-deps.sh installs them).
set -euo pipefail
source "$(dirname "$0")/lib.sh"

need_root_tools podman runc debootstrap findmnt
# The container and Kubernetes sections show only commands these tests run.
untested="$(untested_doc_blocks)"
[ -z "$untested" ] || fail "docs/deploy.md: $untested"
work="$(mktemp -d /tmp/kpack-container-test.XXXXXX)"
SHARE=""

cleanup() {
  podman rm -f -t 0 kpack-mount >/dev/null 2>&1 || true
  if [ -n "$SHARE" ]; then
    if findmnt -n "$SHARE/kpack" >/dev/null 2>&1; then umount -l "$SHARE/kpack" || true; fi
    if findmnt -n "$SHARE" >/dev/null 2>&1; then umount -l "$SHARE" || true; fi
    rm -rf -- "$SHARE"
  fi
  rm -rf -- "$work"
}
trap cleanup EXIT
# The variables, as the document sets them.
source_doc container-vars
export KPACK SHARE
[ "$KPACK" = "$root/samples/rocrand-sample.kpack" ] || fail "KPACK is $KPACK, not the sample"
[ -d "$SHARE" ] || fail "SHARE ($SHARE) is not a directory"
use_test_podman_config "$work"
# A container left by an interrupted run would hold the name.
podman rm -f -t 0 kpack-mount >/dev/null 2>&1 || true

want="$(kernel_sums "$KPACK" "$work/extracted")"
[ "$(printf '%s\n' "$want" | wc -l)" -eq 3 ] || fail "expected 3 kernels in the sample, got: $want"

# The image.
run_doc image 900 >&2

# One container: the entrypoint mounts the pack, the command reads every kernel.
got="$(run_doc run 120)"
same_text "kernels read in the container" "$want" "$got"

# Without the device or the capability the entrypoint says why and exits 3 (no command run).
run_doc_failing no-device 60 3 "kpack-fuse: cannot mount on /opt/rocm/lib/kpack: /dev/fuse does not \
exist (in a container, pass --device /dev/fuse; on a host, load the fuse module: modprobe fuse)"
run_doc_failing no-cap 60 3 \
  "kpack-fuse: cannot mount on /opt/rocm/lib/kpack: fusermount3: mount failed: Operation not permitted"

# Two containers: one mounts under a shared host directory, the other reads through it.
run_doc shared-mount 60 >/dev/null
for _ in $(seq 100); do
  [ "$(findmnt -n -o FSTYPE "$SHARE/kpack" 2>/dev/null)" = fuse.kpack-fuse ] && break
  sleep 0.2
done
[ "$(findmnt -n -o FSTYPE "$SHARE/kpack")" = fuse.kpack-fuse ] \
  || fail "the mount made in the container did not appear on the host at $SHARE/kpack"
got="$(run_doc shared-read 120)"
same_text "kernels read in the second container" "$want" "$got"
run_doc shared-stop 60 >/dev/null
# Stopping the mounting container unmounts, on the host too.
if findmnt -n "$SHARE/kpack" >/dev/null; then fail "$SHARE/kpack still mounted after podman stop"; fi
podman container exists kpack-mount && fail "kpack-mount was not removed (--rm)"

# Recovery. The mounting container again, with a restart policy.
run_doc heal-mount 60 >/dev/null
wait_serving "$SHARE/kpack" "$want" 30 "the container with a restart policy"
# Its daemon killed: the entrypoint must detach the dead mount and exit non-zero (4), and the
# restart policy bring the container back, serving.
kill -KILL "$(host_pid kpack-mount kpack-fuse)"
wait_restarted kpack-mount 1 30 "after its daemon was killed"
logged kpack-mount "kpack-entrypoint: kpack-fuse exited with status 137 while the command ran; stopping the command" \
  "after its daemon was killed"
logged kpack-mount "kpack-entrypoint: exiting with status 4, so that the container is restarted" \
  "after its daemon was killed"
wait_serving "$SHARE/kpack" "$want" 30 "restarted after its daemon was killed"
# The whole container killed: nothing unmounts, the mount stays on the host, dead.
podman kill -s KILL kpack-mount >/dev/null
podman wait kpack-mount >/dev/null
is_dead_mount "$SHARE/kpack" || fail "no dead mount at $SHARE/kpack after podman kill"
# The next start detaches it and mounts again.
run_doc heal-start 60 >/dev/null
wait_serving "$SHARE/kpack" "$want" 30 "started after podman kill"
logged kpack-mount "kpack-entrypoint: /shared/kpack: its daemon is gone (Transport endpoint is not connected); detaching the dead mount" \
  "started after podman kill"
run_doc heal-stop 60 >/dev/null
if findmnt -n "$SHARE/kpack" >/dev/null; then fail "$SHARE/kpack still mounted after podman stop"; fi
say "ok: image built; kernels read byte for byte in one container and through a shared mount," \
  "and again after the daemon was killed and after the whole container was killed"
