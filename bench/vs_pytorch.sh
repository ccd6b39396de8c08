#!/usr/bin/env bash
# bench/vs_pytorch.sh: ndtrain against PyTorch 2.x from PyPI on this CPU, side by side.
#
#   bench/vs_pytorch.sh                          # S, M, GPT-2 124M (B 1); f32 and bf16; eager and compile
#   bench/vs_pytorch.sh --configs S,M --dtypes f32 --rounds 5
#   bench/vs_pytorch.sh --configs S --contend 1  # a shared machine: one busy loop beside
#   bench/vs_pytorch.sh --configs LS,LM          # the llama family against transformers' LlamaForCausalLM
#   bench/vs_pytorch.sh --help                   # every option (bench/vs_pytorch.py)
#
# Makes what it needs when missing, then runs bench/vs_pytorch.py:
#   - a venv with PyTorch ($NDT_TORCH_VENV, default ~/.cache/ndtrain/torch-venv; the package
#     spec $NDT_TORCH_SPEC, default torch==2.15.*). PyPI's Linux wheel is the CUDA build: about
#     5.4 GB installed, with its NVIDIA libraries (about 80 s to install here); the CPU runs do
#     not use them. Where download.pytorch.org is reachable, NDT_TORCH_INDEX=https://download.
#     pytorch.org/whl/cpu takes the CPU-only wheel instead (not reachable from CI machines);
#   - build/bench_gpt_train ($NDT_BUILD_DIR, as scripts/setup.sh builds it: Release).
# Python's venv module comes with Debian's python3-venv package.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${NDT_BUILD_DIR:-build}"
[[ "$BUILD" = /* ]] || BUILD="$ROOT/$BUILD"
VENV="${NDT_TORCH_VENV:-$HOME/.cache/ndtrain/torch-venv}"
SPEC="${NDT_TORCH_SPEC:-torch==2.15.*}"

log() { echo "[vs_pytorch] $*" >&2; }
die() { echo "[vs_pytorch] error: $*" >&2; exit 1; }

if ! "$VENV/bin/python" -c 'import torch' 2>/dev/null; then
  log "PyTorch: installing $SPEC into $VENV"
  python3 -m venv "$VENV" ||
    die "python3 -m venv $VENV failed: install Debian's python3-venv (apt-get install python3-venv)"
  index=()
  [[ -n "${NDT_TORCH_INDEX:-}" ]] && index=(--index-url "$NDT_TORCH_INDEX")
  "$VENV/bin/pip" install --quiet --upgrade pip ||
    die "pip could not reach its package index (PyPI) from $VENV"
  "$VENV/bin/pip" install --quiet "${index[@]}" "$SPEC" numpy ||
    die "pip install $SPEC failed (see above); NDT_TORCH_SPEC picks another version"
  "$VENV/bin/python" -c 'import torch' || die "torch installed into $VENV but does not import"
fi

if [[ ! -x "$BUILD/bench_gpt_train" ]]; then
  [[ -f "$BUILD/CMakeCache.txt" ]] || die "$BUILD is not configured: run scripts/setup.sh first"
  log "building bench_gpt_train in $BUILD"
  cmake --build "$BUILD" --target bench_gpt_train -j"$(nproc)"
fi

exec "$VENV/bin/python" "$ROOT/bench/vs_pytorch.py" --bench "$BUILD/bench_gpt_train" "$@"
