#!/usr/bin/env bash
# tests/scripts/hf_reference.py, the transformers reference of the Llama/Qwen2 tests: `make`
# writes a model folder and reference.safetensors / reference.json with every tensor the C++
# tests read, for llama (llama3 rope scaling, every branch of it) and qwen2 (q/k/v biases);
# `eval` reloads the saved folder and its loss on a token shard equals the loss of the same
# tokens computed from make's logits (so the folder, the shard format and the windows agree).
# Skipped (exit 77) where the reference venv ($NDT_REF_VENV, default ~/.cache/ndtrain/ref-venv;
# scripts/setup.sh --reference makes it) is missing or cannot import torch/transformers.
#   bash tests/scripts/test_hf_reference.sh [BUILD_DIR]   (BUILD_DIR is not used)
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="${NDT_REF_VENV:-$HOME/.cache/ndtrain/ref-venv}"
PY="$VENV/bin/python"
if [[ ! -x "$PY" ]]; then
  echo "SKIPPED: no reference venv at $VENV (scripts/setup.sh --reference makes it)"
  exit 77
fi
source "$ROOT/tests/scripts/lib.sh"
REF="$ROOT/tests/scripts/hf_reference.py"

for arch in llama qwen2; do
  "$PY" "$REF" make "$tmp/$arch" --arch "$arch" --seed 1 >"$tmp/$arch.log" 2>&1
  rc=$?
  cat "$tmp/$arch.log"
  if [[ $rc -eq 3 ]]; then
    echo "SKIPPED: $(head -1 "$tmp/$arch.log")"
    exit 77
  fi
  check "make --arch $arch (exit 0)" test "$rc" -eq 0
  for f in model/config.json model/model.safetensors reference.safetensors reference.json; do
    check "$arch: $f written" test -s "$tmp/$arch/$f"
  done
done

# The tensors, their names, dtypes and shapes; the rope and the parameters of each arch.
check "reference.safetensors holds what the C++ tests read" "$PY" - "$tmp" <<'PY'
import json, sys
from safetensors import safe_open
tmp = sys.argv[1]
ok = True
def want(cond, what):
    global ok
    if not cond:
        print("  wrong:", what)
        ok = False
for arch in ["llama", "qwen2"]:
    info = json.load(open(f"{tmp}/{arch}/reference.json"))
    names = [p["name"] for p in info["parameters"]]
    with safe_open(f"{tmp}/{arch}/reference.safetensors", "np") as f:
        t = {k: f.get_tensor(k) for k in f.keys()}
    with safe_open(f"{tmp}/{arch}/model/model.safetensors", "np") as f:
        w = {k: f.get_tensor(k) for k in f.keys()}
    want(sorted(w) == sorted(names), f"{arch}: the folder's tensors are the parameters")
    want(sorted(t) == sorted(["inputs", "targets", "logits", "loss"] + ["grad." + n for n in names]),
         f"{arch}: tensor names {sorted(t)}")
    want(t["inputs"].dtype.name == "int32" and t["inputs"].shape == (2, 16), f"{arch}: inputs")
    want(t["targets"].dtype.name == "int32" and t["targets"].shape == (2, 16), f"{arch}: targets")
    want((t["inputs"][:, 1:] == t["targets"][:, :-1]).all(), f"{arch}: targets are the next tokens")
    want(t["logits"].dtype.name == "float64" and t["logits"].shape == (2, 16, 96), f"{arch}: logits")
    want(t["loss"].shape == (1,) and abs(t["loss"][0] - info["loss"]) < 1e-12, f"{arch}: loss")
    for n in names:
        want(t["grad." + n].shape == w[n].shape and abs(t["grad." + n]).max() > 0,
             f"{arch}: grad.{n} has the parameter's shape and is not zero")
        if n.endswith("norm.weight"):
            want(abs(w[n] - 1).max() > 0.1, f"{arch}: {n} is not all ones")
    want(info["float64_patches"] and info["patched_vs_stock_logits_max_abs_diff"] < 1e-4,
         f"{arch}: float64 patched, a precision change only")
    want(all(n in names for n in ["lm_head.weight", "model.embed_tokens.weight", "model.norm.weight"]),
         f"{arch}: untied lm_head, embeddings, final norm")
    biases = [n for n in names if n.endswith(".bias")]
    if arch == "qwen2":
        want(len(biases) == 6 and all(".self_attn." in n and "o_proj" not in n for n in biases),
             f"qwen2: q/k/v biases only: {biases}")
        want(all(abs(w[n]).max() > 0 for n in biases), "qwen2: biases randomised")
        want(info["rope"]["params"]["rope_type"] == "default", "qwen2: default rope")
    else:
        r = info["rope"]
        want(not biases, f"llama: no biases: {biases}")
        want(r["params"]["rope_type"] == "llama3" and (r["kept"], r["smoothed"], r["divided"]) == (1, 1, 6),
             f"llama: llama3 scaling keeps 1, smooths 1, divides 6 frequencies: {r}")
sys.exit(0 if ok else 1)
PY

# eval: a shard holding row 0 of llama's batch (T+1 = 17 tokens); one window of 16. Its loss
# from the reloaded folder (float64) equals row 0's mean cross-entropy from make's logits.
"$PY" - "$tmp" <<'PY'
import struct, sys
import numpy as np
from safetensors.numpy import load_file
tmp = sys.argv[1]
t = load_file(f"{tmp}/llama/reference.safetensors")
row = list(t["inputs"][0]) + [int(t["targets"][0, -1])]
with open(f"{tmp}/row0.bin", "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, len(row), *([0] * 253)))
    f.write(struct.pack(f"<{len(row)}H", *row))
z = t["logits"][0]
lse = np.log(np.exp(z - z.max(-1, keepdims=True)).sum(-1)) + z.max(-1)
ce = (lse - z[np.arange(16), t["targets"][0]]).mean()
open(f"{tmp}/row0.want", "w").write(f"{ce:.17g}\n")
PY
"$PY" "$REF" eval "$tmp/llama/model" --tokens "$tmp/row0.bin" --seq-len 16 --batch-size 1 \
  --batches 1 --dtype float64 >"$tmp/eval.txt" 2>&1
rc=$?
cat "$tmp/eval.txt"
check "eval the saved llama folder (exit 0)" test "$rc" -eq 0
check "eval prints one line 'loss <value>'" grep -Eq '^loss [0-9.eE+-]+$' "$tmp/eval.txt"
check "eval's loss (float64) equals make's for the same tokens (1e-12)" python3 -c "
import sys; a = float(open(sys.argv[1]).read().split()[1]); b = float(open(sys.argv[2]).read())
print('  eval', a, 'make', b); sys.exit(abs(a - b) > 1e-12)" "$tmp/eval.txt" "$tmp/row0.want"

# qwen2 in float32, two batches of 2: loss near float64's; too few tokens is an error.
"$PY" - "$tmp" <<'PY'
import random, struct, sys
random.seed(5)
tok = [random.randrange(96) for _ in range(65)]  # 2 batches x 2 x 16 + 1
with open(f"{sys.argv[1]}/val.bin", "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, len(tok), *([0] * 253)))
    f.write(struct.pack(f"<{len(tok)}H", *tok))
PY
for dt in float32 float64; do
  "$PY" "$REF" eval "$tmp/qwen2/model" --tokens "$tmp/val.bin" --seq-len 16 --batch-size 2 \
    --batches 2 --dtype $dt >"$tmp/q_$dt.txt" 2>&1
  check "eval qwen2 $dt (exit 0)" test $? -eq 0
  cat "$tmp/q_$dt.txt"
done
check "qwen2: float32 and float64 eval agree (1e-5)" python3 -c "
import sys; a, b = (float(open(p).read().split()[1]) for p in sys.argv[1:]); sys.exit(abs(a - b) > 1e-5)" \
  "$tmp/q_float32.txt" "$tmp/q_float64.txt"
"$PY" "$REF" eval "$tmp/qwen2/model" --tokens "$tmp/val.bin" --seq-len 16 --batch-size 2 \
  --batches 3 >"$tmp/short.txt" 2>&1
rc=$?
check "a shard too short for the batches is an error naming the counts" \
  bash -c "[[ $rc -ne 0 ]] && grep -q '65 tokens, 3 batches of 2 x 16 need 97' '$tmp/short.txt'"
exit $status
