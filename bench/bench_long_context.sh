#!/usr/bin/env bash
# bench/bench_long_context.sh: how long a sequence trains within a memory budget, with
# context parallelism over 1, 2 and 4 CPU ranks.
#
#   bench/bench_long_context.sh              # budget 256 MiB per rank
#   BUDGET_MIB=128 bench/bench_long_context.sh
#
# A small GPT (2 layers, 2 heads, 64 channels, B 1) takes 2 steps at seq_len 512, 1024,
# 2048, ...; the peak memory of rank 0 (the allocator's figure in train_gpt's step line)
# is printed for each, and the longest seq_len under the budget for each cp. Attention
# keeps a (T x T) score block per head on one process; with cp ranks each holds one
# (T/2cp x T/2cp) block at a time, so the longest length grows with cp.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${NDT_BUILD_DIR:-$ROOT/build}"
cd "$ROOT"
export OMPI_MCA_btl_vader_single_copy_mechanism=none
MPIRUN=(mpirun --oversubscribe --bind-to none)
[[ $EUID -eq 0 ]] && MPIRUN+=(--allow-run-as-root)
[[ -f data/fortunes/vocab.json ]] || { echo "run scripts/train_fortunes.sh once first (it prepares data/fortunes)" >&2; exit 1; }
BUDGET=$(( ${BUDGET_MIB:-256} * 1024 * 1024 ))
MAX_T=${MAX_T:-8192}

peak_bytes() {  # the "(peak X MiB)" of the last step line, in bytes
  sed -n 's/.*(peak \([0-9.]*\) \([MG]\)iB).*/\1 \2/p' "$1" | tail -1 |
    awk '{ m = ($2 == "G") ? 1024 : 1; printf "%d", $1 * m * 1048576 }'
}

printf "%-4s %8s %12s %10s\n" cp seq_len "peak MiB" "ms/step"
for cp in 1 2 4; do
  best=0
  for ((T = 512; T <= MAX_T; T *= 2)); do
    args=(--config configs/fortunes_char.ini --out '' --log.tensorboard '' --model.vocab_size 113 --model.vocab_multiple 4 --model.n_layer 2
          --model.n_head 2 --model.n_embd 64 --model.block_size "$T" --train.seq_len "$T" --train.micro_batch_size 1
          --train.steps 2 --train.eval_every 0 --sample.every -1 --log.report '' --log.metrics '' --checkpoint.dir '' --train.threads 1
          --parallel.cp_size "$cp")
    log="$(mktemp)"
    if ((cp == 1)); then "$BUILD/train_gpt" "${args[@]}" > "$log" 2>&1 || true
    else "${MPIRUN[@]}" -np "$cp" "$BUILD/train_gpt" "${args[@]}" > "$log" 2>&1 || true; fi
    peak=$(peak_bytes "$log")
    ms=$(sed -n 's/^average \([0-9.]*\) ms\/step.*/\1/p' "$log")
    rm -f "$log"
    [[ -z "$peak" ]] && { printf "%-4s %8s %12s\n" "$cp" "$T" "failed"; break; }
    printf "%-4s %8s %12.1f %10s\n" "$cp" "$T" "$(awk -v b="$peak" 'BEGIN {print b / 1048576}')" "${ms:--}"
    ((peak <= BUDGET)) && best=$T
    ((peak > BUDGET)) && break
  done
  echo "cp $cp: longest seq_len within $((BUDGET / 1048576)) MiB per rank: $best"
done
