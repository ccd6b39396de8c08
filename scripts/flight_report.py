#!/usr/bin/env python3
"""The flight records of a failed job, compared: which ranks fell behind, and in which
collective the others wait.

    python3 scripts/flight_report.py out/ckpt/flight      # the rank_<k>.json that train_gpt wrote

train_gpt writes one file per rank that could still write when the job failed (a collective
past parallel.timeout_s, an error, a stop that could not finish). Each lists that rank's last
operations: the group (a communicator's name and which of its groups, e.g. "fsdp@1"), the
operation's sequence number in the group, the collective, its bytes, the step, and whether it
was queued, started, done or failed (a send or receive also names its peer, a world rank);
and the times the process was not running (its watchdog, which runs 10 times a second, did
not for over a second: stopped or starved). Ranks of one group issue their collectives in the
same order, so the same sequence number is the same collective on every member (not so for a
send or receive: it waits for its peer). The report says:
  - which ranks wrote no record (dead, stopped, cut off, or killed before they could);
  - per group, the operations some ranks wait in (started, not done) and how far each rank
    got; a rank whose last operation in the group is behind the others' fell behind;
  - a verdict, from the wait-for graph (who waits in which collective for whom): the rank
    that failed on its own (an error that is not a timeout); else a rank whose record lists
    a time it was not running that lasted into the fault; else the ranks that wrote
    nothing (a whole host of them: that host or its link; one whose host-mates waited across
    the hosts like everyone: cannot tell it from a cut link); else a rank whose own clock shows
    it was not running at the fault (stopped, starved: only what ends after the oldest
    operation still waited in was queued counts); else the ranks the others wait for; else a
    collective that every member reached or that the others completed: the network (inside
    one host: its transport, no network).
Every record names its job; the report reads the newest job's records only (a directory can
hold an earlier job's), says which job it read, and how many records of other jobs it left out.
Exit code 0 when it could read at least one record, 1 otherwise.
"""
import glob
import json
import os
import re
import sys


def load(directory):
    """The records of the newest job in `directory` (job ids start with the job's start time,
    so they sort by it; records of an ndtrain that wrote no id count as the oldest job), by
    rank; and the other jobs' ids with how many records of each were left out."""
    jobs = {}
    for path in sorted(glob.glob(os.path.join(directory, "rank_*.json"))):
        try:
            with open(path) as f:
                r = json.load(f)
            jobs.setdefault(r.get("job", ""), {})[int(r["rank"])] = r
        except (OSError, ValueError, KeyError) as e:
            print(f"flight_report: skipping {path}: {e}", file=sys.stderr)
    if not jobs:
        return "", {}, {}
    newest = max(jobs)
    return newest, jobs[newest], {j: len(rs) for j, rs in jobs.items() if j != newest}


def ranks_str(ks):
    ks = sorted(ks)
    return ("ranks " if len(ks) > 1 else "rank ") + ", ".join(map(str, ks))


# Reasons a rank gives when it only waited for others (not the cause of the failure).
WAITED = ("has not completed after", "asked to stop by signal", "ended by a library call to exit()",
          "it failed on another rank", "the launcher (parent pid")


def waited_s(r):
    """How long a rank had waited in its oldest unfinished operation when it wrote."""
    pend = [e for e in r.get("entries", []) if e["state"] in ("started", "queued")]
    if not pend:
        return None
    return (r["written_us"] - pend[0]["queued_us"]) / 1e6


def cannot_tell_missing(records, missing, host, hosts):
    """True when the records cannot tell a stopped rank from one the launcher ended before it
    wrote: every rank that wrote waited (none failed on its own), and each missing rank's
    host-mates that wrote wait only in groups whose members span hosts, as everyone does when
    a link between hosts is cut. A host-mate waiting in a group inside its host points at the
    missing rank instead (links inside a host are not cut)."""
    if not hosts or any(not any(w in r.get("reason", "") for w in WAITED) for r in records.values()):
        return False
    members = {}  # group -> the hosts of the ranks that recorded it
    for k, r in records.items():
        for e in r.get("entries", []):
            members.setdefault(e["group"], set()).add(host(k))
    for m in missing:
        mates = [k for k in records if host(k) == host(m)]
        if not mates:
            return False
        for k in mates:  # every operation they still wait in spans hosts
            pend = [e for e in records[k].get("entries", []) if e["state"] in ("started", "queued")]
            if not pend or any(len(members[e["group"]]) < 2 for e in pend):
                return False
    return True


def pending_of(r):
    return [e for e in r.get("entries", []) if e["state"] in ("started", "queued")]


def is_p2p(e):
    """A send or receive: its sequence number is not the same operation on another rank."""
    return "peer" in e or e["what"].endswith((".send", ".recv"))


def fault_start(records):
    """When the fault began: the oldest operation any rank still waits in was queued (without
    one, a deadline before the first record was written)."""
    pend = [e["queued_us"] for r in records.values() for e in pending_of(r)]
    if pend:
        return min(pend)
    deadlines = [float(m.group(1)) for r in records.values()
                 for m in [re.search(r"has not completed after ([0-9.]+) s", r.get("reason", ""))] if m]
    return min(r["written_us"] for r in records.values()) - int((max(deadlines, default=0) + 1) * 1e6)


def not_running(records):
    """The ranks whose own record shows a time they were not running (its watchdog, which runs
    10 times a second, did not) that lasted until after the fault began: rank -> (seconds,
    when, in words)."""
    fault_us = fault_start(records)
    out = {}
    for k, r in records.items():
        gaps = [p for p in r.get("paused", []) if p["to_us"] >= fault_us and p["to_us"] - p["from_us"] > 1e6]
        if not gaps:
            continue
        p = max(gaps, key=lambda p: p["to_us"] - p["from_us"])
        rel = (p["from_us"] - fault_us) / 1e6
        start = (f"from {rel:.1f} s after" if rel >= 0.05 else f"from {-rel:.1f} s before" if rel <= -0.05
                 else "from when")
        end = ("until just before it wrote its record" if r["written_us"] - p["to_us"] < 200000
               else "until it ran again")
        out[k] = ((p["to_us"] - p["from_us"]) / 1e6, f"{start} the oldest wait began {end}")
    return out


def waiting_for(records, groups, k):
    """Which ranks waited for rank k, and in what, in words."""
    waiting = []
    for j, r in sorted(records.items()):
        if j == k:
            continue
        for e in pending_of(r):
            members = groups.get(e["group"], {})
            if e.get("peer") == k or (not is_p2p(e) and k in members) or (is_p2p(e) and "peer" not in e
                                                                           and set(members) == {j, k}):
                waiting.append((j, e))
                break
    if not waiting:
        return "no other rank was waiting in an operation with it when they wrote"
    return "; ".join(f"rank {j} waited {describe(e)}" for j, e in waiting)


def describe(e):
    """`pp.send to rank 1 (#85 of group pp@0)`."""
    peer = ""
    if "peer" in e:
        peer = (" to" if e["what"].endswith(".send") else " from") + f" rank {e['peer']}"
    return f"in {e['what']}{peer} (#{e['seq']} of group {e['group']})"


def verdict(records, world, hosts, host, missing, groups, stalled):
    """The likely cause, in one or two lines: a rank that failed on its own; else the ranks
    that wrote nothing; else a rank that was not running; else the ranks the others wait
    for (the ends of the wait-for graph); else the network."""
    on = (lambda k: f" on {host(k)}") if hosts else (lambda k: "")
    by_host = {}
    for k in range(world):
        by_host.setdefault(host(k), []).append(k)
    failed = [k for k in sorted(records) if records[k].get("reason", "").startswith("error:")
              and not any(w in records[k]["reason"] for w in WAITED)]
    if failed:
        k = failed[0]
        return [f"  rank {k}{on(k)} failed on its own: {records[k]['reason']}; the others only waited for it"]
    stopped = not_running(records)
    if stopped:
        return [f"  rank {k} fell behind: it was not running for {s:.1f} s{on(k)} (stopped or starved: its own "
                f"record shows it), {when}; {waiting_for(records, groups, k)}: look there first"
                for k, (s, when) in sorted(stopped.items())]
    if missing:
        whole = [h for h, ks in by_host.items() if hosts and len(by_host) > 1 and set(ks) <= set(missing)]
        if whole:
            return [f"  every rank of host {h} ({ranks_str(by_host[h])}) wrote nothing: look at {h} and its "
                    "network link first (a dead node or a cut link)" for h in whole]
        if cannot_tell_missing(records, missing, host, hosts):
            hs = ", ".join(sorted(by_host))
            return [f"  cannot tell: {ranks_str(missing)} wrote nothing, while the ranks on the same host waited, "
                    f"like every other rank, in collectives across the hosts: either the network between the hosts "
                    f"({hs}) failed and the launcher ended {ranks_str(missing)} before it could write, or "
                    f"{ranks_str(missing)} stopped; look at the network between them first, then at "
                    f"{ranks_str(missing)}"]
        return [f"  {ranks_str(missing)} fell behind or wrote nothing: look there first (a stopped or dead process)"]

    # A rank that was not running (SIGSTOPped, then woken by the launcher's SIGCONT before
    # its SIGTERM) writes a record like the others', but its clock shows the pause: an
    # operation queued but started only seconds later (a running rank's communication
    # thread starts one within milliseconds), or a wait far longer than the deadline at
    # which the others gave up.
    deadlines = [float(m.group(1)) for r in records.values()
                 for m in [re.search(r"has not completed after ([0-9.]+) s", r.get("reason", ""))] if m]
    waited = {k: waited_s(r) for k, r in records.items() if waited_s(r) is not None}
    # The state at the fault, not the whole history: only what ends after the fault began
    # (the oldest operation any rank still waits in was queued) counts, so that a pause at
    # start-up or an early evaluation does not make a healthy rank look stopped.
    pending_since = [e["queued_us"] for r in records.values() for e in r.get("entries", [])
                     if e["state"] in ("started", "queued")]
    fault_us = min(pending_since) if pending_since else 0
    paused = {}
    for k, r in records.items():
        es = sorted(r.get("entries", []), key=lambda e: e["queued_us"])
        gaps = [(e["started_us"] - e["queued_us"]) / 1e6 for e in es if e["started_us"] and e["started_us"] >= fault_us]
        idle = [(b["queued_us"] - a["queued_us"]) / 1e6 for a, b in zip(es, es[1:]) if b["queued_us"] >= fault_us]
        if gaps and max(gaps) > 1.0:
            paused[k] = f"an operation of it started {max(gaps):.1f} s after it was queued"
        elif deadlines and idle and max(idle) > max(deadlines):
            paused[k] = f"it queued no collective for {max(idle):.1f} s, longer than the others' deadline"
    if deadlines and len(waited) > 1:
        for k, w in waited.items():
            others = sorted(v for j, v in waited.items() if j != k)
            if k not in paused and w > max(deadlines) + 1.0 and w > others[len(others) // 2] + 1.0:
                paused[k] = f"it waited {w:.1f} s where the others gave up after {max(deadlines):g} s"
    if paused:
        return [f"  rank {k} fell behind: look there first ({why}{on(k)}: it was not running, stopped or "
                "starved)" for k, why in sorted(paused.items())]

    # Who waits for whom: rank k waits in #seq of a group for the members that have not
    # reached it. The ends of those chains are the suspects.
    pending = {}
    for name, g in groups.items():
        for k, st in g.items():
            for e in st["pending"]:
                if k not in pending or e["queued_us"] < pending[k][1]["queued_us"]:
                    pending[k] = (name, e)
    waits_for = {k: [e["peer"]] if "peer" in e else [j for j, st in groups[name].items()
                                                      if st["last"] < e["seq"]]
                 for k, (name, e) in pending.items()}
    waited_on = {j for js in waits_for.values() for j in js}
    idle = sorted(j for j in waited_on if j not in pending)                 # in no collective at all

    def completed(j, name, seq):
        return any(e["group"] == name and e["seq"] == seq and e["state"] == "done"
                   for e in records[j].get("entries", []))

    # in a collective that other members completed: what they sent it never arrived
    # (a send or receive has no such twin: its number counts that rank's own operations)
    lost = sorted(k for k, (name, e) in pending.items() if not is_p2p(e)
                  and not waits_for[k] and any(completed(j, name, e["seq"]) for j in groups[name] if j != k))
    out = []
    if idle:
        waiting = sorted(k for k, js in waits_for.items() if set(js) & set(idle))
        out.append(f"  {ranks_str(idle)} fell behind: in no collective while {ranks_str(waiting)} waited "
                   "(stopped, or stuck in its own work): look there first")
    if lost:
        for h in sorted({host(k) for k in lost}):
            ks = [k for k in lost if host(k) == h]
            where = (f"the network between {h} and the other hosts failed (a cut link, a failed switch port)"
                     if hosts and len(by_host) > 1 else
                     "the transport between the ranks of the host failed (no network is involved: shared "
                     "memory, or a member stopped after it completed)" if hosts
                     else "the network or the transport failed (a cut link, a failed switch port)")
            out.append(f"  {ranks_str(ks)}{' of host ' + h if hosts else ''} wait in a collective the other members "
                       f"completed, so what they sent never arrived: {where}")
    if out:
        return out
    if stalled:
        name, seq, what, ks = stalled[0]
        hs = sorted({host(k) for k in ks})
        if len(hs) > 1:
            return [f"  no rank fell behind: every rank that wrote reached {what} (#{seq} of group {name}) and it "
                    f"never completed; it spans hosts {', '.join(hs)}: the network between them (a cut link, a "
                    "failed switch port)"]
        # inside one host no network is involved: a member stopped progressing inside it
        return [f"  no rank fell behind: {ranks_str(ks)}{' (on ' + hs[0] + ')' if hosts else ''} reached {what} "
                f"(#{seq} of group {name}) and it never completed: one of them stopped progressing inside it "
                "(a stopped or hung process): look there first"]
    return ["  no rank waits in a collective: the failure is in the reasons above"]


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

    stalled = []  # (group, seq, what): collectives every recorded member reached, none completed
    for name in sorted(groups):
        g = groups[name]
        waiting = {k: min(st["pending"], key=lambda x: x["seq"]) for k, st in g.items() if st["pending"]}
        if not waiting:
            continue
        lines.append(f"group {name}:")
        for k, e in sorted(waiting.items()):
            wait_s = (records[k]["written_us"] - (e["started_us"] or e["queued_us"])) / 1e6
            peer = (f" {'to' if e['what'].endswith('.send') else 'from'} rank {e['peer']}"
                    if "peer" in e else "")
            lines.append(f"  rank {k} waits in {e['what']}{peer} (#{e['seq']} of the group, {e['bytes']} bytes, "
                         f"step {e['step']}) for {wait_s:.1f} s")
        first = min(e["seq"] for e in waiting.values())
        late = [k for k in sorted(g) if g[k]["last"] < first]
        for k in late:
            lines.append(f"  rank {k} has not reached #{first}: its last in this group is #{g[k]['last']}; "
                         f"it waits in {where(k)}")
        if not late:
            e = min(waiting.values(), key=lambda x: x["seq"])
            stalled.append((name, first, e["what"], sorted(g)))

    lines.append("verdict:")
    lines.extend(verdict(records, world, hosts, host, missing, groups, stalled))
    return "\n".join(lines)


def main():
    if len(sys.argv) != 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if len(sys.argv) == 2 else 2
    job, records, others = load(sys.argv[1])
    if not records:
        print(f"flight_report: no rank_*.json in {sys.argv[1]}", file=sys.stderr)
        return 1
    print(f"job {job or '(no id: written by an older ndtrain)'}"
          + "".join(f"; left out {n} record{'s' if n > 1 else ''} of the older job {j or '(no id)'}"
                    for j, n in sorted(others.items())))
    print(report(records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
