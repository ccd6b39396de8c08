#!/usr/bin/env python3
"""The flight records of a failed job, compared: which ranks fell behind, and in which
collective the others wait.

    python3 scripts/flight_report.py out/ckpt/flight      # the rank_<k>.json that train_gpt wrote

train_gpt writes one file per rank that could still write when the job failed (a collective
past parallel.timeout_s, an error, a stop that could not finish). Each lists that rank's last
operations: the group (a communicator's name and which of its groups, e.g. "fsdp@1"), the
operation's sequence number in the group, the collective, its bytes, the step, and whether it
was queued, started, done or failed. Ranks of one group issue their operations in the same
order, so the same sequence number is the same collective on every member. The report says:
  - which ranks wrote no record (dead, stopped, cut off, or killed before they could);
  - per group, the operations some ranks wait in (started, not done) and how far each rank
    got; a rank whose last operation in the group is behind the others' fell behind;
  - a verdict: the rank that failed on its own (an error that is not a timeout), else the
    ranks that fell behind or wrote nothing, and when those are every rank of a host, that
    host (a dead node or a cut link look like this); when nobody fell behind but a group
    that spans hosts never completed, the network between them.
Exit code 0 when it could read at least one record, 1 otherwise.
"""
import glob
import json
import os
import sys


def load(directory):
    records = {}
    for path in sorted(glob.glob(os.path.join(directory, "rank_*.json"))):
        try:
            with open(path) as f:
                r = json.load(f)
            records[int(r["rank"])] = r
        except (OSError, ValueError, KeyError) as e:
            print(f"flight_report: skipping {path}: {e}", file=sys.stderr)
    return records


def ranks_str(ks):
    ks = sorted(ks)
    return ("ranks " if len(ks) > 1 else "rank ") + ", ".join(map(str, ks))


# Reasons a rank gives when it only waited for others (not the cause of the failure).
WAITED = ("has not completed after", "asked to stop by signal", "ended by a library call to exit()",
          "it failed on another rank", "the launcher (parent pid")


def report(records):
    lines = []
    world = max(r.get("world", 0) for r in records.values())
    hosts = next((r["hosts"] for r in records.values() if len(r.get("hosts", [])) == world), [])
    host = (lambda k: hosts[k]) if hosts else (lambda k: "?")
    missing = [k for k in range(world) if k not in records]
    lines.append(f"{len(records)} of {world} ranks wrote a record")
    for k in sorted(records):
        r = records[k]
        on = f" ({host(k)})" if hosts else ""
        lines.append(f"  rank {k}{on}: at step {r.get('step')}: {r.get('reason', '')}")
    if missing:
        lines.append("no record from " + ranks_str(missing) +
                     ": dead, stopped, cut off, or killed before it could write")
    # per group: how far each rank got, and the operations some ranks wait in
    groups = {}
    for k, r in records.items():
        for e in r.get("entries", []):
            st = groups.setdefault(e["group"], {}).setdefault(k, {"last": 0, "pending": []})
            st["last"] = max(st["last"], e["seq"])
            if e["state"] in ("started", "queued"):
                st["pending"].append(e)

    def where(k):  # what rank k waits in, anywhere
        pend = [e for e in records[k].get("entries", []) if e["state"] in ("started", "queued")]
        return f"{pend[0]['what']} (group {pend[0]['group']} #{pend[0]['seq']})" if pend else "no collective"

    behind = set(missing)
    stalled = []  # (group, seq, what): collectives every recorded member reached, none completed
    for name in sorted(groups):
        g = groups[name]
        waiting = {k: min(st["pending"], key=lambda x: x["seq"]) for k, st in g.items() if st["pending"]}
        if not waiting:
            continue
        lines.append(f"group {name}:")
        for k, e in sorted(waiting.items()):
            wait_s = (records[k]["written_us"] - (e["started_us"] or e["queued_us"])) / 1e6
            lines.append(f"  rank {k} waits in {e['what']} (#{e['seq']} of the group, {e['bytes']} bytes, step "
                         f"{e['step']}) for {wait_s:.1f} s")
        first = min(e["seq"] for e in waiting.values())
        late = [k for k in sorted(g) if g[k]["last"] < first]
        for k in late:
            lines.append(f"  rank {k} has not reached #{first}: its last in this group is #{g[k]['last']}; "
                         f"it waits in {where(k)}")
        behind.update(late)
        if not late:
            e = min(waiting.values(), key=lambda x: x["seq"])
            stalled.append((name, first, e["what"], sorted(g)))

    # the verdict
    failed = [k for k in sorted(records) if records[k].get("reason", "").startswith("error:")
              and not any(w in records[k]["reason"] for w in WAITED)]
    lines.append("verdict:")
    if failed:
        k = failed[0]
        lines.append(f"  rank {k}{' on ' + host(k) if hosts else ''} failed on its own: "
                     f"{records[k]['reason']}; the others only waited for it")
    elif behind:
        by_host = {}
        for k in range(world):
            by_host.setdefault(host(k), []).append(k)
        whole = [h for h, ks in by_host.items() if hosts and len(by_host) > 1 and set(ks) <= behind]
        if whole:
            for h in whole:
                alive = all(k in records for k in by_host[h])
                if alive:  # each waited and wrote: the host lives, its link does not
                    lines.append(f"  every rank of host {h} ({ranks_str(by_host[h])}) fell behind, yet each is "
                                 f"alive (it wrote its record after waiting): the network between {h} and the "
                                 "other hosts failed (a cut link, a failed switch port)")
                else:
                    lines.append(f"  every rank of host {h} ({ranks_str(by_host[h])}) fell behind or wrote nothing: "
                                 f"look at {h} and its network link first (a dead node or a cut link)")
        else:
            lines.append(f"  {ranks_str(behind)} fell behind or wrote nothing: look there first "
                         "(a stopped or dead process)")
    elif stalled:
        name, seq, what, ks = stalled[0]
        on = sorted({host(k) for k in ks})
        lines.append(f"  no rank fell behind: every rank that wrote reached {what} (#{seq} of group {name}) and "
                     "it never completed" + (f"; it spans hosts {', '.join(on)}: the network between them "
                                             "(a cut link, a failed switch port)" if len(on) > 1 else ""))
    else:
        lines.append("  no rank waits in a collective: the failure is in the reasons above")
    return "\n".join(lines)


def main():
    if len(sys.argv) != 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if len(sys.argv) == 2 else 2
    records = load(sys.argv[1])
    if not records:
        print(f"flight_report: no rank_*.json in {sys.argv[1]}", file=sys.stderr)
        return 1
    print(report(records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
