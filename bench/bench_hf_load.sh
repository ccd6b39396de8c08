#!/usr/bin/env bash
# bench/bench_hf_load.sh: how much memory loading a sharded Hugging Face folder costs each rank.
#
#   bench/bench_hf_load.sh                        # a ~200M-parameter llama in 100 MB shards
#   bench/bench_hf_load.sh --layouts 1,fsdp2,fsdp4,tp2
#   NDT_HF_LOAD_SHARD=50MB bench/bench_hf_load.sh    # smaller shard files
#
# Makes a random Llama with transformers (LlamaForCausalLM.save_pretrained, max_shard_size
# 100MB: about 9 shard files and an index), then for each layout runs train_gpt twice with
# --train.steps 0 (evaluate, no training): once with --model.init_from the folder and once
# from random weights of the same shapes. Each rank's peak resident memory (getrusage's
# ru_maxrss, through /usr/bin/time) is printed for both; the difference is what reading the
# folder cost that rank beyond the parameters it holds anyway. Needs the reference venv
# (scripts/setup.sh --reference; $NDT_REF_VENV) and build/train_gpt.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${NDT_BUILD_DIR:-$ROOT/build}"
PY="${NDT_REF_VENV:-$HOME/.cache/ndtrain/ref-venv}/bin/python"
LAYOUTS="1,fsdp2,fsdp4,tp2"
[[ "${1:-}" == "--layouts" ]] && LAYOUTS="$2"
[[ -x "$PY" ]] || { echo "bench_hf_load: no reference venv at $PY (scripts/setup.sh --reference)" >&2; exit 1; }
[[ -x "$BUILD/train_gpt" ]] || { echo "bench_hf_load: build $BUILD/train_gpt first" >&2; exit 1; }
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

"$PY" - "$WORK/model" "${NDT_HF_LOAD_SHARD:-100MB}" <<'PYEOF'
import sys, torch, transformers
torch.manual_seed(0)
cfg = transformers.LlamaConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=12,
                               num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=256,
                               rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=False)
m = transformers.LlamaForCausalLM(cfg)
m.save_pretrained(sys.argv[1], max_shard_size=sys.argv[2])
print(f"folder: {sum(p.numel() for p in m.parameters()) / 1e6:.1f}M parameters", file=sys.stderr)
PYEOF
FILES=$(ls "$WORK/model"/*.safetensors | wc -l)
MB=$(du -sm "$WORK/model" | cut -f1)
cat > "$WORK/eval.ini" <<INI
[data]
train = $ROOT/data/fortunes/train_*.bin
val = $ROOT/data/fortunes/val_*.bin
[train]
micro_batch_size = 1
seq_len = 64
eval_steps = 1
steps = 0
device = cpu
dtype = float32
[sample]
length = 0
INI
# the random twin: the folder's shapes written out as model.* keys
SHAPES="--model.arch llama --model.n_layer 12 --model.n_head 16 --model.n_kv_head 4 --model.n_embd 1024 \
--model.intermediate_size 2816 --model.vocab_size 32000 --model.block_size 256 --model.norm_eps 1e-5 \
--model.rope_theta 500000 --model.tie_embeddings false"

# peak RSS (MiB) of each rank: "rank max_rss_mib" lines
run() {  # run NP PARALLEL_ARGS MODEL_ARGS
  local np=$1 par=$2 model=$3
  mpirun --allow-run-as-root --oversubscribe -np "$np" -x OMP_NUM_THREADS=1 \
    /usr/bin/time -f "maxrss_kib %M" -o "$WORK/rss.%q{OMPI_COMM_WORLD_RANK}" \
    "$BUILD/train_gpt" --config "$WORK/eval.ini" $par $model > "$WORK/log" 2>&1 ||
    { tail -5 "$WORK/log" >&2; exit 1; }
  grep -h "final val loss" "$WORK/log" | head -1 >&2 || true
  local worst=0
  for f in "$WORK"/rss.*; do
    local k; k=$(awk '/maxrss_kib/ {print $2}' "$f"); ((k > worst)) && worst=$k
  done
  rm -f "$WORK"/rss.*
  echo $((worst / 1024))
}

echo "folder: $MB MB in $FILES safetensors files (12 layers, C 1024, 16 heads, 4 kv heads, vocab 32000)"
echo
echo "| layout | ranks | peak RSS per rank, from the folder (MiB) | from random weights (MiB) | loading's extra (MiB) |"
echo "|---|---:|---:|---:|---:|"
IFS=, read -ra L <<< "$LAYOUTS"
for lay in "${L[@]}"; do
  case "$lay" in
    1) np=1; par="" ;;
    fsdp*) np=${lay#fsdp}; par="--parallel.dp_shard_size $np" ;;
    tp*) np=${lay#tp}; par="--parallel.tp_size $np" ;;
    *) echo "bench_hf_load: unknown layout $lay (1, fsdpN, tpN)" >&2; exit 2 ;;
  esac
  a=$(run "$np" "$par" "--model.init_from $WORK/model")
  b=$(run "$np" "$par" "$SHAPES")
  echo "| $lay | $np | $a | $b | $((a - b)) |"
done
