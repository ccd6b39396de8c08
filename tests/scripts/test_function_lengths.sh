#!/usr/bin/env bash
# No library function is over 80 lines (option tables excepted): tests/scripts/function_lengths.py
# over the library's folders, and a planted long function that it must find.
#   bash tests/scripts/test_function_lengths.sh [BUILD_DIR]   (BUILD_DIR is not used)
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
check="$ROOT/tests/scripts/function_lengths.py"
python3 "$check" || exit 1
# the checker finds a long function (a check that cannot fail is none)
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/nn"
{
  echo "namespace ndt {"
  echo "int long_one(int x,"
  echo "             int y) {"
  for i in $(seq 1 85); do echo "  x += y * $i;  // { not a brace \"}\""; done
  echo "  return x;"
  echo "}"
  echo "}  // namespace ndt"
} >"$tmp/nn/planted.cpp"
out="$(python3 "$check" --root "$tmp")"
if [[ "$out" != *"nn/planted.cpp:3: long_one is 88 lines"* ]]; then
  echo "FAILED: the planted 88-line function was not found: $out"
  exit 1
fi
echo "OK: no long functions; a planted one is found"
