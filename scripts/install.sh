#!/usr/bin/env bash
# Installs kpack-fuse into a prefix: the kpack-fuse program and its manual pages, librocm_kpack
# (shared + static library, headers, pkg-config file, CMake package), and the mount(8) helper link
# mount.kpack-fuse in a separate sbin directory. Every installed path, and every directory the
# install had to create, is recorded in PREFIX/share/rocm-kpack/install-manifest.txt (relative to
# the prefix, or absolute outside it; directories end in /) so that --uninstall removes exactly
# what the install wrote: its files, then the directories it created, when empty. A directory that
# was there before (Debian ships an empty /usr/local/include and /usr/local/share/man) stays.
#
# The program and the libraries are installed without debug information (a release build keeps
# line tables for profiling, which would triple their size). It is kept in kpack-fuse.debug and
# librocm_kpack.so.debug next to the build output, and each installed file names its .debug file
# (.gnu_debuglink) so gdb and perf find it there, or under /usr/lib/debug/PREFIX/... if copied.
#
#   scripts/install.sh                                    # /usr/local and /sbin, cargo --release first
#   scripts/install.sh --prefix /opt/x --from target/debug --sbindir none
#   scripts/install.sh --prefix /usr/local --uninstall
#
# Options:
#   --prefix DIR    install root (default: /usr/local)
#   --libdir DIR    library directory relative to the prefix (default: lib)
#   --sbindir DIR   where mount(8) looks for helpers, absolute (default: /sbin); "none" skips the
#                   mount.kpack-fuse link
#   --from DIR      directory holding an already built kpack-fuse, librocm_kpack.so and .a
#   --profile NAME  cargo profile to build when --from is not given (default: release)
#   --uninstall     remove the files listed in the prefix's manifest, then the directories the
#                   install created, each only if empty
# DESTDIR, when set, is prepended to every written path (for packaging); the installed files still
# refer to PREFIX.
#
# Components are installed by one function each (install_library, install_program below); the
# manifest covers them all.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
prefix="/usr/local"
libdir="lib"
sbindir="/sbin"
from=""
profile="release"
uninstall=0

die() { echo "install.sh: $*" >&2; exit 1; }

while [ $# -gt 0 ]; do
  case "$1" in
    --prefix) prefix="${2:?--prefix needs a directory}"; shift 2 ;;
    --prefix=*) prefix="${1#*=}"; shift ;;
    --libdir) libdir="${2:?--libdir needs a directory}"; shift 2 ;;
    --libdir=*) libdir="${1#*=}"; shift ;;
    --sbindir) sbindir="${2:?--sbindir needs a directory or none}"; shift 2 ;;
    --sbindir=*) sbindir="${1#*=}"; shift ;;
    --from) from="${2:?--from needs a directory}"; shift 2 ;;
    --from=*) from="${1#*=}"; shift ;;
    --profile) profile="${2:?--profile needs a name}"; shift 2 ;;
    --profile=*) profile="${1#*=}"; shift ;;
    --uninstall) uninstall=1; shift ;;
    # The comment block at the top of this file, up to its first line of code.
    -h|--help) awk 'NR == 1 { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "$0"; exit 0 ;;
    *) die "unknown option: $1" ;;
  esac
done

[ -n "$prefix" ] || die "--prefix is required"
case "$prefix" in /*) ;; *) prefix="$(pwd)/$prefix" ;; esac
prefix="${prefix%/}"
case "$libdir" in /*|*..*) die "--libdir must be a relative path inside the prefix" ;; esac
libdir="${libdir%/}"
case "$sbindir" in none|/*) ;; *) die "--sbindir must be an absolute path or none" ;; esac
[ "$sbindir" = / ] || sbindir="${sbindir%/}"
dest="${DESTDIR:-}${prefix}"
manifest_rel="share/rocm-kpack/install-manifest.txt"
manifest="${dest}/${manifest_rel}"

# where ENTRY: the written path of a manifest entry (absolute entries are outside the prefix).
where() {
  case "$1" in /*) echo "${DESTDIR:-}$1" ;; *) echo "${dest}/$1" ;; esac
}

# ---- uninstall ------------------------------------------------------------------------------
if [ "$uninstall" = 1 ]; then
  [ -f "$manifest" ] || die "no manifest at $manifest: nothing was installed there by this script"
  while IFS= read -r entry; do
    case "$entry" in
      ""|*/) ;;
      # Outside the prefix (the sbin link): remove the link, not a file put there since.
      /*) if [ -L "$(where "$entry")" ]; then rm -f -- "$(where "$entry")"; fi ;;
      *) rm -f -- "$(where "$entry")" ;;
    esac
  done < "$manifest"
  # The directories the install created, deepest first (most slashes), each only if it is empty
  # now: rmdir refuses a directory that holds anything the install did not write.
  mapfile -t dirs < <(grep '/$' -- "$manifest" | awk -F/ '{ print NF "\t" $0 }' |
    sort -t "$(printf '\t')" -k1,1nr | cut -f2-)
  rm -f -- "$manifest"
  for entry in "${dirs[@]}"; do
    rmdir -- "$(where "${entry%/}")" 2>/dev/null || true
  done
  echo "removed kpack-fuse and librocm_kpack from ${prefix}"
  exit 0
fi

# ---- install --------------------------------------------------------------------------------
version="$(sed -n 's/^version = "\(.*\)"$/\1/p' "$root/Cargo.toml" | head -n 1)"
[ -n "$version" ] || die "cannot read the version from Cargo.toml"
soversion="${version%%.*}"
version_major="$soversion"
version_minor="$(echo "$version" | cut -d. -f2)"
# What a program linking the static archive needs besides it (rustc --print native-static-libs).
native_libs="-lgcc_s -lutil -lrt -lpthread -lm -ldl -lc"

if [ -z "$from" ]; then
  command -v cargo >/dev/null || die "cargo not found (or pass --from DIR with a finished build)"
  (cd "$root" && cargo build --profile "$profile" --lib --bin kpack-fuse)
  target_dir="${CARGO_TARGET_DIR:-$root/target}"
  case "$profile" in dev) from="$target_dir/debug" ;; *) from="$target_dir/$profile" ;; esac
fi
[ -f "$from/librocm_kpack.so" ] || die "$from/librocm_kpack.so not found"
[ -f "$from/librocm_kpack.a" ] || die "$from/librocm_kpack.a not found"
[ -x "$from/kpack-fuse" ] || die "$from/kpack-fuse not found"
command -v objcopy >/dev/null || die "objcopy not found (package binutils): it strips the installed files"

installed=()

# make_dir DIR: mkdir -p of a written path (under DESTDIR), recording each directory it creates,
# up to but not including the prefix (or DESTDIR for a path outside the prefix), which are never
# removed.
make_dir() {
  local d="$1" stop="${DESTDIR:-}"
  case "$1" in "$dest"/*) stop="$dest" ;; esac
  local missing=()
  while [ ! -e "$d" ] && [ ! -L "$d" ] && [ "$d" != "$stop" ] && [ "$d" != / ]; do
    missing+=("$d")
    d="$(dirname -- "$d")"
  done
  mkdir -p -- "$1"
  for d in "${missing[@]}"; do
    case "$d" in
      "$dest"/*) installed+=("${d#"$dest"/}/") ;;
      *) installed+=("${d#"${DESTDIR:-}"}/") ;;
    esac
  done
}

# put SRC REL MODE: copies SRC to PREFIX/REL.
put() {
  make_dir "$(dirname -- "${dest}/$2")"
  install -m "$3" -- "$1" "${dest}/$2"
  installed+=("$2")
}

# link TARGET REL: a symlink PREFIX/REL -> TARGET.
link() {
  make_dir "$(dirname -- "${dest}/$2")"
  ln -sfn -- "$1" "${dest}/$2"
  installed+=("$2")
}

# put_stripped SRC REL MODE HOW: installs SRC without its debug information (HOW: --strip-all
# for programs and shared libraries, --strip-debug for a static archive, which must keep its
# symbols). For an ELF executable or shared library the debug information is first saved as
# SRC.debug (written through a temporary name: parallel installs from one build may race) and the
# installed copy links to it.
put_stripped() {
  local tmp
  tmp="$(mktemp)"
  if [ "$4" = --strip-all ]; then
    objcopy --only-keep-debug -- "$1" "$1.debug.tmp$$"
    mv -f -- "$1.debug.tmp$$" "$1.debug"
    objcopy --strip-all --add-gnu-debuglink="$1.debug" -- "$1" "$tmp"
  else
    objcopy --strip-debug -- "$1" "$tmp"
  fi
  put "$tmp" "$2" "$3"
  rm -f -- "$tmp"
}

# fill TEMPLATE REL: copies a template with its @NAME@ placeholders filled in.
fill() {
  local tmp
  tmp="$(mktemp)"
  # Each component of the libdir adds one "..", plus cmake/rocm-kpack.
  local up="../.."
  local IFS=/
  for _ in $libdir; do up="$up/.."; done
  unset IFS
  sed -e "s|@PREFIX@|${prefix}|g" \
      -e "s|@LIBDIR@|\${exec_prefix}/${libdir}|g" \
      -e "s|@INCLUDEDIR@|\${prefix}/include|g" \
      -e "s|@LIBDIR_REL@|${libdir}|g" \
      -e "s|@INCLUDEDIR_REL@|include|g" \
      -e "s|@CMAKE_TO_PREFIX@|${up}|g" \
      -e "s|@VERSION@|${version}|g" \
      -e "s|@SOVERSION@|${soversion}|g" \
      -e "s|@VERSION_MAJOR@|${version_major}|g" \
      -e "s|@VERSION_MINOR@|${version_minor}|g" \
      -e "s|@NATIVE_LIBS@|${native_libs}|g" \
      -e "s|@NATIVE_LIBS_CMAKE@|$(echo "$native_libs" | sed 's/-l//g; s/ /;/g')|g" \
      "$1" > "$tmp"
  put "$tmp" "$2" 0644
  rm -f -- "$tmp"
}

install_library() {
  put_stripped "$from/librocm_kpack.so" "${libdir}/librocm_kpack.so.${version}" 0755 --strip-all
  link "librocm_kpack.so.${version}" "${libdir}/librocm_kpack.so.${soversion}"
  link "librocm_kpack.so.${soversion}" "${libdir}/librocm_kpack.so"
  put_stripped "$from/librocm_kpack.a" "${libdir}/librocm_kpack.a" 0644 --strip-debug
  for h in kpack.h kpack_types.h kpack_export.h; do
    put "$root/include/rocm_kpack/$h" "include/rocm_kpack/$h" 0644
  done
  fill "$root/rocm_kpack.pc.in" "${libdir}/pkgconfig/rocm_kpack.pc"
  fill "$root/cmake/rocm-kpack-config.cmake.in" "${libdir}/cmake/rocm-kpack/rocm-kpack-config.cmake"
  fill "$root/cmake/rocm-kpack-config-version.cmake.in" "${libdir}/cmake/rocm-kpack/rocm-kpack-config-version.cmake"
}

# The program, its manual pages (written by the program itself from its command-line definition)
# and the mount(8) helper link, which must live where mount(8) looks: /sbin, not the prefix.
install_program() {
  put_stripped "$from/kpack-fuse" "bin/kpack-fuse" 0755 --strip-all
  local pages
  pages="$(mktemp -d)"
  "$from/kpack-fuse" man "$pages" || { rm -rf -- "$pages"; die "kpack-fuse man failed"; }
  local page
  for page in "$pages"/*.1; do
    put "$page" "share/man/man1/$(basename -- "$page")" 0644
  done
  rm -rf -- "$pages"
  if [ "$sbindir" != none ]; then
    make_dir "${DESTDIR:-}${sbindir}"
    ln -sfn -- "${prefix}/bin/kpack-fuse" "${DESTDIR:-}${sbindir}/mount.kpack-fuse"
    installed+=("${sbindir}/mount.kpack-fuse")
  fi
}

main() {
  install_library
  install_program
  # Merge with an earlier manifest so a re-install (or another component) keeps its entries.
  make_dir "$(dirname -- "$manifest")"
  { [ -f "$manifest" ] && cat -- "$manifest"; printf '%s\n' "${installed[@]}"; } | sort -u > "$manifest.new"
  mv -- "$manifest.new" "$manifest"
  local where="${prefix}"
  # Staged for packaging: say where the files are now, and where they are meant to live.
  [ -n "${DESTDIR:-}" ] && where="${DESTDIR}${prefix} (staged under DESTDIR=${DESTDIR} for ${prefix})"
  echo "installed kpack-fuse and librocm_kpack ${version} into ${where}" \
    "(helper: $([ "$sbindir" = none ] && echo none || echo "${DESTDIR:-}${sbindir}/mount.kpack-fuse");" \
    "manifest: ${DESTDIR:-}${prefix}/${manifest_rel})"
}

main
