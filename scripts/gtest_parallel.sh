#!/usr/bin/env bash
# scripts/gtest_parallel.sh: run GoogleTest programs side by side, each split into shards
# (GTEST_TOTAL_SHARDS / GTEST_SHARD_INDEX), one process per shard, and add up their results.
# The GPU check runs its tests this way: ctest starts one process per test, and on a GPU each
# of them pays the CUDA context, cuBLAS and cuDNN start-up again (~200 times for the gpu
# label); here each shard pays it once.
#
#   scripts/gtest_parallel.sh [--logs DIR] [--timeout S] PROGRAM[:SHARDS] [-- GTEST_ARGS...]
#   scripts/gtest_parallel.sh --logs /tmp/t build/test_cuda_ops:8 build/test_cuda_train
#
# Every shard's output goes to DIR/<program>.<shard>.log (default: a temporary folder); one
# line per shard, then the total:
#   gtest_parallel: 160 passed, 0 failed, 2 skipped, 0 crashed or timed out, in 9 processes
# Exit status 0 when no test failed and every process ended with its summary; 1 otherwise
# (skips do not fail here: the caller decides what a skip means). A shard that runs past
# --timeout seconds (default 300) is killed and counted as timed out.
set -uo pipefail

LOGDIR=""
TIMEOUT=300
SPECS=()
EXTRA=()
while (($#)); do
  case "$1" in
    --logs) LOGDIR="$2"; shift 2 ;;
    --timeout) TIMEOUT="$2"; shift 2 ;;
    --) shift; EXTRA=("$@"); break ;;
    -h | --help) sed -n '2,/^set -uo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "gtest_parallel: unknown option '$1' (try --help)" >&2; exit 2 ;;
    *) SPECS+=("$1"); shift ;;
  esac
done
((${#SPECS[@]})) || { echo "gtest_parallel: no program given (try --help)" >&2; exit 2; }
[[ -n "$LOGDIR" ]] || LOGDIR="$(mktemp -d)"
mkdir -p "$LOGDIR"

names=() logs=() pids=()
for spec in "${SPECS[@]}"; do
  prog="${spec%%:*}"
  shards=1
  [[ "$spec" == *:* ]] && shards="${spec##*:}"
  [[ -x "$prog" ]] || { echo "gtest_parallel: $prog is not an executable program (built?)" >&2; exit 2; }
  [[ "$shards" =~ ^[1-9][0-9]*$ ]] || { echo "gtest_parallel: '$spec': the shard count must be a positive number" >&2; exit 2; }
  for ((i = 0; i < shards; i++)); do
    name="$(basename "$prog").$i"
    log="$LOGDIR/$name.log"
    GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$i timeout --kill-after=10 "$TIMEOUT" \
      "$prog" --gtest_color=no "${EXTRA[@]}" >"$log" 2>&1 &
    names+=("$name") logs+=("$log") pids+=($!)
  done
done

passed=0 failed=0 skipped=0 broken=0
# count KIND LOG: the number in gtest's closing "[  KIND  ] N tests" line (0 if none)
count() { sed -n "s/^\[  *$1  *\] \([0-9][0-9]*\) tests\{0,1\}[,.].*/\1/p" "$2" | tail -1; }
for k in "${!pids[@]}"; do
  wait "${pids[$k]}"
  rc=$?
  log="${logs[$k]}"
  if grep -q '^\[==========\] .* ran\.' "$log"; then
    p="$(count PASSED "$log")" s="$(count SKIPPED "$log")" f="$(count FAILED "$log")"
    p="${p:-0}" s="${s:-0}" f="${f:-0}"
    passed=$((passed + p)) skipped=$((skipped + s)) failed=$((failed + f))
    line="$p passed, $f failed, $s skipped"
    ((f > 0)) && line="$line: $(grep '^\[  FAILED  \] [A-Za-z]' "$log" | sed 's/^\[  FAILED  \] //; s/ (.*//' | sort -u | tr '\n' ' ' | sed 's/ $//')"
    ((rc != 0 && f == 0)) && { line="$line, but exit $rc"; broken=$((broken + 1)); }
  else
    broken=$((broken + 1))
    if ((rc == 124 || rc == 137)); then line="TIMED OUT after ${TIMEOUT}s"; else line="ended without its summary (exit $rc; a crash?)"; fi
    line="$line, last line: $(tail -1 "$log")"
  fi
  echo "gtest_parallel: ${names[$k]}: $line ($log)"
done
echo "gtest_parallel: $passed passed, $failed failed, $skipped skipped, $broken crashed or timed out, in ${#pids[@]} processes"
((failed == 0 && broken == 0))
