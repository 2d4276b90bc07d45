#!/usr/bin/env bash
# Installs librocm_kpack (shared + static library, headers, pkg-config file, CMake package) into a
# prefix, and records every installed file in PREFIX/share/rocm-kpack/install-manifest.txt so that
# --uninstall removes exactly what was installed.
#
#   scripts/install.sh --prefix /usr/local                 # builds with cargo --release first
#   scripts/install.sh --prefix /opt/x --from target/debug # installs an existing build
#   scripts/install.sh --prefix /usr/local --uninstall
#
# Options:
#   --prefix DIR    install root (required)
#   --libdir DIR    library directory relative to the prefix (default: lib)
#   --from DIR      directory holding an already built librocm_kpack.so and librocm_kpack.a
#   --profile NAME  cargo profile to build when --from is not given (default: release)
#   --uninstall     remove the files listed in the prefix's manifest, then empty directories
# DESTDIR, when set, is prepended to every written path (for packaging); the installed files still
# refer to PREFIX.
#
# Components are installed by one function each (install_library below); other parts of the
# project add their own function and call it from main, and the manifest covers them all.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
prefix=""
libdir="lib"
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
    --from) from="${2:?--from needs a directory}"; shift 2 ;;
    --from=*) from="${1#*=}"; shift ;;
    --profile) profile="${2:?--profile needs a name}"; shift 2 ;;
    --profile=*) profile="${1#*=}"; shift ;;
    --uninstall) uninstall=1; shift ;;
    -h|--help) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option: $1" ;;
  esac
done

[ -n "$prefix" ] || die "--prefix is required"
case "$prefix" in /*) ;; *) prefix="$(pwd)/$prefix" ;; esac
prefix="${prefix%/}"
case "$libdir" in /*|*..*) die "--libdir must be a relative path inside the prefix" ;; esac
libdir="${libdir%/}"
dest="${DESTDIR:-}${prefix}"
manifest_rel="share/rocm-kpack/install-manifest.txt"
manifest="${dest}/${manifest_rel}"

# ---- uninstall ------------------------------------------------------------------------------
if [ "$uninstall" = 1 ]; then
  [ -f "$manifest" ] || die "no manifest at $manifest: nothing was installed there by this script"
  dirs=()
  while IFS= read -r rel; do
    [ -n "$rel" ] || continue
    rm -f -- "${dest}/${rel}"
    dirs+=("$(dirname -- "$rel")")
  done < "$manifest"
  rm -f -- "$manifest"
  dirs+=("$(dirname -- "$manifest_rel")")
  # Remove directories that are now empty, deepest first, never the prefix itself.
  ancestors=()
  for d in "${dirs[@]}"; do
    while [ -n "$d" ] && [ "$d" != "." ] && [ "$d" != "/" ]; do
      ancestors+=("$d")
      d="$(dirname -- "$d")"
    done
  done
  printf '%s\n' "${ancestors[@]}" | awk -F/ '{ print NF "\t" $0 }' | sort -u | sort -t "$(printf '\t')" -k1,1nr |
    cut -f2- | while IFS= read -r d; do
      rmdir -- "${dest}/${d}" 2>/dev/null || true
    done
  echo "removed librocm_kpack from ${prefix}"
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
  (cd "$root" && cargo build --profile "$profile" --lib)
  target_dir="${CARGO_TARGET_DIR:-$root/target}"
  case "$profile" in dev) from="$target_dir/debug" ;; *) from="$target_dir/$profile" ;; esac
fi
[ -f "$from/librocm_kpack.so" ] || die "$from/librocm_kpack.so not found"
[ -f "$from/librocm_kpack.a" ] || die "$from/librocm_kpack.a not found"

installed=()

# put SRC REL MODE: copies SRC to PREFIX/REL.
put() {
  install -D -m "$3" -- "$1" "${dest}/$2"
  installed+=("$2")
}

# link TARGET REL: a symlink PREFIX/REL -> TARGET.
link() {
  mkdir -p -- "$(dirname -- "${dest}/$2")"
  ln -sfn -- "$1" "${dest}/$2"
  installed+=("$2")
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
  put "$from/librocm_kpack.so" "${libdir}/librocm_kpack.so.${version}" 0755
  link "librocm_kpack.so.${version}" "${libdir}/librocm_kpack.so.${soversion}"
  link "librocm_kpack.so.${soversion}" "${libdir}/librocm_kpack.so"
  put "$from/librocm_kpack.a" "${libdir}/librocm_kpack.a" 0644
  for h in kpack.h kpack_types.h kpack_export.h; do
    put "$root/include/rocm_kpack/$h" "include/rocm_kpack/$h" 0644
  done
  fill "$root/rocm_kpack.pc.in" "${libdir}/pkgconfig/rocm_kpack.pc"
  fill "$root/cmake/rocm-kpack-config.cmake.in" "${libdir}/cmake/rocm-kpack/rocm-kpack-config.cmake"
  fill "$root/cmake/rocm-kpack-config-version.cmake.in" "${libdir}/cmake/rocm-kpack/rocm-kpack-config-version.cmake"
}

main() {
  install_library
  # Merge with an earlier manifest so a re-install (or another component) keeps its entries.
  mkdir -p -- "$(dirname -- "$manifest")"
  { [ -f "$manifest" ] && cat -- "$manifest"; printf '%s\n' "${installed[@]}"; } | sort -u > "$manifest.new"
  mv -- "$manifest.new" "$manifest"
  echo "installed librocm_kpack ${version} into ${prefix} (manifest: ${prefix}/${manifest_rel})"
}

main
