#!/usr/bin/env bash
# bench/bench_pipeline.sh: the pipeline's bubble measured on CPU ranks, against the papers'
# formula, with rank 0's peak memory, and a timeline of one step of each schedule.
#
#   bench/bench_pipeline.sh                 # P = 2 (and P = 4 on 4 cores or more)
#   STEPS=10 ROUNDS=5 PS="2 4" bench/bench_pipeline.sh
#
# An 8-block GPT (C = 192, T = 128, 2 sequences per micro-batch: a stage's forward of one
# micro-batch takes several ms on one core) trains STEPS steps of M = 8 micro-batches under
# gpipe, 1f1b, interleaved (2 chunks per rank) and zb-h1, one thread per rank, each rank writing
# its Chrome trace (log.trace); scripts/pipeline_bubble.py measures each run's bubble over
# the steps after the first 2. ROUNDS rounds run the schedules in turn (gpipe, 1f1b,
# interleaved, then again), so that other work on the machine slows every schedule alike;
# the table gives the medians. Then P = 2 with M = 4, 10 steps per schedule, for the
# timelines: the fastest step after the warm-up, the one least disturbed by other work on
# the machine (out/bench_pipeline/pp_<schedule>.svg, as in docs/parallel/pipeline-parallel.md).
#
# Expects build/train_gpt and build/prepare_text ($NDT_BUILD_DIR); builds nothing. Prepares
# data/fortunes from the fortune cookies (as scripts/train_fortunes.sh does) when it is not
# there yet. Writes only under out/bench_pipeline/ (each run's traces, train.log and
# metrics.jsonl in a folder of its own, e.g. out/bench_pipeline/p2_m8_1f1b_r1/).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${NDT_BUILD_DIR:-$ROOT/build}"
cd "$ROOT"
for p in train_gpt prepare_text; do
  [[ -x "$BUILD/$p" ]] || { echo "no $BUILD/$p: build it first (scripts/setup.sh)" >&2; exit 1; }
done
if [[ ! -f data/fortunes/preparation.json ]]; then  # a whole preparation is kept, anything else replaced
  CORPUS=/usr/share/games/fortunes
  [[ -d $CORPUS ]] || { echo "no data/fortunes and no $CORPUS: run scripts/train_fortunes.sh --data-only" >&2; exit 1; }
  mapfile -t files < <(find "$CORPUS" -maxdepth 1 -type f ! -name '*.dat' | sort)
  "$BUILD/prepare_text" --out data/fortunes --vocab char --val_fraction 0.05 --overwrite "${files[@]}" > /dev/null
fi
OUT=out/bench_pipeline
rm -rf "$OUT"
mkdir -p "$OUT"

STEPS="${STEPS:-6}"
ROUNDS="${ROUNDS:-3}"
CORES=$(nproc)
if [[ -z "${PS:-}" ]]; then
  PS=2
  if ((CORES >= 4)); then PS="2 4"; fi
fi
note=""
[[ " $PS " == *" 4 "* ]] || note=" (P = 4 runs on 4 cores or more: left out)"
((CORES >= 4)) || [[ " $PS " != *" 4 "* ]] || note=" (P = 4 on $CORES cores: ranks share cores, their idle time goes to each other)"
echo "machine: $CORES cores ($(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1)), 1 thread per rank; P = ${PS// /, }$note"
model="--model.n_layer 8 --model.n_head 4 --model.n_embd 192 --model.block_size 128 --train.seq_len 128"
common="--config configs/fortunes_char.ini --out '' --log.tensorboard '' $model --train.micro_batch_size 2 --train.eval_every 0 --data.val ''"
common+=" --sample.every -1 --log.every 1 --log.report '' --checkpoint.dir '' --data.shuffle false"
common+=" --optim.warmup_steps 1 --train.threads 1"

# run P M SCHEDULE STEPS NAME -> out/bench_pipeline/NAME/
run() {
  local p=$1 m=$2 schedule=$3 steps=$4 dir="$OUT/$5" v=()
  [[ $schedule == interleaved ]] && v=(--parallel.pp_virtual 2)
  mkdir -p "$dir"
  rm -f "$dir/metrics.jsonl"  # a bench run's own: an earlier round's would be refused
  eval "set -- $common"
  if ! scripts/mpirun --oversubscribe --bind-to none -np "$p" "$BUILD/train_gpt" "$@" --train.steps "$steps" \
      --train.grad_accum_steps "$m" --parallel.pp_size "$p" --parallel.pp_schedule "$schedule" "${v[@]}" \
      --log.trace "$dir/trace.json" --log.metrics "$dir/metrics.jsonl" > "$dir/train.log" 2>&1; then
    echo "p=$p m=$m $schedule failed:" >&2
    tail -5 "$dir/train.log" >&2
    exit 1
  fi
  echo "$dir"
}

runs=()
for p in $PS; do
  for round in $(seq 1 "$ROUNDS"); do
    for schedule in gpipe 1f1b interleaved zb-h1; do
      runs+=("$(run "$p" 8 "$schedule" "$STEPS" "p${p}_m8_${schedule}_r$round")")
    done
  done
done
python3 scripts/pipeline_bubble.py --skip 2 --json "$OUT/bubble.json" "${runs[@]}"

# the timelines: P = 2, M = 4, the fastest of 8 steps after the warm-up
for schedule in gpipe 1f1b interleaved zb-h1; do
  dir=$(run 2 4 "$schedule" 10 "p2_m4_$schedule")
  python3 scripts/pipeline_bubble.py --skip 2 --window -1 --svg "$OUT/pp_$schedule.svg" "$dir" | grep '^timeline'
done
