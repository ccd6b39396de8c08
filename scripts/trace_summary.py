#!/usr/bin/env python3
"""Reads the Chrome traces that train_gpt writes with log.trace (one file per rank) and
prints, per rank, how much of the step time the compute thread spent waiting on
communication (the exposed communication), and optionally draws the timeline as SVG.

    scripts/trace_summary.py out/trace.rank0.json out/trace.rank1.json
    scripts/trace_summary.py --skip 2 --svg docs/img/fsdp_trace.svg --window 1 out/trace.rank*.json

Steps are delimited by the "optimizer" events on the compute track; the first --skip
steps (warm-up) are left out. No dependencies beyond the standard library.
"""
import argparse
import json
import sys

TRACKS = {0: "compute", 1: "comm", 2: "wait"}
COLORS = {0: "#4c78a8", 1: "#f58518", 2: "#e45756"}


def load(path):
    with open(path) as f:
        t = json.load(f)
    ev = [e for e in t["traceEvents"] if e.get("ph") == "X"]
    ev.sort(key=lambda e: e["ts"])
    return ev


def steps_of(ev):
    """(start, end) of each step: from the end of one optimizer event to the end of the next."""
    ends = [e["ts"] + e["dur"] for e in ev if e["tid"] == 0 and e["name"] == "optimizer"]
    first = min(e["ts"] for e in ev) if ev else 0
    return list(zip([first] + ends[:-1], ends))


def overlap(a0, a1, b0, b1):
    return max(0, min(a1, b1) - max(a0, b0))


def summarize(path, skip):
    ev = load(path)
    steps = steps_of(ev)[skip:]
    if not steps:
        sys.exit(f"{path}: fewer than {skip + 1} steps in the trace")
    total = sum(b - a for a, b in steps)
    wait = sum(overlap(e["ts"], e["ts"] + e["dur"], a, b) for e in ev if e["tid"] == 2 for a, b in steps)
    comm = sum(overlap(e["ts"], e["ts"] + e["dur"], a, b) for e in ev if e["tid"] == 1 for a, b in steps)
    nbytes = sum(e.get("args", {}).get("bytes", 0) for e in ev if e["tid"] == 1 and any(a <= e["ts"] < b for a, b in steps))
    return {"steps": len(steps), "step_ms": total / len(steps) / 1e3, "wait_ms": wait / len(steps) / 1e3,
            "comm_ms": comm / len(steps) / 1e3, "exposed": wait / total, "bytes": nbytes / len(steps)}, ev, steps


def svg(ranks, path, width=1400):
    """One step of every rank: a row per (rank, track)."""
    rows = []
    t0 = min(s[0] for _, _, s in ranks)
    t1 = max(s[1] for _, _, s in ranks)
    scale = (width - 160) / max(1, t1 - t0)
    h, y = 18, 30
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{40 + len(ranks) * 3 * (h + 4) + 30}" '
           'font-family="sans-serif" font-size="11">',
           f'<text x="10" y="18" font-size="13">one training step, {(t1 - t0) / 1e3:.1f} ms '
           '(blue: compute, orange: collectives in flight, red: compute thread waiting)</text>']
    for r, ev, (a, b) in ranks:
        for tid in (0, 1, 2):
            out.append(f'<text x="10" y="{y + 13}">rank {r} {TRACKS[tid]}</text>')
            for e in ev:
                if e["tid"] != tid or e["ts"] + e["dur"] < t0 or e["ts"] > t1:
                    continue
                x = 150 + (max(e["ts"], t0) - t0) * scale
                w = max(1.0, (min(e["ts"] + e["dur"], t1) - max(e["ts"], t0)) * scale)
                title = f'{e["name"]} {e["dur"] / 1e3:.2f} ms' + (f', {e["args"]["bytes"]} bytes' if "args" in e else "")
                out.append(f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{h}" fill="{COLORS[tid]}" '
                           f'stroke="white" stroke-width="0.5"><title>{title}</title></rect>')
                if w > 60:
                    out.append(f'<text x="{x + 2:.1f}" y="{y + 13}" fill="white">{e["name"][:int(w / 6)]}</text>')
            y += h + 4
        y += 8
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("traces", nargs="+")
    ap.add_argument("--skip", type=int, default=2, help="warm-up steps to leave out")
    ap.add_argument("--svg", help="draw one step of every rank into this SVG file")
    ap.add_argument("--window", type=int, default=0, help="which step (after --skip) to draw")
    args = ap.parse_args()
    print(f"{'trace':40s} {'steps':>5s} {'step ms':>8s} {'comm ms':>8s} {'wait ms':>8s} {'exposed':>8s} {'MiB/step':>9s}")
    drawn = []
    for r, p in enumerate(args.traces):
        s, ev, steps = summarize(p, args.skip)
        print(f"{p:40s} {s['steps']:5d} {s['step_ms']:8.1f} {s['comm_ms']:8.1f} {s['wait_ms']:8.1f} "
              f"{100 * s['exposed']:7.1f}% {s['bytes'] / 2**20:9.2f}")
        drawn.append((r, ev, steps[min(args.window, len(steps) - 1)]))
    if args.svg:
        svg(drawn, args.svg)
        print(f"timeline: {args.svg}")


if __name__ == "__main__":
    main()
