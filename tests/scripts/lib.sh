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

# small_byte_run STEPS EVAL_EVERY: the repository's docs as a byte-level corpus in $tmp/data
# ($BUILD/prepare_text) and $tmp/gpt.ini, a 2-layer model trained on it for STEPS steps,
# evaluated every EVAL_EVERY; the caller appends its own sections ([log], [sample], ...).
small_byte_run() {
  cat "$ROOT"/docs/*.md "$ROOT/README.md" >"$tmp/text.txt"
  "$BUILD/prepare_text" --out "$tmp/data" --vocab byte --val_fraction 0.1 "$tmp/text.txt" >/dev/null ||
    { echo "FAILED: prepare_text"; exit 1; }
  cat >"$tmp/gpt.ini" <<INI
[model]
n_layer = 2
n_head = 2
n_embd = 32
vocab_size = 256
block_size = 32
[data]
train = $tmp/data/train_*.bin
val = $tmp/data/val_*.bin
[train]
micro_batch_size = 4
seq_len = 32
steps = $1
eval_every = $2
eval_steps = 2
threads = 1
INI
}
