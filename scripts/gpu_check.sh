#!/usr/bin/env bash
# scripts/gpu_check.sh: on a machine with one NVIDIA GPU (an H200 lent through the device
# tool, or any Hopper box), build the CUDA backend and check it: the GPU tests (CUDA kernels
# against their CPU twins), compute-sanitizer memcheck and racecheck on the fast op tests,
# the GPU op benchmark, GPT-2 124M training in bf16 at B 8 and B 16 (T 1024) against a
# throughput floor, the same step in PyTorch (eager and torch.compile) for comparison, and a
# one-rank NCCL training step under mpirun. One markdown summary table comes last.
#
#   scripts/gpu_check.sh            # everything, at most ~9 minutes with the build (16 cores)
#   scripts/gpu_check.sh --quick    # at most ~6: build, gpu tests, GPT-2 bf16 B 8, PyTorch eager
#                                   # B 8, the NCCL step; no sanitizer, no torch.compile
#
# Through the device tool (the command string, carry and timeout_s of one `run` call):
#
#   command:   set -o pipefail; NDT_GPU_CHECK_OUT=$OUT bash scripts/gpu_check.sh 2>&1 | tee $OUT/gpu_check.log
#   carry:     [".gpu-deps", "third_party"]
#   timeout_s: 600            (--quick: add --quick to the command and use 420)
#
# .gpu-deps comes from scripts/gpu_deps.sh (run it first, on a machine with apt); third_party
# holds the cuDNN frontend headers scripts/setup.sh fetches (without them the build has no
# fused attention and test_cuda_attention skips, which fails the check). With
# NDT_GPU_CHECK_OUT set, summary.md and logs.tar.gz are written there too, also when the
# script stops early (the device tool brings back what is under $OUT).
#
# Environment:
#   NDT_BUILD_DIR        build folder (default build-gpu; kept between runs on a warm machine)
#   NDT_DEPS_PREFIX      where .gpu-deps is unpacked (default /tmp/ndt-deps; removed first)
#   NDT_JOBS             build parallelism (default 16)
#   NDT_BUILD_TIMEOUT_S  the build's limit (default 300; 7200 in a dry run)
#   NDT_GPU_CHECK_DRY=1  deps, configure and build only, then stop (for a machine without GPU)
#   NDT_GPU_CHECK_BUDGET_S   seconds from the script's start, build included (default 550,
#                        --quick 370; keep it ~50 s under the run's timeout_s): each
#                        stage's timeout is cut to what is left; a stage with no time left is
#                        reported NOT RUN and fails the check
#   NDT_GPT2_FLOOR       tokens/s the GPT-2 bf16 B 16 run must reach (default 150000; --quick
#                        checks B 8 against it)
#   NDT_NCCL_HOME, NDT_CUDNN_HOME   a folder with include/ and lib/ to use for NCCL / cuDNN
#                        (default: the CUDA toolkit, /usr, else python3's nvidia-nccl-cu13 /
#                        nvidia-cudnn-cu13 wheels, which PyTorch depends on)
#
# Exit status: 0 when every stage passed; 1 on a test failure or skip, a sanitizer error, a
# benchmark crash, timeout or out-of-memory, a stage not run for lack of time, or GPT-2
# below the floor; 2 when a dependency is missing (one line names it) or no GPU is visible.
#
# The floor. GPT-2 124M at T 1024 costs 855 MFLOP per token by bench_gpt_train's count
# (6 x 123.7M parameters, the lm_head included, + 12 x 12 layers x 1024 x 768 for attention),
# so on an H100/H200 (989 TFLOP/s dense bf16) 100% MFU would be ~1.16M tokens/s. Published
# reference points, from karpathy/llm.c (CUDA C, fused kernels, cuDNN flash attention):
#   - discussion #481 "Reproducing GPT-2 (124M) in llm.c in 90 minutes for $20": 10B tokens
#     in ~90 min on 8x A100 80GB SXM, "up to ~60% model flops utilization", i.e. ~230k
#     tokens/s per A100;
#   - the README of KellerJordan/modded-nanogpt: the llm.c GPT-2 replication "needed 45
#     minutes" on 8x H100 for the same 10B tokens, i.e. ~460k tokens/s per H100 (~40% MFU);
#   - Karpathy's llm.c announcement (day 24): ~7% faster than PyTorch nightly with
#     torch.compile and flash attention, ~46% faster than PyTorch 2.3.0.
# The default floor, 150k tokens/s at B 16 (~13% MFU, about a third of llm.c's per-GPU rate),
# is deliberately modest until a GPU run has measured ndtrain: it launches op by op (some
# fusion: cuBLASLt epilogues, add + LayerNorm, the fused classifier, cuDNN attention; no CUDA
# graphs), so it is a "the bf16 GPU path is not badly broken or pathologically slow" line,
# not the goal (llm.c's tokens/s on the same GPU). The PyTorch columns of the summary say
# where ndtrain stands against a framework.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 2
QUICK=0
case "${1:-}" in
  "") ;;
  --quick) QUICK=1 ;;
  -h | --help) sed -n '2,/^set -uo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
  *) echo "[gpu_check] unknown option '$1' (try --help)" >&2; exit 2 ;;
esac
BUILD="${NDT_BUILD_DIR:-build-gpu}"
[[ "$BUILD" = /* ]] || BUILD="$ROOT/$BUILD"
DEPS="${NDT_DEPS_PREFIX:-/tmp/ndt-deps}"
JOBS="${NDT_JOBS:-16}"
DRY="${NDT_GPU_CHECK_DRY:-0}"
FLOOR="${NDT_GPT2_FLOOR:-150000}"
if [[ $QUICK -eq 1 ]]; then BUDGET="${NDT_GPU_CHECK_BUDGET_S:-370}"; else BUDGET="${NDT_GPU_CHECK_BUDGET_S:-550}"; fi
ARCH=x86_64-linux-gnu
LOGS="$BUILD/gpu_check"
START=$SECONDS

log() { echo "[gpu_check] $*"; }
# whatever way the script ends (a missing dependency, a failed configure or build, the end),
# the logs go to NDT_GPU_CHECK_OUT: the one run on a lent GPU must bring back build.log too
save_logs() {
  [[ -n "${NDT_GPU_CHECK_OUT:-}" && -d "$LOGS" ]] || return 0
  mkdir -p "$NDT_GPU_CHECK_OUT"
  [[ -f "$LOGS/summary.md" ]] && cp "$LOGS/summary.md" "$NDT_GPU_CHECK_OUT/summary.md"
  tar -C "$BUILD" -czf "$NDT_GPU_CHECK_OUT/logs.tar.gz" --exclude='gpu_check/nccl_run/*.bin' gpu_check 2>/dev/null || true
}
trap save_logs EXIT
missing() { echo "[gpu_check] missing: $*" >&2; exit 2; }

FAILURES=()   # one line per failed check, for the summary
STAGE_TIMES=()
fail() { FAILURES+=("$*"); log "FAILED: $*"; }

# run_stage NAME CAP LOGFILE CMD...: runs CMD with a timeout of min(CAP, what is left of the
# budget), output to the terminal and LOGFILE; sets STAGE_RC (124: timed out, 125: not run)
# and records the stage's time.
run_stage() {
  local name="$1" cap="$2" logf="$3"
  shift 3
  local left=$((BUDGET - (SECONDS - START) - 10))
  local limit=$((cap < left ? cap : left))
  if ((limit < 15)); then
    log "== $name: NOT RUN (the ${BUDGET}s budget is spent)"
    echo "NOT RUN: no time left in the budget" >"$logf"
    STAGE_RC=125
    STAGE_TIMES+=("$name: not run")
    return
  fi
  log "== $name (timeout ${limit}s): $*"
  local t0=$SECONDS
  timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$logf"
  STAGE_RC=${PIPESTATUS[0]}
  local dt=$((SECONDS - t0))
  STAGE_TIMES+=("$name: ${dt}s")
  log "== $name: exit $STAGE_RC after ${dt}s"
}

# kv KEY LINE: the value of KEY=value in a RESULT line
kv() { sed -n "s/.*[[:space:]]$1=\\([^[:space:]]*\\).*/\\1/p" <<<"$2" | head -1; }

# ---- 0. tools and GPU ---------------------------------------------------------------------
for t in cmake ninja g++ timeout tar; do command -v "$t" >/dev/null || missing "$t (not on PATH)"; done
NVCC="$(command -v nvcc || true)"
[[ -n "$NVCC" ]] || { [[ -x /usr/local/cuda/bin/nvcc ]] && NVCC=/usr/local/cuda/bin/nvcc; }
[[ -n "$NVCC" ]] || missing "nvcc (the CUDA toolkit: not on PATH, not in /usr/local/cuda/bin)"
CUDA_HOME="$(cd "$(dirname "$NVCC")/.." && pwd)"
export PATH="$CUDA_HOME/bin:$PATH"
PYTHON="$(command -v python3 || true)"
GPU="none (dry run)"
if [[ "$DRY" != 1 ]]; then
  if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "[gpu_check] error: no NVIDIA GPU visible (nvidia-smi); nothing to check here (NDT_GPU_CHECK_DRY=1 builds only)" >&2
    exit 2
  fi
  GPU="$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -1)"
fi
mkdir -p "$LOGS"
log "GPU: $GPU"
log "toolchain: $("$NVCC" --version | sed -n 's/.*release \([0-9.]*\).*/nvcc \1/p'), $(g++ --version | head -1), $(cmake --version | head -1)"
log "budget ${BUDGET}s ($([[ $QUICK -eq 1 ]] && echo quick || echo full)), build $BUILD, -j$JOBS"

# ---- 1. dependencies: .gpu-deps unpacked into $DEPS ------------------------------------------
t0=$SECONDS
CMAKE_DEP_ARGS=()
ORIG_LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}"
if [[ -d "$ROOT/.gpu-deps" ]]; then
  case "$DEPS" in /tmp/* | /var/tmp/* | "$HOME"/*) ;; *) missing "a safe NDT_DEPS_PREFIX (got '$DEPS'; it is removed first, so it must be under /tmp)" ;; esac
  # Debian 12's libraries need glibc 2.36 or newer (libevent_core: GLIBC_2.36)
  glibc="$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}')"
  if [[ -n "$glibc" ]] && ! printf '2.36\n%s\n' "$glibc" | sort -V -C; then
    missing "glibc >= 2.36 for the Debian 12 packages of .gpu-deps (this machine has $glibc)"
  fi
  rm -rf "$DEPS"
  mkdir -p "$DEPS"
  unpack() {  # unpack DEB DIR: dpkg-deb, else ar + tar
    if command -v dpkg-deb >/dev/null; then
      dpkg-deb -x "$1" "$2"
    elif command -v ar >/dev/null; then
      local member
      member="$(ar t "$1" | grep '^data\.tar' | head -1)"
      case "$member" in
        *.xz) ar p "$1" "$member" | tar -xJ -C "$2" ;;
        *.zst) ar p "$1" "$member" | tar --zstd -x -C "$2" ;;
        *.gz) ar p "$1" "$member" | tar -xz -C "$2" ;;
        *) return 1 ;;
      esac
    else
      missing "dpkg-deb or ar (to unpack .gpu-deps/*.deb)"
    fi
  }
  n=0
  for deb in "$ROOT"/.gpu-deps/*.deb; do
    unpack "$deb" "$DEPS" || missing "a readable $(basename "$deb")"
    n=$((n + 1))
  done
  [[ -f "$ROOT/.gpu-deps/boost1.74-headers-trimmed.tar.xz" ]] || missing ".gpu-deps/boost1.74-headers-trimmed.tar.xz (run scripts/gpu_deps.sh)"
  # tar -J runs the xz program, which a bare image may lack; python3's tarfile reads .tar.xz too
  tar -C "$DEPS" -xJf "$ROOT/.gpu-deps/boost1.74-headers-trimmed.tar.xz" 2>/dev/null ||
    "${PYTHON:-python3}" -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
      "$ROOT/.gpu-deps/boost1.74-headers-trimmed.tar.xz" "$DEPS" ||
    missing "the Boost headers of .gpu-deps/boost1.74-headers-trimmed.tar.xz unpacked (neither tar -xJ nor python3 could)"
  P="$DEPS/usr"
  L="$P/lib/$ARCH"
  # what Debian's alternatives system would have linked: the MPI commands, the PSM library
  for cmd in mpirun mpiexec; do ln -sf orterun "$P/bin/$cmd"; done
  for cmd in mpicc mpicxx mpic++; do ln -sf opal_wrapper "$P/bin/$cmd"; done
  ln -sf ../libpsm1/libpsm_infinipath.so.1.16 "$L/libpsm_infinipath.so.1"
  # base libraries: only those the system lacks (an older copy must not shadow the system's)
  mkdir -p "$DEPS/fallback-root" "$DEPS/fallback-lib"
  fallback_used=()
  for deb in "$ROOT"/.gpu-deps/fallback/*.deb; do
    [[ -e "$deb" ]] || continue
    unpack "$deb" "$DEPS/fallback-root"
  done
  ldcache="$(ldconfig -p 2>/dev/null || true)"  # read once: `ldconfig -p | grep -q` dies of SIGPIPE under pipefail
  have_lib() {
    local dir
    grep -q "^[[:space:]]*$1 " <<<"$ldcache" && return 0
    for dir in /lib/$ARCH /usr/lib/$ARCH /lib64 /usr/lib64; do [[ -e "$dir/$1" ]] && return 0; done
    return 1
  }
  while IFS= read -r lib; do
    name="$(basename "$lib")"
    if ! have_lib "$name"; then
      ln -sf "$lib" "$DEPS/fallback-lib/$name"
      fallback_used+=("$name")
    fi
  done < <(find "$DEPS/fallback-root" -name 'lib*.so.[0-9]' \( -type f -o -type l \))
  # every file the build needs, named when absent
  for f in "$P/include/$ARCH/openblas-openmp/cblas.h" "$L/openblas-openmp/libopenblas.so" \
           "$L/cmake/Boost-1.74.0/BoostConfig.cmake" "$L/libboost_program_options.so" "$P/include/boost/program_options.hpp" \
           "$L/cmake/GTest/GTestConfig.cmake" "$L/cmake/benchmark/benchmarkConfig.cmake" \
           "$P/share/cmake/nlohmann_json/nlohmann_jsonConfig.cmake" "$L/openmpi/include/mpi.h" \
           "$P/bin/orterun" "$P/bin/opal_wrapper" "$L/libmpi.so.40"; do
    [[ -e "$f" ]] || missing "$f (from .gpu-deps: run scripts/gpu_deps.sh again)"
  done
  export PATH="$P/bin:$PATH"
  export CMAKE_PREFIX_PATH="$P${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
  export LIBRARY_PATH="$L${LIBRARY_PATH:+:$LIBRARY_PATH}"
  export LD_LIBRARY_PATH="$L:$L/openblas-openmp:$DEPS/fallback-lib${ORIG_LD_LIBRARY_PATH:+:$ORIG_LD_LIBRARY_PATH}"
  # Open MPI relocated: its install prefix, PMIx's plugins, no ssh needed for local ranks
  export OPAL_PREFIX="$P"
  export PMIX_MCA_mca_base_component_path="$L/pmix2/lib/pmix"
  export OMPI_MCA_plm_rsh_agent=false
  CMAKE_DEP_ARGS+=(-DNDT_BLAS_LIBRARY="$L/openblas-openmp/libopenblas.so"
                   -DNDT_BLAS_INCLUDE_DIR="$P/include/$ARCH/openblas-openmp"
                   -DMPI_CXX_COMPILER="$P/bin/mpicxx" -DMPIEXEC_EXECUTABLE="$P/bin/mpirun")
  log "deps: $n packages + trimmed Boost headers unpacked into $DEPS in $((SECONDS - t0))s; fallback libraries used: ${fallback_used[*]:-none}"
else
  log "deps: no .gpu-deps here (scripts/gpu_deps.sh makes it); using the system's packages"
  command -v mpirun >/dev/null || missing "mpirun (Open MPI): no .gpu-deps and none on PATH"
fi
# the same MPI settings as the tests use: one node, shared memory, no single-copy mechanism
export OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader
# a failing NCCL init says why (one-shot run: no second chance to turn it on)
export NCCL_DEBUG="${NCCL_DEBUG:-WARN}"

# NCCL and cuDNN: the toolkit's or /usr's, else the Python wheels (PyTorch's nvidia-*-cu13)
wheel_dir() {  # wheel_dir NAME SONAME: the folder holding include/ and lib/SONAME in python3's path
  [[ -n "$PYTHON" ]] || return 1
  "$PYTHON" - "$1" "$2" <<'EOF' 2>/dev/null
import importlib, os, sys
name, soname = sys.argv[1], sys.argv[2]
cands = []
try:
    m = importlib.import_module("nvidia." + name)  # a namespace package: no __file__
    cands += list(getattr(m, "__path__", []))
except Exception:
    pass
for p in sys.path:
    cands += [os.path.join(p, "nvidia", name), os.path.join(p, "nvidia", "cu13")]
for c in cands:
    if os.path.isfile(os.path.join(c, "lib", soname)):
        print(os.path.realpath(c))
        break
EOF
}
EXTRA="$DEPS/cuda-extra"
mkdir -p "$EXTRA/lib"
find_cuda_lib() {  # find_cuda_lib NAME HEADER SONAME ENVHOME: sets FOUND_INC FOUND_LIB FOUND_FROM
  local name="$1" header="$2" soname="$3" home="$4" d
  FOUND_INC="" FOUND_LIB="" FOUND_FROM=""
  for d in "$home" "$CUDA_HOME" /usr; do
    [[ -n "$d" ]] || continue
    for lib in "$d/lib64/lib$name.so" "$d/lib/lib$name.so" "$d/lib/$ARCH/lib$name.so" "$d/lib/$soname" "$d/lib64/$soname"; do
      if [[ -f "$d/include/$header" && -f "$lib" ]]; then
        FOUND_INC="$d/include" FOUND_LIB="$lib" FOUND_FROM="$d"
        return 0
      fi
    done
  done
  if d="$(wheel_dir "$name" "$soname")" && [[ -n "$d" && -f "$d/include/$header" ]]; then
    # the wheels ship lib$name.so.N only: the unversioned name for the linker, in our prefix
    ln -sf "$d/lib/$soname" "$EXTRA/lib/lib$name.so"
    ln -sf "$d/lib/$soname" "$EXTRA/lib/$soname"
    FOUND_INC="$d/include" FOUND_LIB="$EXTRA/lib/lib$name.so" FOUND_FROM="python3 wheel $d"
    export LD_LIBRARY_PATH="$d/lib:$LD_LIBRARY_PATH"
    return 0
  fi
  return 1
}
find_cuda_lib nccl nccl.h libnccl.so.2 "${NDT_NCCL_HOME:-}" ||
  missing "NCCL (nccl.h + libnccl: not in NDT_NCCL_HOME, $CUDA_HOME, /usr, nor python3's nvidia.nccl wheel)"
NCCL_FROM="$FOUND_FROM"
CMAKE_DEP_ARGS+=(-DNCCL_LIBRARY="$FOUND_LIB")
[[ "$FOUND_INC" = "$CUDA_HOME/include" ]] || export CPATH="$FOUND_INC${CPATH:+:$CPATH}"
CUDNN_FROM="not found: the build has no fused attention"
if find_cuda_lib cudnn cudnn.h libcudnn.so.9 "${NDT_CUDNN_HOME:-}"; then
  CUDNN_FROM="$FOUND_FROM"
  CMAKE_DEP_ARGS+=(-DCUDNN_LIBRARY="$FOUND_LIB")
  [[ "$FOUND_INC" = "$CUDA_HOME/include" ]] || export CPATH="$FOUND_INC${CPATH:+:$CPATH}"
else
  log "cuDNN: $CUDNN_FROM (optional)"
fi
export LD_LIBRARY_PATH="$EXTRA/lib:$LD_LIBRARY_PATH"
# cuDNN compiles its attention engines at run time with NVRTC, which loads
# libnvrtc-builtins by soname: the toolkit's copy must be findable (last: it shadows nothing)
for d in "$CUDA_HOME/lib64" "$CUDA_HOME/lib"; do [[ -d "$d" ]] && export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$d"; done
# a graph cuDNN cannot build says why in the logs (the run goes on with the composed attention)
export CUDNN_FRONTEND_LOG_INFO="${CUDNN_FRONTEND_LOG_INFO:-1}" CUDNN_FRONTEND_LOG_FILE="${CUDNN_FRONTEND_LOG_FILE:-$LOGS/cudnn_frontend.log}"
log "NCCL: $NCCL_FROM; cuDNN: $CUDNN_FROM"
STAGE_TIMES+=("deps: $((SECONDS - t0))s")

# ---- 2. configure and build only what runs -------------------------------------------------
TARGETS=(test_cuda_ops test_cuda_train train_gpt bench_gpu_ops bench_gpt_train test_mpi_comm)
[[ -f tests/test_cuda_attention.cpp ]] && TARGETS+=(test_cuda_attention)
[[ -f tests/test_cuda_nccl.cpp ]] && TARGETS+=(test_cuda_nccl)
t0=$SECONDS
log "configure: $BUILD"
cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DNDT_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_CUDA_COMPILER="$NVCC" "${CMAKE_DEP_ARGS[@]}" \
  >"$LOGS/configure.log" 2>&1 || { tail -40 "$LOGS/configure.log"; echo "[gpu_check] error: CMake configure failed ($LOGS/configure.log)" >&2; exit 1; }
grep -E "ndtrain:|Found (MPI|Boost|GTest|benchmark|nlohmann)" "$LOGS/configure.log" | sed 's/^/[gpu_check]   /'
CONFIGURE_TIME=$((SECONDS - t0))
STAGE_TIMES+=("configure: ${CONFIGURE_TIME}s")
t0=$SECONDS
log "build: ${TARGETS[*]} (-j$JOBS)"
BUILD_CAP="${NDT_BUILD_TIMEOUT_S:-300}"
[[ "$DRY" = 1 ]] && BUILD_CAP="${NDT_BUILD_TIMEOUT_S:-7200}"  # a small machine builds for long
if ! timeout "$BUILD_CAP" cmake --build "$BUILD" -j"$JOBS" --target "${TARGETS[@]}" >"$LOGS/build.log" 2>&1; then
  grep -E "error|Error" "$LOGS/build.log" | head -30
  tail -20 "$LOGS/build.log"
  echo "[gpu_check] error: build failed or took over ${BUILD_CAP}s ($LOGS/build.log)" >&2
  exit 1
fi
BUILD_TIME=$((SECONDS - t0))
STAGE_TIMES+=("build: ${BUILD_TIME}s")
log "build: ok in ${BUILD_TIME}s"
if [[ "$DRY" = 1 ]]; then
  log "dry run (NDT_GPU_CHECK_DRY=1): deps, configure (${CONFIGURE_TIME}s) and build (${BUILD_TIME}s) ok; stopping before the GPU stages"
  exit 0
fi

# ---- 3. the GPU tests: any failure or skip fails ----------------------------------------------
# 8 at a time on the one GPU (each test is its own process: start-up, CUDA context and library
# loading dominate the small ones); each gets 2 of the 16 cores for its CPU reference
run_stage "gpu tests" 150 "$LOGS/ctest_gpu.log" \
  env OMP_NUM_THREADS=2 ctest --test-dir "$BUILD" -L gpu -j8 --no-tests=error --output-on-failure --timeout 90
ctest_rc=$STAGE_RC
total="$(sed -n 's/.*tests passed, \([0-9]*\) tests\{0,1\} failed out of \([0-9]*\).*/\2/p' "$LOGS/ctest_gpu.log" | tail -1)"
failed="$(sed -n 's/.*tests passed, \([0-9]*\) tests\{0,1\} failed out of.*/\1/p' "$LOGS/ctest_gpu.log" | tail -1)"
skipped="$(grep -c '(Skipped)' "$LOGS/ctest_gpu.log")"
if [[ -n "$total" ]]; then
  TESTS_LINE="$((total - failed - skipped)) passed, $failed failed, $skipped skipped (of $total)"
else
  TESTS_LINE="no result (exit $ctest_rc)"
fi
[[ $ctest_rc -eq 0 && -n "$total" ]] || fail "gpu tests: $TESTS_LINE"
[[ "$skipped" -eq 0 ]] || fail "gpu tests: $skipped skipped although a GPU is visible"

# ---- 4. GPT-2 124M training, bf16 mixed precision, T 1024 ----------------------------------
declare -A GPT_TOK GPT_MFU GPT_MEM GPT_MS GPT_STATUS GPT_PHASES
BATCHES=(8 16)
[[ $QUICK -eq 1 ]] && BATCHES=(8)
for B in "${BATCHES[@]}"; do
  logf="$LOGS/gpt2_bf16_B$B.log"
  run_stage "GPT-2 bf16 B$B" 100 "$logf" "$BUILD/bench_gpt_train" GPT2 0 cuda none --dtype bf16 --batch "$B" --steps 10 --warmup 3
  line="$(grep '^RESULT ' "$logf" | tail -1)"
  if [[ $STAGE_RC -eq 0 && -n "$line" ]]; then
    GPT_TOK[$B]="$(kv tokens_per_s "$line")" GPT_MFU[$B]="$(kv mfu_pct "$line")"
    GPT_MEM[$B]="$(kv total_peak_mib "$line")" GPT_MS[$B]="$(kv ms "$line")" GPT_STATUS[$B]=ok
    ph="$(grep '^PHASES ' "$logf" | tail -1)"  # host queue time vs device finish, per phase
    [[ -n "$ph" ]] && GPT_PHASES[$B]="forward $(kv forward_queued_ms "$ph")/$(kv forward_done_ms "$ph"), backward $(kv backward_queued_ms "$ph")/$(kv backward_done_ms "$ph"), optimizer $(kv optimizer_queued_ms "$ph")/$(kv optimizer_done_ms "$ph") ms"
  else
    if grep -qi "out of memory" "$logf"; then GPT_STATUS[$B]=OOM
    elif [[ $STAGE_RC -eq 124 ]]; then GPT_STATUS[$B]=TIMEOUT
    elif [[ $STAGE_RC -eq 125 ]]; then GPT_STATUS[$B]="NOT RUN"
    elif [[ $STAGE_RC -eq 0 ]]; then GPT_STATUS[$B]="no RESULT line"
    else GPT_STATUS[$B]="exit $STAGE_RC"; fi
    fail "GPT-2 bf16 B$B: ${GPT_STATUS[$B]} ($logf)"
  fi
done
FLOOR_B=16
[[ $QUICK -eq 1 ]] && FLOOR_B=8
if [[ "${GPT_STATUS[$FLOOR_B]:-}" = ok ]] && ! awk -v t="${GPT_TOK[$FLOOR_B]}" -v f="$FLOOR" 'BEGIN { exit !(t >= f) }'; then
  fail "GPT-2 bf16 B$FLOOR_B: ${GPT_TOK[$FLOOR_B]} tokens/s is below the floor of $FLOOR"
fi

# ---- 5. NCCL: the communicator's test and a training step, one rank under mpirun --------------
MPIRUN=(mpirun --allow-run-as-root --oversubscribe --bind-to none -np 1)
run_stage "NCCL comm test" 60 "$LOGS/nccl_comm.log" "${MPIRUN[@]}" "$BUILD/test_mpi_comm" --gtest_filter='DistNccl*' --gtest_color=no
if [[ $STAGE_RC -eq 0 ]] && grep -q '^\[  PASSED  \] [1-9]' "$LOGS/nccl_comm.log" && ! grep -q 'SKIPPED' "$LOGS/nccl_comm.log"; then
  NCCL_COMM_LINE="ok ($(grep '^\[  PASSED  \]' "$LOGS/nccl_comm.log" | head -1 | sed 's/\[  PASSED  \] //'))"
else
  NCCL_COMM_LINE="FAILED (exit $STAGE_RC$(grep -q SKIPPED "$LOGS/nccl_comm.log" && echo ', skipped: no NCCL in the build?'))"
  fail "NCCL comm test: $NCCL_COMM_LINE ($LOGS/nccl_comm.log)"
fi
# a tiny GPT on random tokens (an llm.c-format shard: 256 int32 header, uint16 tokens)
NCCL_RUN="$LOGS/nccl_run"
rm -rf "$NCCL_RUN"
mkdir -p "$NCCL_RUN"
NCCL_STEP_LINE="not run"
if [[ -z "$PYTHON" ]]; then
  NCCL_STEP_LINE="not run (no python3 to write the token shard)"
  fail "NCCL train step: $NCCL_STEP_LINE"
else
  "$PYTHON" - "$NCCL_RUN/train_000000.bin" <<'EOF'
import random, struct, sys
n = 65536
rng = random.Random(1)
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
    f.write(struct.pack("<%dH" % n, *(rng.randrange(256) for _ in range(n))))
EOF
  cat >"$NCCL_RUN/tiny.ini" <<EOF
[model]
n_layer = 2
n_head = 2
n_embd = 64
vocab_size = 256
block_size = 64
[data]
train = $NCCL_RUN/train_*.bin
[train]
micro_batch_size = 4
seq_len = 64
steps = 5
device = cuda
dtype = bfloat16
[sample]
every = -1
[log]
every = 1
EOF
  if ! "$BUILD/train_gpt" --help 2>&1 | grep -q 'parallel.backend'; then
    log "note: this train_gpt has no parallel.backend option yet; running with it anyway"
  fi
  run_stage "NCCL train step" 60 "$LOGS/nccl_train.log" "${MPIRUN[@]}" "$BUILD/train_gpt" --config "$NCCL_RUN/tiny.ini" \
    --parallel.backend nccl
  steps_done="$(grep -c '^step ' "$LOGS/nccl_train.log")"
  if [[ $STAGE_RC -eq 0 ]] && grep -q 'collectives over NCCL' "$LOGS/nccl_train.log" && [[ "$steps_done" -ge 5 ]]; then
    NCCL_STEP_LINE="ok (5 bf16 steps on cuda over NCCL, $(grep '^step ' "$LOGS/nccl_train.log" | tail -1 | sed 's/.*| loss \([0-9.]*\).*/final loss \1/' | tr -d '\r'))"
  else
    NCCL_STEP_LINE="FAILED (exit $STAGE_RC, $steps_done step lines$(grep -q 'collectives over NCCL' "$LOGS/nccl_train.log" || echo ', NCCL not reported'))"
    fail "NCCL train step: $NCCL_STEP_LINE ($LOGS/nccl_train.log)"
  fi
fi

# ---- 6. the GPU op benchmark --------------------------------------------------------------
OPS_LINE="not run (--quick)"
if [[ $QUICK -eq 0 ]]; then
  run_stage "bench_gpu_ops" 60 "$LOGS/bench_gpu_ops.log" "$BUILD/bench_gpu_ops" --benchmark_min_time=0.1
  # the program's own summary: "name/... <time> ms <rate> <unit>", the bf16 rows
  ops="$(sed -n '/^== bench_gpu_ops summary/,$p' "$LOGS/bench_gpu_ops.log" | grep '_bf16' |
         awk '{ n = $1; sub(/\/.*/, "", n); printf "%s%s %s %s", (NR > 1 ? "; " : ""), n, $(NF-1), $NF }')"
  if [[ $STAGE_RC -eq 0 && -n "$ops" ]]; then
    OPS_LINE="ok: $ops"
  elif [[ $STAGE_RC -eq 0 ]]; then
    OPS_LINE="no summary in the output"
    fail "bench_gpu_ops: $OPS_LINE ($LOGS/bench_gpu_ops.log)"
  else
    OPS_LINE="exit $STAGE_RC"
    fail "bench_gpu_ops: exit $STAGE_RC ($LOGS/bench_gpu_ops.log)"
  fi
fi

# ---- 7. PyTorch, the same GPT-2 step (bench/pytorch_gpt2.py) ---------------------------------
declare -A PT_TOK
PT_LINE="not run"
if [[ -z "$PYTHON" ]] || ! env LD_LIBRARY_PATH="$ORIG_LD_LIBRARY_PATH" "$PYTHON" -c 'import torch' >/dev/null 2>&1; then
  PT_LINE="not run (no python3 with torch)"
  fail "PyTorch reference: $PT_LINE"
else
  PT_MODES=eager,compile PT_BATCHES=8,16 PT_CAP=170
  [[ $QUICK -eq 1 ]] && PT_MODES=eager PT_BATCHES=8 PT_CAP=60
  # what is left, less ~2 x 45 s kept for the two sanitizer stages that come after
  san_reserve=90
  [[ $QUICK -eq 1 ]] && san_reserve=0
  left=$((BUDGET - (SECONDS - START) - 10 - san_reserve))
  PT_CAP=$((PT_CAP < left ? PT_CAP : left))
  # the runs it may still start: that, less ~40 s for the last one (a compile)
  pt_budget=$((PT_CAP - 40))
  ((pt_budget >= 1)) || pt_budget=1
  # PyTorch loads its own CUDA libraries: the loader path it came with
  run_stage "PyTorch GPT-2" "$PT_CAP" "$LOGS/pytorch_gpt2.log" env LD_LIBRARY_PATH="$ORIG_LD_LIBRARY_PATH" \
    PYTHONUNBUFFERED=1 "$PYTHON" bench/pytorch_gpt2.py --batch "$PT_BATCHES" --mode "$PT_MODES" --budget-s "$pt_budget"
  pt_rc=$STAGE_RC
  while IFS= read -r line; do
    m="$(kv mode "$line")" b="$(kv B "$line")" t="$(kv tokens_per_s "$line")"
    if [[ -n "$t" ]]; then PT_TOK[$m,$b]="$t"; else PT_TOK[$m,$b]="${line#* T=* }"; fi
  done < <(grep '^RESULT impl=pytorch' "$LOGS/pytorch_gpt2.log")
  PT_LINE="exit $pt_rc"
  [[ $pt_rc -eq 0 ]] || fail "PyTorch reference: exit $pt_rc ($LOGS/pytorch_gpt2.log)"
fi

# ---- 8. compute-sanitizer on the fast op tests (last: the slowest, and unsupported on gVisor) ----------------------------------------
SAN="$(command -v compute-sanitizer || true)"
for c in "$CUDA_HOME/bin/compute-sanitizer" "$CUDA_HOME/compute-sanitizer/compute-sanitizer"; do
  [[ -n "$SAN" ]] || { [[ -x "$c" ]] && SAN="$c"; }
done
# every registry op at its small shapes in both dtypes, and the kernels the ops do not reach
MEMCHECK_FILTER='Ops/CudaVsCpu.Registry/*:Cuda.GemmAlphaBeta:Cuda.DeterministicReductions:Cuda.StridedCopyAndConversions:Cuda.AttentionMergeKernels:Cuda.VocabParallelCrossEntropyKernels:Cuda.KernelErrorsAreReportedAtTheNextSynchronizationOnce'
# racecheck (slower): the kernels that share memory between threads (reductions, softmax,
# LayerNorm, cross-entropy, attention)
RACECHECK_FILTER='Ops/CudaVsCpu.Registry/*layernorm*:Ops/CudaVsCpu.Registry/*softmax*:Ops/CudaVsCpu.Registry/*cross_entropy*:Ops/CudaVsCpu.Registry/*attention*:Ops/CudaVsCpu.Registry/sum*:Ops/CudaVsCpu.Registry/mean*:Cuda.DeterministicReductions:Cuda.AttentionMergeKernels'
sanitize() {  # sanitize TOOL FILTER -> SAN_LINE
  local tool="$1" filter="$2" logf="$LOGS/sanitizer_$1.log"
  # only ndtrain's own kernels (namespace ndt): cuBLAS/cuDNN kernels under racecheck take minutes
  local only_ours=()
  [[ "$("$SAN" --help 2>&1)" == *"--kernel-name "* ]] && only_ours=(--kernel-name kns=ndt)
  run_stage "compute-sanitizer $tool" 60 "$logf" "$SAN" --tool "$tool" --error-exitcode 99 --print-limit 20 \
    "${only_ours[@]}" "$BUILD/test_cuda_ops" --gtest_filter="$filter" --gtest_brief=1 --gtest_color=no
  local summary
  summary="$(grep -E '(ERROR|RACECHECK) SUMMARY' "$logf" | tail -1 | sed 's/^========= //')"
  local tests
  tests="$(grep -E '^\[  PASSED  \]|^\[  FAILED  \]' "$logf" | head -2 | tr '\n' ' ')"
  if grep -q "Device not supported" "$logf"; then
    SAN_LINE="unsupported on this machine (compute-sanitizer: Device not supported; a gVisor runtime?)"
  elif [[ $STAGE_RC -eq 0 ]] && grep -q '^\[  PASSED  \] [1-9]' "$logf" && ! grep -q '^\[  SKIPPED \]' "$logf"; then
    SAN_LINE="ok: ${summary:-no summary} ${tests}"
  elif [[ $STAGE_RC -eq 0 ]]; then
    SAN_LINE="checked nothing (no test passed, or tests skipped): ${tests}"
    fail "compute-sanitizer $tool: $SAN_LINE"
  else
    SAN_LINE="exit $STAGE_RC: ${summary:-no summary} ${tests}"
    [[ $STAGE_RC -eq 124 ]] && SAN_LINE="TIMEOUT: $SAN_LINE"
    fail "compute-sanitizer $tool: $SAN_LINE"
  fi
}
MEMCHECK_LINE="not run (--quick)" RACECHECK_LINE="not run (--quick)"
if [[ $QUICK -eq 0 ]]; then
  if [[ -z "$SAN" ]]; then
    MEMCHECK_LINE="compute-sanitizer not found" RACECHECK_LINE="$MEMCHECK_LINE"
    fail "compute-sanitizer not found (PATH, $CUDA_HOME/bin, $CUDA_HOME/compute-sanitizer)"
  else
    sanitize memcheck "$MEMCHECK_FILTER"; MEMCHECK_LINE="$SAN_LINE"
    sanitize racecheck "$RACECHECK_FILTER"; RACECHECK_LINE="$SAN_LINE"
  fi
fi

# ---- summary -----------------------------------------------------------------------------
TOTAL=$((SECONDS - START))
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a ~ /^[0-9.]+$/ && b ~ /^[0-9.]+$/ && b > 0) printf "%.2fx", a / b; else printf "-" }'; }
{
  echo
  echo "## GPU check, $(date -u '+%Y-%m-%d %H:%M UTC'), tree $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')$(git -C "$ROOT" diff --quiet 2>/dev/null || echo ' + local changes')"
  echo
  echo "| check | result |"
  echo "|---|---|"
  echo "| GPU | $GPU |"
  echo "| toolchain | $("$NVCC" --version | sed -n 's/.*release \([0-9.]*\).*/nvcc \1/p'), $(g++ --version | head -1), $(cmake --version | head -1) |"
  echo "| NCCL / cuDNN | $NCCL_FROM / $CUDNN_FROM; $(grep -o 'fused attention (cuDNN SDPA) [A-Z]*' "$LOGS/configure.log" | head -1) |"
  echo "| machine | kernel $(uname -r), $(nproc) cores |"
  echo "| build | Release, sm_90, -j$JOBS, ${#TARGETS[@]} targets: configure ${CONFIGURE_TIME}s, build ${BUILD_TIME}s |"
  echo "| gpu tests (ctest -L gpu) | $TESTS_LINE |"
  echo "| compute-sanitizer memcheck | $MEMCHECK_LINE |"
  echo "| compute-sanitizer racecheck | $RACECHECK_LINE |"
  echo "| bench_gpu_ops (bf16) | $OPS_LINE |"
  echo "| NCCL comm test (1 rank) | $NCCL_COMM_LINE |"
  echo "| NCCL train step (mpirun -np 1 train_gpt --parallel.backend nccl) | $NCCL_STEP_LINE |"
  echo "| GPT-2 floor | ${FLOOR} tokens/s at bf16 B $FLOOR_B |"
  times="$(IFS=';'; echo "${STAGE_TIMES[*]}")"
  echo "| stage times | ${times//;/, }, total ${TOTAL}s |"
  echo
  echo "GPT-2 124M training step (T 1024, bf16 mixed precision, AdamW, clip 1.0, random tokens); MFU against 989 TFLOP/s (dense bf16):"
  echo
  echo "| B | ndtrain ms/step | ndtrain tokens/s | MFU | peak memory | PyTorch eager tokens/s | PyTorch compile tokens/s | ndtrain / eager | ndtrain / compile |"
  echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
  for B in 8 16; do
    st="${GPT_STATUS[$B]:-not run}"
    if [[ "$st" = ok ]]; then
      echo "| $B | ${GPT_MS[$B]} | ${GPT_TOK[$B]} | ${GPT_MFU[$B]}% | ${GPT_MEM[$B]} MiB | ${PT_TOK[eager,$B]:--} | ${PT_TOK[compile,$B]:--} | $(ratio "${GPT_TOK[$B]}" "${PT_TOK[eager,$B]:-}") | $(ratio "${GPT_TOK[$B]}" "${PT_TOK[compile,$B]:-}") |"
    else
      echo "| $B | $st | | | | ${PT_TOK[eager,$B]:--} | ${PT_TOK[compile,$B]:--} | | |"
    fi
  done
  echo
  echo "One more step per batch size, phase by phase (host queued / device done; equal: the host sets the pace):"
  echo
  for B in 8 16; do [[ -n "${GPT_PHASES[$B]:-}" ]] && echo "- B $B: ${GPT_PHASES[$B]}"; done
  echo
  if [[ ${#FAILURES[@]} -eq 0 ]]; then
    echo "**Result: PASSED** (every stage)"
  else
    echo "**Result: FAILED** (${#FAILURES[@]}):"
    for f in "${FAILURES[@]}"; do echo "- $f"; done
  fi
} | tee "$LOGS/summary.md"
[[ ${#FAILURES[@]} -eq 0 ]]
