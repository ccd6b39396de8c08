#!/usr/bin/env bash
# scripts/sanitize.sh: build the CPU code with AddressSanitizer and UndefinedBehaviorSanitizer
# into build-asan/ and run the tests under them (the GPU tests are left out: the sanitizers
# do not see device memory). Any report fails the run.
#
#   scripts/sanitize.sh                        # build every test, run all but the gpu label
#   scripts/sanitize.sh -R 'Robust|TrainGpt'   # extra arguments go to ctest
#
# NDT_ASAN_BUILD_DIR (default build-asan), NDT_JOBS (default: all cores). The whole suite
# is slow under the sanitizers on a small machine; -R narrows it (the bad-input and
# robustness tests are test_train and test_robust, which also run train_gpt itself).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${NDT_ASAN_BUILD_DIR:-build-asan}"
[[ "$BUILD" = /* ]] || BUILD="$ROOT/$BUILD"
JOBS="${NDT_JOBS:-$(nproc)}"
FLAGS="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g"

cmake -S "$ROOT" -B "$BUILD" -DNDT_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo -DNDT_BUILD_BENCH=OFF \
  -DCMAKE_CXX_FLAGS="$FLAGS" -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined"
cmake --build "$BUILD" -j "$JOBS"

# detect_leaks=0: OpenBLAS and OpenMP keep thread pools for the life of the process.
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=0:abort_on_error=1:strict_string_checks=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
echo "[sanitize] ctest --test-dir $BUILD -LE gpu $*"
rc=0
ctest --test-dir "$BUILD" --output-on-failure -j "$JOBS" -LE gpu "$@" || rc=$?
echo "[sanitize] ctest exit code $rc"
exit "$rc"
