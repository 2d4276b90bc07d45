# Shared by the hand-run read benchmarks (bench/against-build.sh, bench/cold-cpu.sh): the
# machine's busy CPU time, and one pass of 2 readers over a mount. Sourced, not run.

# Busy ticks of the whole machine so far: user + nice + system + irq + softirq + steal.
busy() {
    awk '/^cpu /{print $2 + $3 + $4 + $7 + $8 + $9; exit}' /proc/stat
}

# One pass over the mount at $1 with 2 readers (to /dev/null: no copy through a pipe counted
# in the CPU time); prints "bytes seconds ticks", the bytes counted from the sizes afterwards.
pass() {
    local mnt=$1 t0 b0 bytes t1 b1
    b0=$(busy)
    t0=$(date +%s.%N)
    find "$mnt" -type f -print0 | xargs -0 -P2 -n 16 cat >/dev/null
    t1=$(date +%s.%N)
    b1=$(busy)
    bytes=$(find "$mnt" -type f -printf '%s\n' | awk '{n += $1} END {print n}')
    echo "$bytes $(echo "$t1 - $t0" | bc -l) $((b1 - b0))"
}

# Drops the page cache and lets freed memory settle.
drop_caches() {
    sync
    echo 3 >/proc/sys/vm/drop_caches
    sleep 1
}

# The median of the numbers on standard input.
median() {
    sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'
}

# Makes a work directory with a mount point: sets $work and $mnt, and on exit unmounts whatever
# is left there with the program $1 (lazily if that fails) and removes the directory.
work_dir() {
    work=$(mktemp -d)
    mnt=$work/mnt
    mkdir -p "$mnt"
    unmount_with=$1
    trap '"$unmount_with" unmount "$mnt" >/dev/null 2>&1 || umount -l "$mnt" 2>/dev/null || true; rm -rf "$work"' EXIT
}
