#!/usr/bin/env python3
"""The bubble of a pipeline, measured from the Chrome traces train_gpt writes with
log.trace (one file per rank), against the papers' formula; bench/bench_pipeline.sh runs it.

    scripts/pipeline_bubble.py --skip 2 out/bench_pipeline/p2_m8_gpipe out/bench_pipeline/p2_m8_1f1b
    scripts/pipeline_bubble.py --svg out/pp_1f1b.svg --window 1 out/bench_pipeline/p2_m4_1f1b

Each RUN folder holds one run's trace.rank*.json (all its ranks); optionally train.log
(train_gpt's output: the schedule's name comes from its "pipeline:" line, else the folder's
name) and metrics.jsonl (log.metrics: rank 0's peak memory). P is the number of trace
files, M the micro-batches and V the chunks per rank seen in the F/B/W events.

Per run, over the steps after --skip (steps end at each "optimizer" event, as in
scripts/trace_summary.py), summed over the ranks:
  busy          the time inside the pipeline's actions (events F3, B3, W3, F3.1 on the
                compute track)
  bubble        1 - busy / (P x step time): the share of the ranks' time not in an action
                (the optimizer, the gradient-norm all-reduce and the data step count as idle)
  idle/compute  (P x step time - busy) / busy
  pipe i/c      the same over the pipeline alone: from the first action of the step on any
                rank to the last one's end (ranks lined up by the traces' clock origin)
  replay        pipe i/c of the step replayed: every rank's actions in their measured order
                with their measured durations, each started as soon as its input exists,
                messages taking no time. pipe i/c - replay is what the messages and the
                work between actions cost; replay - formula what unequal action times cost
  formula       (P - 1) / (V x M): GPipe and 1F1B's (V = 1) and interleaved 1F1B's; zero bubble
                (W actions): (P - 1)(F + B - W) / (M (F + B + W)) with the measured mean
                durations (the paper's H1 bubble); for
                every action of a kind costing the same on every stage
The peak memory is rank 0's (train_gpt writes metrics on rank 0 only): the largest
mem_peak of the measured steps. Runs of the same schedule, P, M and V (rounds of one
benchmark) make one row: the median of each figure, and the range of idle/compute. No
dependencies beyond the standard library.
"""
import argparse
import glob
import json
import os
import re
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from trace_summary import action_of, load, overlap, steps_of, svg_pipeline  # noqa: E402


def rank_of(path):
    m = re.search(r"\.rank(\d+)\.json$", path)
    return int(m.group(1)) if m else 0


def traces_of(run):
    paths = sorted(glob.glob(os.path.join(run, "*.rank*.json")), key=rank_of)
    if not paths:
        sys.exit(f"{run}: no trace.rank*.json files (train_gpt --log.trace {run}/trace.json)")
    return [(rank_of(p), load(p)) for p in paths]


def schedule_name(run):
    """train_gpt's "pipeline: 2 stages, ..., schedule 1f1b over 8 micro-batches", else the folder."""
    try:
        with open(os.path.join(run, "train.log")) as f:
            for line in f:
                m = re.match(r"pipeline: .*, schedule (\S+) over", line)
                if m:
                    return m.group(1)
    except OSError:
        pass
    return os.path.basename(os.path.normpath(run))


def peak_mib(run, skip):
    """Rank 0's largest mem_peak over the measured steps, or None without metrics."""
    try:
        with open(os.path.join(run, "metrics.jsonl")) as f:
            rows = [j for j in map(json.loads, f) if "mem_peak" in j]
    except OSError:
        return None
    rows = rows[skip:]
    return max(j["mem_peak"] for j in rows) / 2**20 if rows else None


def replay(orders, P, V):
    """The span of one step replayed: each rank runs its actions in the measured order and
    with their measured durations, each as soon as its input is there, messages taking no
    time. orders[i]: rank i's [(op, micro, chunk, duration)]; rank i's chunk c is stage
    c * P + i. F(j) of stage s needs F(j) of s - 1, B(j) of s needs B(j) of s + 1 (of the
    last stage: its own F(j)), W(j) its B(j). None when the orders cannot all run."""
    S = P * V
    done, t, at = {}, [0.0] * P, [0] * P
    while any(at[i] < len(orders[i]) for i in range(P)):
        moved = False
        for i in range(P):
            while at[i] < len(orders[i]):
                op, j, c, dur = orders[i][at[i]]
                s = c * P + i
                need = {"F": ("F", j, s - 1) if s > 0 else None,
                        "B": ("B", j, s + 1) if s < S - 1 else ("F", j, s), "W": ("B", j, s)}[op]
                if need is not None and need not in done:
                    break
                t[i] = max(t[i], done[need] if need else 0.0) + dur
                done[(op, j, s)] = t[i]
                at[i] += 1
                moved = True
        if not moved:
            return None
    return max(t)


def measure(ranks, skip):
    """ranks: [(rank, events)] of one run -> the figures of the module docstring (per step)."""
    steps = [steps_of(ev)[skip:] for _, ev in ranks]
    n = min(len(s) for s in steps)
    if n == 0:
        sys.exit(f"fewer than {skip + 1} steps in the traces")
    P = len(ranks)
    micro, chunks = set(), set()
    busy = total = pipe = 0.0
    per_rank = [0.0] * P
    orders = []  # per step, per rank: [(op, micro, chunk, duration)]
    for k in range(n):
        first, last = None, None
        orders.append([[] for _ in range(P)])
        for i, (_, ev) in enumerate(ranks):
            a, b = steps[i][k]
            total += b - a
            for e in ev:
                act = action_of(e["name"]) if e["tid"] == 0 else None
                if not act:
                    continue
                t = overlap(e["ts"], e["ts"] + e["dur"], a, b)
                if t <= 0:
                    continue
                busy += t
                per_rank[i] += t
                orders[k][i].append((*act, e["dur"]))
                micro.add(act[1])
                chunks.add(act[2])
                first = e["ts"] if first is None else min(first, e["ts"])
                last = e["ts"] + e["dur"] if last is None else max(last, e["ts"] + e["dur"])
        if first is not None:
            pipe += P * (last - first)
    if busy == 0:
        sys.exit("no pipeline actions (F3, B3, F3.1, ...) on the compute track: was pp_size > 1?")
    M, V = len(micro), max(chunks) + 1
    spans = [replay(o, P, V) for o in orders]
    replayed = None if None in spans else (P * sum(spans) - busy) / busy
    # the formula: (P-1)/(V M), or with weight passes (zero bubble H1, Qi et al. 2023) each rank
    # idles (P-1)(F + B - W) of its M (F + B + W), from the actions' mean durations
    mean = {}
    for o in orders:
        for acts in o:
            for op, _, _, d in acts:
                mean.setdefault(op, []).append(d)
    mean = {op: sum(d) / len(d) for op, d in mean.items()}
    if "W" in mean:
        f, b, w = mean["F"], mean["B"], mean["W"]
        formula = (P - 1) * max(f + b - w, 0.0) / (M * (f + b + w))
    else:
        formula = (P - 1) / (V * M)
    return {"P": P, "M": M, "V": V, "steps": n, "step_ms": total / P / n / 1e3,
            "busy_ms": [t / n / 1e3 for t in per_rank], "bubble": 1 - busy / total,
            "idle_compute": (total - busy) / busy, "pipe_idle_compute": (pipe - busy) / busy,
            "replay_idle_compute": replayed, "formula": formula}


def row(runs):
    """The runs of one schedule, P, M, V -> one row: medians, and idle/compute's range."""
    med = lambda k: statistics.median(r[k] for r in runs)  # noqa: E731
    peaks = [r["peak_mib"] for r in runs if r["peak_mib"] is not None]
    out = {k: runs[0][k] for k in ("schedule", "P", "M", "V", "formula")}
    out.update({k: med(k) for k in ("step_ms", "bubble", "idle_compute", "pipe_idle_compute")})
    replays = [r["replay_idle_compute"] for r in runs if r["replay_idle_compute"] is not None]
    out["replay_idle_compute"] = statistics.median(replays) if replays else None
    out["busy_ms"] = [statistics.median(r["busy_ms"][i] for r in runs) for i in range(runs[0]["P"])]
    out["peak_mib"] = statistics.median(peaks) if peaks else None
    out["runs"] = len(runs)
    out["idle_compute_range"] = [min(r["idle_compute"] for r in runs), max(r["idle_compute"] for r in runs)]
    return out


def draw(run, ranks, m, skip, window, path):
    """One step of a run (window: its index after skip; -1: the fastest) into an SVG."""
    steps = [steps_of(ev)[skip:] for _, ev in ranks]
    n = min(len(s) for s in steps)
    if window < 0:  # the fastest step: the one least disturbed by other work on the machine
        window = min(range(n), key=lambda k: max(s[k][1] for s in steps) - min(s[k][0] for s in steps))
    window = min(window, n - 1)
    drawn = [(r, ev, s[window]) for (r, ev), s in zip(ranks, steps)]
    title = f"{m['schedule']}, {m['P']} stages, {m['M']} micro-batches" + (
        f", {m['V']} chunks per rank" if m["V"] > 1 else "") + ": one training step"
    svg_pipeline(drawn, path, title)
    print(f"timeline: {path} (step {skip + window + 1} of {run})")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="folders, one per run, with trace.rank*.json")
    ap.add_argument("--skip", type=int, default=2, help="warm-up steps to leave out")
    ap.add_argument("--svg", help="draw one step of the (single) run into this SVG file")
    ap.add_argument("--window", type=int, default=0, help="which step (after --skip) to draw; -1: the fastest")
    ap.add_argument("--json", help="also write the rows to this file")
    args = ap.parse_args()
    if args.svg and len(args.runs) != 1:
        sys.exit("--svg draws one run: give one folder")
    groups = {}
    for run in args.runs:
        ranks = traces_of(run)
        m = measure(ranks, args.skip)
        m["schedule"] = schedule_name(run)
        m["peak_mib"] = peak_mib(run, args.skip)
        groups.setdefault((m["schedule"], m["P"], m["M"], m["V"]), []).append(m)
        if args.svg:
            draw(run, ranks, m, args.skip, args.window, args.svg)
    rows = [row(g) for g in groups.values()]
    print(f"{'schedule':<12} {'P':>2} {'M':>3} {'V':>2} {'runs':>4} {'step ms':>8} {'busy ms/rank':>19} "
          f"{'bubble':>7} {'idle/compute':>12} {'range':>12} {'pipe i/c':>9} {'replay':>7} {'formula':>8} "
          f"{'rank-0 peak MiB':>16}")
    for m in rows:
        busy = "/".join(f"{t:.0f}" for t in m["busy_ms"])
        lo, hi = m["idle_compute_range"]
        peak = "-" if m["peak_mib"] is None else f"{m['peak_mib']:.1f}"
        rep = "-" if m["replay_idle_compute"] is None else f"{m['replay_idle_compute']:.3f}"
        print(f"{m['schedule']:<12} {m['P']:>2} {m['M']:>3} {m['V']:>2} {m['runs']:>4} {m['step_ms']:>8.1f} "
              f"{busy:>19} {m['bubble']:>7.3f} {m['idle_compute']:>12.3f} {f'{lo:.3f}-{hi:.3f}':>12} "
              f"{m['pipe_idle_compute']:>9.3f} {rep:>7} {m['formula']:>8.3f} {peak:>16}")
    print("busy: time inside F/B/W per rank and step; bubble = 1 - busy / (P x step); pipe i/c: idle/compute "
          "from the first action to the last; replay: the same with the measured actions and messages taking "
          "no time; formula (P-1)/(V M), zero bubble (P-1)(F+B-W)/(M(F+B+W)); peak memory: rank 0 only (metrics.jsonl)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
