#!/usr/bin/env bash
# The Kubernetes manifests run with podman kube play, as docs/deploy.md shows: the DaemonSet's pod
# mounts the pack under a shared host directory, the consumer pod (as user 1000, no privileges)
# reads every kernel through HostToContainer propagation, and taking the node pod down unmounts.
# The consumer's output is checked against the kernels kpack-fuse extract writes on the host,
# byte for byte (SHA-256 of each file). In between, the node pod heals: its probes must fail on a
# hung daemon and on a dead mount and pass on a live one; when its daemon is killed the container
# must exit and be restarted, serving; when the whole pod is killed, the next start must detach
# the dead mount it left on the host and serve. Pods and mounts are removed on every exit.
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

# Recovery. The node pod's container, as podman kube play names it, and its probes: the liveness
# probe became its healthcheck; the readiness probe's command is run as the kubelet would.
node=kpack-fuse-kpack-fuse
mapfile -t ready_cmd < <(python3 -c '
import sys, yaml
pod = next(d for d in yaml.safe_load_all(open(sys.argv[1])) if d and d["kind"] == "Pod")
print("\n".join(pod["spec"]["containers"][0]["readinessProbe"]["exec"]["command"]))' "$WORK/node.yaml")
[ "${#ready_cmd[@]}" -gt 0 ] || fail "the DaemonSet has no exec readiness probe"
ready() { timeout --kill-after=5 20 podman exec "$node" "${ready_cmd[@]}" >/dev/null 2>&1; }
live() { timeout --kill-after=5 20 podman healthcheck run "$node" >/dev/null 2>&1; }
probes_pass() {
  ready || fail "$1: the readiness probe failed"
  live || fail "$1: the liveness probe (podman healthcheck run) failed"
}
probes_pass "on the live mount"

# A hung daemon: the readiness probe must fail within its timeout rather than hang.
daemon="$(host_pid "$node" kpack-fuse)"
kill -STOP "$daemon"
started=$SECONDS
if ready; then kill -CONT "$daemon"; fail "the readiness probe passed with the daemon stopped"; fi
kill -CONT "$daemon"
[ $((SECONDS - started)) -lt 15 ] || fail "the readiness probe took $((SECONDS - started)) s on a hung daemon"
probes_pass "with the daemon running again"

# The daemon killed. The entrypoint is stopped first, so that the mount stays dead while the
# probes run; then it must exit, and podman restart the container (restartPolicy Always).
entry="$(podman inspect -f '{{.State.Pid}}' "$node")"
kill -STOP "$entry"
kill -KILL "$daemon"
is_dead_mount "$SHARE/mnt" || { kill -CONT "$entry"; fail "no dead mount at $SHARE/mnt after the daemon was killed"; }
if ready; then kill -CONT "$entry"; fail "the readiness probe passed on a dead mount"; fi
if live; then kill -CONT "$entry"; fail "the liveness probe passed on a dead mount"; fi
kill -CONT "$entry"
wait_restarted "$node" 1 30 "after its daemon was killed"
logged "$node" "kpack-entrypoint: exiting with status 4, so that the container is restarted" \
  "after its daemon was killed"
wait_serving "$SHARE/mnt" "$want" 30 "restarted after its daemon was killed"
probes_pass "after the restart"

# The whole pod killed: the mount stays on the host, dead, and the next start detaches it.
podman pod kill -s KILL kpack-fuse >/dev/null
podman wait "$node" >/dev/null
is_dead_mount "$SHARE/mnt" || fail "no dead mount at $SHARE/mnt after the pod was killed"
podman pod start kpack-fuse >/dev/null
wait_serving "$SHARE/mnt" "$want" 30 "started after the pod was killed"
logged "$node" "kpack-entrypoint: /var/lib/kpack/mnt: its daemon is gone (Transport endpoint is not connected); detaching the dead mount" \
  "started after the pod was killed"
probes_pass "after the pod was started again"

run_doc kube-down 120 >/dev/null
if findmnt -n "$SHARE/mnt" >/dev/null; then fail "$SHARE/mnt still mounted after podman kube down"; fi
say "ok: node pod mounted, consumer pod read every kernel byte for byte; probes failed on a hung" \
  "daemon and a dead mount; the pod healed after its daemon and after the whole pod was killed;" \
  "kube down unmounted"
