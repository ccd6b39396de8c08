#!/usr/bin/env python3
"""bench/bench_planner.py: the planner's predicted step time against measured runs on the
simulated cluster (scripts/cluster.sh: 2 hosts x 2 ranks, TCP between the hosts; needs root).

    bench/bench_planner.py                          # rates none and 100mbit, every layout
    bench/bench_planner.py --rates 100mbit --layouts hsdp2x2,dp4 --steps 5
    bench/bench_planner.py --keep out/planner       # also keep the cluster files and the rows
    bench/bench_planner.py --from out/planner       # predict those runs again (the model changed),
                                                    # measuring nothing: no root, seconds
    bench/bench_planner.py --dtype bfloat16         # mixed precision: calibrated, planned, trained in bf16
    bench/bench_planner.py --rates none --rounds 3  # each layout 3 times, interleaved; how the rounds agree

For each rate: `train_gpt --plan --plan.calibrate` measures the cluster (the matrix
products at the model's shapes, memory, both link classes) into a cluster file; every
layout is planned against it (`--plan --cluster FILE --json`) and trained for --steps
steps (the median ms of the steps after the first two); `--plan --plan.search` recommends
a plan for the same batch, which is trained too (unless it is one of the layouts: then
that row is the pick's measurement). Prints one row per layout (predicted,
measured, error), then per rate and over both: the largest error, the Spearman correlation
of the two rankings, and the recommended plan's measured time against the fastest measured.
Config S (bench/bench_dist.sh), 8 sequences per step, 4 ranks x 1 thread. Needs the
fortunes shards (scripts/train_fortunes.sh prepares data/fortunes). Exits 1 when a bound
given with --max-error, --min-spearman or --max-pick-loss is not met.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.environ.get("NDT_BUILD_DIR", os.path.join(ROOT, "build"))
CLUSTER = os.path.join(ROOT, "scripts", "cluster.sh")
S = ("--model.n_layer 4 --model.n_head 4 --model.n_embd 256 --model.vocab_size 512 "
     "--model.block_size 128 --train.seq_len 128").split()
BATCH = 8  # sequences per step

# name: (dp_replicate, dp_shard, cp, tp); ranks sit on the hosts in order (ppr:2:node)
LAYOUTS = {
    "fsdp4": (1, 4, 1, 1), "hsdp2x2": (2, 2, 1, 1), "dp4": (4, 1, 1, 1),
    "dp2_tp2": (2, 1, 1, 2), "fsdp2_tp2": (1, 2, 1, 2), "dp2_cp2": (2, 1, 2, 1),
    "fsdp2_cp2": (1, 2, 2, 1), "cp2_tp2": (1, 1, 2, 2), "tp4": (1, 1, 1, 4), "cp4": (1, 1, 4, 1),
}


def sh(cmd, **kw):
    return subprocess.run(cmd, check=True, text=True, capture_output=True, **kw).stdout


def layout_args(r, s, cp, tp, micro=None, accum=1, ac="none", pp=1, schedule="1f1b", virtual=1, sp=1):
    dp = r * s
    micro = micro or BATCH // dp
    stages = ["--parallel.pp_size", str(pp), "--parallel.pp_schedule", schedule,
              "--parallel.pp_virtual", str(virtual)] if pp > 1 else []
    return stages + ["--parallel.dp_replicate_size", str(r), "--parallel.dp_shard_size", str(s),
                     "--parallel.cp_size", str(cp), "--parallel.sp_size", str(sp), "--parallel.tp_size", str(tp),
                     "--train.micro_batch_size", str(micro), "--train.grad_accum_steps", str(accum),
                     "--train.activation_checkpointing", ac]


def layout_name(L):
    """'2x1x2x1' (replicate x shard x cp x tp), 'pp2 1f1b 1x2x1x1' with a pipeline, ' sp2' with Ulysses"""
    sizes = f"{L['dp_replicate']}x{L['dp_shard']}x{L['cp']}x{L['tp']}" + (f" sp{L['sp']}" if L.get("sp", 1) > 1 else "")
    return f"pp{L['pp']} {L['pp_schedule']} {sizes}" if L.get("pp", 1) > 1 else sizes


def spearman(a, b):
    def ranks(x):
        order = sorted(range(len(x)), key=lambda i: x[i])
        r = [0.0] * len(x)
        for pos, i in enumerate(order):
            r[i] = float(pos)
        return r
    ra, rb = ranks(a), ranks(b)
    n = len(a)
    if n < 2:
        return 1.0
    d2 = sum((x - y) ** 2 for x, y in zip(ra, rb))
    return 1 - 6 * d2 / (n * (n * n - 1))


def summarize(rows, label):
    rho = spearman([r["predicted_ms"] for r in rows], [r["measured_ms"] for r in rows])
    worst = max(abs(r["error"]) for r in rows)
    within = sum(abs(r["error"]) <= 0.25 for r in rows)
    mean = statistics.mean(abs(r["error"]) for r in rows)
    print(f"{label:8s} {len(rows)} runs: {within} within 25%, mean abs error {100 * mean:.0f}%, "
          f"largest {100 * worst:.0f}%, Spearman {rho:.2f}")


def again(a):
    """The runs kept by --keep, predicted by this train_gpt against their cluster files."""
    rows = json.load(open(os.path.join(a.from_dir, "rows.json")))
    base = [os.path.join(BUILD, "train_gpt"), "--config", os.path.join(ROOT, "configs/fortunes_char.ini"),
            "--out", "", "--log.tensorboard", "", *S,
            "--train.threads", "1", "--train.dtype", rows[0].get("dtype", "float32")]
    for rate in dict.fromkeys(r["rate"] for r in rows):
        cal = os.path.join(a.from_dir, f"cluster_{rate}.ini")
        here = [r for r in rows if r["rate"] == rate]
        for r in here:
            out = json.loads(sh(base + r["args"] + ["--plan", "--cluster", cal, "--json"]))
            old = r["predicted_ms"]
            r["predicted_ms"] = out["time"]["step_s"] * 1e3
            r["error"] = r["predicted_ms"] / r["measured_ms"] - 1
            print(f"{rate:8s} {r['layout']:12s} predicted {r['predicted_ms']:8.0f} ms (was {old:6.0f})  "
                  f"measured {r['measured_ms']:8.0f} ms (spread {100 * r['spread']:3.0f}%)  "
                  f"error {100 * r['error']:+5.0f}%")
        search = json.loads(sh(base + ["--plan", "--plan.search", "--cluster", cal, "--plan.batch", str(BATCH),
                                       "--json"]))
        L = search["plans"][0]["layout"]
        kept = here[0].get("pick", {})
        print(f"{rate:8s} the search now picks {layout_name(L)} "
              f"B{search['plans'][0]['micro_batch_size']}x{search['plans'][0]['grad_accum_steps']} "
              f"{search['plans'][0]['activation_checkpointing']} (kept run: {kept.get('name', '?')}, "
              f"{kept.get('measured_ms', 0):.0f} ms)")
        summarize(here, rate)
    summarize(rows, "all")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rates", default="none,100mbit")
    ap.add_argument("--layouts", default=",".join(LAYOUTS))
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=1,
                    help="run every layout this many times, round by round; measured: the median over all")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="train.dtype of every run")
    ap.add_argument("--max-error", type=float, default=None, help="fail when a prediction is off by more (0.25: 25%%)")
    ap.add_argument("--min-spearman", type=float, default=None)
    ap.add_argument("--max-pick-loss", type=float, default=None,
                    help="fail when the recommended plan is slower than the fastest measured by more (0.1: 10%%)")
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--keep", help="keep the cluster files and the rows (rows.json) in this folder")
    ap.add_argument("--from", dest="from_dir", help="predict the runs kept in this folder again; measure nothing")
    a = ap.parse_args()
    if a.from_dir:
        return again(a)
    if not os.path.isfile(os.path.join(ROOT, "data/fortunes/vocab.json")):
        sys.exit("run scripts/train_fortunes.sh once first (it prepares data/fortunes)")
    env = dict(os.environ, NDT_CLUSTER=os.environ.get("NDT_CLUSTER", "plan"), NDT_CLUSTER_OWNER=str(os.getpid()),
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    tmp = a.keep or tempfile.mkdtemp(prefix="ndt_bench_planner_")
    os.makedirs(tmp, exist_ok=True)
    train_gpt = os.path.join(BUILD, "train_gpt")
    base = [train_gpt, "--config", os.path.join(ROOT, "configs/fortunes_char.ini"), "--out", "", "--log.tensorboard", "",
            *S, "--train.threads", "1",
            "--train.dtype", a.dtype, "--parallel.timeout_s", "120"]
    run_args = ["--train.steps", str(a.steps), "--train.eval_every", "0", "--data.val", "", "--sample.every", "-1",
                "--log.every", "1", "--log.report", "", "--data.shuffle", "false", "--optim.warmup_steps", "1",
                "--checkpoint.dir", ""]
    mpirun = [CLUSTER, "mpirun", "-np", "4", "--map-by", "ppr:2:node"]
    subprocess.run([CLUSTER, "down"], env=env, capture_output=True)
    sh([CLUSTER, "up", "2"], env=env)
    rows, failed = [], []
    try:
        for rate in a.rates.split(","):
            sh([CLUSTER, "rate", "h1", rate], env=env)
            cal = os.path.join(tmp, f"cluster_{rate}.ini")
            sh(mpirun + base + ["--train.micro_batch_size", "2", "--plan", "--plan.calibrate", cal], env=env)

            def predict(args):
                return json.loads(sh(base + args + ["--plan", "--cluster", cal, "--json"]))["time"]["step_s"] * 1e3

            def steps_ms(args, name, rnd):  # the timed steps of one run (after the first two)
                metrics = os.path.join(tmp, f"{rate}_{name}" + (f"_round{rnd}" if a.rounds > 1 else "") + ".jsonl")
                sh(mpirun + base + run_args + args + ["--log.metrics", metrics], env=env)
                return [j["ms"] for j in map(json.loads, open(metrics)) if "loss" in j and "ms" in j][2:]

            search = json.loads(sh(base + ["--plan", "--plan.search", "--cluster", cal, "--plan.batch", str(BATCH),
                                           "--json"]))
            best = search["plans"][0]
            L = best["layout"]
            pick = layout_args(L["dp_replicate"], L["dp_shard"], L["cp"], L["tp"], best["micro_batch_size"],
                               best["grad_accum_steps"], best["activation_checkpointing"], L.get("pp", 1),
                               L.get("pp_schedule") or "1f1b", L.get("pp_virtual", 1), L.get("sp", 1))
            pick_name = (f"pick {layout_name(L)} "
                         f"B{best['micro_batch_size']}x{best['grad_accum_steps']} {best['activation_checkpointing']}")
            # every run once per round, the rounds one after the other: a slow minute of the
            # machine then costs each layout a round, not one layout all of its steps
            names = a.layouts.split(",")
            runs = {name: layout_args(*LAYOUTS[name]) for name in names}
            # a pick that is one of the layouts (same sizes, micro-batch, accumulation and
            # checkpointing) is that row's runs: the same configuration measured twice would
            # only compare one noisy median with another
            pick_row = next((name for name in names if runs[name] == pick), None)
            if pick_row is None:
                runs["pick"] = pick
            timed = {name: [] for name in runs}  # per round, the steps' ms
            for rnd in range(a.rounds):
                for name, args in runs.items():
                    timed[name].append(steps_ms(args, name, rnd))

            def measured(name):  # the median over every timed step; spread: of the steps, or of the rounds
                ms = [x for r in timed[name] for x in r]
                med = statistics.median(ms)
                per = [statistics.median(r) for r in timed[name]] if a.rounds > 1 else ms
                return med, (max(per) - min(per)) / med

            here = []
            for name in names:
                args = runs[name]
                p = predict(args)
                m, spread = measured(name)
                here.append({"rate": rate, "dtype": a.dtype, "layout": name, "predicted_ms": p, "measured_ms": m, "spread": spread,
                             "error": p / m - 1, "args": args,
                             "rounds_ms": [statistics.median(r) for r in timed[name]]})
                print(f"{rate:8s} {name:12s} predicted {p:8.0f} ms  measured {m:8.0f} ms (spread {100 * spread:3.0f}%)"
                      f"  error {100 * (p / m - 1):+5.0f}%", flush=True)
            if a.rounds > 1:  # how well the measurement agrees with itself: round against round
                rhos = [spearman([r["rounds_ms"][i] for r in here], [r["rounds_ms"][j] for r in here])
                        for i in range(a.rounds) for j in range(i + 1, a.rounds)]
                print(f"{rate:8s} the rounds' own rankings agree with each other at Spearman "
                      f"{statistics.mean(rhos):.2f} on average ({min(rhos):.2f} to {max(rhos):.2f})")
            pm, _ = measured(pick_row or "pick")
            fastest = min(here, key=lambda r: r["measured_ms"])
            loss = pm / fastest["measured_ms"] - 1
            if pick_row:
                pick_name += f" (= {pick_row})"
            print(f"{rate:8s} {pick_name}: predicted {best['step_s'] * 1e3:.0f} ms, measured {pm:.0f} ms; "
                  f"fastest measured {fastest['layout']} {fastest['measured_ms']:.0f} ms ({100 * loss:+.0f}%)")
            rho = spearman([r["predicted_ms"] for r in here], [r["measured_ms"] for r in here])
            worst = max(abs(r["error"]) for r in here)
            print(f"{rate:8s} largest error {100 * worst:.0f}%, Spearman {rho:.2f}")
            for r in here:
                r["pick_loss"] = loss
                r["pick"] = {"name": pick_name, "args": pick, "measured_ms": pm}
            rows += here
            if a.max_error is not None and worst > a.max_error:
                failed.append(f"{rate}: a prediction is off by {100 * worst:.0f}% (bound {100 * a.max_error:.0f}%)")
            if a.max_pick_loss is not None and loss > a.max_pick_loss:
                failed.append(f"{rate}: the recommended plan is {100 * loss:.0f}% slower than the fastest measured")
        rho = spearman([r["predicted_ms"] for r in rows], [r["measured_ms"] for r in rows])
        summarize(rows, "all")
        if a.min_spearman is not None and rho < a.min_spearman:
            failed.append(f"Spearman {rho:.2f} < {a.min_spearman}")
        if a.json:
            json.dump(rows, open(a.json, "w"), indent=1)
        if a.keep:
            json.dump(rows, open(os.path.join(tmp, "rows.json"), "w"), indent=1)
    except subprocess.CalledProcessError as e:
        print(f"failed: {' '.join(e.cmd)}\n{e.stdout}\n{e.stderr}", file=sys.stderr)
        failed.append("a command failed")
    finally:
        subprocess.run([CLUSTER, "down"], env=env, capture_output=True)
    for f in failed:
        print("FAILED:", f, file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
