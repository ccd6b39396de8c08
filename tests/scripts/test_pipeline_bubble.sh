#!/usr/bin/env bash
# scripts/pipeline_bubble.py on made-up traces of 2 ranks whose bubble is known: GPipe over
# 2 micro-batches, a forward 10 ms, a backward 20 ms, then a 10 ms optimizer; a step is
# 100 ms (ms from the step's start):
#
#   rank 0: F0 0-10, F1 10-20,                    B0 50-70, B1 70-90, optimizer 90-100
#   rank 1:          F0 10-20, F1 20-30, B0 30-50, B1 50-70,          optimizer 90-100
#
# Each rank is busy 60 of 100 ms: bubble 1 - 120 / 200 = 0.4, idle/compute 80 / 120; from
# the first action to the last (0-90 ms) idle/compute is (180 - 120) / 120 = 0.5, GPipe's
# (p - 1) / m, and so is the step replayed from its actions. The traces also hold what must
# not count: a block's forward nested in each F, communication and wait events, a first
# (warm-up) step twice as slow, and rank 1's clock starting 20 ms after rank 0's (its ts
# 20 ms smaller; its clock_origin_us says so). Then a late message, chunks, no actions.
#   bash tests/scripts/test_pipeline_bubble.sh [BUILD_DIR]   (BUILD_DIR is not used)
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
command -v python3 >/dev/null || { echo "SKIPPED: no python3 here"; exit 77; }
source "$ROOT/tests/scripts/lib.sh"

run="$tmp/gpipe_p2_m2"
mkdir -p "$run"
python3 - "$run" <<'PY'
import json, sys
run = sys.argv[1]
ms = 1000  # ts are in us
layout = {0: [("F0", 0, 10), ("F1", 10, 20), ("B0", 50, 70), ("B1", 70, 90)],
          1: [("F0", 10, 20), ("F1", 20, 30), ("B0", 30, 50), ("B1", 50, 70)]}
origin = {0: 5_000_000, 1: 5_000_000 + 20 * ms}
for r, acts in layout.items():
    ev = []
    def x(name, tid, a, b):
        ev.append({"ph": "X", "name": name, "pid": r, "tid": tid, "ts": a - (origin[r] - origin[0]), "dur": b - a})
    start = 0
    for k in range(4):  # step 0 (warm-up) takes 200 ms: every time doubled
        f = 2 if k == 0 else 1
        for name, a, b in acts:
            x(name, 0, start + f * a * ms, start + f * b * ms)
            if name[0] == "F":
                x("forward h.0", 0, start + f * a * ms, start + f * (a + 5) * ms)
            x("pp.send", 1, start + f * b * ms, start + f * (b + 3) * ms)
            x("wait pp.recv", 2, start + f * (b + 1) * ms, start + f * (b + 2) * ms)
        x("optimizer", 0, start + f * 90 * ms, start + f * 100 * ms)
        start += f * 100 * ms
    ev.sort(key=lambda e: e["ts"])
    with open(f"{run}/trace.rank{r}.json", "w") as fo:
        json.dump({"otherData": {"clock_origin_us": origin[r]},
                   "traceEvents": [{"ph": "M", "name": "process_name", "pid": r}] + ev}, fo)
# rank 0's metrics: the warm-up step's peak (100 MiB) is left out, then the largest (30 MiB)
with open(f"{run}/metrics.jsonl", "w") as fo:
    for step, mib in enumerate([100, 10, 30, 20], 1):
        fo.write(json.dumps({"step": step, "loss": 4.0, "mem_peak": mib * 2**20}) + "\n")
with open(f"{run}/train.log", "w") as fo:
    fo.write("pipeline: 2 stages, blocks per stage 2 2, schedule gpipe over 2 micro-batches\n")
PY

python3 "$ROOT/scripts/pipeline_bubble.py" --skip 1 --json "$tmp/rows.json" --svg "$tmp/pp.svg" "$run" \
  >"$tmp/out.txt" 2>&1
rc=$?
cat "$tmp/out.txt"
check "it reads the traces (exit 0)" test "$rc" -eq 0
figure() {  # figure KEY EXPECTED: the run's KEY in the JSON within 1e-6
  python3 - "$tmp/rows.json" "$1" "$2" <<'PY'
import json, sys
row = json.load(open(sys.argv[1]))[0]
got, want = row[sys.argv[2]], json.loads(sys.argv[3])
ok = (got == want) if isinstance(want, (str, list)) else abs(got - want) < 1e-6
if not ok:
    print(f"  {sys.argv[2]}: {got}, expected {want}")
sys.exit(0 if ok else 1)
PY
}
check "the schedule from train.log" figure schedule '"gpipe"'
check "P 2, M 2, V 1 from the events" bash -c "$(declare -f figure); tmp=$tmp; figure P 2 && figure M 2 && figure V 1"
check "step 100 ms (warm-up left out)" figure step_ms 100
check "busy 60 ms per rank (nested blocks, comm and waits not counted)" figure busy_ms '[60.0, 60.0]'
check "bubble 0.4" figure bubble 0.4
check "idle/compute 80/120" figure idle_compute 0.6666666666666666
check "idle/compute over the pipeline 0.5 (ranks lined up by their clock origin)" figure pipe_idle_compute 0.5
check "the step replayed without message time: the same 0.5" figure replay_idle_compute 0.5
check "formula (p-1)/m = 0.5" figure formula 0.5
check "rank 0's peak: the largest after the warm-up, 30 MiB" figure peak_mib 30
check "the table prints the row" grep -Eq '^gpipe +2 +2 +1 +1 +100\.0 +60/60 +0\.400 +0\.667 .* 0\.500 +0\.500 +0\.500 +30\.0$' "$tmp/out.txt"
check "the timeline labels the actions" bash -c "grep -q '>F1</text>' '$tmp/pp.svg' && grep -q '>B0</text>' '$tmp/pp.svg'"
check "forward and backward in their own colours" bash -c "grep -q 'fill=\"#4c78a8\"[^>]*><title>F0 ' '$tmp/pp.svg' && grep -q 'fill=\"#f58518\"[^>]*><title>B1 ' '$tmp/pp.svg'"
# F1's activation reaching rank 1 5 ms late: rank 1's F1, B0, B1 and so rank 0's B0, B1 run
# 5 ms later (rank 0's optimizer shrinks to 95-100 ms). The pipeline spans 95 ms: pipe i/c
# (190 - 120) / 120; the replay, messages taking no time, keeps 90 ms: 0.5
python3 - "$run" <<'PY'
import json, sys
late = {0: ("B0", "B1"), 1: ("F1", "B0", "B1")}
for r, names in late.items():
    p = f"{sys.argv[1]}/trace.rank{r}.json"
    t = json.load(open(p))
    for e in t["traceEvents"]:
        if e.get("ph") == "X" and e["name"] in names:
            e["ts"] += 5000
        if r == 0 and e.get("ph") == "X" and e["name"] == "optimizer":
            e["ts"] += e["dur"] - 5000
            e["dur"] = 5000
    json.dump(t, open(p, "w"))
PY
python3 "$ROOT/scripts/pipeline_bubble.py" --skip 1 --json "$tmp/rows.json" "$run" >/dev/null 2>&1
check "a late message: pipe i/c 70/120, replay still 0.5, bubble still 0.4" \
  bash -c "$(declare -f figure); tmp=$tmp; figure pipe_idle_compute 0.5833333333333334 && figure replay_idle_compute 0.5 && figure bubble 0.4"

# a chunk number makes V: the same layout named F0.0 ... (rank 0's F1 as F1.1) under
# interleaved halves the formula
rename() {  # rename PYTHON-EXPR-OF-name: every action of both ranks' traces
  python3 - "$run" "$1" <<'PY'
import glob, json, re, sys
for p in glob.glob(sys.argv[1] + "/trace.rank*.json"):
    t = json.load(open(p))
    for e in t["traceEvents"]:
        name, rank = e["name"], e["pid"]
        if re.match(r"^[FB]\d(\.\d)?$", name):
            e["name"] = eval(sys.argv[2])
    json.dump(t, open(p, "w"))
PY
}
rename '"F1.1" if (name, rank) == ("F1", 0) else name + ".0"'
sed -i 's/schedule gpipe/schedule interleaved/' "$run/train.log"
python3 "$ROOT/scripts/pipeline_bubble.py" --skip 1 --json "$tmp/rows.json" "$run" >/dev/null 2>&1
check "V 2 from F1.1, formula (p-1)/(v m) = 0.25" bash -c "$(declare -f figure); tmp=$tmp; figure V 2 && figure formula 0.25 && figure schedule '\"interleaved\"'"
# no pipeline actions: said, not a table of zeros
rename '"forward"'
python3 "$ROOT/scripts/pipeline_bubble.py" --skip 1 "$run" >"$tmp/none.txt" 2>&1
check "a trace without actions is refused" bash -c "! python3 '$ROOT/scripts/pipeline_bubble.py' --skip 1 '$run' >/dev/null 2>&1 && grep -q 'no pipeline actions' '$tmp/none.txt'"
exit $status
