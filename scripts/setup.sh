#!/usr/bin/env bash
# scripts/setup.sh: get a fresh Debian/Ubuntu machine ready for ndtrain, then build it.
#
#   scripts/setup.sh               # install missing packages (apt), configure and build (Release)
#   scripts/setup.sh --deps-only   # only the packages
#   scripts/setup.sh --build-only  # only configure and build (what scripts/test.sh calls)
#   scripts/setup.sh --cudnn-frontend  # only the cuDNN frontend headers, into third_party/
#                                  # (with or without nvcc here; an error if they cannot be had)
#   scripts/setup.sh --parquet     # only the Arrow C++ libraries for .parquet input: the pyarrow
#                                  # wheel (PyPI) in a venv of its own (the default run does this too)
#   scripts/setup.sh --reference   # only the reference venv: torch + transformers from PyPI, CPU
#                                  # only, for tests/scripts/hf_reference.py (the Llama/Qwen2 tests)
#                                  # and tokenizer_reference.py; tiktoken for bench/bench_tokenizer.py;
#                                  # tensorboard to view log.tensorboard (tensorboard --logdir DIR);
#                                  # peft, the reference of LoRA adapters (tests/test_lora.cpp)
#
# Environment:
#   NDT_BUILD_DIR    build folder (default: build, relative to the repository root)
#   NDT_CUDA         AUTO (default: the CUDA backend when nvcc is found, also at
#                    /usr/local/cuda/bin/nvcc, and this machine has an NVIDIA GPU), ON (build
#                    it wherever nvcc is: a build host for GPU nodes; nvcc required) or OFF
#   NDT_BUILD_TARGETS  what to build, a space-separated list of CMake targets (default: all;
#                    scripts/train_fortunes.sh asks only for train_gpt and prepare_text)
#   NDT_BUILD_TYPE   CMake build type (default: Release)
#   NDT_CMAKE_ARGS   extra arguments for the CMake configure step
#   NDT_ARROW_VENV   the venv holding the pyarrow wheel, whose libarrow and libparquet the build
#                    links for .parquet input (default ~/.cache/ndtrain/arrow-venv, where CMake looks)
#   NDT_PARQUET      OFF: no pyarrow wheel, and prepare_text reads no .parquet files
#   NDT_REF_VENV     the reference venv (default ~/.cache/ndtrain/ref-venv)
#   NDT_REF_CUDA     stubs (default: torch without its NVIDIA wheels, ~1.4 GB) or wheels (with
#                    them, as pip installs torch: ~5 GB)
#
# Idempotent and non-interactive: apt runs only when a package is missing (dpkg-query),
# with sudo only when not root. A configured build folder is rebuilt incrementally.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${NDT_BUILD_DIR:-build}"
[[ "$BUILD" = /* ]] || BUILD="$ROOT/$BUILD"

# Everything ndtrain needs: compilers and CMake, OpenBLAS (CPU GEMM; CMake prefers the
# OpenMP build, which shares its threads with our OpenMP loops), oneDNN (bf16 GEMMs on CPUs
# with bf16 instructions), Open MPI (CPU
# collectives), Boost.Program_options (the programs' options) and Boost's headers (CRC-32C of
# the TensorBoard records), nlohmann-json (reports), libxxhash (checkpoint checksums), PCRE2 and
# libunistring (the tokenizer's regexes and Unicode normalization), GoogleTest and
# Google Benchmark, clang-format 14 (the formatting check, tests/scripts/test_format.sh), the fortunes text (the offline training corpus), iproute2 and
# util-linux for the simulated cluster of the multi-host tests (scripts/cluster.sh), and
# python3 for the scripts (scripts/flight_report.py, the trace summary), with its venv module
# for the reference venv (--reference); on x86-64, QEMU's user-mode emulator, with which the
# bit-for-bit test (tests/test_dist_golden.cpp) also checks an AVX2 CPU's figures.
PACKAGES=(
  build-essential cmake pkg-config
  libopenblas-dev libopenblas-openmp-dev libdnnl-dev libopenmpi-dev openmpi-bin
  libboost-program-options-dev libboost-dev nlohmann-json3-dev libxxhash-dev libpcre2-dev libunistring-dev
  libgtest-dev libgmock-dev libbenchmark-dev clang-format-14
  fortunes fortunes-min
  iproute2 util-linux python3 python3-venv
)
if [[ "$(uname -m)" == x86_64 ]]; then PACKAGES+=(qemu-user); fi

log() { echo "[setup] $*"; }
die() { echo "[setup] error: $*" >&2; exit 1; }

install_deps() {
  local missing=() p
  for p in "${PACKAGES[@]}"; do
    if [[ "$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)" != installed ]]; then
      missing+=("$p")
    fi
  done
  if [[ ${#missing[@]} -eq 0 ]]; then
    log "packages: all ${#PACKAGES[@]} already installed, skipping apt"
    return
  fi
  command -v apt-get >/dev/null || die "apt-get not found; install by hand: ${missing[*]}"
  local sudo=()
  if [[ $EUID -ne 0 ]]; then
    command -v sudo >/dev/null || die "not root and sudo is not available; as root run: apt-get install ${missing[*]}"
    sudo=(sudo)
  fi
  log "packages: missing ${missing[*]}"
  log "apt-get update"
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q
  log "apt-get install ${#PACKAGES[@]} packages"
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
    -o Dpkg::Use-Pty=0 "${PACKAGES[@]}"
  log "packages: done"
}

# cuDNN frontend (header-only C++ API over cuDNN's graph backend), used by the fused attention
# on CUDA (tensor/cuda/sdpa.cpp). Pinned; the PyPI wheel carries the headers in include/.
# Fetched only when the CUDA backend will be built; without it (no network) ndtrain builds
# and attention uses the composed kernels.
CUDNN_FRONTEND_VERSION=1.23.0
CUDNN_FRONTEND_DIR="$ROOT/third_party/cudnn_frontend"

gpu_present() {  # an NVIDIA GPU on this machine, as CMakeLists.txt decides it
  compgen -G '/dev/nvidia[0-9]*' >/dev/null || nvidia-smi -L 2>/dev/null | grep -q '^GPU [0-9]'
}

cuda_backend_wanted() {  # the decision CMake makes for NDT_CUDA (AUTO: nvcc and a GPU)
  local mode="${NDT_CUDA:-AUTO}"
  [[ "$mode" != OFF ]] && { command -v nvcc >/dev/null || [[ -x /usr/local/cuda/bin/nvcc ]]; } &&
    { [[ "$mode" = ON ]] || gpu_present; }
}

fetch_cudnn_frontend() {  # fetch_cudnn_frontend [required]
  [[ "${1:-}" = required ]] || cuda_backend_wanted || return 0
  if [[ -f "$CUDNN_FRONTEND_DIR/include/cudnn_frontend.h" ]]; then
    log "cudnn frontend: $CUDNN_FRONTEND_DIR/include already there"
    return 0
  fi
  local tmp
  tmp="$(mktemp -d)"
  if python3 -m pip download --quiet --no-deps --only-binary=:all: -d "$tmp" \
       "nvidia-cudnn-frontend==$CUDNN_FRONTEND_VERSION" >/dev/null 2>&1 &&
     mkdir -p "$CUDNN_FRONTEND_DIR" &&
     python3 -c 'import sys, zipfile; z = zipfile.ZipFile(sys.argv[1]); z.extractall(sys.argv[2], [n for n in z.namelist() if n.startswith("include/")])' \
       "$tmp"/nvidia_cudnn_frontend-*.whl "$tmp/wheel" &&
     [[ -f "$tmp/wheel/include/cudnn_frontend.h" ]]; then
    rm -rf "$CUDNN_FRONTEND_DIR/include"
    mv "$tmp/wheel/include" "$CUDNN_FRONTEND_DIR/include"
    log "cudnn frontend: $CUDNN_FRONTEND_VERSION headers in $CUDNN_FRONTEND_DIR/include"
    CUDNN_FRONTEND_FETCHED=1
  elif [[ "${1:-}" = required ]]; then
    rm -rf "$tmp"
    die "could not fetch nvidia-cudnn-frontend==$CUDNN_FRONTEND_VERSION from PyPI (python3 -m pip download; no network?)"
  else
    log "cudnn frontend: could not fetch nvidia-cudnn-frontend==$CUDNN_FRONTEND_VERSION (no network?); building without fused attention"
  fi
  rm -rf "$tmp"
}

# The reference venv: the packages pinned in scripts/reference-requirements.txt, installed
# with --no-deps. PyPI's Linux torch is the CUDA build, whose libraries name ~3 GB of NVIDIA
# wheels that the loader needs at `import torch` even on a CPU; with NDT_REF_CUDA=stubs (the
# default) scripts/reference_cuda_stubs.py builds stand-ins for them (readelf and cc, from
# build-essential), and only the CUDA runtime and CUPTI (~50 MB, which torch's CPU library
# links) are real. Idempotent: nothing happens when the venv imports torch, transformers,
# safetensors, tiktoken, tensorboard and peft at the pinned versions. A new pin reinstalls in place.
reference_venv() {
  local venv="${NDT_REF_VENV:-$HOME/.cache/ndtrain/ref-venv}" mode="${NDT_REF_CUDA:-stubs}"
  local req="$ROOT/scripts/reference-requirements.txt" torch_v tf_v tk_v tb_v peft_v
  torch_v="$(sed -n 's/^torch==//p' "$req")"
  tf_v="$(sed -n 's/^transformers==//p' "$req")"
  tk_v="$(sed -n 's/^tiktoken==//p' "$req")"
  tb_v="$(sed -n 's/^tensorboard==//p' "$req")"
  peft_v="$(sed -n 's/^peft==//p' "$req")"
  local probe="import torch, transformers, safetensors, tiktoken, tensorboard, peft
assert torch.__version__.split('+')[0] == '$torch_v', torch.__version__
assert transformers.__version__ == '$tf_v', transformers.__version__
assert tiktoken.__version__ == '$tk_v', tiktoken.__version__
assert tensorboard.__version__ == '$tb_v', tensorboard.__version__
assert peft.__version__ == '$peft_v', peft.__version__"
  if "$venv/bin/python" -c "$probe" >/dev/null 2>&1; then
    log "reference venv: $venv has torch $torch_v, transformers $tf_v, tiktoken $tk_v, tensorboard $tb_v and peft $peft_v, skipping"
    return
  fi
  [[ "$mode" = stubs || "$mode" = wheels ]] || die "NDT_REF_CUDA is '$mode': stubs or wheels"
  if [[ "$mode" = stubs ]]; then
    command -v readelf >/dev/null && command -v cc >/dev/null ||
      die "the CUDA stubs need readelf and cc: apt-get install binutils gcc (or scripts/setup.sh --deps-only)"
  fi
  local t0=$SECONDS
  log "reference venv: torch $torch_v, transformers $tf_v into $venv (CUDA libraries: $mode)"
  if [[ ! -x "$venv/bin/python" ]]; then
    mkdir -p "$(dirname "$venv")"
    python3 -m venv "$venv" ||
      die "python3 -m venv $venv failed: install Debian's python3-venv (apt-get install python3-venv)"
  fi
  local nodeps=(--no-deps)
  [[ "$mode" = wheels ]] && nodeps=()
  # --no-cache-dir: the torch wheel (~540 MB) is not kept a second time in pip's cache; pip
  # prints a line per package as it downloads and installs (a minute or two in all)
  "$venv/bin/pip" install --progress-bar off --no-cache-dir --disable-pip-version-check --only-binary=:all: "${nodeps[@]}" -r "$req" ||
    die "pip install -r $req into $venv failed (see above; PyPI unreachable?)"
  if [[ "$mode" = stubs ]]; then
    "$venv/bin/python" "$ROOT/scripts/reference_cuda_stubs.py" \
      "$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" |
      sed 's/^/[setup] reference venv: stub /' || die "the CUDA stubs could not be built"
  fi
  CUDA_VISIBLE_DEVICES="" "$venv/bin/python" -c "$probe
x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
(x @ x.T).sum().backward()
assert x.grad is not None and not torch.cuda.is_available()" ||
    die "torch and transformers installed into $venv but do not work (see above)"
  log "reference venv: done in $((SECONDS - t0)) s, $(du -sh "$venv" | cut -f1) on disk"
}

# Apache Arrow's C++ libraries for prepare_text's .parquet input. Debian 12 packages none; the
# pyarrow wheel ships libarrow, libparquet and their headers (about 45 MB to download, 200 MB
# installed), built for every Linux of glibc 2.28 or later, so a venv of its own holds it and
# CMake links them from there. Without PyPI the build goes on without Parquet.
PYARROW_VERSION=26.0.1
arrow_wheel() {
  if [[ "${NDT_PARQUET:-}" = OFF ]]; then log "parquet: NDT_PARQUET=OFF, no pyarrow wheel"; return; fi
  local venv="${NDT_ARROW_VENV:-$HOME/.cache/ndtrain/arrow-venv}"
  local probe="import pyarrow; assert pyarrow.__version__ == '$PYARROW_VERSION', pyarrow.__version__"
  if [[ -x "$venv/bin/python" ]] && "$venv/bin/python" -c "$probe" >/dev/null 2>&1; then
    log "parquet: $venv has pyarrow $PYARROW_VERSION, skipping"
    return
  fi
  log "parquet: the pyarrow $PYARROW_VERSION wheel (Arrow's C++ libraries) into $venv"
  if ! { [[ -x "$venv/bin/python" ]] || python3 -m venv "$venv"; } ||
    ! "$venv/bin/pip" install --progress-bar off --no-cache-dir --disable-pip-version-check \
      --only-binary=:all: --no-deps "pyarrow==$PYARROW_VERSION" ||
    ! "$venv/bin/python" -c "$probe"; then
    log "warning: the pyarrow wheel could not be installed (PyPI unreachable?): prepare_text will read no .parquet files"
    return
  fi
  # a configured build folder looks for the libraries again
  [[ -f "$BUILD/CMakeCache.txt" ]] && ARROW_INSTALLED=1
  return 0
}

build() {
  fetch_cudnn_frontend
  local jobs
  jobs="$(nproc)"
  local args=(-DCMAKE_BUILD_TYPE="${NDT_BUILD_TYPE:-Release}")
  if [[ -n "${NDT_CUDA:-}" ]]; then args+=(-DNDT_CUDA="$NDT_CUDA"); fi
  # shellcheck disable=SC2206  # NDT_CMAKE_ARGS is a word list on purpose
  if [[ -n "${NDT_CMAKE_ARGS:-}" ]]; then args+=(${NDT_CMAKE_ARGS}); fi
  # (freshly fetched frontend headers: configure again, CMake looks for them at configure time)
  if [[ -f "$BUILD/CMakeCache.txt" && -z "${NDT_CUDA:-}" && -z "${NDT_CMAKE_ARGS:-}" && -z "${NDT_BUILD_TYPE:-}" &&
        -z "${CUDNN_FRONTEND_FETCHED:-}" && -z "${ARROW_INSTALLED:-}" ]]; then
    log "configure: $BUILD already configured (the build re-runs CMake if needed)"
  else
    log "configure: cmake -S $ROOT -B $BUILD ${args[*]}"
    cmake -S "$ROOT" -B "$BUILD" "${args[@]}"
  fi
  local cuda
  cuda="$(sed -n 's/^NDT_CUDA:STRING=//p' "$BUILD/CMakeCache.txt")"
  local targets=() what="everything: the programs, tests and benchmarks"
  if [[ -n "${NDT_BUILD_TARGETS:-}" ]]; then
    read -r -a targets <<<"$NDT_BUILD_TARGETS"
    what="${targets[*]}"
    targets=(--target "${targets[@]}")
  fi
  log "build: $what into $BUILD (${NDT_BUILD_TYPE:-Release}, NDT_CUDA=${cuda:-AUTO}, -j$jobs)"
  local t0=$SECONDS
  cmake --build "$BUILD" -j"$jobs" "${targets[@]}"
  log "build: done in $((SECONDS - t0)) s"
}

case "${1:-}" in
  "") install_deps; arrow_wheel; build ;;
  --deps-only) install_deps ;;
  --build-only) build ;;
  --cudnn-frontend) fetch_cudnn_frontend required ;;
  --parquet) arrow_wheel ;;
  --reference) reference_venv ;;
  -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' ;;
  *) die "unknown option '$1' (try --help)" ;;
esac
