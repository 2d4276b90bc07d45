#!/bin/sh
# Container entrypoint: mounts a kernel pack with kpack-fuse, waits until the mount is live, runs
# the container's command, and unmounts when the command ends or the container is stopped.
#
#   container-entrypoint.sh COMMAND [ARG...]
#
# Configured through the environment:
#   KPACK_SOURCE         the .kpack file, directory of .kpack files or HIPK host binary, or an
#                        oci://REGISTRY/REPOSITORY[:TAG|@DIGEST] reference (required; passed to
#                        kpack-fuse mount as it is)
#   KPACK_MOUNTPOINT     where to mount it (default: /opt/rocm/lib/kpack; created if missing)
#   KPACK_MOUNT_OPTIONS  -o options for kpack-fuse mount (default: ro; for oci://, e.g.
#                        ro,gpu=auto or gpu=ARCH, tls_verify=false)
#   REGISTRY_AUTH_FILE   read by kpack-fuse itself: registry credentials for oci:// sources
#   KPACK_READY_TIMEOUT  seconds to wait for the mount to appear (default: 30)
#   KPACK_FUSE           the kpack-fuse program (default: kpack-fuse from PATH)
#
# The daemon runs in the foreground as a child of this script, so its life is tied to the
# container: SIGTERM and SIGINT to the script reach the command as SIGTERM; when the command has exited
# the daemon is stopped (it unmounts, lazily if something still holds a file) and the script exits
# with the command's status. Failures of the script itself: 2 usage, 3 the mount did not come up,
# 4 the daemon exited while the command ran.
#
# The container heals when restarted (a restart policy, or Kubernetes):
# * A mount whose daemon is gone (the container or its pod was killed, so nothing unmounted)
#   stays where it was, on the host too when the mount point is shared with it, and every access
#   to it fails with ENOTCONN ("Transport endpoint is not connected"). Such a mount on the mount
#   point is detached before mounting.
# * When the daemon dies while the command runs, the command is stopped, the dead mount detached,
#   and the script exits 4, so that the runtime restarts the container.
set -u

say() { echo "kpack-entrypoint: $*" >&2; }

source_path="${KPACK_SOURCE:-}"
mountpoint="${KPACK_MOUNTPOINT:-/opt/rocm/lib/kpack}"
options="${KPACK_MOUNT_OPTIONS-ro}"
timeout="${KPACK_READY_TIMEOUT:-30}"
kpack_fuse="${KPACK_FUSE:-kpack-fuse}"

[ -n "$source_path" ] || { say "KPACK_SOURCE is not set"; exit 2; }
[ $# -gt 0 ] || { say "no command given"; exit 2; }
case "$timeout" in ''|*[!0-9]*) say "KPACK_READY_TIMEOUT must be whole seconds"; exit 2 ;; esac

# Whether $1 is a mount whose daemon is gone: a statfs of it, which the kernel always passes to
# the daemon (a stat may be answered from the attribute cache), fails with ENOTCONN. One that
# does not answer within 10 s is not taken for dead.
is_dead_mount() {
  case "$(LC_ALL=C timeout -s KILL 10 stat -f -c %t -- "$1" 2>&1 >/dev/null)" in
    *'Transport endpoint is not connected'*) return 0 ;;
    *) return 1 ;;
  esac
}

# A mount left by a daemon that was killed is detached (with kpack-fuse unmount, which refuses
# mounts of other file systems), then any below it.
cleared=0
while is_dead_mount "$mountpoint"; do
  if [ "$cleared" -ge 8 ]; then
    say "$mountpoint: still a dead mount after detaching $cleared"
    exit 3
  fi
  say "$mountpoint: its daemon is gone (Transport endpoint is not connected); detaching the dead mount"
  # Resolved through the parent, since the dead mount itself cannot be entered.
  parent="$(cd -- "$(dirname -- "$mountpoint")" && pwd -P)" || exit 3
  "$kpack_fuse" unmount --lazy -- "${parent%/}/$(basename -- "$mountpoint")" \
    || { say "cannot detach the dead mount on $mountpoint"; exit 3; }
  cleared=$((cleared + 1))
done
mkdir -p -- "$mountpoint" || exit 2
mountpoint="$(cd -- "$mountpoint" && pwd -P)" || exit 2

# Whether a kpack-fuse filesystem is mounted on $mountpoint (mountinfo escapes space, tab,
# newline and backslash in paths as octal).
is_mounted() {
  awk -v want="$mountpoint" '
    function unescape(s,   out, i, c) {
      out = ""
      for (i = 1; i <= length(s); i++) {
        c = substr(s, i, 1)
        if (c == "\\" && substr(s, i + 1, 3) ~ /^[0-7][0-7][0-7]$/) {
          out = out sprintf("%c", (substr(s, i + 1, 1) * 64) + (substr(s, i + 2, 1) * 8) + substr(s, i + 3, 1))
          i += 3
        } else {
          out = out c
        }
      }
      return out
    }
    {
      for (sep = 7; sep <= NF && $sep != "-"; sep++) ;
      if (unescape($5) == want && $(sep + 1) == "fuse.kpack-fuse") found = 1
    }
    END { exit !found }' /proc/self/mountinfo
}

if is_mounted; then
  say "$mountpoint already has a kpack-fuse mount"
  exit 3
fi

# A stop request that arrives before the command runs ends the start-up instead.
stop=""
trap 'stop=1' TERM INT

if [ -n "$options" ]; then
  "$kpack_fuse" mount --foreground -o "$options" -- "$source_path" "$mountpoint" &
else
  "$kpack_fuse" mount --foreground -- "$source_path" "$mountpoint" &
fi
daemon=$!

# Wait for the mount, or for the daemon to give up.
waited=0
while ! is_mounted; do
  if ! kill -0 "$daemon" 2>/dev/null; then
    wait "$daemon"
    say "kpack-fuse exited with status $? before $mountpoint was mounted"
    exit 3
  fi
  if [ -n "$stop" ] || [ "$waited" -ge $((timeout * 10)) ]; then
    [ -n "$stop" ] || say "$mountpoint not mounted after ${timeout}s"
    kill -TERM "$daemon" 2>/dev/null
    wait "$daemon"
    if [ -n "$stop" ]; then exit 143; else exit 3; fi
  fi
  sleep 0.1
  waited=$((waited + 1))
done
say "mounted $source_path on $mountpoint"

status=143
daemon_gone=""
if [ -z "$stop" ]; then
  "$@" &
  child=$!
  # A background command ignores SIGINT in a non-interactive shell: pass Ctrl-C on as SIGTERM.
  trap 'stop=1; kill -TERM "$child" 2>/dev/null' TERM INT
  # Wait for the command to exit, and look at the daemon every second meanwhile: sh's wait waits
  # for one given child, not for whichever ends first. wait returns early when a trapped signal
  # arrives, SIGCHLD included where the shell does so (dash), which makes the exits show at once.
  # While the command is to stop, SIGTERM goes to it every round: one sent before the forked
  # shell has cleared its copy of this script's traps (a daemon that dies at once, a stop
  # during start-up) runs that copy, and the command then starts as if nothing was sent. The
  # exited command is reaped by the waits, so kill -0 then fails.
  trap : CHLD
  while kill -0 "$child" 2>/dev/null; do
    if [ -z "$daemon_gone" ] && ! kill -0 "$daemon" 2>/dev/null; then
      wait "$daemon"
      say "kpack-fuse exited with status $? while the command ran; stopping the command"
      daemon_gone=1
    fi
    [ -z "$stop$daemon_gone" ] || kill -TERM "$child" 2>/dev/null
    sleep 1 &
    wait $!
  done
  trap - CHLD
  # wait returns early when a trapped signal arrives; wait again until the command has exited.
  while :; do
    wait "$child"
    status=$?
    kill -0 "$child" 2>/dev/null || break
  done
fi
trap - TERM INT

if [ -z "$daemon_gone" ]; then
  kill -TERM "$daemon" 2>/dev/null
  wait "$daemon"
fi
if is_mounted; then
  say "$mountpoint still mounted after kpack-fuse exited; detaching"
  umount -l -- "$mountpoint" 2>/dev/null || "$kpack_fuse" unmount --lazy -- "$mountpoint"
fi
if [ -n "$daemon_gone" ]; then
  say "exiting with status 4, so that the container is restarted"
  exit 4
fi
exit "$status"
