#!/usr/bin/env bash
# A cold read's CPU per byte against zstd's own, in one run. Cold passes of a mount of ARCHIVE
# (a fresh mount each, page cache dropped before it, 2 readers) are measured two ways: the
# whole machine's busy CPU time from /proc/stat, and the CPU time of a cgroup holding the
# mount's daemon and the readers (cpuacct, cgroup v1: not polluted by other work on a shared
# machine, but blind to kernel threads such as writeback), each over the bytes read. The same
# frames, in memory, are decoded on one thread by the zstd this project links
# (examples/zstd_frames.rs, its thread's CPU time) and by the system's zstd (the `zstd` command,
# Debian's libzstd, its user + system time). Before each mount pass, also on a dropped page
# cache: what keeping the decoded bytes in the page cache costs beyond zstd
# (examples/zstd_frames.rs --page-cache: a new file per kernel under /var/tmp filled, then read
# back), which no design that serves warm reads from the page cache avoids. After each cold
# pass, a warm one on the same mount: the readers' own work, which the cold pass also holds.
# Prints each pass, the best and the median of each measure (and of cold minus warm), and their
# ratios to both zstd figures. Run as root; by hand, not in CI.
#
# usage: bench/cold-cpu.sh ARCHIVE [PASSES] [MOUNT OPTION...]
#   builds the release program and example first (cargo build --release)
set -euo pipefail

[ $# -ge 1 ] || { sed -n '2,18p' "$0" >&2; exit 2; }
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
cg_new mount
mount_cg=$cg
cg_new zstd
zstd_cg=$cg

# zstd as this project links it: the frames in memory, one thread.
c0=$(cg_ns "$zstd_cg")
ours=$(cg_exec "$zstd_cg" "$frames_bin" "$archive" --write-frames "$work/frames.zst")
c1=$(cg_ns "$zstd_cg")
zstd_ours=$(awk '{print $6}' <<<"$ours")
bytes=$(awk '{print $2}' <<<"$ours")
# The system's zstd on the same frames (one stream of them), its user + system time.
TIMEFORMAT='%U %S'
sys_times=$( { time zstd -q -d -c "$work/frames.zst" >/dev/null; } 2>&1 )
zstd_system=$(awk -v b="$bytes" '{printf "%.3f", ($1 + $2) * 1e9 / b}' <<<"$sys_times")
c2=$(cg_ns "$zstd_cg")
cg_exec "$zstd_cg" zstd -q -d -c "$work/frames.zst" >/dev/null
c3=$(cg_ns "$zstd_cg")
echo "zstd, this project's, in memory, 1 thread: $zstd_ours ns/B" >&2
echo "zstd, the system's (zstd -d), 1 thread:    $zstd_system ns/B" >&2
if [ -n "$zstd_cg" ]; then
    awk -v b="$bytes" -v l=$((c1 - c0)) -v s=$((c3 - c2)) 'BEGIN {
        printf "  in a cgroup: ours %.3f ns/B with loading the frames, the system'"'"'s %.3f ns/B\n", l / b, s / b }' >&2
fi

# What holding the decoded bytes in the page cache costs beyond zstd: filling a new file per
# kernel on the scratch file system and reading the files back, on a dropped page cache, right
# before each mount pass (what fresh page frames cost swings with the memory's state).
floor_pass() {
    local dir out
    dir=$(mktemp -d /var/tmp/kpack-floor.XXXXXX)
    out=$("$frames_bin" "$archive" --page-cache "$dir")
    rmdir "$dir"
    awk -v z="$zstd_ours" '{printf "%.3f %.3f %.3f\n", $4, $6, z + $4 + $6}' <<<"$out"
}

hz=$(getconf CLK_TCK)
echo "pass cold_MB/s cold_ns/B(machine) cold_ns/B(cgroup) load warm_ns/B(machine) warm_ns/B(cgroup)" \
    "| page-cache fill read_back zstd+both (ns/B)" >&2
for ((p = 1; p <= passes; p++)); do
    drop_caches
    read -r fill read_back floor <<<"$(floor_pass)"
    echo "$floor" >>"$work/floor"
    drop_caches
    cg_exec "$mount_cg" "$bin" mount "${options[@]}" "$archive" "$mnt"
    read -r n secs ticks cgns <<<"$(pass "$mnt" "$mount_cg")"
    # The same readers again on the same mount, every kernel now in the page cache: their own
    # work (the copies out of the page cache, the opens, starting the programs).
    read -r _ _ wticks wcgns <<<"$(pass "$mnt" "$mount_cg")"
    "$bin" unmount "$mnt"
    awk -v p="$p" -v n="$n" -v s="$secs" -v t="$ticks" -v c="$cgns" -v hz="$hz" \
        -v wt="$wticks" -v wc="$wcgns" -v load="$(cut -d' ' -f1 /proc/loadavg)" \
        'BEGIN { printf "%d %.1f %.3f %.3f %s %.3f %.3f", p, n / s / 1e6, t / hz * 1e9 / n,
                 c / n, load, wt / hz * 1e9 / n, wc / n }' \
        | tee -a "$work/passes" >&2
    echo >>"$work/passes"
    echo " | $fill $read_back $floor" >&2
done

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2fx", a / b }'; }
printf '%-36s %10s %18s %18s\n' "" "ns/B" "/ zstd (ours)" "/ zstd (system)"
printf '%-36s %10s %18s %18s\n' "zstd, ours" "$zstd_ours" "1.00x" "$(ratio "$zstd_ours" "$zstd_system")"
printf '%-36s %10s %18s %18s\n' "zstd, system" "$zstd_system" "$(ratio "$zstd_system" "$zstd_ours")" "1.00x"
for which in best median; do
    if [ "$which" = best ]; then
        floor=$(sort -g "$work/floor" | head -n 1)
    else
        floor=$(median <"$work/floor")
    fi
    printf '%-36s %10s %18s %18s\n' "zstd + page-cache floor, $which" "$floor" \
        "$(ratio "$floor" "$zstd_ours")" "$(ratio "$floor" "$zstd_system")"
done
for col in 3 4; do
    what=machine
    ((col == 4)) && what=cgroup
    [ "$what" = cgroup ] && [ -z "$mount_cg" ] && continue
    best=$(awk -v c="$col" '{print $c}' "$work/passes" | sort -g | head -n 1)
    med=$(awk -v c="$col" '{print $c}' "$work/passes" | median)
    printf '%-36s %10s %18s %18s\n' "mount cold ($what), best of $passes" "$best" \
        "$(ratio "$best" "$zstd_ours")" "$(ratio "$best" "$zstd_system")"
    printf '%-36s %10s %18s %18s\n' "mount cold ($what), median" "$med" \
        "$(ratio "$med" "$zstd_ours")" "$(ratio "$med" "$zstd_system")"
    # Columns 6 and 7: the warm pass after each cold one, machine-wide and in the cgroup.
    warm=$(awk -v c=$((col + 3)) '{print $c}' "$work/passes" | median)
    decode=$(awk -v c="$col" -v w=$((col + 3)) '{print $c - $w}' "$work/passes" | median)
    printf '%-36s %10s %18s %18s\n' "mount warm ($what), median" "$warm" \
        "$(ratio "$warm" "$zstd_ours")" "$(ratio "$warm" "$zstd_system")"
    printf '%-36s %10s %18s %18s\n' "mount cold - warm ($what), median" "$decode" \
        "$(ratio "$decode" "$zstd_ours")" "$(ratio "$decode" "$zstd_system")"
done
