#!/usr/bin/env bash
# The oci:// source on a real kernel set, in one run, against nginx serving the same archive over
# http:// (both on 127.0.0.1; the registry is Debian's docker-registry, filesystem storage):
#   1. lazy open: the set packed in the reference layout (no frame positions, no digests) and
#      pushed (with its kernel index), mounted, one kernel read: the bytes the registry sent
#      over the blob's size;
#   2. cold full read, from the mount command to the last byte read by 2 readers, through the
#      registry and through nginx, ROUNDS rounds alternating which goes first (page cache
#      dropped, fresh mount each): median MB/s and the ratio registry / nginx;
#   3. --gpu: the set split into one archive per arch, pushed as one artifact, mounted with
#      --gpu for one arch and read whole: the bytes the registry sent of the other layers' blobs.
# Byte counts come from the registry's access log. Run as root on an idle machine; by hand.
#
# usage: bench/oci.sh TREE [ROUNDS]    TREE: <key>/<arch>.hsaco (bench/fetch-rocsparse.sh)
set -euo pipefail

[ $# -ge 1 ] || { sed -n '2,14p' "$0" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
tree=$(realpath "$1")
rounds=${2:-3}
[ "$(id -u)" = 0 ] || { echo "oci: run as root (it mounts and drops caches)" >&2; exit 2; }
for c in docker-registry nginx; do
    command -v "$c" >/dev/null || { echo "oci: needs $c (scripts/setup-deps.sh)" >&2; exit 2; }
done

# shellcheck source=bench/lib.sh
. "$here/lib.sh"

(cd "$here/.." && cargo build --release --bin kpack-fuse >&2)
bin=$here/../target/release/kpack-fuse
work_dir "$bin"

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# The registry.
reg_port=$(free_port)
mkdir -p "$work/registry"
cat >"$work/registry.yml" <<EOF
version: 0.1
log:
  level: error
storage:
  filesystem:
    rootdirectory: $work/registry
http:
  addr: 127.0.0.1:$reg_port
EOF
docker-registry serve "$work/registry.yml" >"$work/registry.log" 2>&1 &
reg_pid=$!
# nginx, serving $work/www.
ngx_port=$(free_port)
mkdir -p "$work/www" "$work/nginx"
chmod 755 "$work" "$work/www" # nginx's workers run as nobody
cat >"$work/nginx/nginx.conf" <<EOF
daemon off;
pid $work/nginx/pid;
error_log $work/nginx/error.log;
events { worker_connections 256; }
http {
  access_log off;
  client_body_temp_path $work/nginx/body;
  proxy_temp_path $work/nginx/proxy;
  fastcgi_temp_path $work/nginx/fcgi;
  uwsgi_temp_path $work/nginx/uwsgi;
  scgi_temp_path $work/nginx/scgi;
  server { listen 127.0.0.1:$ngx_port; root $work/www; }
}
EOF
nginx -p "$work/nginx" -c "$work/nginx/nginx.conf" &
ngx_pid=$!
trap 'kill $reg_pid $ngx_pid 2>/dev/null; "$bin" unmount "$mnt" >/dev/null 2>&1 || umount -l "$mnt" 2>/dev/null || true; rm -rf "$work"' EXIT
for _ in $(seq 50); do
    curl -sf "http://127.0.0.1:$reg_port/v2/" >/dev/null && curl -s "http://127.0.0.1:$ngx_port/" >/dev/null && break
    sleep 0.1
done
reg=127.0.0.1:$reg_port

# Bytes the registry sent for GETs of blob $1 since line $2 of its log.
blob_bytes() {
    tail -n +"$2" "$work/registry.log" |
        awk -v d="$1" '$6 == "\"GET" && index($7, "/blobs/" d) && ($9 == 200 || $9 == 206) {n += $10} END {print n + 0}'
}
log_lines() { wc -l <"$work/registry.log"; }

echo "packing $tree in the reference layout" >&2
"$bin" pack --reference-layout -o "$work/www/set.kpack" "$tree" >&2
size=$(stat -c %s "$work/www/set.kpack")
"$bin" push --json "$work/www/set.kpack" "oci://$reg/bench/set:ref" >"$work/push.json"
blob=$(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(next(l["digest"] for l in d["layers"] if l["title"] == "set.kpack"))' "$work/push.json")

echo "== 1. one kernel of a reference-layout archive ($size bytes)"
at=$(log_lines)
drop_caches
"$bin" mount "oci://$reg/bench/set:ref" "$mnt"
first=$(find "$mnt" -name '*.hsaco' -type f -print -quit)
cat "$first" >/dev/null
"$bin" unmount "$mnt"
sent=$(blob_bytes "$blob" "$at")
awk -v s="$sent" -v t="$size" -v k="$(stat -c %s "$first" 2>/dev/null || echo 0)" 'BEGIN {
    printf "blob bytes fetched: %d of %d (%.2f%%; target < 2%%)\n", s, t, 100 * s / t }'

echo "== 2. cold full read, mount command to last byte, 2 readers, $rounds rounds"
# Prints the MB/s of one cold pass of source $1.
cold_pass() {
    local t0 t1 bytes
    drop_caches
    t0=$(date +%s.%N)
    "$bin" mount "$1" "$mnt"
    bytes=$(pass "$mnt" | awk '{print $1}')
    t1=$(date +%s.%N)
    "$bin" unmount "$mnt"
    echo "$bytes $t0 $t1" | awk '{printf "%.0f\n", $1 / ($3 - $2) / 1e6}'
}
: >"$work/reg.mbs"
: >"$work/ngx.mbs"
for r in $(seq "$rounds"); do
    if [ $((r % 2)) = 1 ]; then
        cold_pass "oci://$reg/bench/set:ref" >>"$work/reg.mbs"
        cold_pass "http://127.0.0.1:$ngx_port/set.kpack" >>"$work/ngx.mbs"
    else
        cold_pass "http://127.0.0.1:$ngx_port/set.kpack" >>"$work/ngx.mbs"
        cold_pass "oci://$reg/bench/set:ref" >>"$work/reg.mbs"
    fi
done
reg_med=$(median <"$work/reg.mbs")
ngx_med=$(median <"$work/ngx.mbs")
echo "registry: $(tr '\n' ' ' <"$work/reg.mbs")MB/s, median $reg_med"
echo "nginx:    $(tr '\n' ' ' <"$work/ngx.mbs")MB/s, median $ngx_med"
awk -v a="$reg_med" -v b="$ngx_med" 'BEGIN {printf "registry / nginx: %.2fx (target >= 0.9x)\n", a / b}'

echo "== 3. --gpu on an artifact of one archive per arch"
mkdir -p "$work/per-arch"
arches=$(find "$tree" -name '*.hsaco' -printf '%f\n' | sed 's/\.hsaco$//' | sort -u)
for a in $arches; do
    (cd "$tree" && find . -name "$a.hsaco" -printf '%P\n') >"$work/list"
    rm -rf "$work/t" && mkdir -p "$work/t"
    while read -r f; do
        mkdir -p "$work/t/$(dirname "$f")"
        ln "$tree/$f" "$work/t/$f" 2>/dev/null || cp "$tree/$f" "$work/t/$f"
    done <"$work/list"
    "$bin" pack -o "$work/per-arch/$a.kpack" "$work/t" >&2
done
"$bin" push --json "$work/per-arch" "oci://$reg/bench/per-arch:1" >"$work/per-arch.json"
want=${arches%%$'\n'*}
at=$(log_lines)
drop_caches
"$bin" mount "oci://$reg/bench/per-arch:1" "$mnt" --gpu "$want"
pass "$mnt" >/dev/null
"$bin" unmount "$mnt"
python3 - "$work/per-arch.json" "$want.kpack" <<'EOF' | while read -r title digest; do
import json, sys
for l in json.load(open(sys.argv[1]))["layers"]:
    print(l["title"], l["digest"])
EOF
    echo "$title $(blob_bytes "$digest" "$at")"
done | awk -v w="$want.kpack" '$1 == w {mine = $2; next} {others += $2} END {
    printf "--gpu %s: %d bytes of its own layer, %d bytes of the other layers (target 0)\n",
        substr(w, 1, length(w) - 6), mine, others }'
