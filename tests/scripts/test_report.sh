#!/usr/bin/env bash
# The training report (log.report) as a browser sees it: train_gpt trains a few steps on two
# ranks (one without mpirun) on a small byte-level corpus, then a headless Chromium loads the
# page from disk and a probe script (added to a copy of the page; the report itself has no
# script) reads the parsed SVG back: every chart the metrics call for is there, no other, and
# every line in it has as many points as metrics.jsonl has values, drawn with a non-zero width.
# The samples are on the page, and a screenshot of it is taken (kept at $NDT_REPORT_SCREENSHOT
# when that is set).
#   bash tests/scripts/test_report.sh BUILD_DIR
# Skipped (exit 77) without the built programs, python3, or a headless Chromium (Debian:
# apt-get install chromium-headless-shell, ~290 MB installed, not installed by scripts/setup.sh).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="$(cd "${1:-$ROOT/build}" 2>/dev/null && pwd)" || { echo "SKIPPED: no build folder ${1:-}"; exit 77; }
for p in train_gpt prepare_text; do
  [[ -x "$BUILD/$p" ]] || { echo "SKIPPED: $BUILD/$p is not built"; exit 77; }
done
command -v python3 >/dev/null || { echo "SKIPPED: no python3 here"; exit 77; }
browser=""
for b in chromium-headless-shell chromium chromium-browser google-chrome; do
  command -v "$b" >/dev/null && { browser="$(command -v "$b")"; break; }
done
[[ -n "$browser" ]] || {
  echo "SKIPPED: no headless Chromium to load the report (apt-get install chromium-headless-shell)"
  exit 77
}
source "$ROOT/tests/scripts/lib.sh"

# ---- a run: 12 steps, evaluations at 0, 6 and the end, a sample at step 6 and at the end ----
small_byte_run 12 6
cat >>"$tmp/gpt.ini" <<INI
[optim]
lr = 0.01
warmup_steps = 3
[log]
metrics = $tmp/out/metrics.jsonl
report = $tmp/out/report.html
[sample]
every = 6
length = 40
prompt = <a & b>
INI
launch=("$BUILD/train_gpt") ranks=1
if command -v mpirun >/dev/null; then
  ranks=2
  launch=("$ROOT/scripts/mpirun" -np 2 --oversubscribe --bind-to none "$BUILD/train_gpt" --parallel.dp_shard_size 2)
fi
"${launch[@]}" --config "$tmp/gpt.ini" >"$tmp/train.log" 2>&1
rc=$?
[[ $rc -eq 0 ]] || { cat "$tmp/train.log"; echo "FAILED: train_gpt (exit $rc)"; exit 1; }
check "train_gpt ran ($ranks ranks)" test "$rc" -eq 0
check "it wrote the report" test -s "$tmp/out/report.html"

# ---- the browser: the page as parsed, and a screenshot -----------------------------------------
flags=(--headless --no-sandbox --disable-gpu --no-first-run --disable-dev-shm-usage --allow-file-access-from-files)
run_browser() { timeout 120 "$browser" "${flags[@]}" "$@" 2>>"$tmp/browser.log"; }
# the probe: per chart, each polyline's name, point count (SVGPointList: it was parsed as SVG)
# and drawn width (getBBox: it was laid out)
probe="<script>
const out = [];
for (const f of document.querySelectorAll('figure.chart'))
  for (const p of f.querySelectorAll('polyline'))
    out.push([f.dataset.metric, p.dataset.series, p.points.numberOfItems, p.getBBox().width.toFixed(1)].join('|'));
document.body.setAttribute('data-probe', out.join(';'));
</script>"
python3 - "$tmp/out/report.html" "$tmp/probe.html" "$probe" <<'PY'
import sys
page = open(sys.argv[1], encoding="utf-8").read()
open(sys.argv[2], "w", encoding="utf-8").write(page.replace("</body>", sys.argv[3] + "</body>"))
PY
run_browser --dump-dom "file://$tmp/probe.html" >"$tmp/dom.html"
grep -q 'data-probe=' "$tmp/dom.html" || { tail -20 "$tmp/browser.log"; echo "FAILED: $browser did not load the page"; exit 1; }
check "the browser loaded the page" true
run_browser --screenshot="$tmp/shot.png" --window-size=1000,2600 --hide-scrollbars "file://$tmp/out/report.html" >/dev/null
check "a screenshot of it (> 20 kB)" test "$(stat -c %s "$tmp/shot.png" 2>/dev/null || echo 0)" -gt 20000
[[ -n "${NDT_REPORT_SCREENSHOT:-}" && -f "$tmp/shot.png" ]] && cp "$tmp/shot.png" "$NDT_REPORT_SCREENSHOT"

# ---- what the page shows against what metrics.jsonl holds -------------------------------------
python3 - "$tmp/out/metrics.jsonl" "$tmp/dom.html" <<'PY' >"$tmp/verdict.txt"
import html, json, re, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
dom = open(sys.argv[2], encoding="utf-8").read()
steps = [r for r in rows if "loss" in r]
vals = [r for r in rows if "val_loss" in r]
samples = [r for r in rows if "sample" in r]
nonzero = lambda k: any(r.get(k, 0) for r in steps)
want = ["loss", "lr", "grad_norm", "tokens_per_sec", "mfu" if nonzero("mfu") else "gflops_per_sec"]
want += ["mem_in_use"] if nonzero("mem_in_use") or nonzero("mem_peak") else []
want += ["comm_bytes"] if nonzero("comm_bytes") else []
want += ["ms"]
probe = html.unescape(re.search(r'data-probe="([^"]*)"', dom).group(1))
lines = [p.split("|") for p in probe.split(";") if p]
charts = list(dict.fromkeys(m for m, *_ in lines))
print("charts:", " ".join(charts))
print("expected:", " ".join(want))
bad = [l for l in lines if float(l[3]) <= 0 or int(l[2]) < 1]
print("empty lines:", bad)
counts = {(m, s): int(n) for m, s, n, _ in lines}
expect_counts = {("loss", "train"): len(steps), ("loss", "train, smoothed"): len(steps),
                 ("lr", "lr"): len(steps), ("ms", "step time"): len(steps)}
if vals: expect_counts[("loss", "validation")] = len(vals)
if nonzero("comm_bytes"): expect_counts[("comm_bytes", "sent")] = len(steps)
wrong = {k: (counts.get(k), v) for k, v in expect_counts.items() if counts.get(k) != v}
print("point counts wrong:", wrong)
shown = len(re.findall(r'<pre class="sample"', dom))
print(f"steps {len(steps)}, evaluations {len(vals)}, samples {len(samples)} (shown {shown})")
ok = charts == want and not bad and not wrong and shown == len(samples) and len(samples) > 0
print("verdict:", "ok" if ok else "FAILED")
PY
cat "$tmp/verdict.txt"
check "every chart the metrics call for, each line with all its points" grep -q '^verdict: ok$' "$tmp/verdict.txt"
check "the sample's prompt is escaped, not markup" grep -q '&lt;a &amp; b&gt;' "$tmp/out/report.html"
check "the page fetches nothing" bash -c "! grep -Eq '(src|href)=.(https?:|//)' '$tmp/out/report.html'"
exit $status
