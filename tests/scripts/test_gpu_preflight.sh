#!/usr/bin/env bash
# The GPU check's pre-flight (scripts/gpu_check.sh --preflight), without a GPU: on this
# machine, with the CUDA toolkit, it finds everything a dry run needs and exits 0 (or, in a
# checkout where scripts/gpu_prepare.sh has not fetched the cuDNN frontend headers yet, names
# exactly those and exits 2); with the toolkit, CMake and Ninja taken away it names each of
# them on its own line, exits 2, and has built nothing. Skipped (exit 77) where there is no
# CUDA toolkit.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
if ! command -v nvcc >/dev/null && [[ ! -x /usr/local/cuda/bin/nvcc ]]; then
  echo "SKIPPED: no CUDA toolkit (nvcc) here"
  exit 77
fi
source "$ROOT/tests/scripts/lib.sh"

# 1. everything there: exit 0, nothing missing; but the cuDNN frontend headers, which only
# scripts/gpu_prepare.sh brings (from PyPI), until it has run in this checkout
fetched=1
[[ -d "$ROOT/third_party/cudnn_frontend/include" ]] || fetched=0
NDT_GPU_CHECK_DRY=1 NDT_BUILD_DIR="$tmp/build-ok" "$ROOT/scripts/gpu_check.sh" --preflight >"$tmp/ok.log" 2>&1
rc=$?
cat "$tmp/ok.log"
if [[ $fetched -eq 1 ]]; then
  check "a complete machine passes (exit 0)" test "$rc" -eq 0
  check "it says nothing is missing" grep -q ' 0 missing' "$tmp/ok.log"
else
  echo "note: third_party/cudnn_frontend is not fetched here (scripts/gpu_prepare.sh brings it): expected missing"
  check "a machine without the fetched headers fails with exit 2" test "$rc" -eq 2
  check "it names only the cuDNN frontend headers" \
    bash -c "grep -q ' 1 missing' '$tmp/ok.log' && grep -q 'MISSING  third_party/cudnn_frontend/include' '$tmp/ok.log'"
fi
check "it found nvcc, NCCL and cuDNN" bash -c "grep -q 'ok *nvcc ' '$tmp/ok.log' && grep -q 'ok *NCCL ' '$tmp/ok.log' && grep -q 'ok *cuDNN [0-9]' '$tmp/ok.log'"

# 2. no toolkit, no cmake, no ninja: a PATH with only the basic tools, an empty toolkit folder
mkdir -p "$tmp/bin" "$tmp/no-cuda"
for t in bash sh env sed awk grep cat mkdir rm mktemp dirname basename head tail sort wc cut find \
         du df getconf date tee tr timeout tar g++ gcc python3 ln ls cp mv chmod uname nproc sleep \
         xargs stat git dpkg-deb ar xz ldconfig readlink realpath as ld mpirun; do
  p="$(command -v "$t" 2>/dev/null)" && ln -s "$p" "$tmp/bin/$t"
done
env -i HOME="$HOME" PATH="$tmp/bin" NDT_CUDA_HOME="$tmp/no-cuda" NDT_GPU_CHECK_DRY=1 NDT_BUILD_DIR="$tmp/build-bad" \
  "$ROOT/scripts/gpu_check.sh" --preflight >"$tmp/bad.log" 2>&1
rc=$?
cat "$tmp/bad.log"
check "a machine missing things fails with exit 2" test "$rc" -eq 2
# the toolkit's absence also hides the NCCL and cuDNN it holds: five lines, one for each
for what in "cmake:" "ninja:" "nvcc:" "NCCL:" "cuDNN:"; do
  check "one MISSING line names $what" test "$(grep -c "MISSING  $what" "$tmp/bad.log")" -eq 1
done
check "and nothing else is missing" test "$(grep -c "MISSING" "$tmp/bad.log")" -eq $((5 + 1 - fetched))
check "nothing was configured" test ! -e "$tmp/build-bad/CMakeCache.txt"
exit $status
