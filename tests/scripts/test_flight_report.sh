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
exit $status
