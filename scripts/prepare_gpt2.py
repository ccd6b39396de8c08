#!/usr/bin/env python3
"""Tokenize text files with GPT-2's BPE (tiktoken) into llm.c-format shards for train_gpt.

    pip install tiktoken numpy
    python3 scripts/prepare_gpt2.py --out data/mytext --val_fraction 0.05 FILE...

Writes DIR/train_NNNNNN.bin and DIR/val_000000.bin (int32 header[256] = {20240520, 1, ntok},
then uint16 tokens), the same format as prepare_text and llm.c. Train with
model.vocab_size = 50257 (and model.vocab_multiple = 128 for speed). Optional: nothing in the
build or the tests needs it.
"""
import argparse
import os

import numpy as np


def write_shard(path, tokens):
    header = np.zeros(256, dtype=np.int32)
    header[0], header[1], header[2] = 20240520, 1, len(tokens)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(header.tobytes())
        f.write(np.asarray(tokens, dtype=np.uint16).tobytes())
    os.replace(tmp, path)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--val_fraction", type=float, default=0.05)
    ap.add_argument("--shard_tokens", type=int, default=100_000_000)
    ap.add_argument("files", nargs="+")
    a = ap.parse_args()
    import tiktoken

    enc = tiktoken.get_encoding("gpt2")
    tokens = []
    for path in a.files:
        with open(path, encoding="utf-8", errors="replace") as f:
            tokens.append(enc.eot_token)  # documents are separated by <|endoftext|>
            tokens.extend(enc.encode_ordinary(f.read()))
    n_val = max(1, int(len(tokens) * a.val_fraction))
    train, val = tokens[:-n_val], tokens[-n_val:]
    os.makedirs(a.out, exist_ok=True)
    for i, s in enumerate(range(0, len(train), a.shard_tokens)):
        write_shard(os.path.join(a.out, f"train_{i:06d}.bin"), train[s : s + a.shard_tokens])
    write_shard(os.path.join(a.out, "val_000000.bin"), val)
    print(f"{len(tokens)} GPT-2 tokens: {len(train)} train, {len(val)} val, in {a.out}")


if __name__ == "__main__":
    main()
