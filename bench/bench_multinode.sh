#!/usr/bin/env bash
# bench/bench_multinode.sh: which dimension should cross hosts, measured on the simulated
# cluster of scripts/cluster.sh (2 hosts x 2 ranks, TCP between the hosts, shared memory
# inside one; needs root).
#
#   bench/bench_multinode.sh                       # rates none, 1gbit, 100mbit; every layout
#   RATES=100mbit LAYOUTS="fsdp4 hsdp2x2" STEPS=6 bench/bench_multinode.sh
#
# Config S (as bench/bench_dist.sh), the same global batch of 8 sequences, 4 ranks x 1
# thread. The rate limits both directions of host 1's link (tc tbf), so it bounds the
# traffic between the hosts. Layouts: FSDP over all 4 ranks, HSDP (shard inside a host,
# replicas across), DP over 4, TP2 x DP2 with the TP pairs inside a host and across hosts
# (ranks placed round-robin), FSDP2 x TP2 (TP inside), CP2 x DP2 with the ring across hosts,
# and a pipeline of 2 stages across the hosts with DP2, FSDP2 or TP2 inside each (4
# micro-batches of 1 or 2 sequences: the same 8 sequences a step).
# Per layout: train_gpt's average ms/step; the bytes sent to the other host per step as
# train_gpt counts them (a communicator knows which members share its host; ring model, see
# dist/comm/communicator.h), by rank 0 (its step log) and by all ranks (the line at the end);
# the bytes that really left the hosts per step (both hosts' interface counters from the end
# of step 2 to the end, over those steps); and the
# exposed communication (the share of the step the compute threads waited on collectives,
# from the Chrome traces, scripts/trace_summary.py). Needs the fortunes shards
# (scripts/train_fortunes.sh prepares data/fortunes).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${NDT_BUILD_DIR:-$ROOT/build}"
cd "$ROOT"
[[ -f data/fortunes/vocab.json ]] || { echo "run scripts/train_fortunes.sh once first (it prepares data/fortunes)" >&2; exit 1; }
export NDT_CLUSTER=bench NDT_CLUSTER_OWNER=$$
C=scripts/cluster.sh
OUT="$(mktemp -d)"
trap '$C down >/dev/null 2>&1 || true; rm -rf "$OUT"' EXIT
$C down >/dev/null 2>&1 || true
$C up 2 >/dev/null

STEPS="${STEPS:-10}"
S="--model.n_layer 4 --model.n_head 4 --model.n_embd 256 --model.vocab_size 512 --model.block_size 128 --train.seq_len 128"
common="--config configs/fortunes_char.ini --out '' --log.tensorboard '' $S --train.steps $STEPS --train.eval_every 0 --data.val '' --sample.every -1 --log.every 1 --log.report '' --data.shuffle false --optim.warmup_steps 1 --train.threads 1 --checkpoint.dir ''"

tx() {  # bytes sent by both hosts' interfaces so far
  local t=0
  for h in h0 h1; do t=$((t + $($C run $h cat /sys/class/net/eth0/statistics/tx_bytes))); done
  echo $t
}
speed() { sed -n 's/^average \([0-9.]*\) ms\/step, \([0-9.]*\) tok\/s$/\1/p' "$1"; }

printf "%-8s %-16s %9s %11s %11s %11s %9s\n" rate layout "ms/step" "rank 0 MiB" "ranks MiB" "wire MiB" exposed
for rate in ${RATES:-none 1gbit 100mbit}; do
  $C rate h1 "$rate"
  for layout in ${LAYOUTS:-fsdp4 hsdp2x2 dp4 tp2_in_dp2 tp2_across_dp2 fsdp2_tp2_in cp2_across_dp2 pp2_dp2 pp2_fsdp2 pp2_tp2 pp2_dp2_zb}; do
    map="--map-by ppr:2:node"  # ranks 0,1 on h0, 2,3 on h1
    case $layout in
      fsdp4) par="--parallel.dp_shard_size 4"; B=2 ;;
      hsdp2x2) par="--parallel.dp_replicate_size 2 --parallel.dp_shard_size 2"; B=2 ;;
      dp4) par="--parallel.dp_replicate_size 4"; B=2 ;;
      tp2_in_dp2) par="--parallel.dp_replicate_size 2 --parallel.tp_size 2"; B=4 ;;
      tp2_across_dp2) par="--parallel.dp_replicate_size 2 --parallel.tp_size 2"; B=4; map="--map-by node" ;;
      fsdp2_tp2_in) par="--parallel.dp_shard_size 2 --parallel.tp_size 2"; B=4 ;;
      cp2_across_dp2) par="--parallel.dp_replicate_size 2 --parallel.cp_size 2"; B=4; map="--map-by node" ;;
      # a pipeline across the hosts (stage 0 on h0, stage 1 on h1), 4 micro-batches a step
      pp2_dp2) par="--parallel.pp_size 2 --parallel.dp_replicate_size 2 --train.grad_accum_steps 4"; B=1 ;;
      pp2_fsdp2) par="--parallel.pp_size 2 --parallel.dp_shard_size 2 --train.grad_accum_steps 4"; B=1 ;;
      pp2_tp2) par="--parallel.pp_size 2 --parallel.tp_size 2 --train.grad_accum_steps 4"; B=2 ;;
      pp2_dp2_zb) par="--parallel.pp_size 2 --parallel.dp_replicate_size 2 --train.grad_accum_steps 4 --parallel.pp_schedule zb-h1"; B=1 ;;
      *) echo "unknown layout $layout" >&2; exit 1 ;;
    esac
    rm -f "$OUT"/trace* "$OUT/m.jsonl"
    eval "set -- $common"
    $C mpirun -np 4 $map "$BUILD/train_gpt" "$@" --train.micro_batch_size $B $par \
      --log.metrics "$OUT/m.jsonl" --log.trace "$OUT/trace.json" > "$OUT/$layout.txt" 2>&1 &
    job=$!
    until [[ -f "$OUT/m.jsonl" && $(grep -c '"loss"' "$OUT/m.jsonl") -ge 2 ]] || ! kill -0 $job 2>/dev/null; do sleep 0.05; done
    tx0=$(tx)
    wait $job || { echo "$layout at $rate failed:" >&2; tail -5 "$OUT/$layout.txt" >&2; exit 1; }
    tx1=$(tx)
    ms=$(speed "$OUT/$layout.txt")
    rank0=$(python3 -c "import json; r=[j for j in map(json.loads, open('$OUT/m.jsonl')) if 'loss' in j][2:]; print('%.1f' % (sum(x['comm_bytes_across_hosts'] for x in r)/len(r)/2**20))")
    # "across hosts: 25.4 MiB per step from all ranks (ring model)"
    ours=$(awk '/^across hosts: / {v = $3; u = $4; f = u == "KiB" ? 1 / 1024 : u == "GiB" ? 1024 : u == "MiB" ? 1 : 1 / 1048576; printf "%.1f", v * f}' "$OUT/$layout.txt")
    wire=$(awk -v a="$tx0" -v b="$tx1" -v n=$((STEPS - 2)) 'BEGIN {printf "%.1f", (b - a) / n / 2^20}')
    exposed=$(python3 scripts/trace_summary.py --skip 2 "$OUT"/trace.rank*.json | awk 'NR>1 {s+=$6; n++} END {printf "%.0f%%", s/n}')
    printf "%-8s %-16s %9.0f %11s %11s %11s %9s\n" "$rate" "$layout" "$ms" "$rank0" "$ours" "$wire" "$exposed"
  done
done
