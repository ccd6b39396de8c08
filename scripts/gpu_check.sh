#!/usr/bin/env bash
# scripts/gpu_check.sh: on a machine with an NVIDIA GPU, build the CUDA backend and run the
# GPU tests (CUDA kernels against their CPU twins), the GPU op benchmark, then the rest of
# the suite; a short summary table (with the benchmark figures) comes last.
#
#   scripts/gpu_check.sh            # build into build-gpu (NDT_BUILD_DIR), ctest -L gpu, bench, all
#   scripts/gpu_check.sh --gpu-only # only the gpu label and the benchmark
#
# Environment: NDT_BUILD_DIR (default build-gpu), NDT_BENCH_MIN_TIME (seconds per benchmark,
# default 0.2: the benchmark takes well under a minute on one H100).
# Needs the packages from scripts/setup.sh --deps-only and the CUDA toolkit (nvcc on PATH or
# at /usr/local/cuda/bin/nvcc). Fails, rather than skipping, when no GPU is visible. Exits
# non-zero when the build or a test fails; the benchmark only measures (it never fails it).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export NDT_BUILD_DIR="${NDT_BUILD_DIR:-build-gpu}"
BUILD="$NDT_BUILD_DIR"
[[ "$BUILD" = /* ]] || BUILD="$ROOT/$BUILD"
MIN_TIME="${NDT_BENCH_MIN_TIME:-0.2}"
START=$SECONDS

if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L; then
  echo "[gpu_check] error: no NVIDIA GPU visible (nvidia-smi); the GPU tests would only skip" >&2
  exit 1
fi
GPU="$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -1)"
# configure (cmake -DNDT_CUDA=ON -DCMAKE_BUILD_TYPE=Release) and build with every core
NDT_CUDA=ON "$ROOT/scripts/setup.sh" --build-only
BUILD_TIME=$((SECONDS - START))

echo "[gpu_check] ctest -L gpu"
log="$BUILD/gpu_check.log"
gpu_rc=0
ctest --test-dir "$BUILD" --output-on-failure -j2 -L gpu 2>&1 | tee "$log" || gpu_rc=$?
gpu_line="$(grep -E 'tests passed|tests failed' "$log" | tail -1 || true)"
# A GPU test that skipped here means the backend did not see the device: a failure.
if grep -q "(Skipped)" "$log"; then
  echo "[gpu_check] error: GPU tests skipped although nvidia-smi sees a GPU (see $log)" >&2
  gpu_rc=1
  gpu_line="${gpu_line}; some SKIPPED (the CUDA backend saw no device)"
fi

# The NCCL communicator (one rank: its collectives on the device and its stream/event order).
nccl_rc=0
nccl_line="not run (no mpirun here)"
if command -v mpirun >/dev/null && [[ -x "$BUILD/test_mpi_comm" ]]; then
  echo "[gpu_check] mpirun -np 1 test_mpi_comm --gtest_filter=DistNccl*"
  nccl_log="$BUILD/gpu_check_nccl.log"
  OMPI_MCA_btl_vader_single_copy_mechanism=none timeout 120 mpirun --allow-run-as-root --oversubscribe -np 1 \
    "$BUILD/test_mpi_comm" --gtest_filter='DistNccl*' 2>&1 | tee "$nccl_log" || nccl_rc=$?
  nccl_line="$(grep -E 'PASSED|FAILED|SKIPPED' "$nccl_log" | head -1 || true)"
  if grep -q SKIPPED "$nccl_log"; then nccl_rc=1; nccl_line="$nccl_line (skipped with a GPU: no NCCL in the build?)"; fi
fi

echo "[gpu_check] bench_gpu_ops --benchmark_min_time=$MIN_TIME"
bench_log="$BUILD/gpu_check_bench.log"
bench_rc=0
timeout 300 "$BUILD/bench_gpu_ops" --benchmark_min_time="$MIN_TIME" 2>&1 | tee "$bench_log" || bench_rc=$?

echo "[gpu_check] bench_gpt_train GPT2 0 cuda (GPT-2 124M, B 16, T 1024, f32)"
gpt_log="$BUILD/gpu_check_gpt2.log"
gpt_rc=0
timeout 240 "$BUILD/bench_gpt_train" GPT2 0 cuda 2>&1 | tee "$gpt_log" || gpt_rc=$?

all_rc=0
all_line="not run (--gpu-only)"
if [[ "${1:-}" != --gpu-only ]]; then
  echo "[gpu_check] ctest (everything)"
  all_log="$BUILD/gpu_check_all.log"
  ctest --test-dir "$BUILD" --output-on-failure -j2 2>&1 | tee "$all_log" || all_rc=$?
  all_line="$(grep -E 'tests passed|tests failed' "$all_log" | tail -1 || true)"
fi

echo
echo "== gpu_check summary =="
printf '%-11s %s\n' "gpu" "$GPU"
printf '%-11s %s\n' "build" "ok ($BUILD, ${BUILD_TIME}s)"
printf '%-11s %s\n' "gpu tests" "$([[ $gpu_rc -eq 0 ]] && echo ok || echo FAILED): ${gpu_line:-no result} ($log)"
printf '%-11s %s\n' "all tests" "$([[ $all_rc -eq 0 ]] && echo ok || echo FAILED): ${all_line:-no result}"
printf '%-11s %s\n' "nccl" "$([[ $nccl_rc -eq 0 ]] && echo ok || echo FAILED): $nccl_line"
printf '%-11s %s\n' "bench" "$([[ $bench_rc -eq 0 ]] && echo ok || echo "exit $bench_rc") ($bench_log)"
printf '%-11s %s\n' "gpt2 124M" "$([[ $gpt_rc -eq 0 ]] && grep -E '^\| GPT2' "$gpt_log" || echo "exit $gpt_rc ($gpt_log)")"
printf '%-11s %s\n' "time" "$((SECONDS - START))s"
sed -n '/^== bench_gpu_ops summary/,$p' "$bench_log"
[[ $gpu_rc -eq 0 && $all_rc -eq 0 && $nccl_rc -eq 0 ]]
