#!/usr/bin/env bash
# The Kubernetes manifests run with podman kube play, as docs/deploy.md shows: the DaemonSet's pod
# mounts the pack under a shared host directory, the consumer pod (as user 1000, no privileges)
# reads every kernel through HostToContainer propagation, and taking the node pod down unmounts.
# The consumer's output is checked against the kernels kpack-fuse extract writes on the host,
# byte for byte (SHA-256 of each file). Pods and mounts are removed on every exit.
#
# Needs root, /dev/fuse, podman, runc and the image tests/deploy/container.sh builds (built here
# the same way when it is missing).
set -euo pipefail
source "$(dirname "$0")/lib.sh"

need_root_tools podman runc findmnt python3
work=""

cleanup() {
  [ -n "$work" ] || return 0
  local f
  for f in "$work/consumer.yaml" "$work/node.yaml"; do
    if [ -f "$f" ]; then podman kube down "$f" >/dev/null 2>&1 || true; fi
  done
  podman pod rm -f -t 0 kpack-consumer kpack-fuse >/dev/null 2>&1 || true
  if findmnt -n "$SHARE/mnt" >/dev/null 2>&1; then umount -l "$SHARE/mnt" || true; fi
  if findmnt -n "$SHARE" >/dev/null 2>&1; then umount -l "$SHARE" || true; fi
  rm -rf -- "$work"
}
trap cleanup EXIT
# The directories and the node's pack, as the document makes them (the DaemonSet's hostPath
# directory holds kernels.kpack; the consumer, user 1000, reaches the mount through $WORK).
source_doc kube-vars
work="$WORK"
export WORK PACKS SHARE
use_test_podman_config "$work"
podman pod rm -f -t 0 kpack-consumer kpack-fuse >/dev/null 2>&1 || true

want="$(kernel_sums "$PACKS/kernels.kpack" "$work/extracted")"
[ "$(printf '%s\n' "$want" | wc -l)" -eq 3 ] || fail "expected 3 kernels in the sample, got: $want"

podman image exists kpack-fuse || run_doc image 900 >&2

run_doc kube-node 120 >/dev/null
for _ in $(seq 150); do
  [ "$(findmnt -n -o FSTYPE "$SHARE/mnt" 2>/dev/null)" = fuse.kpack-fuse ] && break
  sleep 0.2
done
[ "$(findmnt -n -o FSTYPE "$SHARE/mnt")" = fuse.kpack-fuse ] \
  || fail "the node pod's mount did not appear on the host at $SHARE/mnt"

run_doc kube-consumer 120 >/dev/null
status="$(podman inspect kpack-consumer-app --format '{{.State.ExitCode}}')"
[ "$status" = 0 ] || fail "the consumer pod's container exited with $status"
got="$(run_doc kube-logs 60)"
same_text "kernels read in the consumer pod" "$want" "$got"

run_doc kube-down 120 >/dev/null
if findmnt -n "$SHARE/mnt" >/dev/null; then fail "$SHARE/mnt still mounted after podman kube down"; fi
say "ok: node pod mounted, consumer pod read every kernel byte for byte, kube down unmounted"
