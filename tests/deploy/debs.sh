#!/usr/bin/env bash
# The Debian packages: built by scripts/build-debs.sh, checked by lintian and by their symbols
# file, installed with dpkg, used (a pack mounted through the packaged mount helper and read byte
# for byte; a C program built against the packaged library with pkg-config, and with CMake,
# reading each kernel), then removed and purged, after which every file and directory is as it
# was before the install.
#
# Needs root, /dev/fuse, dpkg-dev, debhelper, lintian, gcc, pkg-config and cmake
# (scripts/setup-deps.sh installs them), and a machine where these packages are not installed.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

need_root_tools dpkg-buildpackage dh lintian gcc pkg-config cmake findmnt
packages=(kpack-fuse librocm-kpack0 librocm-kpack-dev)
work="$(mktemp -d /tmp/kpack-debs-test.XXXXXX)"
KPACK="$root/samples/rocrand-sample.kpack"

cleanup() {
  if findmnt -n "$work/mnt" >/dev/null 2>&1; then umount -l "$work/mnt" || true; fi
  if [ -n "${installed:-}" ]; then dpkg -P "${packages[@]}" >/dev/null 2>&1 || true; fi
  rm -rf -- "$work"
}
trap cleanup EXIT

for p in "${packages[@]}"; do
  if dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q installed; then
    fail "$p is installed on this machine: the test installs and purges it (dpkg -P $p first)"
  fi
done
for f in /usr/bin/kpack-fuse /usr/sbin/mount.kpack-fuse; do
  [ ! -e "$f" ] && [ ! -L "$f" ] || fail "$f exists and would be replaced by the package"
done

# ---- build ----------------------------------------------------------------------------------
say "building the packages"
mapfile -t debs < <(scripts/build-debs.sh)
[ "${#debs[@]}" -eq 3 ] || fail "build-debs.sh printed ${#debs[@]} packages: ${debs[*]}"
version="$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)"
arch="$(dpkg --print-architecture)"
multiarch="$(dpkg-architecture -qDEB_HOST_MULTIARCH)"
for i in 0 1 2; do
  [ "${debs[$i]}" = "$root/target/debian/${packages[$i]}_${version}_${arch}.deb" ] \
    || fail "unexpected package file ${debs[$i]}"
done

# What each package holds (the paths; man pages compressed by dh_compress).
contents() { dpkg-deb -c "$1" | awk '{ p = $6; for (i = 7; i <= NF; i++) p = p " " $i; print p }' | LC_ALL=C sort; }
has() {
  grep -qxF -- "$2" <<< "$(contents "$1")" || fail "$(basename -- "$1") lacks $2"
}
has "${debs[0]}" "./usr/bin/kpack-fuse"
has "${debs[0]}" "./usr/sbin/mount.kpack-fuse -> ../bin/kpack-fuse"
has "${debs[0]}" "./usr/share/man/man1/kpack-fuse-mount.1.gz"
has "${debs[0]}" "./usr/share/man/man8/mount.kpack-fuse.8.gz -> ../man1/kpack-fuse-mount.1.gz"
has "${debs[0]}" "./lib/systemd/system/opt-rocm-lib-kpack.mount"
has "${debs[0]}" "./usr/share/doc/kpack-fuse/examples/kubernetes/kpack-daemonset.yaml"
has "${debs[1]}" "./usr/lib/$multiarch/librocm_kpack.so.$version"
has "${debs[1]}" "./usr/lib/$multiarch/librocm_kpack.so.0 -> librocm_kpack.so.$version"
has "${debs[2]}" "./usr/lib/$multiarch/librocm_kpack.so -> librocm_kpack.so.0"
has "${debs[2]}" "./usr/lib/$multiarch/librocm_kpack.a"
has "${debs[2]}" "./usr/include/rocm_kpack/kpack.h"
has "${debs[2]}" "./usr/lib/$multiarch/pkgconfig/rocm_kpack.pc"
has "${debs[2]}" "./usr/lib/$multiarch/cmake/rocm-kpack/rocm-kpack-config.cmake"
# No file in two packages (dpkg would refuse to install them together).
dups="$(for d in "${debs[@]}"; do contents "$d" | grep -v '/$'; done | sort | uniq -d)"
[ -z "$dups" ] || fail "files in more than one package: $dups"

# ---- symbols --------------------------------------------------------------------------------
# The packaged symbols file lists exactly the library's exported functions ...
dpkg-deb -e "${debs[1]}" "$work/control"
exported="$(nm -D --defined-only "$root/target/release/librocm_kpack.so" | awk '{ print $3 }' | LC_ALL=C sort)"
listed="$(awk '/^ / { sub(/@Base$/, "", $1); print $1 }' "$work/control/symbols" | LC_ALL=C sort)"
[ "$(wc -l <<< "$exported")" -eq 14 ] || fail "the library exports $(wc -l <<< "$exported") functions, not 14"
same_text "symbols of librocm-kpack0" "$exported" "$listed"
grep -qx "librocm_kpack.so.0 librocm-kpack0 #MINVER#" "$work/control/symbols" \
  || fail "the symbols file does not name librocm_kpack.so.0"
grep -qx "librocm_kpack 0 librocm-kpack0 (>= $version)" "$work/control/shlibs" \
  || fail "shlibs: $(cat "$work/control/shlibs")"
# ... and the check the package build makes fails when one is missing from it.
dpkg-deb -x "${debs[1]}" "$work/lib"
grep -v ' kpack_close@Base ' debian/librocm-kpack0.symbols > "$work/short.symbols"
if dpkg-gensymbols -plibrocm-kpack0 -P"$work/lib" -I"$work/short.symbols" -O"$work/out.symbols" \
    -c4 -e"$work/lib/usr/lib/$multiarch/librocm_kpack.so.$version" > "$work/gensymbols.out" 2>&1; then
  fail "dpkg-gensymbols -c4 accepted a symbols file without kpack_close"
fi
grep -q '^+ kpack_close@Base' "$work/gensymbols.out" \
  || fail "dpkg-gensymbols did not name the new symbol: $(cat "$work/gensymbols.out")"

# ---- lintian --------------------------------------------------------------------------------
# Every tag down to info level is either absent or overridden with a reason in
# debian/*.lintian-overrides (an override that no longer matches is itself reported).
say "lintian"
status=0
lintian --display-info --fail-on error,warning,info "${debs[@]}" > "$work/lintian.out" 2>&1 || status=$?
grep -vx "running with root privileges is not recommended!" "$work/lintian.out" > "$work/lintian.tags" || true
if [ "$status" -ne 0 ] || [ -s "$work/lintian.tags" ]; then
  cat "$work/lintian.out" >&2
  fail "lintian reported tags (status $status) not covered by the packages' overrides"
fi

# ---- install and use ------------------------------------------------------------------------
snapshot() {
  find /usr /etc /lib /opt /var/lib/systemd /var/lib/dpkg/info /var/lib/dpkg/alternatives \
    -xdev \( -path /etc/ld.so.cache \) -prune -o -print 2>/dev/null | LC_ALL=C sort
}
snapshot > "$work/before.txt"
say "installing ${packages[*]}"
installed=1
dpkg -i "${debs[@]}" > "$work/dpkg-i.out" 2>&1 || { cat "$work/dpkg-i.out" >&2; fail "dpkg -i failed"; }
[ "$(command -v kpack-fuse)" = /usr/bin/kpack-fuse ] || fail "kpack-fuse is not /usr/bin/kpack-fuse"
[ "$(kpack-fuse --version)" = "kpack-fuse $version" ] || fail "kpack-fuse --version: $(kpack-fuse --version)"
[ "$(man -w kpack-fuse-mount)" = /usr/share/man/man1/kpack-fuse-mount.1.gz ] || fail "man -w kpack-fuse-mount"
# man follows the link to the page it names.
[ "$(man -w 8 mount.kpack-fuse)" = /usr/share/man/man1/kpack-fuse-mount.1.gz ] || fail "man -w 8 mount.kpack-fuse"

want="$(kernel_sums "$KPACK" "$work/extracted")"
[ "$(wc -l <<< "$want")" -eq 3 ] || fail "expected 3 kernels in the sample, got: $want"

# The packaged mount(8) helper.
mkdir -p "$work/mnt"
timeout 60 mount -t kpack-fuse -o ro,nodev,nosuid "$KPACK" "$work/mnt" || fail "mount -t kpack-fuse failed"
[ "$(findmnt -n -o FSTYPE "$work/mnt")" = fuse.kpack-fuse ] || fail "no kpack-fuse mount on $work/mnt"
got="$(cd "$work/mnt" && timeout 60 find . -type f -name '*.hsaco' -exec sha256sum {} + | LC_ALL=C sort -k2)"
same_text "kernels read through the packaged mount helper" "$want" "$got"
timeout 60 umount "$work/mnt" || fail "umount failed"

# A C program built with pkg-config against the packaged library, run without any library path.
cflags="$(pkg-config --cflags --libs rocm_kpack)"
cflags="${cflags% }"
[ "$cflags" = "-lrocm_kpack" ] || fail "pkg-config --cflags --libs rocm_kpack: $cflags"
gcc -Wall -Werror -o "$work/read-kernel" tests/deploy/read-kernel.c $cflags || fail "building against the package failed"
resolved="$(ldd "$work/read-kernel" | awk '$1 == "librocm_kpack.so.0" { print $3 }')"
[ -n "$resolved" ] && [ "$(readlink -f -- "$resolved")" = "/usr/lib/$multiarch/librocm_kpack.so.$version" ] \
  || fail "read-kernel does not use the packaged library: $(ldd "$work/read-kernel")"
# The same program built with CMake through the packaged rocm-kpack package.
mkdir -p "$work/cmake"
cat > "$work/cmake/CMakeLists.txt" <<CMAKE
cmake_minimum_required(VERSION 3.16)
project(read_kernel C)
find_package(rocm-kpack REQUIRED)
add_executable(read-kernel "$root/tests/deploy/read-kernel.c")
target_link_libraries(read-kernel PRIVATE rocm::rocm_kpack)
CMAKE
{ cmake -S "$work/cmake" -B "$work/cmake/build" && cmake --build "$work/cmake/build"; } > "$work/cmake.out" 2>&1 \
  || { cat "$work/cmake.out" >&2; fail "building with find_package(rocm-kpack) failed"; }
n=0
while read -r _ path; do
  binary="$(dirname -- "${path#./}")"
  arch_name="$(basename -- "$path" .hsaco)"
  for program in "$work/read-kernel" "$work/cmake/build/read-kernel"; do
    timeout 60 "$program" "$KPACK" "$binary" "$arch_name" > "$work/kernel" \
      || fail "$program $binary $arch_name failed"
    cmp -- "$work/kernel" "$work/extracted/${path#./}" || fail "$program $binary $arch_name: wrong bytes"
  done
  n=$((n + 1))
done <<< "$want"
[ "$n" -eq 3 ] || fail "read $n kernels with the C programs, not 3"

# ---- remove and purge -----------------------------------------------------------------------
say "removing and purging"
dpkg -r "${packages[@]}" > "$work/dpkg-r.out" 2>&1 || { cat "$work/dpkg-r.out" >&2; fail "dpkg -r failed"; }
for f in /usr/bin/kpack-fuse /usr/sbin/mount.kpack-fuse "/usr/lib/$multiarch/librocm_kpack.so.0"; do
  [ ! -e "$f" ] && [ ! -L "$f" ] || fail "$f is still there after dpkg -r"
done
dpkg -P "${packages[@]}" > "$work/dpkg-p.out" 2>&1 || { cat "$work/dpkg-p.out" >&2; fail "dpkg -P failed"; }
installed=""
for p in "${packages[@]}"; do
  if dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q installed; then fail "$p still installed"; fi
done
snapshot > "$work/after.txt"
if ! diff "$work/before.txt" "$work/after.txt" > "$work/left.diff"; then
  cat "$work/left.diff" >&2
  fail "install and purge changed the file system (diff above: < before, > after)"
fi
say "ok: ${packages[*]} built, lintian clean, installed, used (mount, pkg-config, CMake), purged without a trace"
