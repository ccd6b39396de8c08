#!/usr/bin/env bash
# bench/bench_prepare.sh: prepare_text against Hugging Face datasets on a chat .jsonl
# (bench/bench_prepare.py says what is measured). It makes its own venv the first time,
# ~/.cache/ndtrain/data-bench-venv (NDT_DATA_BENCH_VENV): datasets, transformers and tokenizers
# from PyPI with their dependencies (no torch), about 300 MB. Needs build/prepare_text.
#   bench/bench_prepare.sh [--mb 50] [--procs 2] [--repeat 2] [--build build]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${NDT_DATA_BENCH_VENV:-$HOME/.cache/ndtrain/data-bench-venv}"
pins=(datasets==5.2.0 transformers==5.25.0 tokenizers==0.23.3 jinja2==3.1.6)
probe="import datasets, transformers, tokenizers
assert (datasets.__version__, transformers.__version__, tokenizers.__version__) == ('5.2.0', '5.25.0', '0.23.3')"
if ! { [[ -x "$venv/bin/python" ]] && "$venv/bin/python" -c "$probe" 2>/dev/null; }; then
  echo "[bench_prepare] making $venv: ${pins[*]}"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --progress-bar off --disable-pip-version-check --only-binary=:all: -q "${pins[@]}"
  "$venv/bin/python" -c "$probe"
fi
exec "$venv/bin/python" "$ROOT/bench/bench_prepare.py" "$@"
