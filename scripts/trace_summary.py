#!/usr/bin/env python3
"""Reads the Chrome traces that train_gpt writes with log.trace (one file per rank) and
prints, per rank, how much of the step time the compute thread spent waiting on
communication (the exposed communication), and optionally draws the timeline as SVG.

    scripts/trace_summary.py out/trace.rank0.json out/trace.rank1.json
    scripts/trace_summary.py --skip 2 --svg docs/img/fsdp_trace.svg --window 1 out/trace.rank*.json
    scripts/trace_summary.py --pipeline --svg out/pp.svg out/trace.rank*.json   # F/B boxes per rank

Steps are delimited by the "optimizer" events on the compute track; the first --skip
steps (warm-up) are left out. Times are shifted by each file's clock origin, so the ranks
of one host share a time axis. No dependencies beyond the standard library.
scripts/pipeline_bubble.py measures pipeline bubbles from the same files.
"""
import argparse
import json
import re
import sys

TRACKS = {0: "compute", 1: "comm", 2: "wait"}
COLORS = {0: "#4c78a8", 1: "#f58518", 2: "#e45756"}
# a pipeline action on the compute track: F3 (forward of micro-batch 3), B3, W3, F3.1 (chunk 1)
ACTION = re.compile(r"^([FBW])(\d+)(?:\.(\d+))?$")
# pipeline view: forward blue, backward orange, weight gradient green (chunk 1 and up darker);
# other compute (the optimizer) grey
ACTION_COLORS = {"F": ("#4c78a8", "#2b4f77"), "B": ("#f58518", "#b35c0c"), "W": ("#54a24b", "#36702f")}
OTHER_COLOR = "#bab0ac"


def action_of(name):
    """("F", micro, chunk) for a pipeline action's event name, else None."""
    m = ACTION.match(name)
    return (m.group(1), int(m.group(2)), int(m.group(3) or 0)) if m else None


def load(path):
    """The complete ("X") events of one rank's trace, by start time. train_gpt's traces carry
    otherData.clock_origin_us (the trace's start on the host's steady clock): it is added to
    every ts so that the ranks of one host line up; older traces without it start at 0."""
    with open(path) as f:
        t = json.load(f)
    origin = t.get("otherData", {}).get("clock_origin_us", 0)
    ev = [dict(e, ts=e["ts"] + origin) for e in t["traceEvents"] if e.get("ph") == "X"]
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


def svg_pipeline(ranks, path, title=None, width=1400):
    """One step of a pipeline: a row per rank with its forwards (F), backwards (B) and weight
    gradients (W) as boxes labelled by micro-batch (F3.1: micro-batch 3 on chunk 1); other
    compute (the optimizer) grey, idle time left white. ranks: (rank, events, (start, end))."""
    t0 = min(s[0] for _, _, s in ranks)
    t1 = max(s[1] for _, _, s in ranks)
    left, h, gap = 60, 24, 8
    scale = (width - left - 20) / max(1, t1 - t0)
    top = 52
    height = top + len(ranks) * (h + gap) + 34
    acts = [a for _, ev, _ in ranks for e in ev if e["tid"] == 0 and (a := action_of(e["name"]))]
    ops = [o for o in "FBW" if o in {a[0] for a in acts}]
    last_chunk = max((a[2] for a in acts), default=0)
    title = title or "one training step"
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           'font-family="sans-serif" font-size="11">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="10" y="18" font-size="13">{title}, {(t1 - t0) / 1e3:.1f} ms</text>']
    x = 10
    words = {"F": "forward", "B": "backward", "W": "weight gradient"}
    if last_chunk == 0:
        legend = [(ACTION_COLORS[o][0], words[o]) for o in ops]
    else:  # interleaved: chunk 0 light, the later chunks dark
        later = "chunk 1" if last_chunk == 1 else "chunks 1 and up"
        legend = [(ACTION_COLORS[o][k], f"{words[o]}, {'chunk 0' if k == 0 else later}") for o in ops for k in (0, 1)]
    legend += [(OTHER_COLOR, "other compute (optimizer)"), ("white", "idle (waiting for a neighbour)")]
    for color, what in legend:
        out.append(f'<rect x="{x}" y="28" width="12" height="12" fill="{color}" stroke="#888" stroke-width="0.5"/>')
        out.append(f'<text x="{x + 16}" y="38">{what}</text>')
        x += 24 + 6 * len(what)
    y = top
    for r, ev, _ in ranks:
        out.append(f'<text x="10" y="{y + h / 2 + 4:.0f}">rank {r}</text>')
        out.append(f'<rect x="{left}" y="{y}" width="{(t1 - t0) * scale:.1f}" height="{h}" fill="none" '
                   'stroke="#ddd" stroke-width="0.5"/>')
        mine = [e for e in ev if e["tid"] == 0 and e["ts"] < t1 and e["ts"] + e["dur"] > t0]
        # other compute first: the events nested inside an action (its blocks) lie under its box
        for e in sorted(mine, key=lambda e: action_of(e["name"]) is not None):
            act = action_of(e["name"])
            b, en = max(e["ts"], t0), min(e["ts"] + e["dur"], t1)
            bx, w = left + (b - t0) * scale, max(1.0, (en - b) * scale)
            color = ACTION_COLORS[act[0]][min(act[2], 1)] if act else OTHER_COLOR
            out.append(f'<rect x="{bx:.1f}" y="{y}" width="{w:.1f}" height="{h}" fill="{color}" stroke="white" '
                       f'stroke-width="0.5"><title>{e["name"]} {e["dur"] / 1e3:.2f} ms</title></rect>')
            if act and w >= 6.2 * len(e["name"]) + 2:
                out.append(f'<text x="{bx + w / 2:.1f}" y="{y + h / 2 + 4:.0f}" fill="white" '
                           f'text-anchor="middle">{e["name"]}</text>')
        y += h + gap
    # time axis: a tick every 1, 2, 5, 10, ... ms, about ten of them
    span_ms = (t1 - t0) / 1e3
    tick = next(t for t in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 1e9) if span_ms / t <= 12)
    out.append(f'<line x1="{left}" y1="{y}" x2="{left + (t1 - t0) * scale:.1f}" y2="{y}" stroke="#888"/>')
    k = 0
    while k * tick <= span_ms:
        tx = left + k * tick * 1e3 * scale
        out.append(f'<line x1="{tx:.1f}" y1="{y}" x2="{tx:.1f}" y2="{y + 4}" stroke="#888"/>')
        out.append(f'<text x="{tx:.1f}" y="{y + 16}" text-anchor="middle" fill="#555">{k * tick:g} ms</text>')
        k += 1
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("traces", nargs="+")
    ap.add_argument("--skip", type=int, default=2, help="warm-up steps to leave out")
    ap.add_argument("--svg", help="draw one step of every rank into this SVG file")
    ap.add_argument("--window", type=int, default=0, help="which step (after --skip) to draw")
    ap.add_argument("--pipeline", action="store_true",
                    help="draw a pipeline's step: one row per rank, its F/B/W actions labelled by micro-batch")
    ap.add_argument("--title", help="the SVG's title (with --pipeline)")
    args = ap.parse_args()
    print(f"{'trace':40s} {'steps':>5s} {'step ms':>8s} {'comm ms':>8s} {'wait ms':>8s} {'exposed':>8s} {'MiB/step':>9s}")
    drawn = []
    for r, p in enumerate(args.traces):
        s, ev, steps = summarize(p, args.skip)
        print(f"{p:40s} {s['steps']:5d} {s['step_ms']:8.1f} {s['comm_ms']:8.1f} {s['wait_ms']:8.1f} "
              f"{100 * s['exposed']:7.1f}% {s['bytes'] / 2**20:9.2f}")
        drawn.append((r, ev, steps[min(args.window, len(steps) - 1)]))
    if args.svg and args.pipeline:
        svg_pipeline(drawn, args.svg, args.title)
    elif args.svg:
        svg(drawn, args.svg)
        print(f"timeline: {args.svg}")


if __name__ == "__main__":
    main()
