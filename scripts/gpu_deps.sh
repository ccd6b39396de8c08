#!/usr/bin/env bash
# scripts/gpu_deps.sh: collect, on a Debian 12 machine with apt (this one), the packages that
# the GPU check needs on a bare GPU machine that has the CUDA toolkit, CMake, ninja and a
# compiler but no Debian -dev packages and no network. Writes .gpu-deps/ (git-ignored):
#
#   .gpu-deps/*.deb                        packages, unpacked there with dpkg-deb -x (never into /)
#   .gpu-deps/fallback/*.deb               base libraries, used only where the system lacks them
#   .gpu-deps/boost1.74-headers-trimmed.tar.xz
#                                          the Boost headers program_options needs, and Boost's
#                                          CMake config files, instead of libboost1.74-dev
#                                          (9 MiB packed, 135 MiB unpacked)
#   .gpu-deps/MANIFEST                     package, version, bytes; the total
#
#   scripts/gpu_deps.sh            # (re)download everything into .gpu-deps
#   scripts/gpu_deps.sh --list     # the package names it takes, one per line (no download)
#
# scripts/gpu_check.sh unpacks it into /tmp/ndt-deps-<clone> and points CMake, the compiler, the
# loader and Open MPI (OPAL_PREFIX) there; it is copied to the GPU node inside the repository.
# scripts/gpu_prepare.sh runs this (when .gpu-deps is missing or stale) and checks the result.
# Needs apt-get (run apt-get update first if apt-get download cannot find a package),
# dpkg-deb, g++ (to find the Boost headers program_options includes), tar and xz.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="$ROOT/.gpu-deps"
ARCH=x86_64-linux-gnu

# What the build and the check need, and why. Versions are Debian 12's (apt's candidates).
PACKAGES=(
  # OpenBLAS, the OpenMP build (CMakeLists.txt prefers it): headers, libopenblas.so and
  # the runtime library it points to; that one links libgfortran (which links libquadmath)
  libopenblas-dev libopenblas-openmp-dev libopenblas0-openmp libgfortran5 libquadmath0
  # Boost.Program_options (train/config.cpp): the library, its CMake config; the headers
  # come from the trimmed tarball below, not from libboost1.74-dev
  libboost-program-options-dev libboost-program-options1.74-dev libboost-program-options1.74.0
  # libxxhash: the XXH64 of checkpoint files (train/io/files.cpp): header and library
  libxxhash-dev libxxhash0
  # tests and benchmarks: GoogleTest/GoogleMock (static libraries and CMake config in the
  # -dev packages), Google Benchmark, nlohmann-json (header-only)
  libgtest-dev libgmock-dev libbenchmark-dev libbenchmark1debian nlohmann-json3-dev
  # Open MPI 4.1: headers and wrappers (FindMPI), mpirun (orterun), the libraries and MCA
  # plugins, help texts (openmpi-common)
  libopenmpi-dev openmpi-bin libopenmpi3 openmpi-common
  # what libopenmpi3 and its plugins link (readelf NEEDED over every ELF file unpacked):
  # libevent, hwloc, PMIx (links libmunge), libfabric (links libefa from ibverbs-providers,
  # libpsm_infinipath, libpsm2, librdmacm, libnuma, libnl), UCX
  libevent-core-2.1-7 libevent-pthreads-2.1-7 libhwloc15 libpmix2 libmunge2
  libfabric1 libibverbs1 ibverbs-providers librdmacm1 libnl-3-200 libnl-route-3-200
  libpsm-infinipath1 libpsm2-2 libucx0 libnuma1
)
# Base libraries that some of the above link and that nearly every image has. gpu_check.sh
# puts one on the loader path only when the system has no library of that name: an older
# copy must not shadow the system's own (libudev for hwloc, libuuid for libpsm_infinipath,
# libatomic for libfabric).
FALLBACK=(libudev1 libuuid1 libatomic1)
# Not taken: libboost1.74-dev (see the tarball), googletest (sources; the -dev packages have
# the built libraries), libhwloc-plugins (optional hwloc plugins with X11/OpenCL/libxml2
# dependencies), libjs-jquery*, libibverbs-dev, libhwloc-dev, libevent-dev, libpmix-dev,
# zlib1g-dev and gfortran (the -dev packages Debian's libopenmpi-dev depends on: only for
# building against those libraries directly, or Fortran MPI). Always on the GPU machine:
# libc6, libstdc++6, libgcc-s1, libgomp1 (with the compiler), zlib1g.

# The Boost headers to keep: every header a translation unit that includes
# <boost/program_options.hpp> and <boost/crc.hpp> (train/io/tensorboard.cpp) opens (g++ -M, C++17 and C++20, with and without
# optimization, also as nvcc's host compiler would see it), plus these whole folders, so
# that a header chosen by another compiler or standard library version is there as well.
BOOST_KEEP_DIRS=(
  config predef preprocessor mpl type_traits core detail smart_ptr program_options function
  exception container_hash assert utility iterator lexical_cast concept bind type_index move
  numeric/conversion range integer
)

if [[ "${1:-}" = --list ]]; then
  printf '%s\n' "${PACKAGES[@]}" "${FALLBACK[@]}"
  exit 0
elif [[ -n "${1:-}" ]]; then
  echo "[gpu_deps] unknown option '$1' (--list, or nothing)" >&2
  exit 2
fi

log() { echo "[gpu_deps] $*"; }
die() { echo "[gpu_deps] error: $*" >&2; exit 1; }

for tool in apt-get dpkg-deb g++ tar xz; do
  command -v "$tool" >/dev/null || die "$tool not found"
done

rm -rf "$OUT"
mkdir -p "$OUT/fallback"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

log "apt-get download: ${#PACKAGES[@]} packages"
(cd "$OUT" && apt-get download -q "${PACKAGES[@]}" 2>&1 | grep -v '^W: Download is performed unsandboxed') ||
  die "apt-get download failed (run apt-get update?)"
log "apt-get download: ${#FALLBACK[@]} fallback packages"
(cd "$OUT/fallback" && apt-get download -q "${FALLBACK[@]}" 2>&1 | grep -v '^W: Download is performed unsandboxed') ||
  die "apt-get download of the fallback packages failed"

log "Boost headers: trimming libboost1.74-dev"
(cd "$tmp" && apt-get download -q libboost1.74-dev 2>&1 | grep -v '^W: Download is performed unsandboxed') ||
  die "apt-get download libboost1.74-dev failed"
mkdir -p "$tmp/boost"
dpkg-deb -x "$tmp"/libboost1.74-dev_*.deb "$tmp/boost"
inc="$tmp/boost/usr/include"
printf '#include <boost/program_options.hpp>\n#include <boost/crc.hpp>\nint main() { return 0; }\n' >"$tmp/bpo.cpp"
{
  for std in c++17 c++20; do
    for opt in -O0 -O3; do
      g++ -std=$std $opt -I"$inc" -M "$tmp/bpo.cpp"
      g++ -std=$std $opt -D__CUDACC__ -I"$inc" -M "$tmp/bpo.cpp" 2>/dev/null || true
    done
  done
} | tr -s ' \134' '\n' | grep "^$inc/boost/" | sed "s|^$inc/||" | sort -u >"$tmp/headers.txt"
[[ -s "$tmp/headers.txt" ]] || die "found no Boost header behind boost/program_options.hpp and boost/crc.hpp"
for d in "${BOOST_KEEP_DIRS[@]}"; do
  [[ -d "$inc/boost/$d" ]] || die "boost/$d is not in libboost1.74-dev"
  (cd "$inc" && find "boost/$d" -type f) >>"$tmp/headers.txt"
done
echo boost/version.hpp >>"$tmp/headers.txt"
sort -u -o "$tmp/headers.txt" "$tmp/headers.txt"
# the CMake package files (BoostConfig.cmake, boost_headers-config.cmake, the toolset
# detection) and the licence
(cd "$tmp/boost" && {
  sed 's|^|usr/include/|' "$tmp/headers.txt"
  find "usr/lib/$ARCH/cmake" -type f
  echo usr/share/doc/libboost1.74-dev/copyright
} >"$tmp/files.txt")
tar -C "$tmp/boost" -cJf "$OUT/boost1.74-headers-trimmed.tar.xz" --owner=0 --group=0 -T "$tmp/files.txt"
boost_full="$(du -sb "$tmp"/libboost1.74-dev_*.deb | cut -f1)"
log "Boost headers: $(wc -l <"$tmp/headers.txt") headers kept ($(du -sb "$OUT/boost1.74-headers-trimmed.tar.xz" | cut -f1) bytes packed, against $boost_full for the .deb)"

# manifest: what is there, with versions and sizes
{
  echo "# .gpu-deps, made by scripts/gpu_deps.sh on $(date -u +%F) from $(sed -n 's/^PRETTY_NAME="\(.*\)"/\1/p' /etc/os-release)"
  echo "# package version bytes"
  for f in "$OUT"/*.deb "$OUT"/fallback/*.deb; do
    printf '%s %s %s\n' "$(dpkg-deb -f "$f" Package)" "$(dpkg-deb -f "$f" Version)" "$(stat -c %s "$f")"
  done
  printf 'boost1.74-headers-trimmed.tar.xz %s %s\n' "$(dpkg-deb -f "$tmp"/libboost1.74-dev_*.deb Version)" \
    "$(stat -c %s "$OUT/boost1.74-headers-trimmed.tar.xz")"
} >"$OUT/MANIFEST"

deps_bytes="$(du -sb "$OUT" | cut -f1)"
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
echo "total $deps_bytes bytes" >>"$OUT/MANIFEST"
log "$(find "$OUT" -name '*.deb' | wc -l) .deb files + the Boost tarball: $(mib "$deps_bytes") in $OUT"
