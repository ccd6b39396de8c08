#!/usr/bin/env bash
# The C++ sources are formatted as .clang-format says: every tracked .h, .cpp, .cu and .cuh
# outside third_party/, checked by clang-format 14 (Debian 12's; scripts/setup.sh installs
# it; another version formats some constructs differently, so only 14 is asked). A file
# that differs is named with clang-format's first complaint; `scripts/format.sh` fixes them.
# Skipped (exit 77) where clang-format-14 or git is missing.
#   bash tests/scripts/test_format.sh [BUILD_DIR]   (BUILD_DIR is not used)
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT" || exit 1
if ! command -v clang-format-14 >/dev/null; then
  echo "SKIPPED: no clang-format-14 here (scripts/setup.sh installs it)"
  exit 77
fi
if ! git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  echo "SKIPPED: not a git checkout (the check formats the tracked files)"
  exit 77
fi
mapfile -t files < <(git ls-files '*.h' '*.cpp' '*.cu' '*.cuh' | grep -v '^third_party/')
bad=0
for f in "${files[@]}"; do
  [[ -f "$f" ]] || continue
  if ! out="$(clang-format-14 --style=file --dry-run --Werror "$f" 2>&1)"; then
    echo "FAILED: $f is not formatted: $(printf '%s\n' "$out" | head -1)"
    bad=$((bad + 1))
  fi
done
if [[ $bad -gt 0 ]]; then
  echo "FAILED: $bad of ${#files[@]} files differ from .clang-format; run scripts/format.sh"
  exit 1
fi
echo "ok: ${#files[@]} files formatted as .clang-format says"
