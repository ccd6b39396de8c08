#!/usr/bin/env bash
# scripts/flight_report.py reads one job's records: a flight/ folder that also holds an
# earlier job's records (or ones an older ndtrain wrote without a job id) gives the report of
# the newest job only, names it, and says what it left out. The records are made up here:
# job A (older) had rank 1 fail on its own; job B (newer) has rank 0 waiting on a missing
# rank 1. Read together, A's error would blame rank 1 for B's failure.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
command -v python3 >/dev/null || { echo "SKIPPED: no python3 here"; exit 77; }
source "$ROOT/tests/scripts/lib.sh"

record() {  # record FILE JOB RANK REASON
  cat >"$1" <<JSON
{"job": "$2", "rank": $3, "world": 2, "reason": "$4", "step": 5, "written_us": 2000000,
 "hosts": ["h0", "h1"],
 "entries": [
  {"group": "dp@0", "seq": 7, "what": "dp.all_reduce", "bytes": 64, "step": 5, "state": "started", "queued_us": 1000000, "started_us": 1000100, "finished_us": 0}
 ]}
JSON
}
mkdir -p "$tmp/flight"
record "$tmp/flight/rank_1.json" "20261203T100000Z-h0-11" 1 "error: a data file is damaged"
record "$tmp/flight/rank_0.json" "20261204T083000Z-h0-22" 0 "error: dp.all_reduce (64 bytes) on world rank 0 has not completed after 3 s (parallel.timeout_s)"
python3 "$ROOT/scripts/flight_report.py" "$tmp/flight" >"$tmp/out.txt" 2>&1
rc=$?
cat "$tmp/out.txt"
check "it reads the records (exit 0)" test "$rc" -eq 0
check "it names the newest job and what it left out" \
  grep -q '^job 20261204T083000Z-h0-22; left out 1 record of the older job 20261203T100000Z-h0-11$' "$tmp/out.txt"
check "the older job's record is not read" bash -c "! grep -q 'a data file is damaged' '$tmp/out.txt'"
check "the newest job's missing rank is the suspect" grep -q '1 of 2 ranks wrote a record' "$tmp/out.txt"
check "the verdict is not the older job's error" bash -c "! grep -q 'failed on its own' '$tmp/out.txt'"
# a record without a job id (an older ndtrain) counts as the oldest job
sed -i 's/"job": "20261203T100000Z-h0-11", //' "$tmp/flight/rank_1.json"
python3 "$ROOT/scripts/flight_report.py" "$tmp/flight" >"$tmp/out2.txt" 2>&1
check "a record without an id is left out as older" grep -q 'left out 1 record of the older job (no id)' "$tmp/out2.txt"

# A link cut after a healthy rank paused at start-up for 20 s (an early evaluation looks the
# same): the pause is history, not the state at the fault. Both ranks wait in the same
# collective across the hosts: the verdict is the network, not "rank 1 was not running".
cut="$tmp/cut"
mkdir -p "$cut"
entry() {  # entry SEQ QUEUED_S STATE
  local q=$(($2 * 1000000)) f=0
  [[ $3 == done ]] && f=$((q + 1000))
  echo "{\"group\": \"world@0\", \"seq\": $1, \"what\": \"world.all_reduce\", \"bytes\": 8, \"step\": $1, \"state\": \"$3\", \"queued_us\": $q, \"started_us\": $((q + 100)), \"finished_us\": $f}"
}
for k in 0 1; do
  first=1; [[ $k == 1 ]] && first=21  # rank 1's first collective 20 s after its start
  cat >"$cut/rank_$k.json" <<JSON
{"job": "20261204T090000Z-h0-33", "rank": $k, "world": 2, "step": 4, "written_us": 43000000,
 "reason": "error: world.all_reduce (8 bytes) on world rank $k has not completed after 3 s (parallel.timeout_s): a rank of the group is dead, stopped or cut off",
 "hosts": ["h0", "h1"],
 "entries": [$(entry 1 $first done), $(entry 2 38 done), $(entry 3 39 done), $(entry 4 40 started)]}
JSON
done
python3 "$ROOT/scripts/flight_report.py" "$cut" >"$tmp/cut.txt" 2>&1
cat "$tmp/cut.txt"
check "a start-up pause does not make a healthy rank the suspect" bash -c "! grep -q 'rank [0-9] fell behind' '$tmp/cut.txt'"
check "the verdict is the network between the hosts" grep -q 'it spans hosts h0, h1: the network between them' "$tmp/cut.txt"

# 2 hosts x 2 ranks, a link cut, and rank 3 ended by the launcher before it wrote: rank 2, on
# the same host, waits like ranks 0 and 1 in the replicas' all-reduce across the hosts. The
# records cannot tell that from a stopped rank 3: the report says so, the network first.
# With rank 2 waiting in its host's own shard group instead, rank 3 is the suspect.
three="$tmp/three"
mkdir -p "$three"
for k in 0 1 2; do
  group="replicate@$((k % 2))"
  cat >"$three/rank_$k.json" <<JSON
{"job": "20261204T091000Z-h0-44", "rank": $k, "world": 4, "step": 6, "written_us": 20000000,
 "reason": "error: replicate.all_reduce (64 bytes) on world rank $k has not completed after 3 s (parallel.timeout_s): a rank of the group is dead, stopped or cut off",
 "hosts": ["h0", "h0", "h1", "h1"],
 "entries": [{"group": "$group", "seq": 9, "what": "replicate.all_reduce", "bytes": 64, "step": 6, "state": "started", "queued_us": 17000000, "started_us": 17000100, "finished_us": 0}]}
JSON
done
python3 "$ROOT/scripts/flight_report.py" "$three" >"$tmp/three.txt" 2>&1
cat "$tmp/three.txt"
check "a missing rank whose host-mate waited across hosts: cannot tell" grep -q 'cannot tell: rank 3 wrote nothing' "$tmp/three.txt"
check "... the network first" grep -q 'look at the network between them first, then at rank 3' "$tmp/three.txt"
sed -i 's/"group": "replicate@0", "seq": 9, "what": "replicate.all_reduce"/"group": "fsdp@1", "seq": 9, "what": "fsdp.all_gather"/' "$three/rank_2.json"
python3 "$ROOT/scripts/flight_report.py" "$three" >"$tmp/three2.txt" 2>&1
check "a host-mate stuck inside its host: the missing rank is the suspect" grep -q 'verdict:$' "$tmp/three2.txt"
check "... named" grep -q '  rank 3 fell behind or wrote nothing' "$tmp/three2.txt"

# Pipeline stages on one host; stage 1 SIGSTOPped, then woken by the launcher's SIGCONT: its
# record shows the time it was not running ("paused", from its watchdog). Stage 0 waits in a
# send to rank 1; stage 1's own numbering of its sends and receives completed the same numbers
# after it woke. The verdict is rank 1, not the network (one host has none between its ranks).
pp="$tmp/pp"
mkdir -p "$pp"
p2p() {  # p2p SEQ WHAT PEER STATE QUEUED_MS FINISHED_MS
  echo "{\"group\": \"pp@0\", \"seq\": $1, \"what\": \"$2\", \"bytes\": 2048, \"peer\": $3, \"step\": 9, \"state\": \"$4\", \"queued_us\": $(($5 * 1000)), \"started_us\": $(($5 * 1000 + 50)), \"finished_us\": $(($6 * 1000))}"
}
cat >"$pp/rank_0.json" <<JSON
{"job": "20261204T092000Z-vm-55", "rank": 0, "world": 2, "step": 9, "written_us": 4000000, "hosts": ["vm", "vm"], "paused": [],
 "reason": "error: pp.recv (2048 bytes; the pipeline; step 9, micro-step 4 of 4) on world rank 0 has not completed after 3 s (parallel.timeout_s): a rank of the group is dead, stopped or cut off",
 "entries": [$(p2p 84 pp.recv 1 done 900 901), $(p2p 85 pp.send 1 started 1000 0), $(p2p 86 pp.recv 1 started 1001 0)]}
JSON
cat >"$pp/rank_1.json" <<JSON
{"job": "20261204T092000Z-vm-55", "rank": 1, "world": 2, "step": 9, "written_us": 4030000, "hosts": ["vm", "vm"],
 "paused": [{"from_us": 950000, "to_us": 4020000}],
 "reason": "error: pp.recv (2048 bytes; the pipeline; step 9, micro-step 2 of 4) on world rank 1 has not completed after 3 s (parallel.timeout_s): a rank of the group is dead, stopped or cut off",
 "entries": [$(p2p 84 pp.send 0 done 890 899), $(p2p 85 pp.recv 0 done 940 4021), $(p2p 86 pp.send 0 done 945 4022)]}
JSON
python3 "$ROOT/scripts/flight_report.py" "$pp" >"$tmp/pp.txt" 2>&1
cat "$tmp/pp.txt"
check "a stage whose record shows it was not running is named" \
  grep -q '^  rank 1 fell behind: it was not running for 3.1 s on vm (stopped or starved: its own' "$tmp/pp.txt"
check "... with the send that waited for it" grep -q 'rank 0 waited in pp.send to rank 1 (#85 of group pp@0)' "$tmp/pp.txt"
check "a send or receive is not another rank's operation of the same number" bash -c "! grep -q 'network' '$tmp/pp.txt'"
check "the waiting send names its peer" grep -q 'rank 0 waits in pp.send to rank 1 (#85 of the group' "$tmp/pp.txt"
# the healthy stage ended by the launcher before it wrote: the stopped one is still the suspect
rm "$pp/rank_0.json"
python3 "$ROOT/scripts/flight_report.py" "$pp" >"$tmp/pp2.txt" 2>&1
check "a missing healthy rank is not blamed over a record that shows a pause" \
  grep -q '^  rank 1 fell behind: it was not running' "$tmp/pp2.txt"

# One host, no pause recorded, rank 0 in a collective that rank 1 completed: the transport
# inside the host, not a network.
one="$tmp/one"
mkdir -p "$one"
for k in 0 1; do
  state=done; [[ $k == 0 ]] && state=started
  cat >"$one/rank_$k.json" <<JSON
{"job": "20261204T093000Z-vm-66", "rank": $k, "world": 2, "step": 5, "written_us": 9000000, "hosts": ["vm", "vm"], "paused": [],
 "reason": "error: world.all_reduce (8 bytes) on world rank $k has not completed after 3 s (parallel.timeout_s)",
 "entries": [$(entry 5 5 $state)]}
JSON
done
python3 "$ROOT/scripts/flight_report.py" "$one" >"$tmp/one.txt" 2>&1
cat "$tmp/one.txt"
check "on one host a lost collective is the transport inside it" \
  grep -q 'the transport between the ranks of the host failed (no network is involved' "$tmp/one.txt"

# 2 hosts x 2 ranks, rank 3 SIGSTOPped inside the world's all-reduce, then woken: every rank
# reached that all-reduce (no one's numbering is behind), which alone reads as the network;
# rank 3's record shows the pause, from before the others began to wait.
ar="$tmp/allreduce"
mkdir -p "$ar"
for k in 0 1 2 3; do
  paused='[]'; written=8000000; q=$((5000000 + k * 100))
  [[ $k == 3 ]] && paused='[{"from_us": 5000500, "to_us": 8500000}]' && written=8510000
  cat >"$ar/rank_$k.json" <<JSON
{"job": "20261204T094000Z-h0-77", "rank": $k, "world": 4, "step": 6, "written_us": $written, "hosts": ["h0", "h0", "h1", "h1"],
 "paused": $paused,
 "reason": "error: world.all_reduce (16 bytes; the world; step 6) on world rank $k has not completed after 3 s (parallel.timeout_s): a rank of the group is dead, stopped or cut off",
 "entries": [{"group": "world", "seq": 40, "what": "world.all_reduce", "bytes": 16, "step": 6, "state": "started", "queued_us": $q, "started_us": $((q + 50)), "finished_us": 0}]}
JSON
done
python3 "$ROOT/scripts/flight_report.py" "$ar" >"$tmp/ar.txt" 2>&1
cat "$tmp/ar.txt"
check "a rank stopped inside the collective the others wait in is named" \
  grep -q '^  rank 3 fell behind: it was not running for 3.5 s on h1 (stopped or starved: its own' "$tmp/ar.txt"
check "... and the others wait in it" grep -q 'rank 0 waited in world.all_reduce (#40 of group world)' "$tmp/ar.txt"
check "... not the network" bash -c "! grep -q 'network between' '$tmp/ar.txt'"
# a pause that ended before the fault (a slow start) is history, not the cause
sed -i 's/"from_us": 5000500, "to_us": 8500000/"from_us": 1000000, "to_us": 3000000/' "$ar/rank_3.json"
python3 "$ROOT/scripts/flight_report.py" "$ar" >"$tmp/ar2.txt" 2>&1
check "a pause before the fault is not the cause" bash -c "! grep -q 'not running' '$tmp/ar2.txt'"
exit $status
