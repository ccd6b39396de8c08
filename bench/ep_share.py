#!/usr/bin/env python3
"""bench/ep_share.py: the expert-parallel all-to-alls' share of a training step on CPU ranks.

Runs train_gpt under mpirun on a Qwen3-MoE-shaped model (bench_gpt_train's config MS: 4 layers,
C 256, 8 heads reading 4 kv heads, q/k norms, every MLP 16 SwiGLU experts of 128 hidden units,
top 4) on the fortunes text, in each layout asked for, with a Chrome trace of every rank
(log.trace), and reads the traces: per rank, from the end of the first step's optimizer (the
first step warms up) to the end of the last, the step time, and the time the rank spent blocked
on the expert-parallel group's collectives (the trace's "wait" track: `wait ep.*`, the
all-to-all-v exchanges and the counts' all-gather) and on every other group's. The share is
that blocked time over the step time, the mean over ranks; the bytes a step are train_gpt's
own counter (rank 0's). Also the machine's load beside the run (bench/idle.py's meter).

    python3 bench/ep_share.py                          # ep2 x dp2 and fsdp2 alone, B 4 a rank
    python3 bench/ep_share.py --layouts ep2_dp2,dp2 --steps 5 --batch 2

Needs data/fortunes (scripts/train_fortunes.sh prepares it) and a build (NDT_BUILD_DIR, default
build/).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from idle import OthersMeter  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = ("--model.arch llama --model.n_layer 4 --model.n_head 8 --model.n_kv_head 4 --model.n_embd 256 "
         "--model.qk_norm true --model.head_dim 32 --model.intermediate_size 512 --model.rope_theta 10000 "
         "--model.n_experts 16 --model.n_experts_per_tok 4 --model.moe_intermediate_size 128 "
         "--model.norm_topk_prob true --model.block_size 256")
LAYOUTS = {  # name: (ranks, parallel arguments)
    "ep2_dp2": (2, "--parallel.dp_replicate_size 2 --parallel.ep_size 2"),
    "dp2": (2, "--parallel.dp_replicate_size 2"),
    "ep2_fsdp2": (2, "--parallel.dp_shard_size 2 --parallel.ep_size 2"),
    "fsdp2": (2, "--parallel.dp_shard_size 2"),
}


def blocked(path):
    """(step seconds, seconds blocked on ep, on the rest) of one rank's trace, after step 1."""
    with open(path) as f:
        events = json.load(f)
    events = events["traceEvents"] if isinstance(events, dict) else events
    ends = sorted(e["ts"] + e["dur"] for e in events if e.get("name") == "optimizer" and "dur" in e)
    if len(ends) < 2:
        raise SystemExit(f"{path}: fewer than 2 steps traced")
    t0, t1 = ends[0], ends[-1]
    ep = other = 0.0
    for e in events:
        name = e.get("name", "")
        if not name.startswith("wait ") or "dur" not in e or e["ts"] < t0 or e["ts"] >= t1:
            continue
        if name.startswith("wait ep."):
            ep += e["dur"]
        else:
            other += e["dur"]
    steps = len(ends) - 1
    return (t1 - t0) / 1e6 / steps, ep / 1e6 / steps, other / 1e6 / steps


def run(name, args, out):
    ranks, parallel = LAYOUTS[name]
    build = os.environ.get("NDT_BUILD_DIR", os.path.join(ROOT, "build"))
    d = tempfile.mkdtemp(prefix=name + "_", dir=out)  # a layout may be asked for twice
    mpirun = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(ranks)]
    if os.geteuid() == 0:
        mpirun.append("--allow-run-as-root")
    cmd = (mpirun + [os.path.join(build, "train_gpt"), "--config", os.path.join(ROOT, "configs/fortunes_char.ini")]
           + MODEL.split() + parallel.split()
           + ["--train.seq_len", "256", "--train.micro_batch_size", str(args.batch), "--train.grad_accum_steps",
              "1", "--train.steps", str(args.steps), "--train.threads", str(args.threads), "--out", d,
              "--log.trace", os.path.join(d, "trace.json"), "--log.metrics", os.path.join(d, "metrics.jsonl"),
              "--sample.every", "-1", "--checkpoint.format", "full", "--checkpoint.dir", os.path.join(d, "ck")])
    env = dict(os.environ, OMPI_MCA_btl_vader_single_copy_mechanism="none")
    with OthersMeter() as meter:
        r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{name}: train_gpt failed:\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    per_rank = [blocked(os.path.join(d, f"trace.rank{k}.json")) for k in range(ranks)]
    with open(os.path.join(d, "metrics.jsonl")) as f:
        comm = [json.loads(line)["comm_bytes"] for line in f if "comm_bytes" in line]
    step = sum(p[0] for p in per_rank) / ranks
    ep = sum(p[1] for p in per_rank) / ranks
    other = sum(p[2] for p in per_rank) / ranks
    return step, ep, other, comm[-1], meter.cores


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layouts", default="ep2_dp2,dp2,ep2_fsdp2,fsdp2")
    ap.add_argument("--steps", type=int, default=4, help="steps a run; the first warms up")
    ap.add_argument("--batch", type=int, default=4, help="sequences of 256 characters a rank")
    ap.add_argument("--threads", type=int, default=1, help="threads a rank")
    args = ap.parse_args()
    if not os.path.exists(os.path.join(ROOT, "data/fortunes/vocab.json")):
        raise SystemExit("run scripts/train_fortunes.sh once first (it prepares data/fortunes)")
    print(f"| layout | ms/step | blocked on ep | ep share | blocked on the rest | bytes a step (rank 0) | others (cores) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as out:
        for name in args.layouts.split(","):
            if name not in LAYOUTS:
                raise SystemExit(f"--layouts: unknown layout {name}; known: {', '.join(LAYOUTS)}")
            step, ep, other, comm, cores = run(name, args, out)
            print(f"| {name} | {step * 1e3:.0f} | {ep * 1e3:.1f} ms | {100 * ep / step:.1f}% | "
                  f"{other * 1e3:.1f} ms | {comm / 2**20:.2f} MiB | {cores:.2f} |", flush=True)


if __name__ == "__main__":
    main()
