# Shared by the hand-run read benchmarks (bench/against-build.sh, bench/cold-cpu.sh): the
# machine's busy CPU time, the CPU time of a cgroup, and one pass of 2 readers over a mount.
# Sourced, not run.

# Busy ticks of the whole machine so far: user + nice + system + irq + softirq + steal.
busy() {
    awk '/^cpu /{print $2 + $3 + $4 + $7 + $8 + $9; exit}' /proc/stat
}

# CPU time of one group of processes, which other work on a shared machine does not pollute
# (the whole machine's busy time counts everyone's builds): a cgroup v1 cpuacct group. What the
# kernel does outside the group's tasks (writeback threads, interrupts on behalf of the disk) is
# not in it; the whole machine's figure is, so the scripts print both.
cg_root=/sys/fs/cgroup/cpuacct
cg_dirs=()

# Makes a cpuacct group named after this script's process and $1, and sets $cg to its
# directory; to nothing where there is no cgroup v1 cpuacct hierarchy (the scripts then print
# no cgroup figure). Call it in the script's own shell, not in $(...), so that the group is
# removed at exit.
cg_new() {
    cg=
    [ -w "$cg_root/cgroup.procs" ] || return 0
    cg=$cg_root/kpack-bench-$$-$1
    mkdir -p "$cg"
    cg_dirs+=("$cg")
}

# Runs "$2..." with its process (and so its children: a mount's daemon, the readers) in the
# group at $1 (as it is when $1 is empty).
cg_exec() {
    local dir=$1
    shift
    if [ -n "$dir" ]; then
        bash -c 'echo $$ >"$0/cgroup.procs" && exec "$@"' "$dir" "$@"
    else
        "$@"
    fi
}

# The group's CPU time so far in ns (0 without a group).
cg_ns() {
    if [ -n "$1" ]; then cat "$1/cpuacct.usage"; else echo 0; fi
}

# Removes the groups cg_new made (once their processes are gone; a daemon may take a moment).
cg_cleanup() {
    local d i
    for d in "${cg_dirs[@]}"; do
        for ((i = 0; i < 50; i++)); do
            rmdir "$d" 2>/dev/null && break
            sleep 0.1
        done
    done
}

# One pass over the mount at $1 with 2 readers (to /dev/null: no copy through a pipe counted
# in the CPU time), the readers in the cgroup $2 if given (where the mount's daemon should be
# too); prints "bytes seconds ticks cgroup_ns": the whole machine's busy ticks and the group's
# CPU time over the pass (0 without a group), the bytes counted from the sizes afterwards.
pass() {
    local mnt=$1 group=${2:-} t0 b0 c0 bytes t1 b1 c1
    c0=$(cg_ns "$group")
    b0=$(busy)
    t0=$(date +%s.%N)
    cg_exec "$group" sh -c 'find "$1" -type f -print0 | xargs -0 -P2 -n 16 cat >/dev/null' sh "$mnt"
    t1=$(date +%s.%N)
    b1=$(busy)
    c1=$(cg_ns "$group")
    bytes=$(find "$mnt" -type f -printf '%s\n' | awk '{n += $1} END {print n}')
    echo "$bytes $(echo "$t1 - $t0" | bc -l) $((b1 - b0)) $((c1 - c0))"
}

# Drops the page cache and lets freed memory settle: on a VM with free page reporting, waits
# until the count of memory handed back to the host has not moved for 3 seconds (at most 20 s;
# reporting runs in rounds about 2 s apart, the first about a second after the drop). A frame
# handed back costs a host fault at its next first touch, so a pass started sooner would meet
# a mix of frames set by whatever ran before it; elsewhere it waits a second. The suite waits
# the same way (settle_freed_memory in benches/suite.rs).
drop_caches() {
    local reported=/sys/module/page_reporting/parameters/reported_kib last now quiet=0 waited=0
    sync
    echo 3 >/proc/sys/vm/drop_caches
    if [ ! -r "$reported" ]; then
        sleep 1
        return
    fi
    last=$(cat "$reported")
    while ((quiet < 30 && waited < 200)); do
        sleep 0.1
        waited=$((waited + 1))
        now=$(cat "$reported")
        if [ "$now" = "$last" ]; then
            quiet=$((quiet + 1))
        else
            last=$now
            quiet=0
        fi
    done
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
    trap '"$unmount_with" unmount "$mnt" >/dev/null 2>&1 || umount -l "$mnt" 2>/dev/null || true; rm -rf "$work"; cg_cleanup' EXIT
}
