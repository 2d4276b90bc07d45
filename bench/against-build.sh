#!/usr/bin/env bash
# Compares the mount's read path of two builds on one archive, in one run: cold passes with 2
# readers (`find | xargs -P2 cat`, page cache dropped before each, a fresh mount each) and warm
# passes (the same mount, right after its cold pass), in rounds that alternate which build goes
# first. Prints, per build, the median cold MB/s, the cold CPU time per byte read measured two
# ways (the whole machine's user + nice + system + irq + softirq from /proc/stat; and a cgroup
# holding the mount's daemon and the readers, cpuacct in cgroup v1, which other work on a shared
# machine does not pollute but which misses kernel threads such as writeback) and the median
# warm MB/s, then the ratios NEW / OLD. Run as root; by hand, not in CI.
#
# usage: bench/against-build.sh OLD_KPACK_FUSE NEW_KPACK_FUSE ARCHIVE [ROUNDS] [MOUNT OPTION...]
#   e.g. bench/against-build.sh /tmp/old/kpack-fuse target/release/kpack-fuse rocsparse.kpack 5
set -euo pipefail

[ $# -ge 3 ] || { sed -n '2,12p' "$0" >&2; exit 2; }
old=$(realpath "$1") new=$(realpath "$2") archive=$(realpath "$3")
rounds=${4:-5}
shift $(( $# < 4 ? $# : 4 ))
options=("$@")
[ "$(id -u)" = 0 ] || { echo "against-build: run as root (it mounts and drops caches)" >&2; exit 2; }

# shellcheck source=bench/lib.sh
. "$(dirname "$0")/lib.sh"

work_dir "$new"
cg_new mount

# One cold and one warm pass of build $1; appends
# "build cold_mbs ns_per_byte(machine) warm_mbs ns_per_byte(cgroup) load".
measure() {
    local build=$1 bin cold warm
    bin=$old
    [ "$build" = new ] && bin=$new
    drop_caches
    cg_exec "$cg" "$bin" mount "${options[@]}" "$archive" "$mnt"
    cold=$(pass "$mnt" "$cg")
    warm=$(pass "$mnt" "$cg")
    "$bin" unmount "$mnt"
    read -r bytes secs ticks cgns <<<"$cold"
    read -r wbytes wsecs _ <<<"$warm"
    awk -v b="$build" -v n="$bytes" -v s="$secs" -v t="$ticks" -v wn="$wbytes" -v ws="$wsecs" \
        -v c="$cgns" -v hz="$(getconf CLK_TCK)" -v load="$(cut -d' ' -f1 /proc/loadavg)" 'BEGIN {
            printf "%s %.1f %.3f %.1f %.3f %s\n", b, n / s / 1e6, t / hz * 1e9 / n, wn / ws / 1e6,
                c / n, load }' \
        | tee -a "$work/results" >&2
}

echo "build cold_MB/s cold_ns/B(machine) warm_MB/s cold_ns/B(cgroup) load" >&2
for ((r = 0; r < rounds; r++)); do
    if ((r % 2 == 0)); then measure old; measure new; else measure new; measure old; fi
done

for col in 2 3 4 5; do
    for build in old new; do
        awk -v b="$build" -v c="$col" '$1 == b {print $c}' "$work/results" | median >"$work/$build.$col"
    done
done
printf '%-10s %14s %16s %16s %14s\n' "" "cold MB/s" "cold ns/B mach." "cold ns/B cgroup" "warm MB/s"
for build in old new; do
    printf '%-10s %14s %16s %16s %14s\n' "$build" "$(cat "$work/$build.2")" "$(cat "$work/$build.3")" \
        "$(cat "$work/$build.5")" "$(cat "$work/$build.4")"
done
quot() { awk -v a="$(cat "$work/new.$1")" -v b="$(cat "$work/old.$1")" 'BEGIN {
    if (b > 0) printf "%.2fx", a / b; else print "-" }'; }
printf '%-10s %14s %16s %16s %14s\n' "new / old" "$(quot 2)" "$(quot 3)" "$(quot 5)" "$(quot 4)"
echo "(medians of $rounds rounds; each cold and warm pass per build per round; spread on stderr above)"
