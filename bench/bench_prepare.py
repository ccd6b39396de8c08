#!/usr/bin/env python3
"""bench/bench_prepare.py: preparing a chat dataset for fine-tuning, ndtrain's prepare_text
against Hugging Face datasets' map with the fast tokenizer's apply_chat_template, on the same
rows, tokenizer, template and cores, in one run.

  bench/bench_prepare.sh [--mb 50] [--procs 2] [--repeat 2]      # makes its venv, then runs this

The rows: examples/fortunes_chat/chats.jsonl (545 conversations) repeated, each copy's
questions numbered so that no two rows are equal, up to --mb megabytes of .jsonl. The
tokenizer and template: examples/fortunes_chat (a byte-level BPE of 959 tokens, ChatML).
ndtrain: `prepare_text --tokenizer examples/fortunes_chat --threads P FILE` (reading,
rendering each conversation through the template, tokenizing, the loss masks of the
assistant's turns, the shards written). datasets: load_dataset("json") then
map(apply_chat_template(tokenize=True), batched, num_proc=P), caching off, into a fresh
cache folder; its output is token ids only (no loss masks: the template has no {% generation %}
markers, so transformers cannot give the assistant's tokens), so it does less than ndtrain.
Each side's best of --repeat runs (wall time, the process started and ended inside it). The
ids of the first 200 rows are compared between the two.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOKENIZER = os.path.join(ROOT, "examples", "fortunes_chat")

HF_SCRIPT = r"""
import sys, time, datasets, transformers
path, procs, cache = sys.argv[1], int(sys.argv[2]), sys.argv[3]
datasets.disable_caching()
t0 = time.perf_counter()
tok = transformers.AutoTokenizer.from_pretrained(sys.argv[4])
ds = datasets.load_dataset("json", data_files=path, split="train", cache_dir=cache)
def render(batch):
    return {"input_ids": [tok.apply_chat_template(m, tokenize=True, return_dict=False) for m in batch["messages"]]}
out = ds.map(render, batched=True, num_proc=procs, remove_columns=ds.column_names)
n = sum(len(x) for x in out["input_ids"])
print(time.perf_counter() - t0, n, len(out))
import json as j
print(j.dumps(out["input_ids"][:200]))
"""


def make_rows(path, mb):
    rows = [json.loads(line) for line in open(os.path.join(TOKENIZER, "chats.jsonl"))]
    size, copy = 0, 0
    with open(path, "w") as f:
        while size < mb * 1e6:
            for r in rows:
                m = [dict(x) for x in r["messages"]]
                m[0]["content"] = f"{m[0]['content']} ({copy})"
                line = json.dumps({"messages": m}) + "\n"
                f.write(line)
                size += len(line.encode())
            copy += 1
    return size, copy * len(rows)


def run_ndtrain(build, path, procs, out):
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    r = subprocess.run([os.path.join(build, "prepare_text"), "--out", out, "--tokenizer", TOKENIZER,
                        "--threads", str(procs), "--val_fraction", "0.001", path],
                       capture_output=True, text=True)
    dt = time.perf_counter() - t0
    if r.returncode:
        sys.exit("prepare_text failed:\n" + r.stdout + r.stderr)
    return dt, r.stdout


def ndtrain_docs(out, n):
    """The first n documents of the shards (uint16 after a 256 x int32 header)."""
    import array
    raw = open(os.path.join(out, "train_000000.bin"), "rb").read()
    ids = array.array("H", raw[1024:])
    starts = open(os.path.join(out, "train_000000.docs"), "rb").read()
    docs, cur = [], []
    for i, t in enumerate(ids):
        if starts[i] and cur:
            docs.append(cur)
            cur = []
            if len(docs) == n:
                break
        cur.append(t)
    return docs


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--mb", type=float, default=50)
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=2)
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="ndt_bench_prepare_")
    try:
        path = os.path.join(tmp, "chats.jsonl")
        size, rows = make_rows(path, a.mb)
        print(f"rows: {rows} conversations, {size / 1e6:.1f} MB of .jsonl; tokenizer {TOKENIZER}; "
              f"{a.procs} threads / processes")
        nd = []
        for _ in range(a.repeat):
            dt, log = run_ndtrain(a.build, path, a.procs, os.path.join(tmp, "nd"))
            nd.append(dt)
        hf, hf_ids = [], None
        for k in range(a.repeat):
            cache = os.path.join(tmp, f"hf_cache{k}")
            r = subprocess.run([sys.executable, "-c", HF_SCRIPT, path, str(a.procs), cache, TOKENIZER],
                               capture_output=True, text=True)
            if r.returncode:
                sys.exit("datasets failed:\n" + r.stderr[-3000:])
            lines = r.stdout.strip().split("\n")
            hf.append(float(lines[-2].split()[0]))
            hf_ids = json.loads(lines[-1])
        same = ndtrain_docs(os.path.join(tmp, "nd"), len(hf_ids)) == hf_ids
        print(log.strip().split("\n")[-2])
        print()
        print("| | best of %d (s) | MB/s | conversations/s |" % a.repeat)
        print("|---|---:|---:|---:|")
        for name, t in (("ndtrain prepare_text", min(nd)), ("datasets map + apply_chat_template", min(hf))):
            print(f"| {name} | {t:.2f} | {size / 1e6 / t:.1f} | {rows / t:,.0f} |")
        print(f"\nndtrain is {min(hf) / min(nd):.1f}x faster; the first {len(hf_ids)} conversations' ids "
              f"{'are equal' if same else 'DIFFER'}")
        return 0 if same else 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
