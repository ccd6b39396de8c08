#!/usr/bin/env bash
# examples/fortunes_chat/, the bundled chat data set of the README's "Your own data":
# scripts/make_fortunes_chat.py makes its files again byte for byte from the fortunes text;
# prepare_text takes the folder as a chat model's (545 rows through its template, the
# assistants' tokens trained); where the reference venv is, transformers' AutoTokenizer on the
# folder renders and tokenizes every row into the ids prepare_text wrote; and
# configs/llama/sft_tiny.ini trains on it, its validation loss falling by a nat in 60 steps.
# Skipped (exit 77) without the fortunes text or the built programs.
#   bash tests/scripts/test_fortunes_chat.sh BUILD_DIR
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="$(cd "${1:-$ROOT/build}" 2>/dev/null && pwd)" || { echo "SKIPPED: no build folder ${1:-}"; exit 77; }
for p in train_gpt prepare_text; do
  [[ -x "$BUILD/$p" ]] || { echo "SKIPPED: $BUILD/$p is not built"; exit 77; }
done
[[ -f /usr/share/games/fortunes/riddles ]] || { echo "SKIPPED: no fortunes text (scripts/setup.sh installs it)"; exit 77; }
source "$ROOT/tests/scripts/lib.sh"
DATA="$ROOT/examples/fortunes_chat"

python3 "$ROOT/scripts/make_fortunes_chat.py" --out "$tmp/made" >"$tmp/made.log" 2>&1
check "make_fortunes_chat.py runs" test $? -eq 0
for f in chats.jsonl tokenizer.json tokenizer_config.json; do
  check "it makes $f again byte for byte" cmp "$DATA/$f" "$tmp/made/$f"
done

"$BUILD/prepare_text" --out "$tmp/data" --tokenizer "$DATA" --val_fraction 0.1 "$DATA/chats.jsonl" >"$tmp/prep.log" 2>&1
check "prepare_text takes the folder and its rows" test $? -eq 0
cat "$tmp/prep.log"
check "545 rows, each a document through the template, part of it trained" \
  grep -q "vocabulary of 959 .*; 545 documents, 17514 of their 29217 tokens trained" "$tmp/prep.log"

VENV="${NDT_REF_VENV:-$HOME/.cache/ndtrain/ref-venv}"
if [[ -x "$VENV/bin/python" ]] && "$VENV/bin/python" -c "import transformers" 2>/dev/null; then
  check "transformers renders and tokenizes every row into prepare_text's ids" \
    env HF_HUB_OFFLINE=1 "$VENV/bin/python" - "$DATA" "$tmp/data" <<'PY'
import json, struct, sys
from transformers import AutoTokenizer
folder, data = sys.argv[1], sys.argv[2]
tok = AutoTokenizer.from_pretrained(folder)
want = []
for line in open(f"{folder}/chats.jsonl"):
    ids = tok.apply_chat_template(json.loads(line)["messages"], tokenize=True)
    want += ids if isinstance(ids, list) else ids["input_ids"]
got = []
for name in ["train_000000.bin", "val_000000.bin"]:
    raw = open(f"{data}/{name}", "rb").read()
    n = struct.unpack("<3i", raw[:12])[2]
    got += list(struct.unpack(f"<{n}H", raw[1024:1024 + 2 * n]))
print(f"  transformers: {len(want)} tokens, prepare_text: {len(got)}")
sys.exit(0 if got == want else 1)
PY
else
  echo "note: no reference venv at $VENV (scripts/setup.sh --reference): transformers' ids not compared"
fi

"$BUILD/train_gpt" --config "$ROOT/configs/llama/sft_tiny.ini" --out '' --train.steps 60 --train.eval_every 60 \
  --sample.every -1 --data.train "$tmp/data/train_*.bin" --data.val "$tmp/data/val_*.bin" >"$tmp/train.log" 2>&1
check "configs/llama/sft_tiny.ini trains on it" test $? -eq 0
grep "val loss" "$tmp/train.log"
first="$(sed -n 's/^step 0 | val loss //p' "$tmp/train.log")"
last="$(sed -n 's/^final val loss //p' "$tmp/train.log")"
check "the validation loss falls by a nat in 60 steps (${first:-?} -> ${last:-?})" \
  awk -v a="${first:-0}" -v b="${last:-9}" 'BEGIN { exit !(b < a - 1) }'
exit $status
