#!/usr/bin/env bash
# bench/bench_sp_cp.sh: Ulysses (sp), the ring (cp) or both (USP) to split a long sequence,
# measured against the planner's prediction, on plain CPU ranks and on the simulated cluster
# of scripts/cluster.sh (2 hosts, TCP between them; needs root for it).
#
#   bench/bench_sp_cp.sh                               # rates plain none 100mbit, 1k .. 32k tokens
#   MAX_T=4096 RATES="plain none" bench/bench_sp_cp.sh # a quick look
#   LAYOUTS="sp2 cp2" MAX_S=60 bench/bench_sp_cp.sh
#
# A small llama (2 blocks, 4 heads reading 2 kv heads, 64 channels, the char vocabulary of
# data/fortunes, B 1) takes 2 steps (the first warms up; the second is measured) at seq_len
# 1024, 2048, ... up to MAX_T. Layouts: sp2 and cp2 on 2 ranks, sp2 x cp2 (USP) on 4.
# Rates: "plain" runs the ranks under mpirun on this machine (shared memory); "none" and a tc
# rate such as "100mbit" run them on the 2-host cluster, sp2 and cp2 with one rank a host
# (their all-to-alls or ring across), sp2 x cp2 with its sp pairs inside a host and the ring
# across. A layout stops at its first failure or when a step takes over MAX_S seconds.
# Per run: train_gpt's ms/step (the second step), the bytes rank 0 sent that step (its
# communicators' counter, as bench_multinode.sh reads them), rank 0's peak MiB, and the
# planner's predicted ms/step for the same layout on a [cluster] like the run's (the cpu-sim
# preset: one host of the ranks for "plain", 2 hosts otherwise, inter_gbps of the rate).
# At the end, per rate, the shortest length from which cp2 beats sp2, measured and planned.
# Needs the fortunes shards (scripts/train_fortunes.sh prepares data/fortunes).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${NDT_BUILD_DIR:-$ROOT/build}"
cd "$ROOT"
[[ -f data/fortunes/vocab.json ]] || { echo "run scripts/train_fortunes.sh once first (it prepares data/fortunes)" >&2; exit 1; }
export OMPI_MCA_btl_vader_single_copy_mechanism=none
MPIRUN=(mpirun --oversubscribe --bind-to none)
[[ $EUID -eq 0 ]] && MPIRUN+=(--allow-run-as-root)
MAX_T=${MAX_T:-32768}
MAX_S=${MAX_S:-120}
RATES=${RATES:-plain none 100mbit}
LAYOUTS=${LAYOUTS:-sp2 cp2 sp2_cp2}
export NDT_CLUSTER=spcp NDT_CLUSTER_OWNER=$$
C=scripts/cluster.sh
OUT="$(mktemp -d)"
cluster_up=0
trap '((cluster_up)) && { $C down >/dev/null 2>&1 || true; }; rm -rf "$OUT"' EXIT

# the host's links under a tc rate, GB/s per rank of a 2-rank host (cpu-sim's note: about
# 0.0029 at 100 Mbit/s, measured), times the ranks on a host
inter_gbps() {  # rate ranks_per_host
  case $1 in
    none) echo "" ;;
    *mbit) awk -v r="${1%mbit}" -v n="$2" 'BEGIN {printf "%.6f", 0.0029 * r / 100 * 2 / n}' ;;
    *gbit) awk -v r="${1%gbit}" -v n="$2" 'BEGIN {printf "%.6f", 0.0029 * r * 10 * 2 / n}' ;;
    *) echo "unknown rate $1 (plain, none, Nmbit, Ngbit)" >&2; exit 1 ;;
  esac
}

printf "%-8s %-8s %7s %10s %10s %9s %12s\n" rate layout seq_len "ms/step" "MiB sent" "peak MiB" "planned ms"
for rate in $RATES; do
  if [[ $rate != plain ]]; then
    if ((!cluster_up)); then
      $C down >/dev/null 2>&1 || true
      $C up 2 >/dev/null || { echo "the simulated cluster needs root (scripts/cluster.sh); rate $rate skipped" >&2; continue; }
      cluster_up=1
    fi
    $C rate h1 "$rate"
  fi
  for layout in $LAYOUTS; do
    case $layout in
      sp2) par="--parallel.sp_size 2"; np=2; per_host=1 ;;
      cp2) par="--parallel.cp_size 2"; np=2; per_host=1 ;;
      sp2_cp2) par="--parallel.sp_size 2 --parallel.cp_size 2"; np=4; per_host=2 ;;  # ranks 0,1: one cp rank's sp pair
      *) echo "unknown layout $layout (sp2, cp2, sp2_cp2)" >&2; exit 1 ;;
    esac
    for ((T = 1024; T <= MAX_T; T *= 2)); do
      args=(--config configs/fortunes_char.ini --out '' --log.tensorboard '' --model.arch llama --model.n_layer 2
            --model.n_head 4 --model.n_kv_head 2 --model.n_embd 64 --model.intermediate_size 192
            --model.vocab_size 113 --model.vocab_multiple 4 --model.block_size "$T" --train.seq_len "$T"
            --train.micro_batch_size 1 --train.steps 2 --train.eval_every 0 --data.val '' --sample.every -1
            --log.every 1 --log.report '' --checkpoint.dir '' --train.threads 1 --optim.warmup_steps 1 $par)
      # the planner: the same config on a cluster like the run's
      if [[ $rate == plain ]]; then cl=(--cluster.preset cpu-sim --cluster.hosts 1 --cluster.devices_per_host "$np")
      else
        cl=(--cluster.preset cpu-sim --cluster.hosts 2 --cluster.devices_per_host "$per_host")
        g=$(inter_gbps "$rate" "$per_host"); [[ -n $g ]] && cl+=(--cluster.inter_gbps "$g")
      fi
      planned=$("$BUILD/train_gpt" "${args[@]}" --plan --json "${cl[@]}" 2>/dev/null |
        python3 -c "import json,sys; print('%.0f' % (1e3 * json.load(sys.stdin)['time']['step_s']))" 2>/dev/null || echo -)
      rm -f "$OUT/m.jsonl"
      log="$OUT/$rate.$layout.$T.txt"
      ok=1
      if [[ $rate == plain ]]; then
        timeout "$MAX_S" "${MPIRUN[@]}" -np "$np" "$BUILD/train_gpt" "${args[@]}" --log.metrics "$OUT/m.jsonl" > "$log" 2>&1 || ok=0
      else
        map=$([[ $per_host == 1 ]] && echo "--map-by node" || echo "--map-by ppr:2:node")
        timeout "$MAX_S" $C mpirun -np "$np" $map "$BUILD/train_gpt" "${args[@]}" --log.metrics "$OUT/m.jsonl" > "$log" 2>&1 || ok=0
      fi
      if ((!ok)) || [[ ! -f "$OUT/m.jsonl" ]]; then
        printf "%-8s %-8s %7s %10s\n" "$rate" "$layout" "$T" "failed or over ${MAX_S}s"; tail -2 "$log" >&2; break
      fi
      # the measured step (the second): its ms, bytes and peak (metrics.jsonl's)
      read -r ms sent peak < <(python3 -c "
import json
r = [j for j in map(json.loads, open('$OUT/m.jsonl')) if 'loss' in j][-1]
print('%.0f %.2f %.1f' % (r['ms'], r['comm_bytes'] / 2**20, r['mem_peak'] / 2**20))")
      printf "%-8s %-8s %7s %10s %10s %9s %12s\n" "$rate" "$layout" "$T" "$ms" "$sent" "$peak" "$planned"
      echo "$rate $layout $T $ms $planned" >> "$OUT/rows"
    done
  done
done
# per rate: the shortest length from which cp2 is faster than sp2 at every length measured
[[ -f "$OUT/rows" ]] && python3 - "$OUT/rows" <<'EOF'
import sys
rows = [l.split() for l in open(sys.argv[1])]
for rate in dict.fromkeys(r[0] for r in rows):
    def ms(layout, col):
        return {int(r[2]): float(r[col]) for r in rows if r[0] == rate and r[1] == layout and r[col] != "-"}
    for col, what in ((3, "measured"), (4, "planned")):
        sp, cp = ms("sp2", col), ms("cp2", col)
        both = sorted(set(sp) & set(cp))
        cross = next((T for i, T in enumerate(both) if all(cp[t] < sp[t] for t in both[i:])), None)
        print(f"{rate:8s} {what:9s} cp2 beats sp2 from seq_len "
              f"{cross if cross else 'never (up to %s)' % (both[-1] if both else '-')}")
EOF
