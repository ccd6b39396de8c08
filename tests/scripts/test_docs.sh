#!/usr/bin/env bash
# The docs check (tests/scripts/check_docs.py): the paths, file:line references, config keys,
# program options and code names that README.md and docs/**/*.md quote still exist in the code,
# the README's layout block lists the folders there are, no docs page is too long, and the
# output the docs quote under `<!-- output-check -->` is what BUILD_DIR's programs print now
# (when BUILD_DIR/train_gpt is built; plans, not timings). First the checker's own test on
# small fixture trees (tests/scripts/test_check_docs.py), then the check of this repository.
# Skipped (exit 77) where there is no python3.
#   bash tests/scripts/test_docs.sh [BUILD_DIR]
set -uo pipefail
if ! command -v python3 >/dev/null; then
  echo "SKIPPED: no python3 here"
  exit 77
fi
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT" || exit 1
python3 tests/scripts/test_check_docs.py || exit 1
if [[ -n "${1:-}" && -x "$1/train_gpt" ]]; then
  exec python3 tests/scripts/check_docs.py --build "$1"
fi
echo "note: ${1:-no build folder given}: no train_gpt there, the quoted outputs are not run"
exec python3 tests/scripts/check_docs.py
