#!/usr/bin/env bash
# bench/idle.py, the benchmarks' idle check: a busy loop beside a run is seen as other
# processes' CPU (the run is tried again, then kept and marked NOT CLEAN), the benchmark's own
# child is not counted, the command's exit code comes back, and a call without a command is
# refused with exit 2.
#   bash tests/scripts/test_idle.sh
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
command -v python3 >/dev/null || { echo "SKIPPED: no python3 here"; exit 77; }
source "$ROOT/tests/scripts/lib.sh"
idle=(python3 "$ROOT/bench/idle.py")

# a busy loop beside a one-second run: other processes took CPU, on every try
python3 -c 'while True: pass' &
busy=$!
trap 'kill $busy 2>/dev/null; rm -rf "$tmp"' EXIT
sleep 0.2
"${idle[@]}" --max 0.05 --redo 1 -- sleep 1 >"$tmp/busy.out" 2>&1
rc=$?
kill $busy 2>/dev/null
wait $busy 2>/dev/null
cat "$tmp/busy.out"
check "a busy neighbour: the run is tried again" grep -q "running it again" "$tmp/busy.out"
check "a busy neighbour: kept and marked after 2 tries" grep -q "(NOT CLEAN, 2 tries)$" "$tmp/busy.out"
check "the command's exit code (0)" test "$rc" -eq 0

# the benchmark's own work is not the others': a child's CPU time (here half a second of it)
# is counted as the benchmark's own once the child is waited for
python3 - "$ROOT/bench" >"$tmp/own.out" 2>&1 <<'PY'
import subprocess, sys
sys.path.insert(0, sys.argv[1])
from idle import own_cpu_s
before = own_cpu_s([])
subprocess.run([sys.executable, "-c", "import time\nwhile time.process_time() < 0.5: pass"], check=True)
print(f"own CPU over the child: {own_cpu_s([]) - before:.2f} s")
PY
cat "$tmp/own.out"
check "a waited-for child's CPU counts as the benchmark's own" \
  python3 -c "import sys; sys.exit(0 if float(open('$tmp/own.out').read().split()[-2]) >= 0.45 else 1)"

"${idle[@]}" -- sh -c 'exit 3' >/dev/null 2>&1
check "the command's exit code comes back (3)" test $? -eq 3
"${idle[@]}" >"$tmp/none.out" 2>&1
rc=$?
check "no command: exit 2" test "$rc" -eq 2
check "no command: says so" grep -q "idle.py: error: no command" "$tmp/none.out"
"${idle[@]}" -- /nonexistent/program >"$tmp/missing.out" 2>&1
check "a command that cannot run: exit 127 and one line" \
  grep -q "idle.py: error: cannot run /nonexistent/program" "$tmp/missing.out"
exit $status
