#!/usr/bin/env bash
# scripts/train_fortunes.sh: the main job. On a fresh machine: installs what ndtrain needs
# and builds it (scripts/setup.sh), turns the text of Debian's fortune cookies (installed by
# setup) into character-level token shards (build/prepare_text -> data/fortunes/), and
# trains a small GPT on CPU for a few minutes (configs/fortunes_char.ini), printing the
# loss, the validation loss, samples, and writing out/fortunes/report.html.
#
#   scripts/train_fortunes.sh                       # setup + data + training
#   scripts/train_fortunes.sh --train.steps 100     # extra arguments go to train_gpt
#   scripts/train_fortunes.sh --data-only           # setup + data, no training (out/ untouched)
#
# It builds only train_gpt and prepare_text (scripts/test.sh builds the rest). NDT_BUILD_DIR,
# NDT_CUDA and NDT_BUILD_TARGETS work as in scripts/setup.sh.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${NDT_BUILD_DIR:-build}"
[[ "$BUILD" = /* ]] || BUILD="$ROOT/$BUILD"
CORPUS=/usr/share/games/fortunes
DATA_ONLY=0
if [[ "${1:-}" == --data-only ]]; then
  DATA_ONLY=1
  shift
fi

# the main job needs two programs: the tests and benchmarks are built by scripts/test.sh
NDT_BUILD_TARGETS="${NDT_BUILD_TARGETS:-train_gpt prepare_text}" "$ROOT/scripts/setup.sh"
cd "$ROOT"
# data/fortunes is this script's own folder: a whole preparation there (its preparation.json,
# written last) is kept; anything else there (an interrupted or an older preparation) is
# replaced (--overwrite)
if [[ ! -f data/fortunes/preparation.json ]]; then
  [[ -d "$CORPUS" ]] || { echo "[train] error: $CORPUS not found; run scripts/setup.sh (it installs fortunes)" >&2; exit 1; }
  # the cookie files themselves: not the .dat indexes, not the .u8 links to the same files
  mapfile -t files < <(find "$CORPUS" -maxdepth 1 -type f ! -name '*.dat' | sort)
  echo "[train] preparing data/fortunes from ${#files[@]} files in $CORPUS"
  "$BUILD/prepare_text" --out data/fortunes --vocab char --val_fraction 0.05 --overwrite "${files[@]}"
fi
if [[ $DATA_ONLY -eq 1 ]]; then
  echo "[train] data/fortunes is ready ($(ls data/fortunes/*.bin | wc -l) shards)"
  exit 0
fi
vocab_size=$(sed -n 's/^ *"size": *\([0-9]*\).*/\1/p' data/fortunes/vocab.json)
echo "[train] $BUILD/train_gpt --config configs/fortunes_char.ini --model.vocab_size $vocab_size $*"
exec "$BUILD/train_gpt" --config configs/fortunes_char.ini --model.vocab_size "$vocab_size" "$@"
