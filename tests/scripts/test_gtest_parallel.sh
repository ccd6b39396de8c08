#!/usr/bin/env bash
# scripts/gtest_parallel.sh, which runs the GPU check's tests: shards of a real test program
# add up to the unsharded run; gtest's summaries of passes, failures and skips are counted;
# a program that ends without its summary (a crash) or runs past the timeout fails the run.
#   bash tests/scripts/test_gtest_parallel.sh BUILD_DIR
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="${1:?usage: test_gtest_parallel.sh BUILD_DIR}"
RUN="$ROOT/scripts/gtest_parallel.sh"
source "$ROOT/tests/scripts/lib.sh"

# 1. a real program: 3 shards run every test once
whole="$("$BUILD/test_tensor" --gtest_list_tests | grep -c '^  ')"
"$RUN" --logs "$tmp/real" "$BUILD/test_tensor:3" >"$tmp/real.out"
rc=$?
cat "$tmp/real.out"
check "3 shards of test_tensor pass (exit 0)" test $rc -eq 0
check "they ran its $whole tests once each" grep -q "^gtest_parallel: $whole passed, 0 failed, 0 skipped, 0 crashed or timed out, in 3 processes" "$tmp/real.out"

# 2. programs that print what GoogleTest prints: a pass with a skip, a failure, a crash
fake() {  # fake NAME BODY: an executable script
  printf '#!/usr/bin/env bash\n%s\n' "$2" >"$tmp/$1"
  chmod +x "$tmp/$1"
}
fake skips 'echo "[==========] 3 tests from 1 test suite ran. (1 ms total)"; echo "[  PASSED  ] 2 tests."; echo "[  SKIPPED ] 1 test, listed below:"; echo "[  SKIPPED ] A.B"'
fake fails 'echo "[==========] 2 tests from 1 test suite ran. (1 ms total)"; echo "[  PASSED  ] 1 test."; echo "[  FAILED  ] 1 test, listed below:"; echo "[  FAILED  ] A.Broken"; echo " 1 FAILED TEST"; exit 1'
fake crashes 'echo "[ RUN      ] A.C"; kill -SEGV $$'
fake hangs 'sleep 30'
"$RUN" --logs "$tmp/f1" "$tmp/skips:2" >"$tmp/f1.out"
check "skips alone do not fail the run" test $? -eq 0
check "skips are counted over both shards" grep -q "^gtest_parallel: 4 passed, 0 failed, 2 skipped, 0 crashed" "$tmp/f1.out"
"$RUN" --logs "$tmp/f2" "$tmp/skips" "$tmp/fails" >"$tmp/f2.out"
check "a failed test fails the run" test $? -eq 1
check "and is named" grep -q "fails.0: 1 passed, 1 failed, 0 skipped: A.Broken (" "$tmp/f2.out"
"$RUN" --logs "$tmp/f3" "$tmp/crashes" >"$tmp/f3.out"
check "a crash fails the run" test $? -eq 1
check "and is counted as one" grep -q "0 passed, 0 failed, 0 skipped, 1 crashed or timed out" "$tmp/f3.out"
"$RUN" --logs "$tmp/f4" --timeout 1 "$tmp/hangs" >"$tmp/f4.out"
check "a program past its timeout fails the run" test $? -eq 1
check "and says so" grep -q "hangs.0: TIMED OUT after 1s" "$tmp/f4.out"
"$RUN" "$tmp/none" >"$tmp/f5.out" 2>&1
check "a program that is not there is refused (exit 2)" test $? -eq 2
cat "$tmp/f2.out" "$tmp/f3.out" "$tmp/f4.out" "$tmp/f5.out"
exit $status
