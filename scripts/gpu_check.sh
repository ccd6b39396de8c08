#!/usr/bin/env bash
# scripts/gpu_check.sh: on a node with an NVIDIA GPU (Ampere or Hopper), build the CUDA
# backend and check it: the GPU tests (CUDA kernels against their CPU twins), GPT-2 124M
# training in bf16 at T 1024 against a throughput floor, the same step in PyTorch for
# comparison, a one-rank NCCL training step, the GPU op benchmark and compute-sanitizer. One
# markdown summary table comes last.
#
# Made for the usual GPU node: the CUDA toolkit, CMake, Ninja, a compiler and PyTorch are
# there, but no Debian -dev packages and no internet. On a build host with apt and network,
# scripts/gpu_prepare.sh makes the two git-ignored folders this script needs, .gpu-deps/
# (the Debian packages of the build, unpacked into a prefix here, never into /) and
# third_party/cudnn_frontend/ (the cuDNN frontend headers: without them the build has no
# fused attention and test_cuda_attention skips, which fails the check); copy the
# repository with both to the node and run this one script there:
#
#   scripts/gpu_check.sh              # everything (~9 min on a 16-core node)
#   scripts/gpu_check.sh --preflight  # ~10 s: every tool, library and header the check needs,
#                                     # each missing one named in one line; then stop
#   scripts/gpu_check.sh --quick      # the first half (~3-4 min), for a node held only for
#                                     # minutes at a time: pre-flight, build, the GPU tests,
#                                     # GPT-2 bf16 B 16 against the floor, PyTorch eager at B 16
#   scripts/gpu_check.sh --rest       # the second half: the NCCL test and step, bench_gpu_ops,
#                                     # torch.compile at B 16, memcheck and racecheck (reuses
#                                     # build-gpu/ when the node kept it; else builds, ~1 min)
#
# To keep the results of a node you cannot log in to again (a batch job):
#
#   set -o pipefail; NDT_GPU_CHECK_OUT=$HOME/gpu-check bash scripts/gpu_check.sh 2>&1 | tee gpu_check.log
#
# With NDT_GPU_CHECK_OUT set, summary.md and logs.tar.gz are written there too, also when
# the script stops early. docs/gpu-check.md says what each stage proves and how to read the
# summary.
#
# Environment:
#   NDT_BUILD_DIR        build folder (default build-gpu; reused when it is there)
#   NDT_DEPS_PREFIX      where .gpu-deps is unpacked (default /tmp/ndt-deps-<8 hex digits of
#                        this clone's path>; removed first)
#   NDT_JOBS             build parallelism (default: the number of cores)
#   NDT_BUILD_TIMEOUT_S  the build's limit (default 240; 7200 in a dry run)
#   NDT_GPU_CHECK_DRY=1  pre-flight (no GPU, no PyTorch asked for), deps, configure and
#                        build, then stop: the check of this script on a machine without GPU
#                        (=configure: stop after the configure; scripts/gpu_prepare.sh does)
#   NDT_GPU_CHECK_BUDGET_S   the time limit, in seconds from the script's start, build
#                        included (default: quick 250, rest 280, full 550; keep it ~50 s under
#                        the job's own limit, e.g. Slurm's --time, so the summary is written):
#                        each stage's timeout is cut to what is left; a stage with no time
#                        left is reported NOT RUN and fails the check
#   NDT_GPT2_FLOOR       tokens/s the GPT-2 bf16 B 16 run must reach (default 150000)
#   NDT_CUDA_HOME        the CUDA toolkit to use (default: nvcc's on PATH, else /usr/local/cuda)
#   NDT_NCCL_HOME, NDT_CUDNN_HOME   a folder with include/ and lib/ to use for NCCL / cuDNN
#                        (default: the CUDA toolkit, /usr, else python3's nvidia-nccl-cu13 /
#                        nvidia-cudnn-cu13 wheels, which PyTorch depends on)
#
# Exit status: 0 when every stage passed; 1 on a test failure or skip, a sanitizer error, a
# benchmark crash, timeout or out-of-memory, a stage not run for lack of time, or GPT-2
# below the floor; 2 when the pre-flight found something missing (one line each) or no GPU
# is visible.
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
MODE=full
PREFLIGHT_ONLY=0
for arg in "$@"; do
  case "$arg" in
    --quick) MODE=quick ;;
    --rest) MODE=rest ;;
    --preflight) PREFLIGHT_ONLY=1 ;;
    -h | --help) sed -n '2,/^set -uo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "[gpu_check] unknown option '$arg' (try --help)" >&2; exit 2 ;;
  esac
done
BUILD="${NDT_BUILD_DIR:-build-gpu}"
[[ "$BUILD" = /* ]] || BUILD="$ROOT/$BUILD"
# 8 hex digits of this clone's path (pure bash: the pre-flight may run with a bare PATH), so
# that the folders this script keeps outside the repository are one per clone
clone_id() {
  local h=5381 i c
  for ((i = 0; i < ${#ROOT}; i++)); do printf -v c '%d' "'${ROOT:i:1}"; h=$(((h * 33 + c) & 0xffffffff)); done
  printf '%08x' "$h"
}
DEPS="${NDT_DEPS_PREFIX:-/tmp/ndt-deps-$(clone_id)}"
JOBS="${NDT_JOBS:-$(nproc)}"
DRY="${NDT_GPU_CHECK_DRY:-0}"
case "$DRY" in 0 | 1 | configure) ;; *) echo "[gpu_check] NDT_GPU_CHECK_DRY=$DRY: want 0, 1 or configure" >&2; exit 2 ;; esac
FLOOR="${NDT_GPT2_FLOOR:-150000}"
case "$MODE" in
  quick) BUDGET="${NDT_GPU_CHECK_BUDGET_S:-250}" ;;
  rest) BUDGET="${NDT_GPU_CHECK_BUDGET_S:-280}" ;;
  full) BUDGET="${NDT_GPU_CHECK_BUDGET_S:-550}" ;;
esac
ARCH=x86_64-linux-gnu
LOGS="$BUILD/gpu_check"
START=$SECONDS

log() { echo "[gpu_check] $*"; }
# whatever way the script ends (a missing dependency, a failed configure or build, the end),
# the logs go to NDT_GPU_CHECK_OUT: a node that is gone after the run must leave build.log too
save_logs() {
  [[ -n "${NDT_GPU_CHECK_OUT:-}" && -d "$LOGS" ]] || return 0
  mkdir -p "$NDT_GPU_CHECK_OUT"
  [[ -f "$LOGS/summary.md" ]] && cp "$LOGS/summary.md" "$NDT_GPU_CHECK_OUT/summary.md"
  tar -C "$BUILD" -czf "$NDT_GPU_CHECK_OUT/logs.tar.gz" --exclude='gpu_check/nccl_run/*.bin' gpu_check 2>/dev/null || true
}
trap save_logs EXIT
missing() { stop_early 2 "missing: $*"; }

FAILURES=()   # one line per failed check, for the summary
STAGE_TIMES=()
fail() { FAILURES+=("$*"); log "FAILED: $*"; }
# the tree this runs: git's commit where there is a .git; a device machine's copy has none,
# so the one scripts/gpu_prepare.sh wrote into .gpu-deps/TREE
tree_id() {
  if git -C "$ROOT" rev-parse --short HEAD >/dev/null 2>&1; then
    echo "$(git -C "$ROOT" rev-parse --short HEAD)$(git -C "$ROOT" diff --quiet 2>/dev/null || echo ' + local changes')"
  elif [[ -f "$ROOT/.gpu-deps/TREE" ]]; then
    echo "$(cat "$ROOT/.gpu-deps/TREE") (when scripts/gpu_prepare.sh ran)"
  else
    echo "?"
  fi
}
# stop_early CODE WHAT [DETAIL...]: the check cannot go on. A short summary.md says why (in
# NDT_GPU_CHECK_OUT too, as a full one would be), then exit CODE.
stop_early() {
  local code="$1" what="$2" d
  shift 2
  echo "[gpu_check] error: $what" >&2
  {
    echo
    echo "## GPU check ($MODE), $(date -u '+%Y-%m-%d %H:%M UTC'), tree $(tree_id)"
    echo
    echo "**Result: FAILED before the GPU stages**: $what"
    for d in "$@"; do echo "- $d"; done
    ((${#STAGE_TIMES[@]})) && printf '\nStage times: %s; total %ss\n' "$(IFS=';'; echo "${STAGE_TIMES[*]}" | sed 's/;/, /g')" "$((SECONDS - START))"
  } >"$LOGS/summary.md"
  exit "$code"
}

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
# hdr_version FILE MAJOR MINOR PATCH: "M.m.p" from a header's #define lines
hdr_version() {
  local f="$1" out="" part v
  shift
  for part in "$@"; do
    v="$(sed -n "s/^#define[[:space:]]\\{1,\\}$part[[:space:]]\\{1,\\}\\([0-9]\\{1,\\}\\).*/\\1/p" "$f" 2>/dev/null | head -1)"
    out="${out:+$out.}${v:-?}"
  done
  echo "$out"
}

# ---- 0. pre-flight: everything the check will need, each missing one named, in ~10 s -------
# Nothing is changed here (no unpacking, no links): it only looks. Every problem is collected
# and printed, one line each with what to do, so that one short call names all of them.
PF_T0=$SECONDS
PF_OK=()        # what was found, for the log
PF_MISSING=()   # what is missing, one line each
found() { PF_OK+=("$*"); }
lacks() { PF_MISSING+=("$*"); }
mkdir -p "$LOGS"
rm -f "$LOGS/summary.md"  # a build folder kept from the last run may hold its summary
PF_TMP="$(mktemp -d)"
trap 'rm -rf "$PF_TMP"; save_logs' EXIT

# PyTorch's import takes seconds: start it now, read it at the end
PYTHON="$(command -v python3 || true)"
if [[ -n "$PYTHON" && "$DRY" = 0 ]]; then
  timeout 30 "$PYTHON" -c 'import torch; print(torch.__version__, torch.version.cuda or "no-cuda")' \
    >"$PF_TMP/torch.out" 2>"$PF_TMP/torch.err" &
  TORCH_PID=$!
fi

tools=()
for t in cmake ninja g++ timeout tar sed awk; do
  if command -v "$t" >/dev/null; then tools+=("$t"); else lacks "$t: not on PATH (the check builds with CMake + Ninja + g++)"; fi
done
found "tools: ${tools[*]}"
[[ -n "$PYTHON" ]] && found "python3 $("$PYTHON" -c 'import platform; print(platform.python_version())' 2>/dev/null)" ||
  lacks "python3: not on PATH (writes the NCCL step's token shard, runs the PyTorch reference)"
if command -v cmake >/dev/null; then
  want="$(sed -n 's/^cmake_minimum_required(VERSION \([0-9.]*\).*/\1/p' "$ROOT/CMakeLists.txt" | head -1)"
  have="$(cmake --version | sed -n '1s/.* \([0-9][0-9.]*\).*/\1/p')"
  if printf '%s\n%s\n' "$want" "$have" | sort -V -C; then found "cmake $have (>= $want)"
  else lacks "cmake >= $want (this one is $have)"; fi
fi

# the CUDA toolkit and the development files the build links: cuBLAS, cuBLASLt, NVRTC
if [[ -n "${NDT_CUDA_HOME:-}" ]]; then
  NVCC=""
  [[ -x "$NDT_CUDA_HOME/bin/nvcc" ]] && NVCC="$NDT_CUDA_HOME/bin/nvcc"
else
  NVCC="$(command -v nvcc || true)"
  [[ -n "$NVCC" ]] || { [[ -x /usr/local/cuda/bin/nvcc ]] && NVCC=/usr/local/cuda/bin/nvcc; }
fi
CUDA_HOME=""
if [[ -z "$NVCC" ]]; then
  lacks "nvcc: the CUDA toolkit is not $([[ -n "${NDT_CUDA_HOME:-}" ]] && echo "in NDT_CUDA_HOME=$NDT_CUDA_HOME" || echo "on PATH nor in /usr/local/cuda/bin")"
else
  CUDA_HOME="$(cd "$(dirname "$NVCC")/.." && pwd)"
  export PATH="$CUDA_HOME/bin:$PATH"
  found "nvcc $("$NVCC" --version | sed -n 's/.*release \([0-9.]*\), V\([0-9.]*\).*/\2/p') in $CUDA_HOME"
  # (CUB sits under include/cccl since CUDA 13; nvcc looks there itself)
  inc_dirs=("$CUDA_HOME/include" "$CUDA_HOME/targets/x86_64-linux/include" "$CUDA_HOME/include/cccl" "$CUDA_HOME/targets/x86_64-linux/include/cccl")
  lib_dirs=("$CUDA_HOME/lib64" "$CUDA_HOME/lib" "$CUDA_HOME/targets/x86_64-linux/lib")
  for h in cuda_runtime.h cublas_v2.h cublasLt.h nvrtc.h cub/cub.cuh; do
    ok=0
    for d in "${inc_dirs[@]}"; do [[ -f "$d/$h" ]] && ok=1; done
    ((ok)) || lacks "$h: not under $CUDA_HOME/include (the toolkit's development headers)"
  done
  # the unversioned names are what the linker needs (the -dev part of each library)
  for l in libcudart.so libcublas.so libcublasLt.so libnvrtc.so 'libnvrtc-builtins.so*'; do
    ok=0
    for d in "${lib_dirs[@]}"; do compgen -G "$d/$l" >/dev/null && ok=1; done
    ((ok)) || lacks "$l: not in $CUDA_HOME/lib64 (the toolkit's development libraries; cuDNN's attention loads libnvrtc-builtins at run time)"
  done
  # nvcc with this g++ for sm_90: a toolkit that rejects the host compiler fails here, not
  # after a minute of building
  printf '__global__ void k(float* p) { p[threadIdx.x] = 1.0f; }\nint main() { k<<<1, 1>>>(nullptr); return 0; }\n' >"$PF_TMP/k.cu"
  if "$NVCC" -arch=sm_90 -std=c++20 -o "$PF_TMP/k" "$PF_TMP/k.cu" >"$PF_TMP/nvcc.log" 2>&1; then
    found "nvcc compiles for sm_90 with $(g++ -dumpfullversion 2>/dev/null | sed 's/^/g++ /')"
  else
    lacks "nvcc cannot compile a kernel for sm_90 with this g++: $(grep -m1 -i error "$PF_TMP/nvcc.log" || head -1 "$PF_TMP/nvcc.log")"
  fi
fi
printf '#include <omp.h>\nint main() { return omp_get_max_threads() > 0 ? 0 : 1; }\n' >"$PF_TMP/omp.cpp"
if command -v g++ >/dev/null && g++ -fopenmp -o "$PF_TMP/omp" "$PF_TMP/omp.cpp" >/dev/null 2>&1 && "$PF_TMP/omp"; then
  found "g++ with OpenMP"
else
  lacks "g++ with OpenMP (-fopenmp and libgomp): the CPU kernels and OpenBLAS's OpenMP build need it"
fi

# NCCL and cuDNN: the toolkit's or /usr's, else the Python wheels (PyTorch's nvidia-*-cu13).
# Nothing is linked or put on a search path here; section 1 does that.
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
find_cuda_lib() {  # find_cuda_lib NAME HEADER SONAME ENVHOME: sets FOUND_INC FOUND_LIB FOUND_FROM
  local name="$1" header="$2" soname="$3" home="$4" d lib
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
    FOUND_INC="$d/include" FOUND_LIB="$d/lib/$soname" FOUND_FROM="python3 wheel $d"
    return 0
  fi
  return 1
}
NCCL_FROM="" CUDNN_FROM=""
if find_cuda_lib nccl nccl.h libnccl.so.2 "${NDT_NCCL_HOME:-}"; then
  NCCL_INC="$FOUND_INC" NCCL_LIB="$FOUND_LIB" NCCL_FROM="$FOUND_FROM"
  NCCL_VERSION="$(hdr_version "$NCCL_INC/nccl.h" NCCL_MAJOR NCCL_MINOR NCCL_PATCH)"
  found "NCCL $NCCL_VERSION from $NCCL_FROM"
else
  lacks "NCCL: nccl.h + libnccl.so.2 in none of ${NDT_NCCL_HOME:+$NDT_NCCL_HOME, }${CUDA_HOME:+$CUDA_HOME, }/usr, python3's nvidia-nccl wheel (or set NDT_NCCL_HOME)"
fi
if find_cuda_lib cudnn cudnn.h libcudnn.so.9 "${NDT_CUDNN_HOME:-}"; then
  CUDNN_INC="$FOUND_INC" CUDNN_LIB="$FOUND_LIB" CUDNN_FROM="$FOUND_FROM"
  CUDNN_VERSION="$(hdr_version "$CUDNN_INC/cudnn_version.h" CUDNN_MAJOR CUDNN_MINOR CUDNN_PATCHLEVEL)"
  found "cuDNN $CUDNN_VERSION from $CUDNN_FROM"
else
  lacks "cuDNN: cudnn.h + libcudnn.so.9 in none of ${NDT_CUDNN_HOME:+$NDT_CUDNN_HOME, }${CUDA_HOME:+$CUDA_HOME, }/usr, python3's nvidia-cudnn wheel (or set NDT_CUDNN_HOME; the fused attention needs it)"
fi
if [[ -f "$ROOT/third_party/cudnn_frontend/include/cudnn_frontend.h" ]]; then
  found "cuDNN frontend headers in third_party/"
else
  lacks "third_party/cudnn_frontend/include: the cuDNN frontend headers (scripts/gpu_prepare.sh fetches them on a build host; copy third_party/ here)"
fi

# the Debian packages: .gpu-deps, complete, and what unpacks it; or the system's own
if [[ -d "$ROOT/.gpu-deps" ]]; then
  if [[ -f "$ROOT/.gpu-deps/MANIFEST" ]]; then
    want="$(grep -vc '^#\|^total \|^boost' "$ROOT/.gpu-deps/MANIFEST")"
    have="$(find "$ROOT/.gpu-deps" -name '*.deb' | wc -l)"
    if [[ "$want" -eq "$have" && -f "$ROOT/.gpu-deps/boost1.74-headers-trimmed.tar.xz" ]]; then
      found ".gpu-deps: $have packages + the Boost headers ($(du -sh "$ROOT/.gpu-deps" | cut -f1))"
    else
      lacks ".gpu-deps is incomplete ($have of $want packages$([[ -f "$ROOT/.gpu-deps/boost1.74-headers-trimmed.tar.xz" ]] || echo ', no Boost tarball')): run scripts/gpu_prepare.sh again"
    fi
  else
    lacks ".gpu-deps/MANIFEST: .gpu-deps was not made by scripts/gpu_prepare.sh (run it again)"
  fi
  command -v dpkg-deb >/dev/null || { command -v ar >/dev/null && command -v xz >/dev/null; } ||
    lacks "dpkg-deb, or ar and xz: what unpacks .gpu-deps/*.deb"
  # Debian 12's libraries need glibc 2.36 or newer (libevent_core: GLIBC_2.36)
  glibc="$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}')"
  if [[ -n "$glibc" ]] && ! printf '2.36\n%s\n' "$glibc" | sort -V -C; then
    lacks "glibc >= 2.36 for the Debian 12 packages of .gpu-deps (this machine has $glibc)"
  fi
else
  if command -v mpirun >/dev/null; then
    found "no .gpu-deps: the system's packages (CMake's configure checks the -dev ones)"
  else
    lacks ".gpu-deps: no Debian packages here and no mpirun (run scripts/gpu_prepare.sh on a build host with apt; copy .gpu-deps/ here)"
  fi
fi

# room to build and unpack
room() {  # room DIR MIB WHAT
  local d="$1" avail
  while [[ ! -d "$d" ]]; do d="$(dirname "$d")"; done
  avail="$(df -Pm "$d" | awk 'NR == 2 { print $4 }')"
  if [[ -n "$avail" && "$avail" -lt "$2" ]]; then lacks "$2 MiB free for $3 in $d (there are $avail)"; fi
}
room "$BUILD" 4096 "the build"
room "$DEPS" 1024 "the unpacked packages"

# the GPU, PyTorch, and compute-sanitizer for the stages that use them
GPU="none (dry run)"
if [[ "$DRY" = 0 ]]; then
  if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
    GPU="$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -1)"
    found "GPU: $GPU"
  else
    lacks "an NVIDIA GPU: nvidia-smi sees none (NDT_GPU_CHECK_DRY=1 checks the script without one)"
  fi
  if [[ -n "${TORCH_PID:-}" ]] && wait "$TORCH_PID" && [[ -s "$PF_TMP/torch.out" ]]; then
    found "torch $(cat "$PF_TMP/torch.out") (the PyTorch reference)"
  else
    lacks "python3 with torch: $(tail -1 "$PF_TMP/torch.err" 2>/dev/null || echo 'no python3') (the PyTorch reference runs bench/pytorch_gpt2.py)"
  fi
fi
SAN=""
if [[ "$MODE" != quick && "$DRY" = 0 ]]; then
  SAN="$(command -v compute-sanitizer || true)"
  for c in "$CUDA_HOME/bin/compute-sanitizer" "$CUDA_HOME/compute-sanitizer/compute-sanitizer"; do
    [[ -n "$SAN" ]] || { [[ -x "$c" ]] && SAN="$c"; }
  done
  [[ -n "$SAN" ]] && found "compute-sanitizer" || lacks "compute-sanitizer: not on PATH nor in $CUDA_HOME (the sanitizer stages of --rest)"
fi

for f in "${PF_OK[@]}"; do log "preflight: ok       $f"; done
for f in "${PF_MISSING[@]}"; do echo "[gpu_check] preflight: MISSING  $f" >&2; done
log "preflight: ${#PF_OK[@]} found, ${#PF_MISSING[@]} missing, in $((SECONDS - PF_T0))s ($MODE check$([[ "$DRY" != 0 ]] && echo ', dry run: no GPU or PyTorch asked for'))"
if ((${#PF_MISSING[@]})); then
  stop_early 2 "the pre-flight found ${#PF_MISSING[@]} thing(s) missing; nothing was built" "${PF_MISSING[@]}"
fi
STAGE_TIMES+=("preflight: $((SECONDS - PF_T0))s")
[[ $PREFLIGHT_ONLY -eq 1 ]] && exit 0
log "budget ${BUDGET}s ($MODE), build $BUILD, -j$JOBS"

# ---- 1. dependencies: .gpu-deps unpacked into $DEPS ------------------------------------------
t0=$SECONDS
CMAKE_DEP_ARGS=()
ORIG_LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}"
if [[ -d "$ROOT/.gpu-deps" ]]; then
  case "$DEPS" in /tmp/* | /var/tmp/* | "$HOME"/*) ;; *) missing "a safe NDT_DEPS_PREFIX (got '$DEPS'; it is removed first, so it must be under /tmp)" ;; esac
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
  [[ -f "$ROOT/.gpu-deps/boost1.74-headers-trimmed.tar.xz" ]] || missing ".gpu-deps/boost1.74-headers-trimmed.tar.xz (run scripts/gpu_prepare.sh)"
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
    [[ -e "$f" ]] || missing "$f (from .gpu-deps: run scripts/gpu_prepare.sh again)"
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
                   -DMPI_CXX_COMPILER="$P/bin/mpicxx" -DMPIEXEC_EXECUTABLE="$P/bin/mpirun"
                   -DNDT_ONEDNN=OFF)  # not in .gpu-deps: the GPU's bf16 GEMMs are cuBLAS's; the
                                      # dry run here then builds what the GPU machine builds
  log "deps: $n packages + trimmed Boost headers unpacked into $DEPS in $((SECONDS - t0))s; fallback libraries used: ${fallback_used[*]:-none}"
else
  log "deps: no .gpu-deps here (scripts/gpu_deps.sh makes it); using the system's packages"
  command -v mpirun >/dev/null || missing "mpirun (Open MPI): no .gpu-deps and none on PATH"
fi
# the same MPI settings as the tests use: one node, shared memory, no single-copy mechanism
export OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader
# a failing NCCL init says why (one-shot run: no second chance to turn it on)
export NCCL_DEBUG="${NCCL_DEBUG:-WARN}"

# NCCL and cuDNN, where the pre-flight found them. Only their own headers are linked into a
# folder of ours, passed to CMake as NCCL_INCLUDE_DIR / CUDNN_INCLUDE_DIR (-isystem): a wheel's
# include/ may hold CUDA runtime headers too, which must not shadow the toolkit's (CPATH would).
EXTRA="$DEPS/cuda-extra"
rm -rf "$EXTRA"
mkdir -p "$EXTRA/lib" "$EXTRA/include"
link_cuda_lib() {  # link_cuda_lib NAME INC LIB SONAME HEADERGLOB: sets LINKED_INC LINKED_LIB
  local name="$1" inc="$2" lib="$3" soname="$4" glob="$5" h
  LINKED_INC="$inc" LINKED_LIB="$lib"
  if [[ "$inc" != "$CUDA_HOME/include" && "$inc" != /usr/include ]]; then
    for h in "$inc"/$glob; do ln -sf "$h" "$EXTRA/include/"; done
    LINKED_INC="$EXTRA/include"
  fi
  if [[ "$(basename "$lib")" != "lib$name.so" ]]; then
    # a wheel ships lib$name.so.N only: the unversioned name for the linker, in our prefix
    ln -sf "$lib" "$EXTRA/lib/lib$name.so"
    ln -sf "$lib" "$EXTRA/lib/$soname"
    LINKED_LIB="$EXTRA/lib/lib$name.so"
    export LD_LIBRARY_PATH="$(dirname "$lib")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  fi
}
link_cuda_lib nccl "$NCCL_INC" "$NCCL_LIB" libnccl.so.2 'nccl*.h'
CMAKE_DEP_ARGS+=(-DNCCL_LIBRARY="$LINKED_LIB" -DNCCL_INCLUDE_DIR="$LINKED_INC")
link_cuda_lib cudnn "$CUDNN_INC" "$CUDNN_LIB" libcudnn.so.9 'cudnn*.h'
CMAKE_DEP_ARGS+=(-DCUDNN_LIBRARY="$LINKED_LIB" -DCUDNN_INCLUDE_DIR="$LINKED_INC")
export LD_LIBRARY_PATH="$EXTRA/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# cuDNN compiles its attention engines at run time with NVRTC, which loads
# libnvrtc-builtins by soname: the toolkit's copy must be findable (last: it shadows nothing)
for d in "$CUDA_HOME/lib64" "$CUDA_HOME/lib"; do [[ -d "$d" ]] && export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$d"; done
log "NCCL: $NCCL_FROM; cuDNN: $CUDNN_FROM"
STAGE_TIMES+=("deps: $((SECONDS - t0))s")

# ---- what this call runs ----------------------------------------------------------------
# --quick: does the GPU path work, and how fast is GPT-2 against PyTorch? --rest: everything
# else, as a second run. Both build every target, so that --rest after --quick on the same
# node builds nothing.
DO_TESTS=0 DO_NCCL=0 DO_OPS=0 DO_SAN=0
case "$MODE" in
  quick) DO_TESTS=1 GPT_BATCHES=(16) PT_RUNS=eager:16 ;;
  rest) DO_NCCL=1 DO_OPS=1 DO_SAN=1 GPT_BATCHES=() PT_RUNS=compile:16 ;;
  full) DO_TESTS=1 DO_NCCL=1 DO_OPS=1 DO_SAN=1 GPT_BATCHES=(8 16) PT_RUNS=eager:8,eager:16,compile:8,compile:16 ;;
esac
NOT_HERE="not in this part (--$([[ $MODE = quick ]] && echo rest || echo quick) runs it)"

# ---- 2. configure and build only what runs -------------------------------------------------
# every GPU test program (tests/test_cuda_*.cpp; test_cuda_ops runs in 8 shards), the programs
# the benchmarks and the NCCL stages run
GPU_TESTS=()
GPU_TEST_PROGRAMS=()
for src in "$ROOT"/tests/test_cuda_*.cpp; do
  name="$(basename "$src" .cpp)"
  GPU_TESTS+=("$name")
  if [[ $name = test_cuda_ops ]]; then GPU_TEST_PROGRAMS+=("$BUILD/$name:8"); else GPU_TEST_PROGRAMS+=("$BUILD/$name"); fi
done
TARGETS=("${GPU_TESTS[@]}" train_gpt bench_gpu_ops bench_gpt_train test_mpi_comm)
t0=$SECONDS
log "configure: $BUILD"
cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DNDT_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_CUDA_COMPILER="$NVCC" "${CMAKE_DEP_ARGS[@]}" \
  >"$LOGS/configure.log" 2>&1 || { tail -40 "$LOGS/configure.log"; stop_early 1 "CMake configure failed ($LOGS/configure.log)" "$(grep -m3 'Error' -A2 "$LOGS/configure.log" | tr '\n' ' ')"; }
# the found packages, then CMake's summary (from "ndtrain: configuration summary" on)
{
  grep -E "Found (MPI|Boost|GTest|benchmark|nlohmann)" "$LOGS/configure.log"
  sed -n '/ndtrain: configuration summary/,/^-- Configuring done/p' "$LOGS/configure.log" | grep -v 'Configuring done'
} | sed 's/^/[gpu_check]   /'
CONFIGURE_TIME=$((SECONDS - t0))
STAGE_TIMES+=("configure: ${CONFIGURE_TIME}s")
if [[ -d "$ROOT/.gpu-deps" ]]; then
  # every package CMake found must be the unpacked one, not a system copy that the GPU
  # machine will not have (on a machine with the -dev packages installed both are there)
  for v in Boost_DIR GTest_DIR benchmark_DIR nlohmann_json_DIR MPI_mpi_LIBRARY NDT_BLAS_LIBRARY; do
    val="$(sed -n "s/^$v:[A-Z]*=//p" "$BUILD/CMakeCache.txt" | head -1)"
    [[ "$val" == "$DEPS"/* ]] || stop_early 1 "CMake took $v from '$val', not from the packages unpacked in $DEPS"
  done
  log "configure: Boost, GTest, benchmark, nlohmann_json, MPI and OpenBLAS all from $DEPS"
fi
if [[ "$DRY" = configure ]]; then
  log "dry run (NDT_GPU_CHECK_DRY=configure): pre-flight, deps and configure (${CONFIGURE_TIME}s) ok; stopping before the build"
  exit 0
fi
t0=$SECONDS
log "build: ${TARGETS[*]} (-j$JOBS)"
BUILD_CAP="${NDT_BUILD_TIMEOUT_S:-240}"
[[ "$DRY" = 1 ]] && BUILD_CAP="${NDT_BUILD_TIMEOUT_S:-7200}"  # a small machine builds for long
# in the background, so that a long build says how far it is (Ninja's [done/total]) each minute
timeout "$BUILD_CAP" cmake --build "$BUILD" -j"$JOBS" --target "${TARGETS[@]}" >"$LOGS/build.log" 2>&1 &
build_pid=$!
while kill -0 "$build_pid" 2>/dev/null; do
  for _ in $(seq 12); do kill -0 "$build_pid" 2>/dev/null && sleep 5; done
  steps="$(grep -o '^\[[0-9]*/[0-9]*\]' "$LOGS/build.log" | tail -1 | tr -d '[]' || true)"
  kill -0 "$build_pid" 2>/dev/null && [[ -n "$steps" ]] &&
    log "build: ${steps%/*} of ${steps#*/} steps done after $((SECONDS - t0))s"
done
if ! wait "$build_pid"; then
  grep -E "error|Error" "$LOGS/build.log" | head -30
  tail -20 "$LOGS/build.log"
  mapfile -t errs < <(grep -E "error" "$LOGS/build.log" | head -5)
  stop_early 1 "build failed or took over ${BUILD_CAP}s ($LOGS/build.log)" "${errs[@]}"
fi
BUILD_TIME=$((SECONDS - t0))
STAGE_TIMES+=("build: ${BUILD_TIME}s")
log "build: ok in ${BUILD_TIME}s"
if [[ "$DRY" = 1 ]]; then
  # what a build alone does not show: every program finds its libraries with this loader
  # path, and the test programs start and end (each test skips: no GPU here)
  for t in "${TARGETS[@]}"; do
    nf="$(ldd "$BUILD/$t" 2>&1 | grep 'not found' | awk '{print $1}' | tr '\n' ' ')"
    [[ -z "$nf" ]] || stop_early 1 "$t: libraries not found: $nf"
  done
  "$ROOT/scripts/gtest_parallel.sh" --logs "$LOGS/gpu_tests" --timeout 300 "${GPU_TEST_PROGRAMS[@]}" | tail -1 |
    sed 's/^/[gpu_check] dry run: the GPU test programs without a GPU: /'
  [[ ${PIPESTATUS[0]} -eq 0 ]] || stop_early 1 "a GPU test program failed or crashed without a GPU ($LOGS/gpu_tests)"
  log "dry run (NDT_GPU_CHECK_DRY=1): deps, configure (${CONFIGURE_TIME}s), build (${BUILD_TIME}s), libraries and test programs ok; stopping before the GPU stages"
  exit 0
fi

# ---- 3. the GPU tests: any failure or skip fails ----------------------------------------------
# Each program once, test_cuda_ops in 8 shards: 11 processes side by side on the one GPU (not
# ctest's ~200, each paying the CUDA context and cuBLAS/cuDNN start-up again), 2 of the 16
# cores each for the CPU references. cuDNN's frontend logs in this stage only: a graph it
# cannot build says why there (the run goes on with the composed attention); in the timed
# stages the logging would cost time.
TESTS_LINE="$NOT_HERE"
if [[ $DO_TESTS -eq 1 ]]; then
  run_stage "gpu tests" 120 "$LOGS/gpu_tests.log" \
    env OMP_NUM_THREADS=2 CUDNN_FRONTEND_LOG_INFO=1 CUDNN_FRONTEND_LOG_FILE="$LOGS/cudnn_frontend.log" \
    "$ROOT/scripts/gtest_parallel.sh" --logs "$LOGS/gpu_tests" --timeout 100 "${GPU_TEST_PROGRAMS[@]}"
  total="$(grep '^gtest_parallel: [0-9]* passed' "$LOGS/gpu_tests.log" | tail -1)"
  skipped="$(sed -n 's/.* \([0-9]*\) skipped.*/\1/p' <<<"$total")"
  if [[ -n "$total" ]]; then
    TESTS_LINE="${total#gtest_parallel: }"
  else
    TESTS_LINE="no result (exit $STAGE_RC)"
  fi
  [[ $STAGE_RC -eq 0 && -n "$total" ]] || fail "gpu tests: $TESTS_LINE ($LOGS/gpu_tests.log)"
  [[ "${skipped:-0}" -eq 0 ]] || fail "gpu tests: $skipped skipped although a GPU is visible ($LOGS/gpu_tests/)"
fi

# ---- 4. GPT-2 124M training, bf16 mixed precision, T 1024 ----------------------------------
declare -A GPT_TOK=() GPT_MFU=() GPT_MEM=() GPT_MS=() GPT_STATUS=() GPT_PHASES=()
# gpt_result B LOGFILE: bench_gpt_train's RESULT (and PHASES: host queue time against device
# finish, per phase) into the GPT_* arrays; 1 when the log has no RESULT line
gpt_result() {
  local B="$1" line ph
  line="$(grep '^RESULT ' "$2" 2>/dev/null | tail -1)"
  [[ -n "$line" ]] || return 1
  GPT_TOK[$B]="$(kv tokens_per_s "$line")" GPT_MFU[$B]="$(kv mfu_pct "$line")"
  GPT_MEM[$B]="$(kv total_peak_mib "$line")" GPT_MS[$B]="$(kv ms "$line")" GPT_STATUS[$B]=ok
  ph="$(grep '^PHASES ' "$2" | tail -1)"
  [[ -n "$ph" ]] && GPT_PHASES[$B]="forward $(kv forward_queued_ms "$ph")/$(kv forward_done_ms "$ph"), backward $(kv backward_queued_ms "$ph")/$(kv backward_done_ms "$ph"), optimizer $(kv optimizer_queued_ms "$ph")/$(kv optimizer_done_ms "$ph") ms"
  return 0
}
for B in "${GPT_BATCHES[@]}"; do
  logf="$LOGS/gpt2_bf16_B$B.log"
  run_stage "GPT-2 bf16 B$B" 90 "$logf" "$BUILD/bench_gpt_train" GPT2 0 cuda none --dtype bf16 --batch "$B" --steps 10 --warmup 3
  if [[ $STAGE_RC -eq 0 ]] && gpt_result "$B" "$logf"; then
    :
  else
    if grep -qi "out of memory" "$logf"; then GPT_STATUS[$B]=OOM
    elif [[ $STAGE_RC -eq 124 ]]; then GPT_STATUS[$B]=TIMEOUT
    elif [[ $STAGE_RC -eq 125 ]]; then GPT_STATUS[$B]="NOT RUN"
    elif [[ $STAGE_RC -eq 0 ]]; then GPT_STATUS[$B]="no RESULT line"
    else GPT_STATUS[$B]="exit $STAGE_RC"; fi
    fail "GPT-2 bf16 B$B: ${GPT_STATUS[$B]} ($logf)"
  fi
done
# --rest on the node --quick ran on (its build folder is still there) shows that call's
# B 16 figures beside torch.compile's
GPT_FROM_QUICK=0
if [[ $MODE = rest ]] && gpt_result 16 "$LOGS/gpt2_bf16_B16.log"; then GPT_FROM_QUICK=1; fi
FLOOR_B=16  # the floor is for B 16: --quick and the full check run it
if [[ "${GPT_STATUS[$FLOOR_B]:-}" = ok ]] && ! awk -v t="${GPT_TOK[$FLOOR_B]}" -v f="$FLOOR" 'BEGIN { exit !(t >= f) }'; then
  fail "GPT-2 bf16 B$FLOOR_B: ${GPT_TOK[$FLOOR_B]} tokens/s is below the floor of $FLOOR"
fi

# ---- 5. NCCL: the communicator's test and a training step, one rank under mpirun --------------
NCCL_COMM_LINE="$NOT_HERE" NCCL_STEP_LINE="$NOT_HERE"
if [[ $DO_NCCL -eq 1 ]]; then
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
fi

# ---- 6. the GPU op benchmark --------------------------------------------------------------
OPS_LINE="$NOT_HERE"
if [[ $DO_OPS -eq 1 ]]; then
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
declare -A PT_TOK=()
# (the pre-flight imported torch)
# eager at B 16 (--quick) ~30 s with the import; each torch.compile run ~40-60 s
case "$MODE" in quick) PT_CAP=80 ;; rest) PT_CAP=100 ;; full) PT_CAP=170 ;; esac
# what is left, less ~2 x 45 s kept for the two sanitizer stages that come after
san_reserve=$((DO_SAN ? 90 : 0))
left=$((BUDGET - (SECONDS - START) - 10 - san_reserve))
PT_CAP=$((PT_CAP < left ? PT_CAP : left))
# the runs it may still start: that, less what the last one takes (a compile: ~40 s)
last=$([[ "$PT_RUNS" == *compile* ]] && echo 40 || echo 25)
pt_budget=$((PT_CAP - last))
((pt_budget >= 1)) || pt_budget=1
# PyTorch loads its own CUDA libraries: the loader path it came with
run_stage "PyTorch GPT-2" "$PT_CAP" "$LOGS/pytorch_gpt2_$MODE.log" env LD_LIBRARY_PATH="$ORIG_LD_LIBRARY_PATH" \
  PYTHONUNBUFFERED=1 "$PYTHON" bench/pytorch_gpt2.py --runs "$PT_RUNS" --budget-s "$pt_budget"
pt_rc=$STAGE_RC
while IFS= read -r line; do
  m="$(kv mode "$line")" b="$(kv B "$line")" t="$(kv tokens_per_s "$line")"
  if [[ -n "$t" ]]; then PT_TOK[$m,$b]="$t"; else PT_TOK[$m,$b]="${line#* T=* }"; fi
done < <(grep -h '^RESULT impl=pytorch' "$LOGS/pytorch_gpt2_$MODE.log" \
           $([[ $GPT_FROM_QUICK -eq 1 && -f "$LOGS/pytorch_gpt2_quick.log" ]] && echo "$LOGS/pytorch_gpt2_quick.log"))
[[ $pt_rc -eq 0 ]] || fail "PyTorch reference: exit $pt_rc ($LOGS/pytorch_gpt2_$MODE.log)"

# ---- 8. compute-sanitizer on the fast op tests (last: the slowest, and unsupported on gVisor) ----------------------------------------
# (the pre-flight found compute-sanitizer as SAN)
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
MEMCHECK_LINE="$NOT_HERE" RACECHECK_LINE="$NOT_HERE"
if [[ $DO_SAN -eq 1 ]]; then
  sanitize memcheck "$MEMCHECK_FILTER"; MEMCHECK_LINE="$SAN_LINE"
  sanitize racecheck "$RACECHECK_FILTER"; RACECHECK_LINE="$SAN_LINE"
fi

# ---- summary -----------------------------------------------------------------------------
TOTAL=$((SECONDS - START))
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a ~ /^[0-9.]+$/ && b ~ /^[0-9.]+$/ && b > 0) printf "%.2fx", a / b; else printf "-" }'; }
{
  echo
  echo "## GPU check ($MODE$([[ $MODE = full ]] || echo ": scripts/gpu_check.sh --$MODE")), $(date -u '+%Y-%m-%d %H:%M UTC'), tree $(tree_id)"
  echo
  echo "| check | result |"
  echo "|---|---|"
  echo "| GPU | $GPU |"
  echo "| toolchain | $("$NVCC" --version | sed -n 's/.*release \([0-9.]*\).*/nvcc \1/p'), $(g++ --version | head -1), $(cmake --version | head -1) |"
  echo "| NCCL / cuDNN | $NCCL_FROM / $CUDNN_FROM; $(grep -o 'fused attention (cuDNN SDPA) [A-Z]*' "$LOGS/configure.log" | head -1) |"
  echo "| machine | kernel $(uname -r), $(nproc) cores |"
  echo "| build | Release, sm_90, -j$JOBS, ${#TARGETS[@]} targets: configure ${CONFIGURE_TIME}s, build ${BUILD_TIME}s |"
  echo "| gpu tests (test_cuda_*, scripts/gtest_parallel.sh) | $TESTS_LINE |"
  echo "| compute-sanitizer memcheck | $MEMCHECK_LINE |"
  echo "| compute-sanitizer racecheck | $RACECHECK_LINE |"
  echo "| bench_gpu_ops (bf16) | $OPS_LINE |"
  echo "| NCCL comm test (1 rank) | $NCCL_COMM_LINE |"
  echo "| NCCL train step (mpirun -np 1 train_gpt --parallel.backend nccl) | $NCCL_STEP_LINE |"
  echo "| GPT-2 floor | ${FLOOR} tokens/s at bf16 B $FLOOR_B$([[ " ${GPT_BATCHES[*]} " == *" 16 "* ]] || echo " ($NOT_HERE)") |"
  times="$(IFS=';'; echo "${STAGE_TIMES[*]}")"
  echo "| stage times | ${times//;/, }, total ${TOTAL}s |"
  echo
  echo "GPT-2 124M training step (T 1024, bf16 mixed precision, AdamW, clip 1.0, random tokens); MFU against 989 TFLOP/s (dense bf16):"
  echo
  echo "| B | ndtrain ms/step | ndtrain tokens/s | MFU | peak memory | PyTorch eager tokens/s | PyTorch compile tokens/s | ndtrain / eager | ndtrain / compile |"
  echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
  for B in 8 16; do
    st="${GPT_STATUS[$B]:-not run}"
    [[ -n "${GPT_STATUS[$B]:-}" || " ${GPT_BATCHES[*]} " == *" $B "* ]] || st="$NOT_HERE"
    if [[ "$st" = ok ]]; then
      echo "| $B | ${GPT_MS[$B]} | ${GPT_TOK[$B]} | ${GPT_MFU[$B]}% | ${GPT_MEM[$B]} MiB | ${PT_TOK[eager,$B]:--} | ${PT_TOK[compile,$B]:--} | $(ratio "${GPT_TOK[$B]}" "${PT_TOK[eager,$B]:-}") | $(ratio "${GPT_TOK[$B]}" "${PT_TOK[compile,$B]:-}") |"
    else
      echo "| $B | $st | | | | ${PT_TOK[eager,$B]:--} | ${PT_TOK[compile,$B]:--} | | |"
    fi
  done
  echo
  ((GPT_FROM_QUICK)) && echo && echo "(B 16: ndtrain's and PyTorch eager's figures are the --quick call's, on the same machine)"
  if ((${#GPT_PHASES[@]})); then
    echo
    echo "One more step per batch size, phase by phase (host queued / device done; equal: the host sets the pace):"
    echo
    for B in 8 16; do [[ -n "${GPT_PHASES[$B]:-}" ]] && echo "- B $B: ${GPT_PHASES[$B]}"; done
  fi
  echo
  if [[ ${#FAILURES[@]} -eq 0 ]]; then
    echo "**Result: PASSED** (every stage)"
  else
    echo "**Result: FAILED** (${#FAILURES[@]}):"
    for f in "${FAILURES[@]}"; do echo "- $f"; done
  fi
} | tee "$LOGS/summary.md"
[[ ${#FAILURES[@]} -eq 0 ]]
