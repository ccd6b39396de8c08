#!/usr/bin/env python3
"""A tiny chat data set and its tokenizer folder, made from Debian's fortunes text.

Writes into OUT (default examples/fortunes_chat):
  chats.jsonl            {"messages": [user, assistant]} rows: "Tell me a fortune about X."
                         answered by a short fortune of the fortunes file X, and the Q:/A:
                         riddles of the fortunes text answered by their A: line
  tokenizer.json         a byte-level BPE (GPT-2's pre-tokenizer) trained here on those rows,
                         with the special tokens <|endoftext|>, <|im_start|> and <|im_end|>
  tokenizer_config.json  a Qwen2.5-style ChatML template (no default system prompt), eos <|im_end|>

Only the Python standard library; the same fortunes text gives the same files byte for byte.
  python3 scripts/make_fortunes_chat.py [--fortunes /usr/share/games/fortunes] [--out DIR]
"""
import argparse
import collections
import hashlib
import json
import os
import re
import sys

# the fortunes files asked about, each with its name in the question
TOPICS = {"art": "art", "computers": "computers", "education": "school", "food": "food",
          "kids": "kids", "law": "the law", "linux": "Linux", "literature": "books",
          "love": "love", "medicine": "medicine", "pets": "pets",
          "science": "science", "sports": "sports", "wisdom": "wisdom", "work": "work"}
PER_TOPIC = 30
ASKS = ["Tell me a fortune about {}.", "A fortune about {}, please.", "What do the fortunes say about {}?"]
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = 700  # 256 bytes + 700 merges + 3 special tokens: a vocabulary of 959
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")


def entries(path):
    """The fortunes of one file, each with its whitespace runs made one space."""
    with open(path, encoding="utf-8", errors="replace") as f:
        return [" ".join(e.split()) for e in f.read().split("\n%\n") if e.strip()]


def short(e):
    return 40 <= len(e) <= 160 and e.isascii() and "Q:" not in e


def rows(fortunes):
    out = []
    for i, (name, topic) in enumerate(TOPICS.items()):
        picks = [e for e in entries(os.path.join(fortunes, name)) if short(e)]
        if len(picks) < PER_TOPIC:
            sys.exit(f"make_fortunes_chat: {name} has {len(picks)} short fortunes, {PER_TOPIC} needed")
        for k in range(PER_TOPIC):  # evenly spread over the file, the same every time
            answer = picks[k * len(picks) // PER_TOPIC]
            out.append([ASKS[(i + k) % len(ASKS)].format(topic), answer])
    riddle = re.compile(r"^Q: (.+?) A: (.+)$")
    for name in ["riddles"] + list(TOPICS):
        for e in entries(os.path.join(fortunes, name)):
            m = riddle.match(e)
            if m and e.isascii() and len(e) <= 200 and " Q: " not in m.group(2):
                out.append([m.group(1), m.group(2)])
    # in an order of their own (by hash), so that the validation split's last rows hold every kind
    out.sort(key=lambda qa: hashlib.sha256((qa[0] + "\n" + qa[1]).encode()).hexdigest())
    return [{"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}
            for q, a in out]


def byte_chars():
    """GPT-2's bytes_to_unicode: each byte as a printable character."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    bs += list(range(ord("®"), 256))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def train_bpe(texts, merges):
    """Byte-level BPE merges over GPT-2's pre-tokens (ASCII classes: the text is ASCII)."""
    split = re.compile(r"'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+")
    chars = byte_chars()
    words = collections.Counter()
    for t in texts:
        for w in split.findall(t):
            words[tuple(chars[b] for b in w.encode("utf-8"))] += 1
    vocab = [chars[b] for b in sorted(chars, key=lambda b: ord(chars[b]))]
    rules = []
    for _ in range(merges):
        pairs = collections.Counter()
        for w, n in words.items():
            for p in zip(w, w[1:]):
                pairs[p] += n
        if not pairs:
            break
        best = max(pairs, key=lambda p: (pairs[p], [-ord(c) for c in p[0] + p[1]]))
        rules.append(best)
        if best[0] + best[1] not in vocab:  # ("a", "bc") and ("ab", "c") make one token
            vocab.append(best[0] + best[1])
        merged = collections.Counter()
        for w, n in words.items():
            i, out = 0, []
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == best:
                    out.append(w[i] + w[i + 1])
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            merged[tuple(out)] += n
        words = merged
    return vocab, rules


def tokenizer_json(vocab, rules):
    ids = {t: i for i, t in enumerate(vocab)}
    added = [{"id": len(vocab) + i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for i, s in enumerate(SPECIALS)]
    level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
            "normalizer": None, "pre_tokenizer": level, "post_processor": None, "decoder": level,
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                      "ignore_merges": False, "vocab": ids, "merges": [list(r) for r in rules]}}


def tokenizer_config(n_vocab):
    added = {str(n_vocab + i): {"content": s, "lstrip": False, "normalized": False, "rstrip": False,
                                "single_word": False, "special": True} for i, s in enumerate(SPECIALS)}
    return {"added_tokens_decoder": added, "bos_token": None, "eos_token": "<|im_end|>",
            "pad_token": "<|endoftext|>", "model_max_length": 256, "clean_up_tokenization_spaces": False,
            "tokenizer_class": "PreTrainedTokenizerFast", "chat_template": CHAT_TEMPLATE}


def write(path, text):
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8", newline="\n") as f:
        f.write(text)
    os.replace(tmp, path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fortunes", default="/usr/share/games/fortunes", help="the fortunes files' folder")
    ap.add_argument("--out", help="default: examples/fortunes_chat of this repository",
                    default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples",
                                         "fortunes_chat"))
    a = ap.parse_args()
    missing = [n for n in ["riddles"] + list(TOPICS) if not os.path.isfile(os.path.join(a.fortunes, n))]
    if missing:
        sys.exit(f"make_fortunes_chat: {a.fortunes} lacks {', '.join(missing)}: install the packages "
                 "fortunes and fortunes-min (scripts/setup.sh does), or give --fortunes")
    data = rows(a.fortunes)
    vocab, rules = train_bpe([m["content"] for r in data for m in r["messages"]] + ["user\n", "assistant\n"],
                             MERGES)
    os.makedirs(a.out, exist_ok=True)
    write(os.path.join(a.out, "chats.jsonl"), "".join(json.dumps(r) + "\n" for r in data))
    write(os.path.join(a.out, "tokenizer.json"), json.dumps(tokenizer_json(vocab, rules), indent=1) + "\n")
    config = tokenizer_config(len(vocab))
    write(os.path.join(a.out, "tokenizer_config.json"), json.dumps(config, indent=1) + "\n")
    print(f"make_fortunes_chat: {len(data)} rows, a vocabulary of {len(vocab) + len(SPECIALS)}, in "
          f"{os.path.normpath(a.out)}")


if __name__ == "__main__":
    main()
