#!/usr/bin/env bash
# Kernel packs from a container registry, as docs/deploy.md shows: the sample's three GPU targets
# pushed as three one-target archives to a password-protected registry (docker-registry on
# 127.0.0.1, a free port, storage in a temporary directory); a container mounting the pack of one
# GPU from it (podman run); the oci:// DaemonSet played with podman kube play, its credentials
# from a dockerconfigjson Secret's file, mounting under a shared host directory; and the consumer
# pod reading the mount. What the container, the host and the consumer read is checked against
# the kernel kpack-fuse extract writes on the host, byte for byte (SHA-256); the registry's access
# log must show that only that GPU's layer was fetched. The machines have no GPU: the test names
# one of the sample's targets (GPU=gfx90a:xnack-) where a node would say gpu=auto. Pods, the
# registry and mounts are removed on every exit.
#
# Needs root, /dev/fuse, podman, runc, docker-registry, htpasswd, the release build and the image
# tests/deploy/container.sh builds (built here the same way when it is missing).
set -euo pipefail
source "$(dirname "$0")/lib.sh"

need_root_tools podman runc findmnt python3 docker-registry htpasswd
kpack_fuse="$root/target/release/kpack-fuse"
[ -x "$kpack_fuse" ] || fail "no release build: cargo build --release"
work=""
registry_pid=""

cleanup() {
  [ -n "$work" ] || return 0
  local f
  for f in "$work/consumer.yaml" "$work/oci-node.yaml"; do
    if [ -f "$f" ]; then timeout 60 podman kube down "$f" >/dev/null 2>&1 || true; fi
  done
  timeout 60 podman pod rm -f -t 0 kpack-consumer kpack-fuse-oci >/dev/null 2>&1 || true
  if findmnt -n "$SHARE/mnt" >/dev/null 2>&1; then umount -l "$SHARE/mnt" || true; fi
  if findmnt -n "$SHARE" >/dev/null 2>&1; then umount -l "$SHARE" || true; fi
  if [ -n "$registry_pid" ]; then
    kill "$registry_pid" 2>/dev/null || true
    wait "$registry_pid" 2>/dev/null || true
  fi
  rm -rf -- "$work"
}
trap cleanup EXIT
# The directories, as the document makes them.
source_doc oci-vars
work="$WORK"
use_test_podman_config "$work"
timeout 60 podman pod rm -f -t 0 kpack-consumer kpack-fuse-oci >/dev/null 2>&1 || true

# The node's GPU, and the archives: one per target of the sample.
GPU='gfx90a:xnack-'
all="$(kernel_sums "$root/samples/rocrand-sample.kpack" "$work/extracted")"
[ "$(printf '%s\n' "$all" | wc -l)" -eq 3 ] || fail "expected 3 kernels in the sample, got: $all"
want="$(grep -F "/$GPU.hsaco" <<<"$all")" || fail "no $GPU kernel in the sample"
mkdir -p "$PACKS"
for arch in gfx1030 'gfx90a:xnack+' 'gfx90a:xnack-'; do
  key='lib/x86_64-linux-gnu/librocrand.so.1.1#0'
  mkdir -p "$work/tree-$arch/$key"
  cp "$work/extracted/$key/$arch.hsaco" "$work/tree-$arch/$key/"
  "$kpack_fuse" pack "$work/tree-$arch" -o "$PACKS/rocrand_${arch//:/_}.kpack" >/dev/null \
    || fail "kpack-fuse pack of $arch failed"
done
want_blob="sha256:$(sha256sum "$PACKS/rocrand_${GPU//:/_}.kpack" | cut -d' ' -f1)"

# The registry: basic authentication, one user; the Secret's file holds its credentials the way
# `kubectl create secret docker-registry` writes them.
port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
password="$(head -c 18 /dev/urandom | base64 | tr -d '/+=')"
htpasswd -Bbn kpack "$password" > "$work/htpasswd" 2>/dev/null || fail "htpasswd failed"
cat > "$work/registry.yml" <<CFG
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: $work/registry
http:
  addr: 127.0.0.1:$port
  secret: kpack-fuse-test
auth:
  htpasswd:
    realm: kpack-test
    path: $work/htpasswd
CFG
docker-registry serve "$work/registry.yml" > "$work/registry.log" 2>&1 &
registry_pid=$!
for _ in $(seq 150); do
  kill -0 "$registry_pid" 2>/dev/null || { cat "$work/registry.log" >&2; fail "docker-registry exited"; }
  (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
  sleep 0.2
done
(exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null || fail "docker-registry did not listen on 127.0.0.1:$port"
REGISTRY="127.0.0.1:$port"
mkdir -p "$AUTH"
python3 - "$AUTH/.dockerconfigjson" "$REGISTRY" "$password" <<'PY'
import base64, json, sys
path, registry, password = sys.argv[1:]
entry = {"username": "kpack", "password": password,
         "auth": base64.b64encode(f"kpack:{password}".encode()).decode()}
with open(path, "w") as f:
    json.dump({"auths": {registry: entry}}, f)
PY
chmod 0644 "$AUTH/.dockerconfigjson"
export WORK SHARE PACKS AUTH REGISTRY GPU
export PATH="$root/target/release:$PATH"

podman image exists kpack-fuse || run_doc image 900 >&2

run_doc oci-push 120 >/dev/null
# What the registry serves from here on is what the mounts fetched.
fetched_from="$(($(wc -l < "$work/registry.log") + 1))"

got="$(run_doc oci-run 120)"
same_text "kernels read in the container" "$want" "$got"

run_doc oci-node 120 >/dev/null
wait_serving "$SHARE/mnt" "$want" 60 "the node pod's mount"

run_doc kube-consumer 120 >/dev/null
status="$(podman inspect kpack-consumer-app --format '{{.State.ExitCode}}')"
[ "$status" = 0 ] || fail "the consumer pod's container exited with $status"
got="$(run_doc kube-logs 60)"
same_text "kernels read in the consumer pod" "$want" "$got"

run_doc oci-down 120 >/dev/null
if findmnt -n "$SHARE/mnt" >/dev/null; then fail "$SHARE/mnt still mounted after podman kube down"; fi

blobs="$(tail -n "+$fetched_from" "$work/registry.log" \
  | grep -o 'GET /v2/kpack/rocrand/blobs/sha256:[0-9a-f]*' | sed 's|.*/blobs/||' | sort -u)"
same_text "the blobs the mounts fetched (only the $GPU archive)" "$want_blob" "$blobs"
say "ok: pushed 3 one-target archives; a container and the oci:// DaemonSet's pod (credentials" \
  "from the Secret's file) mounted the $GPU kernel alone, fetching only its layer; the host and" \
  "the consumer pod read it byte for byte; kube down unmounted"
