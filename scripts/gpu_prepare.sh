#!/usr/bin/env bash
# scripts/gpu_prepare.sh: on a build host (Debian 12 with apt and network; no GPU needed),
# make what scripts/gpu_check.sh needs on a GPU node that has the CUDA toolkit, CMake, Ninja
# and a compiler but no Debian -dev packages and no internet; check it the way the node will
# use it; and say what to copy and run.
#
#   scripts/gpu_prepare.sh           # make and check (about a minute; what .ci/run does)
#   scripts/gpu_prepare.sh --build   # also build the check's targets for sm_90 against the
#                                    # prepared packages, as the node will, and rehearse the
#                                    # check on that build (minutes here)
#   scripts/gpu_prepare.sh --fresh   # download .gpu-deps again even if it is up to date, and
#                                    # build from scratch (the build folder is reused otherwise)
#   scripts/gpu_prepare.sh --clean   # remove the check's build folder and unpacked packages
#                                    # (/tmp/ndt-gpu-prepare-*, ~280 MiB after --build) when it
#                                    # ends, passed or failed (what .ci/run does); kept otherwise,
#                                    # for an incremental build next time
#
# What it makes (both git-ignored, both to copy to the node inside the repository):
#   .gpu-deps/                    the Debian packages of the build (OpenBLAS, Boost.Program_options,
#                                 GoogleTest, Google Benchmark, nlohmann-json, Open MPI and what
#                                 its plugins link): scripts/gpu_deps.sh, run when .gpu-deps is
#                                 missing or its list differs from that script's
#   third_party/cudnn_frontend/   the cuDNN frontend headers (scripts/setup.sh --cudnn-frontend)
#
# What it checks: the pre-flight of gpu_check.sh (without GPU or PyTorch), then gpu_check.sh
# with NDT_GPU_CHECK_DRY=configure: .gpu-deps unpacked into a prefix, CMake configured with
# every package found there and not on this machine; then it adds up what to copy (the
# repository's files plus the two folders). NDT_GPU_PREPARE_LIMIT_MIB=N makes a total above
# N MiB an error (a transfer quota). Exit status 0 when all of it holds, else 1 with one line
# saying what failed.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
BUILD_TOO=0
FRESH=0
CLEAN=0
for arg in "$@"; do
  case "$arg" in
    --build) BUILD_TOO=1 ;;
    --fresh) FRESH=1 ;;
    --clean) CLEAN=1 ;;
    -h | --help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "[gpu_prepare] unknown option '$arg' (try --help)" >&2; exit 2 ;;
  esac
done
COPY=(.gpu-deps third_party)
LIMIT_MIB="${NDT_GPU_PREPARE_LIMIT_MIB:-}"
# outside the repository, named after this clone's path, so that two clones on one machine
# never share (or remove) each other's
CLONE_ID="$(printf '%s' "$ROOT" | cksum | cut -d' ' -f1)"
CHECK_BUILD="${NDT_GPU_PREPARE_BUILD_DIR:-/tmp/ndt-gpu-prepare-build-$CLONE_ID}"
CHECK_DEPS="${NDT_GPU_PREPARE_DEPS_PREFIX:-/tmp/ndt-gpu-prepare-deps-$CLONE_ID}"

log() { echo "[gpu_prepare] $*"; }
if [[ $CLEAN -eq 1 ]]; then
  # the rehearsal's stand-ins too (kept on a failure without --clean, for its log)
  REHEARSAL_DIR=""
  # shellcheck disable=SC2317  # called by the trap
  clean_up() {
    rm -rf "$CHECK_BUILD" "$CHECK_DEPS" ${REHEARSAL_DIR:+"$REHEARSAL_DIR"}
    echo "[gpu_prepare] --clean: removed $CHECK_BUILD and $CHECK_DEPS"
  }
  trap clean_up EXIT
fi
die() { echo "[gpu_prepare] error: $*" >&2; exit 1; }
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
T0=$SECONDS

for tool in git python3 awk; do command -v "$tool" >/dev/null || die "$tool not found"; done

# ---- 1. .gpu-deps: made again when missing, incomplete, or listing other packages ----------
deps_current() {
  [[ -f .gpu-deps/MANIFEST && -f .gpu-deps/boost1.74-headers-trimmed.tar.xz ]] || return 1
  local want have
  want="$(scripts/gpu_deps.sh --list | sort)"
  have="$(grep -v '^#\|^total \|^boost' .gpu-deps/MANIFEST | awk '{ print $1 }' | sort)"
  [[ "$want" = "$have" ]] || return 1
  [[ "$(find .gpu-deps -name '*.deb' | wc -l)" -eq "$(wc -l <<<"$want")" ]]
}
if [[ $FRESH -eq 0 ]] && deps_current; then
  log ".gpu-deps: up to date ($(grep -vc '^#\|^total \|^boost' .gpu-deps/MANIFEST) packages + the Boost headers, made $(sed -n '1s/.* on \([0-9-]*\) .*/\1/p' .gpu-deps/MANIFEST))"
else
  log ".gpu-deps: making it (scripts/gpu_deps.sh)"
  if ! scripts/gpu_deps.sh; then
    # apt's package lists may be missing or stale (a fresh machine, or an old one)
    [[ $EUID -eq 0 ]] || die "scripts/gpu_deps.sh failed (as root: apt-get update, then run this again)"
    log "apt-get update, then once more"
    DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null
    scripts/gpu_deps.sh || die "scripts/gpu_deps.sh failed after apt-get update (its lines above say which package)"
  fi
  deps_current || die ".gpu-deps does not hold what scripts/gpu_deps.sh lists"
fi

# the tree this was prepared from: the GPU machine's copy has no .git to say it
echo "$(git rev-parse --short HEAD)$(git diff --quiet HEAD 2>/dev/null || echo ' + local changes')" >.gpu-deps/TREE

# ---- 2. the cuDNN frontend headers ------------------------------------------------------------
scripts/setup.sh --cudnn-frontend | sed 's/^\[setup\]/[gpu_prepare]/'

# A rehearsal of both halves of the check (--quick, --rest) on the build just made, with stand-ins for what this
# machine lacks: an nvidia-smi that names no real GPU, a torch module that imports but has no
# CUDA, a compute-sanitizer that says "Device not supported". Every GPU stage then fails here,
# and must fail the way it would on a broken GPU machine: exit 1, a summary.md in
# NDT_GPU_CHECK_OUT that names each failed stage, and no shell error on the way. It runs every
# line of the script that a GPU run will, up to what the GPU itself would answer.
rehearse() {
  local fake part rc out
  fake="$(mktemp -d)"
  REHEARSAL_DIR="$fake"
  mkdir -p "$fake/bin" "$fake/py/torch"
  printf '#!/bin/sh
case "$*" in *-L*) echo "GPU 0: rehearsal stand-in (no GPU here)" ;; *) echo "rehearsal stand-in, 0 MiB, none" ;; esac
' >"$fake/bin/nvidia-smi"
  printf '#!/bin/sh
echo "========= Error: Device not supported"
exit 1
' >"$fake/bin/compute-sanitizer"
  chmod +x "$fake/bin/nvidia-smi" "$fake/bin/compute-sanitizer"
  printf '__version__ = "0+rehearsal"


class version:
    cuda = None
' >"$fake/py/torch/__init__.py"
  for part in quick rest; do
    out="$fake/out-$part"
    PATH="$fake/bin:$PATH" PYTHONPATH="$fake/py" NDT_GPU_CHECK_OUT="$out" NDT_BUILD_DIR="$CHECK_BUILD" \
      NDT_DEPS_PREFIX="$CHECK_DEPS" NDT_JOBS="$(nproc)" scripts/gpu_check.sh --$part >"$fake/$part.log" 2>&1 && rc=0 || rc=$?
    local expect=()
    case "$part" in
      quick) expect=("gpu tests: " "GPT-2 bf16 B16: " "PyTorch reference: ") ;;
      rest) expect=("NCCL comm test: " "NCCL train step: " "PyTorch reference: ") ;;
    esac
    local problems=()
    ((rc == 1)) || problems+=("exit $rc, not 1")
    [[ -f "$out/summary.md" && -f "$out/logs.tar.gz" ]] || problems+=("no summary.md and logs.tar.gz in NDT_GPU_CHECK_OUT")
    grep -q '^\*\*Result: FAILED\*\*' "$out/summary.md" 2>/dev/null || problems+=("the summary has no FAILED result")
    for e in "${expect[@]}"; do grep -q -- "^- $e" "$out/summary.md" 2>/dev/null || problems+=("the summary does not list '$e'"); done
    if grep -nE 'syntax error|unbound variable|command not found|bad substitution|integer expression expected|bad array subscript' "$fake/$part.log" >"$fake/errors"; then
      problems+=("shell errors: $(head -3 "$fake/errors" | tr '\n' ' ')")
    fi
    if ((${#problems[@]})); then
      tail -30 "$fake/$part.log" | sed 's/^/  /'
      die "the rehearsal of gpu_check.sh --$part: $(IFS=';'; echo "${problems[*]}") (its log: $fake/$part.log)"
    fi
    log "rehearsal of gpu_check.sh --$part with a stand-in GPU: every stage ran and failed as it must ($(grep -c '^- ' "$out/summary.md") failures listed, exit 1, summary.md and logs.tar.gz written)"
  done
  rm -rf "$fake"
}

# ---- 3. the check, as the GPU machine will run it, up to the configure (or the build) -----------
if command -v nvcc >/dev/null || [[ -x /usr/local/cuda/bin/nvcc ]]; then
  dry=configure
  [[ $BUILD_TOO -eq 1 ]] && dry=1
  log "gpu_check.sh with NDT_GPU_CHECK_DRY=$dry (build folder $CHECK_BUILD, packages unpacked in $CHECK_DEPS)"
  # reused for an incremental build, unless --fresh or it was configured from another tree
  if [[ $FRESH -eq 1 ]] || { [[ -f "$CHECK_BUILD/CMakeCache.txt" ]] &&
       [[ "$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$CHECK_BUILD/CMakeCache.txt")" != "$ROOT" ]]; }; then
    rm -rf "$CHECK_BUILD"
  fi
  t0=$SECONDS
  NDT_GPU_CHECK_DRY=$dry NDT_BUILD_DIR="$CHECK_BUILD" NDT_DEPS_PREFIX="$CHECK_DEPS" NDT_JOBS="$(nproc)" \
    scripts/gpu_check.sh --quick 2>&1 | sed 's/^/  /' ||
    die "the dry run of scripts/gpu_check.sh failed (its lines above; logs in $CHECK_BUILD/gpu_check)"
  log "gpu_check.sh dry run ($dry): ok in $((SECONDS - t0))s"
  if [[ $BUILD_TOO -eq 1 ]]; then
    rehearse
    cpu="$(awk 'NR > 1 { s += ($2 - $1) / 1000 } END { printf "%.0f", s }' "$CHECK_BUILD/.ninja_log")"
    longest="$(awk 'NR > 1 { t = ($2 - $1) / 1000; if (t > m) { m = t; n = $4 } } END { printf "%.0f s (%s)", m, n }' "$CHECK_BUILD/.ninja_log")"
    log "build: $cpu s of compile and link steps in all, the longest $longest: on the GPU machine's 16 cores the longest one is the build's floor"
  fi
else
  log "no nvcc here: .gpu-deps and the headers are made, but the check's dry run needs the CUDA toolkit (not tried)"
fi

# ---- 4. what to copy to the node ------------------------------------------------------------------
# the repository's files (tracked, and untracked ones git does not ignore) and the two folders
tree_bytes="$(git ls-files -z -c -o --exclude-standard | xargs -0 -r stat -c %s 2>/dev/null | awk '{ s += $1 } END { print s + 0 }')"
copy_bytes="$(du -sb "${COPY[@]}" | awk '{ s += $1 } END { print s + 0 }')"
total=$((tree_bytes + copy_bytes))
log "to copy: the repository's files $(mib "$tree_bytes") + $(for c in "${COPY[@]}"; do printf '%s %s, ' "$c/" "$(mib "$(du -sb "$c" | cut -f1)")"; done | sed 's/, $//') = $(mib "$total")"
if [[ -n "$LIMIT_MIB" ]] && ((total > LIMIT_MIB * 1048576)); then
  die "what to copy is over NDT_GPU_PREPARE_LIMIT_MIB=$LIMIT_MIB MiB: trim .gpu-deps or untracked files"
fi

cat <<EOF
[gpu_prepare] ready in $((SECONDS - T0))s. On the GPU node:
  1. copy this repository there with its two git-ignored folders, .gpu-deps/ and third_party/
     (a git clone on the node lacks them), e.g.  rsync -a --exclude 'build*' $ROOT/ node:ndtrain/
  2. run, in the copy:  scripts/gpu_check.sh
     (or scripts/gpu_check.sh --quick, then --rest, where the node is held for minutes at a time;
     NDT_GPU_CHECK_OUT=DIR also leaves summary.md and logs.tar.gz in DIR)
  3. read the summary it ends with: **Result: PASSED**, or one line per failed stage
     (docs/gpu-check.md says what each stage proves)
EOF
