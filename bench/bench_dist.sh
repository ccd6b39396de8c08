#!/usr/bin/env bash
# bench/bench_dist.sh: data-parallel training speed on CPU ranks, through train_gpt.
#
#   bench/bench_dist.sh            # configs S and M; prints a table (docs/PERFORMANCE.md)
#   STEPS=10 bench/bench_dist.sh S # one config, fewer steps
#
# For each config, the same global batch (8 sequences) trained by one process with 2
# threads and by 2 ranks x 1 thread in each 2-rank layout: DP and FSDP (each rank 4
# sequences), TP and CP (both ranks the same 8 sequences; TP splits the layers, CP the
# sequence). LAYOUTS="dp2 fsdp2 tp2 cp2" (default) picks them; the 4-rank layouts
# fsdp2_tp2, fsdp2_cp2, hsdp2x2 and tp2_cp2 run 4 ranks x 1 thread on the same cores
# (oversubscribed 2x on a 2-core machine: compare them with each other, not with 1 x 2). Tokens/s
# are train_gpt's averages over the steps after the first. With FSDP the Chrome trace of
# every rank gives the exposed communication: the share of the step the compute thread
# spent waiting on a collective (scripts/trace_summary.py).
# Needs the fortunes shards (scripts/train_fortunes.sh prepares data/fortunes).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${NDT_BUILD_DIR:-$ROOT/build}"
cd "$ROOT"
export OMPI_MCA_btl_vader_single_copy_mechanism=none  # containers without ptrace rights
MPIRUN=(mpirun --oversubscribe --bind-to none)
[[ $EUID -eq 0 ]] && MPIRUN+=(--allow-run-as-root)
[[ -f data/fortunes/vocab.json ]] || { echo "run scripts/train_fortunes.sh once first (it prepares data/fortunes)" >&2; exit 1; }
OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"' EXIT

declare -A ARGS=(
  [S]="--model.n_layer 4 --model.n_head 4 --model.n_embd 256 --model.vocab_size 512 --model.block_size 128 --train.seq_len 128"
  [M]="--model.n_layer 6 --model.n_head 6 --model.n_embd 384 --model.vocab_size 4096 --model.block_size 256 --train.seq_len 256"
)
STEPS="${STEPS:-30}"
common="--config configs/fortunes_char.ini --train.steps $STEPS --train.eval_every 0 --sample.every -1 --log.every 1000 --log.report '' --data.shuffle false --optim.warmup_steps 1"

speed() { sed -n 's/^average \([0-9.]*\) ms\/step, \([0-9.]*\) tok\/s$/\1 \2/p' "$1"; }

printf "%-6s %-22s %10s %10s %8s %10s\n" config layout "ms/step" "tok/s" "vs 1x2" "exposed"
for cfg in ${1:-S M}; do
  eval "set -- ${ARGS[$cfg]} $common"
  "$BUILD/train_gpt" "$@" --train.micro_batch_size 8 --train.threads 2 > "$OUT/single.txt" 2>&1
  read -r ms0 tok0 < <(speed "$OUT/single.txt")
  printf "%-6s %-22s %10.1f %10.0f %8s %10s\n" "$cfg" "1 process x 2 threads" "$ms0" "$tok0" "1.00x" "-"
  for layout in ${LAYOUTS:-dp2 fsdp2 tp2 cp2}; do
    np=2
    case $layout in
      dp2) par="--parallel.dp_replicate_size 2"; B=4 ;;
      fsdp2) par="--parallel.dp_shard_size 2"; B=4 ;;
      tp2) par="--parallel.tp_size 2"; B=8 ;;
      tp2_sp) par="--parallel.tp_size 2 --parallel.sequence_parallel true"; B=8 ;;
      cp2) par="--parallel.cp_size 2"; B=8 ;;
      fsdp2_tp2) par="--parallel.dp_shard_size 2 --parallel.tp_size 2"; B=4; np=4 ;;
      fsdp2_cp2) par="--parallel.dp_shard_size 2 --parallel.cp_size 2"; B=4; np=4 ;;
      hsdp2x2) par="--parallel.dp_replicate_size 2 --parallel.dp_shard_size 2"; B=2; np=4 ;;
      tp2_cp2) par="--parallel.tp_size 2 --parallel.cp_size 2"; B=8; np=4 ;;
      *) echo "unknown layout $layout" >&2; exit 1 ;;
    esac
    rm -f "$OUT"/trace*
    "${MPIRUN[@]}" -np $np "$BUILD/train_gpt" "$@" --train.micro_batch_size $B --train.threads 1 $par \
      --log.trace "$OUT/trace.json" > "$OUT/$layout.txt" 2>&1
    read -r ms tok < <(speed "$OUT/$layout.txt")
    exposed=$(python3 scripts/trace_summary.py --skip 2 "$OUT"/trace.rank*.json | awk 'NR>1 {s+=$6; n++} END {printf "%.1f%%", s/n}')
    ratio=$(awk -v a="$tok" -v b="$tok0" 'BEGIN {printf "%.2fx", a/b}')
    printf "%-6s %-22s %10.1f %10.0f %8s %10s\n" "$cfg" "$layout ($np ranks x 1)" "$ms" "$tok" "$ratio" "$exposed"
    if [[ $layout == fsdp2 && -n "${SVG:-}" ]]; then
      python3 scripts/trace_summary.py --skip 2 --window 3 --svg "$SVG" "$OUT"/trace.rank*.json > /dev/null
    fi
  done
done
