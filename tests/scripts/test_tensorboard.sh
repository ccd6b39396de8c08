#!/usr/bin/env bash
# log.tensorboard read back by TensorBoard itself: train_gpt trains a few steps with a
# validation set, and tensorboard's EventAccumulator (the reader behind `tensorboard --logdir`)
# loads the directory; every scalar is there with one value per step, equal to metrics.jsonl's,
# and every sample is in its text plugin.
# Then a run that stopped past its last checkpoint is resumed into the same directory: each
# step is there once.
#   bash tests/scripts/test_tensorboard.sh BUILD_DIR
# Skipped (exit 77) without the built programs or without the reference venv's tensorboard
# (scripts/setup.sh --reference installs it).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="$(cd "${1:-$ROOT/build}" 2>/dev/null && pwd)" || { echo "SKIPPED: no build folder ${1:-}"; exit 77; }
for p in train_gpt prepare_text; do
  [[ -x "$BUILD/$p" ]] || { echo "SKIPPED: $BUILD/$p is not built"; exit 77; }
done
py="${NDT_REF_VENV:-$HOME/.cache/ndtrain/ref-venv}/bin/python"
"$py" -c "from tensorboard.backend.event_processing.event_accumulator import EventAccumulator" 2>/dev/null ||
  { echo "SKIPPED: no tensorboard in the reference venv (scripts/setup.sh --reference)"; exit 77; }
source "$ROOT/tests/scripts/lib.sh"

small_byte_run 10 5
cat >>"$tmp/gpt.ini" <<INI
[log]
metrics = $tmp/metrics.jsonl
tensorboard = $tmp/tb
[sample]
every = 5
length = 24
INI
"$BUILD/train_gpt" --config "$tmp/gpt.ini" >"$tmp/train.log" 2>&1 || { cat "$tmp/train.log"; echo "FAILED: train_gpt"; exit 1; }
check "train_gpt names the event file" grep -q "^tensorboard: $tmp/tb/events.out.tfevents." "$tmp/train.log"

"$py" - "$tmp/tb" "$tmp/metrics.jsonl" <<'PY' >"$tmp/verdict.txt" 2>&1
import json, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
acc = EventAccumulator(sys.argv[1], size_guidance={"scalars": 0, "tensors": 0})
acc.Reload()
tags = sorted(acc.Tags()["scalars"])
print("tags:", " ".join(tags))
rows = [json.loads(l) for l in open(sys.argv[2])]
steps = [r for r in rows if "loss" in r]
vals = [r for r in rows if "val_loss" in r]
ok = True
def same(tag, key, want_rows):
    global ok
    got = [(e.step, e.value) for e in acc.Scalars(tag)]
    want = [(r["step"], r[key]) for r in want_rows]
    good = len(got) == len(want) and all(gs == ws and abs(gv - wv) <= 1e-6 * max(1, abs(wv))
                                         for (gs, gv), (ws, wv) in zip(got, want))
    print(f"{tag}: {len(got)} values, metrics.jsonl {len(want)}: {'same' if good else 'DIFFERENT'}")
    ok = ok and good
for tag, key in [("loss/train", "loss"), ("lr", "lr"), ("grad_norm", "grad_norm"),
                 ("throughput/tokens_per_sec", "tokens_per_sec"), ("time/step_ms", "ms"),
                 ("memory/in_use_bytes", "mem_in_use"), ("memory/peak_bytes", "mem_peak")]:
    same(tag, key, steps)
same("loss/val", "val_loss", vals)
print("wall times increase:", all(a.wall_time <= b.wall_time for a, b in zip(acc.Scalars("lr"), acc.Scalars("lr")[1:])))
# the samples, in the Text tab: each one a Markdown code block of the sample's lines
samples = [r for r in rows if "sample" in r]
texts = [(e.step, e.tensor_proto.string_val[0].decode("utf-8")) for e in acc.Tensors("samples")]
plugin = acc.SummaryMetadata("samples").plugin_data.plugin_name if texts else ""
def same_text(tb, js):
    if "\ufffd" in tb or "\ufffd" in js:  # bytes that are not UTF-8: both replace them, maybe not alike
        return len(tb) > 0
    return tb == "\n".join("    " + l for l in js.split("\n"))
good_samples = (plugin == "text" and len(samples) >= 2 and [s for s, _ in texts] == [r["step"] for r in samples]
                and all(same_text(t, r["sample"]) for (_, t), r in zip(texts, samples)))
print(f"samples: {len(texts)} in TensorBoard's text plugin ({plugin!r}), metrics.jsonl {len(samples)}: "
      f"{'same' if good_samples else 'DIFFERENT'}")
print("verdict:", "ok" if ok and good_samples and len(vals) == 3 else "FAILED")
PY
cat "$tmp/verdict.txt"
check "TensorBoard reads every scalar, equal to metrics.jsonl" grep -q '^verdict: ok$' "$tmp/verdict.txt"

# ---- a run that stopped after step 6 but saved last at step 3, then resumed: TensorBoard
# shows each step once, the resumed run's values from step 4 on (its SessionLog START) ----
rerun=(--train.steps 6 --checkpoint.dir "$tmp/ck" --checkpoint.every 3 --log.tensorboard "$tmp/tb2"
       --log.metrics "$tmp/m2.jsonl")
"$BUILD/train_gpt" --config "$tmp/gpt.ini" "${rerun[@]}" >"$tmp/run1.log" 2>&1 ||
  { cat "$tmp/run1.log"; echo "FAILED: train_gpt"; exit 1; }
rm -rf "$tmp/ck/step_00000006" "$tmp/ck/latest"
sleep 1.1  # event files sort by the second in their names: the resumed run's comes after
"$BUILD/train_gpt" --config "$tmp/gpt.ini" "${rerun[@]}" --checkpoint.resume true >"$tmp/run2.log" 2>&1 ||
  { cat "$tmp/run2.log"; echo "FAILED: train_gpt (resumed)"; exit 1; }
check "the resumed run started at step 3" grep -q "at step 3$" "$tmp/run2.log"
"$py" - "$tmp/tb2" "$tmp/m2.jsonl" <<'PY' >"$tmp/verdict2.txt" 2>&1
import json, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
acc = EventAccumulator(sys.argv[1], size_guidance={"scalars": 0})
acc.Reload()
got = [(e.step, e.value) for e in acc.Scalars("loss/train")]
want = [(r["step"], r["loss"]) for r in map(json.loads, open(sys.argv[2])) if "loss" in r]
print("loss/train steps:", [s for s, _ in got], "metrics.jsonl:", [s for s, _ in want])
good = [s for s, _ in got] == list(range(1, 7)) and len(got) == len(want) and all(
    gs == ws and abs(gv - wv) <= 1e-6 * max(1, abs(wv)) for (gs, gv), (ws, wv) in zip(got, want))
print("verdict:", "ok" if good else "FAILED")
PY
cat "$tmp/verdict2.txt"
check "after a resume TensorBoard holds every step once, equal to metrics.jsonl" grep -q '^verdict: ok$' "$tmp/verdict2.txt"
exit $status
