#!/usr/bin/env bash
# bundle.sh - everything the GPU test machine lacks, in one git-ignored
# folder that travels with one device command (docs/GPU.md, issue 17).
#
#   ./scripts/gpu/bundle.sh            # (re)build .gpu-bundle/, check its size
#   ./scripts/gpu/bundle.sh --check    # only the size check of an existing bundle
#
# The GPU machine (an NVIDIA CUDA image: nvcc, CMake, ninja, gcc, Python with
# PyTorch + transformers) has none of our Debian libraries and no package
# registry. This script, run here (Debian 12, x86-64, no GPU needed):
#
#  1. fetches the .deb files with `apt-get download` (no root, nothing
#     installed): the -dev packages we compile against, the shared libraries
#     they name and what those need in turn, protoc-c (which CMake runs on
#     proto/) and pkgconf (the image may have no pkg-config);
#  2. unpacks them with `dpkg-deb -x` into one private prefix, as if /usr;
#     merges /lib into /usr/lib (Debian 12 is usr-merged, the packages
#     are not), drops what a build never reads (static archives, docs,
#     manuals, the headers of the libraries we only link through gRPC),
#     turns absolute symlinks into relative ones and rewrites every .pc
#     file to be relative to its own folder (pkgconf's ${pcfiledir}), so
#     the prefix works wherever it is unpacked;
#  3. proves the prefix resolves every module CMakeLists.txt asks for,
#     with pkg-config looking at the prefix alone;
#  4. packs it into .gpu-bundle/prefix.tar.xz (one file; OpenBLAS alone is
#     35 MiB unpacked, 4 MiB compressed) with a MANIFEST of package versions
#     and SHA256SUMS, which scripts/gpu/check.sh verifies and unpacks there;
#  5. prints the folder's size and FAILS (exit 3) if it plus the tracked
#     tree exceeds 60 MiB: the device tool moves at most 64 MiB per command
#     (working tree + carried paths), and the margin is for the untracked
#     files a checkout may hold.
#
# libc6, libgcc-s1 and libstdc++6 are never bundled: every image that has
# gcc has them, newer than ours, and an older copy would break the image's
# own programs. libssl3 and zlib1g are bundled into a separate base/ folder
# that check.sh puts on the library path only if the machine lacks them
# (overriding the image's own OpenSSL could break its Python).
set -euo pipefail
cd "$(dirname "$0")/../.."

BUNDLE=.gpu-bundle          # what travels (git-ignored, named in `carry`)
WORK=.gpu-bundle.work       # downloads and staging (git-ignored, stays here)
LIMIT_MIB=${SPECD_BUNDLE_LIMIT_MIB:-60}
ARCH_TRIPLET=x86_64-linux-gnu

# Headers kept: the libraries our C code includes.
DEV_PKGS=(libpcre2-dev libcjson-dev libyaml-dev libgrpc-dev libprotobuf-c-dev
          libcmocka-dev libopenblas-pthread-dev libmicrohttpd-dev)
# Link-only: their .pc files and .so links resolve grpc.pc's Requires and
# Libs (absl_*, openssl, re2, cares, z); we never include their headers.
LINK_PKGS=(libabsl-dev libssl-dev libre2-dev libc-ares-dev zlib1g-dev)
# Shared libraries the programs load, and the build tools.
RUNTIME_PKGS=(libpcre2-8-0 libcjson1 libyaml-0-2 libgrpc29 libabsl20220623 libre2-9
              libc-ares2 libprotobuf-c1 libcmocka0 libopenblas0-pthread libgfortran5
              libquadmath0 protobuf-c-compiler libprotoc32 libprotobuf32 pkgconf-bin
              libpkgconf3 libmicrohttpd12)
# Base libraries nearly every image has; used there only when missing.
# GnuTLS and its libraries are there for libmicrohttpd (the /metrics
# listener) only.
BASE_PKGS=(libssl3 zlib1g libgnutls30 libnettle8 libhogweed6 libgmp10 libp11-kit0
           libtasn1-6 libunistring2 libidn2-0 libffi8)
# What CMakeLists.txt asks pkg-config for (pkg_check_modules).
PC_MODULES=(libpcre2-8 libcjson cmocka yaml-0.1 grpc libprotobuf-c openblas libmicrohttpd)

size_mib() { du -sb "$1" | awk '{printf "%.1f", $1 / 1048576}'; }
tracked_bytes() { git ls-files -z | xargs -0 stat -L -c %s 2>/dev/null | awk '{s += $1} END {print s + 0}'; }

check_size() {
  [ -d "$BUNDLE" ] || { echo "bundle: $BUNDLE/ does not exist (run scripts/gpu/bundle.sh)" >&2; exit 2; }
  local b t total
  b=$(du -sb "$BUNDLE" | awk '{print $1}')
  t=$(tracked_bytes)
  total=$((b + t))
  awk -v b="$b" -v t="$t" -v n="$total" -v lim="$LIMIT_MIB" 'BEGIN {
    printf "bundle: %s/ %.1f MiB + tracked tree %.1f MiB = %.1f MiB (limit %d MiB)\n",
           "'"$BUNDLE"'", b / 1048576, t / 1048576, n / 1048576, lim }'
  if [ "$total" -gt $((LIMIT_MIB * 1048576)) ]; then
    echo "bundle: FAIL: over the ${LIMIT_MIB} MiB that may travel with one device command" >&2
    exit 3
  fi
  echo "bundle: size OK"
}

if [ "${1:-}" = "--check" ]; then check_size; exit 0; fi
[ $# -eq 0 ] || { echo "usage: $0 [--check]" >&2; exit 2; }
[ "$(dpkg --print-architecture)" = amd64 ] || {
  echo "bundle: the GPU machine is x86-64; run this on an amd64 Debian" >&2; exit 2; }

rm -rf "$WORK/root" "$WORK/base" "$BUNDLE"
mkdir -p "$WORK/debs" "$WORK/root" "$WORK/base" "$BUNDLE"

# 1. Download (cached: a .deb already in $WORK/debs at the candidate version
# is not fetched again). apt-get download writes into the current folder.
sandbox=(); [ "$(id -u)" -ne 0 ] || sandbox=(-o APT::Sandbox::User=root)
all=("${DEV_PKGS[@]}" "${LINK_PKGS[@]}" "${RUNTIME_PKGS[@]}" "${BASE_PKGS[@]}")
(cd "$WORK/debs" && for p in "${all[@]}"; do
   v=$(apt-cache policy "$p" | awk '/Candidate:/ {print $2}')
   [ -n "$v" ] && [ "$v" != "(none)" ] || { echo "bundle: no candidate for $p" >&2; exit 1; }
   # as root apt would warn that its sandbox user cannot write here
   ls "${p}_"*.deb >/dev/null 2>&1 || apt-get download -q "${sandbox[@]}" "$p" >/dev/null
 done)

# 2. Unpack into the prefix (base libraries into their own folder).
: > "$WORK/manifest"
unpack() { # deb dest
  dpkg-deb -x "$1" "$2"
  dpkg-deb -f "$1" Package Version | paste -sd' ' >> "$WORK/manifest"
}
for p in "${DEV_PKGS[@]}" "${LINK_PKGS[@]}" "${RUNTIME_PKGS[@]}"; do
  unpack "$WORK/debs/${p}"_*.deb "$WORK/root"
done
for p in "${BASE_PKGS[@]}"; do unpack "$WORK/debs/${p}"_*.deb "$WORK/base"; done

# usr-merge: packages that still install to /lib
for d in "$WORK/root" "$WORK/base"; do
  if [ -d "$d/lib" ]; then
    mkdir -p "$d/usr/lib"; cp -a "$d/lib/." "$d/usr/lib/"; rm -rf "$d/lib"
  fi
done
# base/ keeps only the shared objects: it is a library folder, not a
# prefix, placed inside the prefix so the -dev links can point at it
mkdir -p "$WORK/root/base"
find "$WORK/base/usr/lib/$ARCH_TRIPLET" -maxdepth 1 -name '*.so.*' -exec cp -a {} "$WORK/root/base/" \;
rm -rf "$WORK/base"

R="$WORK/root/usr"
# What a build never reads. Headers of link-only libraries go too (absl's
# alone are 10 MB); sbin/etc bits of the packages are not needed either.
rm -rf "$R/share/doc" "$R/share/man" "$R/share/lintian" "$R/share/bug" "$R/share/aclocal" \
       "$R/lib/$ARCH_TRIPLET/cmake" "$R/lib/$ARCH_TRIPLET/openblas-pthread/cmake" \
       "$R/include/absl" "$R/include/openssl" "$R/include/$ARCH_TRIPLET/openssl" \
       "$R/include/re2" "$R/include/ares"*.h "$R/include/zlib.h" "$R/include/zconf.h" \
       "$R/include/grpc++" "$R/include/grpcpp" "$WORK/root/etc"
find "$WORK/root" -name '*.a' -delete
# OpenBLAS: only libopenblas (the trainers call cblas_sgemm); its BLAS and
# LAPACK compatibility libraries are 7.7 MB we never load.
rm -f "$R/lib/$ARCH_TRIPLET/openblas-pthread/"{libblas,liblapack}.so*
# libmicrohttpd.pc names gnutls in Requires.private, which only a static
# link reads; without the line pkg-config needs no gnutls.pc (we link
# shared, and libgnutls.so.30 is in base/).
sed -i '/^Requires.private:/d' "$R/lib/$ARCH_TRIPLET/pkgconfig/libmicrohttpd.pc"
# gRPC without TLS: we link the secure library only.
rm -f "$R/lib/$ARCH_TRIPLET/"libgrpc_unsecure.so* "$R/lib/$ARCH_TRIPLET/pkgconfig/grpc_unsecure.pc"

# Absolute symlinks (zlib's libz.so -> /lib/...) made relative to the
# prefix; a -dev link to a base library (libz.so, libssl.so) points into
# base/, so the linker finds it whether or not the machine has its own.
while IFS= read -r -d '' l; do
  t=$(readlink "$l")
  case "$t" in
    /*) t=${t#/usr}; abs="$WORK/root/usr$t" ;;
    *) abs="$(dirname "$l")/$t" ;;
  esac
  [ -e "$abs" ] || [ ! -e "$WORK/root/base/$(basename "$t")" ] || abs="$WORK/root/base/$(basename "$t")"
  ln -sfn "$(realpath --relative-to="$(dirname "$l")" -m "$abs")" "$l"
done < <(find "$WORK/root" -type l -print0)
# Links that lead nowhere (pcre2-dev's 16/32-bit and POSIX libraries, which
# we do not bundle) would only confuse a linker search.
find "$WORK/root" -xtype l -delete
find "$WORK/root" -depth -type d -empty -delete

# .pc files: every /usr becomes ${bundle_usr}, defined relative to the file.
while IFS= read -r -d '' pc; do
  rel=$(realpath --relative-to="$(dirname "$pc")" "$R")
  { echo "bundle_usr=\${pcfiledir}/$rel"; sed -e 's#=/usr\([/ ]\|$\)#=${bundle_usr}\1#g' \
      -e 's#\([ =]-[IL]\)/usr/#\1${bundle_usr}/#g' "$pc"; } > "$pc.new"
  mv "$pc.new" "$pc"
  # Debian's grpc.pc and gpr.pc say libdir=/usr/lib, but their libraries
  # are in the multiarch folder: the linker of an installed system finds
  # them anyway, the GPU image's has no /usr/lib/x86_64-linux-gnu copy. A
  # .pc under lib/.../pkgconfig describes the libraries of the folder above.
  case "$pc" in */lib/*/pkgconfig/*.pc)
    sed -i 's#^libdir=.*#libdir=${pcfiledir}/..#' "$pc" ;; esac
done < <(find "$R" -name '*.pc' -type f -print0)
# openblas.pc is an alternatives link on an installed system; here the
# pthread flavour's file is found through PKG_CONFIG_LIBDIR (bundle.env).

cat > "$WORK/root/bundle.env" <<'ENV'
# Sourced by scripts/gpu/check.sh with SPECD_PREFIX set to where the bundle
# was unpacked. pkg-config sees the bundle alone; programs find its shared
# libraries (and base/ only where the machine has no OpenSSL 3 / zlib).
U="$SPECD_PREFIX/usr"; L="$U/lib/x86_64-linux-gnu"
export PKG_CONFIG="$U/bin/pkgconf"
export PKG_CONFIG_LIBDIR="$L/pkgconfig:$L/openblas-pthread/pkgconfig:$U/share/pkgconfig"
export PATH="$U/bin:$PATH"
SPECD_BUNDLE_LIBS="$L:$L/openblas-pthread"
for so in libssl.so.3 libz.so.1; do
  if ! ldconfig -p 2>/dev/null | grep -q "$so"; then
    SPECD_BUNDLE_LIBS="$SPECD_BUNDLE_LIBS:$SPECD_PREFIX/base"; break
  fi
done
export SPECD_BUNDLE_LIBS
export LD_LIBRARY_PATH="$SPECD_BUNDLE_LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
ENV
sort "$WORK/manifest" > "$WORK/root/MANIFEST"

# 3. The prefix must resolve every module CMake asks for, on its own. The
# bundled pkgconf runs here too (same machine type), with the bundle's libs.
(
  export SPECD_PREFIX="$PWD/$WORK/root"
  # shellcheck disable=SC1091
  . "$SPECD_PREFIX/bundle.env"
  for m in "${PC_MODULES[@]}"; do
    flags=$("$PKG_CONFIG" --cflags --libs "$m") || { echo "bundle: pkg-config cannot resolve $m" >&2; exit 1; }
    case "$flags" in *" -I/usr/"*|*" -L/usr/"*|-I/usr/*|-L/usr/*)
      echo "bundle: $m still points at /usr: $flags" >&2; exit 1 ;; esac
    # as CMake's pkg_check_modules resolves them: each -lNAME in a -L folder
    # given BEFORE it (a library found only later, or only in this
    # machine's /usr, stays a bare -lNAME that the GPU image cannot link)
    dirs=()
    for f in $flags; do
      case "$f" in
        -L*) dirs+=("${f#-L}") ;;
        -l*) lib=${f#-l}; found=0
             for dir in "${dirs[@]}"; do [ -e "$dir/lib$lib.so" ] && found=1; done
             # the toolchain's own libraries come with gcc and libc everywhere
             case "$lib" in m|rt|dl|pthread|atomic|stdc++|gcc_s) found=1 ;; esac
             [ $found = 1 ] || { echo "bundle: $m links -l$lib, not in a -L folder before it: $flags" >&2; exit 1; } ;;
      esac
    done
  done
  protoc-c --version >/dev/null || { echo "bundle: bundled protoc-c does not run" >&2; exit 1; }
)

# 4. Pack. xz: the tree is compressed once here and unpacked in seconds there.
XZ_OPT=-6T2 tar -C "$WORK/root" -cJf "$BUNDLE/prefix.tar.xz" .
cp "$WORK/root/MANIFEST" "$BUNDLE/MANIFEST"
(cd "$BUNDLE" && sha256sum prefix.tar.xz > SHA256SUMS)
echo "bundle: $(wc -l < "$BUNDLE/MANIFEST") packages, prefix $(size_mib "$WORK/root") MiB unpacked," \
     "$(size_mib "$BUNDLE/prefix.tar.xz") MiB packed"

# 5. The size rule.
check_size
