#!/usr/bin/env bash
# A cold read's CPU per byte against zstd's own, in one run. Cold passes of a mount of ARCHIVE
# (a fresh mount each, page cache dropped before it, 2 readers) are measured as the whole
# machine's busy CPU time from /proc/stat over the bytes read; the same frames, in memory, are
# decoded on one thread by the zstd this project links (examples/zstd_frames.rs) and by the
# system's zstd (the `zstd` command, Debian's libzstd). Prints each pass, the best and the
# median, and their ratios to both zstd figures. Run as root on an idle machine; by hand, not in
# CI.
#
# usage: bench/cold-cpu.sh ARCHIVE [PASSES] [MOUNT OPTION...]
#   builds the release program and example first (cargo build --release)
set -euo pipefail

[ $# -ge 1 ] || { sed -n '2,10p' "$0" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
archive=$(realpath "$1")
passes=${2:-5}
shift $(( $# < 2 ? $# : 2 ))
options=("$@")
[ "$(id -u)" = 0 ] || { echo "cold-cpu: run as root (it mounts and drops caches)" >&2; exit 2; }
command -v zstd >/dev/null || { echo "cold-cpu: needs the zstd command (apt-get install zstd)" >&2; exit 2; }

# shellcheck source=bench/lib.sh
. "$here/lib.sh"

(cd "$here/.." && cargo build --release --bin kpack-fuse --example zstd_frames >&2)
bin=$here/../target/release/kpack-fuse
frames_bin=$here/../target/release/examples/zstd_frames

work_dir "$bin"

# zstd as this project links it: the frames in memory, one thread.
ours=$("$frames_bin" "$archive" --write-frames "$work/frames.zst")
zstd_ours=$(awk '{print $6}' <<<"$ours")
bytes=$(awk '{print $2}' <<<"$ours")
# The system's zstd on the same frames (one stream of them), its user + system time.
TIMEFORMAT='%U %S'
sys_times=$( { time zstd -q -d -c "$work/frames.zst" >/dev/null; } 2>&1 )
zstd_system=$(awk -v b="$bytes" '{printf "%.3f", ($1 + $2) * 1e9 / b}' <<<"$sys_times")
echo "zstd, this project's, in memory, 1 thread: $zstd_ours ns/B" >&2
echo "zstd, the system's (zstd -d), 1 thread:    $zstd_system ns/B" >&2

hz=$(getconf CLK_TCK)
echo "pass cold_MB/s cold_ns/B" >&2
for ((p = 1; p <= passes; p++)); do
    drop_caches
    "$bin" mount "${options[@]}" "$archive" "$mnt"
    read -r n secs ticks <<<"$(pass "$mnt")"
    "$bin" unmount "$mnt"
    awk -v p="$p" -v n="$n" -v s="$secs" -v t="$ticks" -v hz="$hz" \
        'BEGIN { printf "%d %.1f %.3f\n", p, n / s / 1e6, t / hz * 1e9 / n }' | tee -a "$work/passes" >&2
done

best=$(awk '{print $3}' "$work/passes" | sort -g | head -n 1)
med=$(awk '{print $3}' "$work/passes" | median)
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2fx", a / b }'; }
printf '%-28s %10s %18s %18s\n' "" "ns/B" "/ zstd (ours)" "/ zstd (system)"
printf '%-28s %10s %18s %18s\n' "zstd, ours" "$zstd_ours" "1.00x" "$(ratio "$zstd_ours" "$zstd_system")"
printf '%-28s %10s %18s %18s\n' "zstd, system" "$zstd_system" "$(ratio "$zstd_system" "$zstd_ours")" "1.00x"
printf '%-28s %10s %18s %18s\n' "mount cold, best of $passes" "$best" "$(ratio "$best" "$zstd_ours")" "$(ratio "$best" "$zstd_system")"
printf '%-28s %10s %18s %18s\n' "mount cold, median" "$med" "$(ratio "$med" "$zstd_ours")" "$(ratio "$med" "$zstd_system")"
