#!/usr/bin/env bash
# Compares the mount's read path of two builds on one archive, in one run: cold passes with 2
# readers (`find | xargs -P2 cat`, page cache dropped before each, a fresh mount each) and warm
# passes (the same mount, right after its cold pass), in rounds that alternate which build goes
# first. Prints, per build, the median cold MB/s, the CPU time of the whole machine per byte read
# (user + nice + system + irq + softirq from /proc/stat) and the median warm MB/s, then the
# ratios NEW / OLD. Run as root on an idle machine; by hand, not in CI.
#
# usage: bench/against-build.sh OLD_KPACK_FUSE NEW_KPACK_FUSE ARCHIVE [ROUNDS] [MOUNT OPTION...]
#   e.g. bench/against-build.sh /tmp/old/kpack-fuse target/release/kpack-fuse rocsparse.kpack 5
set -euo pipefail

[ $# -ge 3 ] || { sed -n '2,10p' "$0" >&2; exit 2; }
old=$(realpath "$1") new=$(realpath "$2") archive=$(realpath "$3")
rounds=${4:-5}
shift $(( $# < 4 ? $# : 4 ))
options=("$@")
[ "$(id -u)" = 0 ] || { echo "against-build: run as root (it mounts and drops caches)" >&2; exit 2; }

# shellcheck source=bench/lib.sh
. "$(dirname "$0")/lib.sh"

work_dir "$new"

# One cold and one warm pass of build $1; appends "build cold_mbs ns_per_byte warm_mbs".
measure() {
    local build=$1 bin cold warm
    bin=$old
    [ "$build" = new ] && bin=$new
    drop_caches
    "$bin" mount "${options[@]}" "$archive" "$mnt"
    cold=$(pass "$mnt")
    warm=$(pass "$mnt")
    "$bin" unmount "$mnt"
    read -r bytes secs ticks <<<"$cold"
    read -r wbytes wsecs _ <<<"$warm"
    awk -v b="$build" -v n="$bytes" -v s="$secs" -v t="$ticks" -v wn="$wbytes" -v ws="$wsecs" \
        -v hz="$(getconf CLK_TCK)" 'BEGIN {
            printf "%s %.1f %.3f %.1f\n", b, n / s / 1e6, t / hz * 1e9 / n, wn / ws / 1e6 }' \
        | tee -a "$work/results" >&2
}

echo "build cold_MB/s cold_ns/B warm_MB/s" >&2
for ((r = 0; r < rounds; r++)); do
    if ((r % 2 == 0)); then measure old; measure new; else measure new; measure old; fi
done

for col in 2 3 4; do
    for build in old new; do
        awk -v b="$build" -v c="$col" '$1 == b {print $c}' "$work/results" | median >"$work/$build.$col"
    done
done
printf '%-10s %14s %14s %14s\n' "" "cold MB/s" "cold CPU ns/B" "warm MB/s"
for build in old new; do
    printf '%-10s %14s %14s %14s\n' "$build" "$(cat "$work/$build.2")" "$(cat "$work/$build.3")" "$(cat "$work/$build.4")"
done
printf '%-10s %14s %14s %14s\n' "new / old" \
    "$(echo "$(cat "$work/new.2") / $(cat "$work/old.2")" | bc -l | xargs printf '%.2fx')" \
    "$(echo "$(cat "$work/new.3") / $(cat "$work/old.3")" | bc -l | xargs printf '%.2fx')" \
    "$(echo "$(cat "$work/new.4") / $(cat "$work/old.4")" | bc -l | xargs printf '%.2fx')"
echo "(medians of $rounds rounds; each cold and warm pass per build per round; spread on stderr above)"
