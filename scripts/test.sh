#!/usr/bin/env bash
# scripts/test.sh: build if needed, then run the whole test suite with CTest.
#
#   scripts/test.sh                 # every test; GPU tests skip without a GPU
#   scripts/test.sh -L gradcheck    # one label: unit, gradcheck, gpu (later: dist)
#   scripts/test.sh -R Smoke        # extra arguments go to ctest
#
# Uses NDT_BUILD_DIR (default: build) like scripts/setup.sh; runs the full setup when the
# build folder is not configured yet. The exit code is ctest's.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${NDT_BUILD_DIR:-build}"
[[ "$BUILD" = /* ]] || BUILD="$ROOT/$BUILD"

if [[ -f "$BUILD/CMakeCache.txt" ]]; then
  "$ROOT/scripts/setup.sh" --build-only
else
  echo "[test] $BUILD is not configured yet: running scripts/setup.sh"
  "$ROOT/scripts/setup.sh"
fi

echo "[test] ctest --test-dir $BUILD --output-on-failure -j2 $*"
rc=0
ctest --test-dir "$BUILD" --output-on-failure -j2 "$@" || rc=$?
echo "[test] ctest exit code $rc"
exit "$rc"
