#!/usr/bin/env bash
# The docs check (tests/scripts/check_docs.py): the paths, file:line references, config keys
# and program options that README.md and docs/**/*.md quote still exist in the code. Needs no
# build; skipped (exit 77) where there is no python3.
#   bash tests/scripts/test_docs.sh [BUILD_DIR]   (BUILD_DIR is not used)
set -uo pipefail
if ! command -v python3 >/dev/null; then
  echo "SKIPPED: no python3 here"
  exit 77
fi
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT" && exec python3 tests/scripts/check_docs.py
