# tests/scripts/lib.sh: what the script tests share (sourced, not run): a scratch folder $tmp
# removed at exit, and check WHAT CONDITION... which prints ok/FAILED and remembers a failure
# in $status (each test ends with `exit $status`).
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
status=0
check() {  # check WHAT CONDITION...
  local what="$1"
  shift
  if "$@"; then echo "ok: $what"; else echo "FAILED: $what"; status=1; fi
}
