#!/usr/bin/env bash
# The docs check (tests/scripts/check_docs.py): the paths, file:line references, config keys,
# program options and code names that README.md and docs/**/*.md quote still exist in the code,
# the README's layout block lists the folders there are, and no docs page is too long. First
# the checker's own test on small fixture trees (tests/scripts/test_check_docs.py), then the
# check of this repository. Needs no build; skipped (exit 77) where there is no python3.
#   bash tests/scripts/test_docs.sh [BUILD_DIR]   (BUILD_DIR is not used)
set -uo pipefail
if ! command -v python3 >/dev/null; then
  echo "SKIPPED: no python3 here"
  exit 77
fi
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT" || exit 1
python3 tests/scripts/test_check_docs.py || exit 1
exec python3 tests/scripts/check_docs.py
