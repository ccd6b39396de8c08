#!/usr/bin/env bash
# Formats the C++ sources as .clang-format says, in place, with clang-format 14 (the version
# the test suite checks with: tests/scripts/test_format.sh). With file arguments, only those.
#   scripts/format.sh                  # every tracked .h, .cpp, .cu, .cuh outside third_party/
#   scripts/format.sh train/trainer.cpp
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
command -v clang-format-14 >/dev/null || { echo "format: clang-format-14 is missing (apt-get install clang-format-14)" >&2; exit 1; }
if [[ $# -gt 0 ]]; then
  files=("$@")
else
  mapfile -t files < <(git ls-files '*.h' '*.cpp' '*.cu' '*.cuh' | grep -v '^third_party/')
fi
clang-format-14 --style=file -i "${files[@]}"
echo "format: ${#files[@]} files"
