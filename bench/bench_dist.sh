#!/usr/bin/env bash
# bench/bench_dist.sh: data-parallel training speed on CPU ranks, through train_gpt.
#
#   bench/bench_dist.sh            # configs S and M; prints a table (docs/PERFORMANCE.md)
#   STEPS=10 bench/bench_dist.sh S # one config, fewer steps
#   ROUNDS=3 LAYOUTS="cp2 cp2_composed" bench/bench_dist.sh S   # medians of 3 interleaved rounds
#
# For each config, the same global batch (8 sequences) trained by one process with 2
# threads and by 2 ranks x 1 thread in each 2-rank layout: DP and FSDP (each rank 4
# sequences), TP and CP (both ranks the same 8 sequences; TP splits the layers, CP the
# sequence). LAYOUTS="dp2 fsdp2 tp2 cp2" (default) picks them (also tp2_sp, and
# cp2_composed: cp2 with NDT_SDPA=0, the ring's pairs composed from GEMMs and recomputed in
# backward as on a GPU in f32, instead of the CPU's fused kernel); the 4-rank layouts
# fsdp2_tp2, fsdp2_cp2, hsdp2x2 and tp2_cp2 run 4 ranks x 1 thread on the same cores
# (oversubscribed 2x on a 2-core machine: compare them with each other, not with 1 x 2). Tokens/s
# are train_gpt's averages over the steps after the first. With FSDP the Chrome trace of
# every rank gives the exposed communication: the share of the step the compute thread
# spent waiting on a collective (scripts/trace_summary.py). Every run is metered by
# bench/idle.py: run again while other processes took over 0.1 cores beside it; the table's
# last column says the most they took.
# Needs the fortunes shards (scripts/train_fortunes.sh prepares data/fortunes). Writes no
# checkpoint, metrics or report (the main job's out/fortunes/ stays as it was): its logs and
# traces go to a temporary folder, removed at the end.
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
common="--config configs/fortunes_char.ini --out '' --log.tensorboard '' --train.steps $STEPS --train.eval_every 0 --sample.every -1 --log.every 1000 --log.report '' --log.metrics '' --checkpoint.dir '' --data.shuffle false --optim.warmup_steps 1"

speed() { sed -n 's/^average \([0-9.]*\) ms\/step, \([0-9.]*\) tok\/s$/\1 \2/p' "$1"; }
# every run goes through bench/idle.py, which runs it again (twice at most) while other
# processes took more than 0.1 cores beside it, and says how much they took
IDLE=(python3 "$ROOT/bench/idle.py" --)
others() { sed -n 's/^\[idle\] others took \([0-9.]*\) cores.*/\1/p' "$1" | tail -1; }

# one run: config, layout (or "single"), round -> a line "cfg layout np ms tok exposed" in $OUT/runs
run_one() {
  local cfg=$1 layout=$2 round=$3 np=2 par B env=()
  eval "set -- ${ARGS[$cfg]} $common"
  if [[ $layout == single ]]; then
    "${IDLE[@]}" "$BUILD/train_gpt" "$@" --train.micro_batch_size 8 --train.threads 2 > "$OUT/single.txt" 2>&1
    read -r ms tok < <(speed "$OUT/single.txt")
    echo "$cfg single 1 $ms $tok - $(others "$OUT/single.txt")" >> "$OUT/runs"
    return
  fi
  case $layout in
    dp2) par="--parallel.dp_replicate_size 2"; B=4 ;;
    fsdp2) par="--parallel.dp_shard_size 2"; B=4 ;;
    tp2) par="--parallel.tp_size 2"; B=8 ;;
    tp2_sp) par="--parallel.tp_size 2 --parallel.sequence_parallel true"; B=8 ;;
    cp2) par="--parallel.cp_size 2"; B=8 ;;
    cp2_composed) par="--parallel.cp_size 2"; B=8; env=(NDT_SDPA=0) ;;  # the ring's pairs composed, not fused
    fsdp2_tp2) par="--parallel.dp_shard_size 2 --parallel.tp_size 2"; B=4; np=4 ;;
    fsdp2_cp2) par="--parallel.dp_shard_size 2 --parallel.cp_size 2"; B=4; np=4 ;;
    hsdp2x2) par="--parallel.dp_replicate_size 2 --parallel.dp_shard_size 2"; B=2; np=4 ;;
    tp2_cp2) par="--parallel.tp_size 2 --parallel.cp_size 2"; B=8; np=4 ;;
    *) echo "unknown layout $layout" >&2; exit 1 ;;
  esac
  rm -f "$OUT"/trace*
  env "${env[@]}" "${IDLE[@]}" "${MPIRUN[@]}" -np $np "$BUILD/train_gpt" "$@" --train.micro_batch_size $B --train.threads 1 $par \
    --log.trace "$OUT/trace.json" > "$OUT/$layout.txt" 2>&1
  read -r ms tok < <(speed "$OUT/$layout.txt")
  exposed=$(python3 scripts/trace_summary.py --skip 2 "$OUT"/trace.rank*.json | awk 'NR>1 {s+=$6; n++} END {printf "%.1f", s/n}')
  echo "$cfg $layout $np $ms $tok $exposed $(others "$OUT/$layout.txt")" >> "$OUT/runs"
  if [[ $layout == fsdp2 && -n "${SVG:-}" && $round == 1 ]]; then
    python3 scripts/trace_summary.py --skip 2 --window 3 --svg "$SVG" "$OUT"/trace.rank*.json > /dev/null
  fi
}

# ROUNDS=N: every config's runs N times, interleaved (single, the layouts, then again), so
# that a machine whose speed drifts moves every row alike; the table gives medians, the
# spread of ms/step over the rounds, and the median of the per-round ratios to one process
: > "$OUT/runs"
for round in $(seq 1 "${ROUNDS:-1}"); do
  for cfg in ${1:-S M}; do
    run_one "$cfg" single "$round"
    for layout in ${LAYOUTS:-dp2 fsdp2 tp2 cp2}; do run_one "$cfg" "$layout" "$round"; done
  done
done
python3 - "$OUT/runs" "${ROUNDS:-1}" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
rounds = int(sys.argv[2])
print(f"{'config':<6} {'layout':<28} {'ms/step':>10} {'spread':>8} {'tok/s':>10} {'vs 1x2':>8} {'exposed':>10} "
      f"{'others (max)':>13}")
order = list(dict.fromkeys((r[0], r[1]) for r in rows))
for cfg, layout in order:
    mine = [r for r in rows if r[0] == cfg and r[1] == layout]
    single = [r for r in rows if r[0] == cfg and r[1] == "single"]
    ms = [float(r[3]) for r in mine]
    tok = [float(r[4]) for r in mine]
    ratios = [float(m[4]) / float(s[4]) for m, s in zip(mine, single)]
    spread = f"{(max(ms) - min(ms)) / statistics.median(ms) * 100:.0f}%" if rounds > 1 else "-"
    name = "1 process x 2 threads" if layout == "single" else f"{layout} ({mine[0][2]} ranks x 1)"
    exposed = "-" if layout == "single" else f"{statistics.median(float(r[5]) for r in mine):.1f}%"
    busy = max(float(r[6]) for r in mine)
    print(f"{cfg:<6} {name:<28} {statistics.median(ms):>10.1f} {spread:>8} {statistics.median(tok):>10.0f} "
          f"{statistics.median(ratios):>7.2f}x {exposed:>10} {busy:>7.2f} cores")
print("(others: the most CPU other processes took beside one of the row's runs, bench/idle.py; a run above "
      "0.1 cores was run again, twice at most)")
PY
