#!/usr/bin/env python3
"""bench/bench_tokenizer.py: encoding speed (MB/s) of ndtrain's tokenizer against Hugging Face's
tokenizers and tiktoken, on the same documents, tokenizer and thread count, in one run.

  ~/.cache/ndtrain/ref-venv/bin/python bench/bench_tokenizer.py [--build build] [--threads 1,2]
      [--repeat 5] [--tokenizer PATH ...] [FILE ...]

Run it with the reference venv's python (scripts/setup.sh --reference installs tokenizers and
tiktoken there); build bench_tokenizer first (cmake --build build --target bench_tokenizer).

The documents: the FILEs (default: the fortunes text, /usr/share/games/fortunes), each file one
document, read as UTF-8 with errors="replace". The tokenizers: the given tokenizer.json files, or
two trained here offline on the documents with the tokenizers package (kept in a temporary
folder between runs): "gpt2-style" (GPT-2's pipeline and size: ByteLevel with GPT-2's regex,
50,257 tokens) and "llama3-style" (Llama 3's regex, ignore_merges, 70,000 tokens and 256 special
tokens). tiktoken's own files are downloaded on first use, so its Encoding is built here from the
same tokenizer.json: mergeable_ranks from the vocabulary, pat_str from its regex.

Each library runs in its own process per thread count: ndtrain's bench_tokenizer (encode_batch,
OpenMP threads), tokenizers' encode_batch_fast (RAYON_NUM_THREADS) and tiktoken's
encode_ordinary_batch (num_threads); "ndtrain, one text" is the documents joined into one
text, which encode splits across the threads (the others have no such mode: their one text
runs on one thread). Each repeat loads the tokenizer afresh (a cold cache, as in
a new process) and times the encoding alone; the best repeat is reported. The ids of every
library are hashed (FNV-1a over the ids in order) and compared with tokenizers'.
"""
import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

# One library's timing, in a process of its own: argv = library, tokenizer.json, threads,
# repeats, the documents' list file. Prints one JSON line.
WORKER = r'''
import json, sys, time
lib, path, threads, repeat, listing = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
docs = [open(p, "rb").read().decode("utf-8", errors="replace") for p in open(listing).read().split("\n") if p]
nbytes = sum(len(d.encode("utf-8")) for d in docs)

def fnv(ids_lists):
    h = 0xCBF29CE484222325
    for ids in ids_lists:
        for i in ids:
            for k in range(4):
                h ^= (i >> (8 * k)) & 0xFF
                h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return "%016x" % h

def tiktoken_encoding(path):
    import tiktoken
    j = json.load(open(path))
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b); cs.append(256 + n); n += 1
    to_byte = {chr(c): b for b, c in zip(bs, cs)}
    ranks = {bytes(to_byte[ch] for ch in tok): i for tok, i in j["model"]["vocab"].items()
             if all(ch in to_byte for ch in tok)}
    pre = j["pre_tokenizer"]
    steps = pre["pretokenizers"] if pre["type"] == "Sequence" else [pre]
    split = [s for s in steps if s["type"] == "Split"]
    pat = split[0]["pattern"]["Regex"] if split else sys.argv[6]
    special = {a["content"]: a["id"] for a in j.get("added_tokens", []) if a["content"] not in j["model"]["vocab"]}
    return tiktoken.Encoding("bench", pat_str=pat, mergeable_ranks=ranks, special_tokens=special), tiktoken.__version__

best, out, version = 1e30, None, ""
for r in range(repeat):
    if lib == "tokenizers":
        import tokenizers
        tok = tokenizers.Tokenizer.from_file(path)
        version = tokenizers.__version__
        t0 = time.perf_counter()
        out = [e.ids for e in tok.encode_batch_fast(docs, add_special_tokens=False)]
    else:
        enc, version = tiktoken_encoding(path)
        t0 = time.perf_counter()
        out = enc.encode_ordinary_batch(docs, num_threads=threads)
    best = min(best, time.perf_counter() - t0)
print(json.dumps({"library": lib, "version": version, "threads": threads, "mb_per_s": nbytes / best / 1e6,
                  "bytes": nbytes, "tokens": sum(map(len, out)), "hash": fnv(out)}))
'''


def train(docs, out):
    """The two tokenizers trained on the documents (once: kept in `out`)."""
    from tokenizers import Tokenizer, Regex, models, pre_tokenizers, decoders, trainers
    made = {}
    for name in ["gpt2-style", "llama3-style"]:
        path = os.path.join(out, name, "tokenizer.json")
        made[name] = path
        if os.path.exists(path):
            continue
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if name == "gpt2-style":
            tok = Tokenizer(models.BPE())
            tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
            trainer = trainers.BpeTrainer(vocab_size=50257, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                          special_tokens=["<|endoftext|>"], show_progress=False)
        else:
            tok = Tokenizer(models.BPE(ignore_merges=True))
            tok.pre_tokenizer = pre_tokenizers.Sequence([
                pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
            trainer = trainers.BpeTrainer(vocab_size=70000, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                          show_progress=False)
        tok.decoder = decoders.ByteLevel()
        tok.train_from_iterator(docs, trainer)
        if name == "llama3-style":
            tok.add_special_tokens(["<|begin_of_text|>", "<|end_of_text|>"] +
                                   [f"<|reserved_special_token_{i}|>" for i in range(254)])
        tok.save(path + ".tmp")
        os.replace(path + ".tmp", path)
    return made


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"), help="the build folder (bench_tokenizer)")
    ap.add_argument("--threads", default="1,2", help="thread counts, comma-separated")
    ap.add_argument("--repeat", type=int, default=5, help="timed repeats per measurement (the best counts)")
    ap.add_argument("--tokenizer", action="append", help="a tokenizer.json (default: two trained here)")
    ap.add_argument("files", nargs="*", help="documents (default: the fortunes text)")
    a = ap.parse_args()
    try:
        import tokenizers  # noqa: F401
        import tiktoken  # noqa: F401
    except ImportError as e:
        sys.exit(f"bench_tokenizer.py: {e}: run it with the reference venv's python "
                 "(scripts/setup.sh --reference makes it)")
    binary = os.path.join(a.build, "bench_tokenizer")
    if not os.path.exists(binary):
        sys.exit(f"bench_tokenizer.py: no {binary}: cmake --build {a.build} --target bench_tokenizer")
    files = a.files or sorted(p for p in glob.glob("/usr/share/games/fortunes/*")
                              if os.path.isfile(p) and not os.path.islink(p) and not p.endswith(".dat"))
    if not files:
        sys.exit("bench_tokenizer.py: no documents (give FILEs, or install the fortunes text)")
    docs = [open(p, "rb").read().decode("utf-8", errors="replace") for p in files]
    if a.tokenizer:
        toks = {os.path.basename(os.path.dirname(os.path.abspath(p))) or p: p for p in a.tokenizer}
    else:
        toks = train(docs, os.path.join(tempfile.gettempdir(), "ndt_bench_tokenizer"))
    listing = os.path.join(tempfile.gettempdir(), f"ndt_bench_tokenizer_files_{os.getpid()}.txt")
    with open(listing, "w") as f:
        f.write("\n".join(os.path.abspath(p) for p in files) + "\n")
    nbytes = sum(os.path.getsize(p) for p in files)
    print(f"{len(files)} documents, {nbytes / 1e6:.2f} MB; best of {a.repeat}; {os.cpu_count()} cores here")
    rows = []
    for name, path in toks.items():
        for threads in [int(t) for t in a.threads.split(",")]:
            env = dict(os.environ, RAYON_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads))
            res = {}
            out = subprocess.run([binary, "--tokenizer", path, "--threads", str(threads), "--repeat", str(a.repeat)]
                                 + files, env=env, check=True, capture_output=True, text=True).stdout
            res["ndtrain"] = json.loads(out)
            res["ndtrain"]["version"] = "this build"
            out = subprocess.run([binary, "--tokenizer", path, "--threads", str(threads), "--repeat", str(a.repeat),
                                  "--one_text"] + files, env=env, check=True, capture_output=True, text=True).stdout
            res["ndtrain, one text"] = json.loads(out)
            res["ndtrain, one text"]["version"] = "this build"
            for lib in ["tokenizers", "tiktoken"]:
                out = subprocess.run([sys.executable, "-c", WORKER, lib, path, str(threads), str(a.repeat), listing,
                                      GPT2_PATTERN], env=env, check=True, capture_output=True, text=True).stdout
                res[lib] = json.loads(out)
            for lib in ["ndtrain", "tokenizers", "tiktoken", "ndtrain, one text"]:
                r = res[lib]
                same = "yes" if r["hash"] == res["tokenizers"]["hash"] else f"no ({r['tokens']} vs {res['tokenizers']['tokens']} ids)"
                if lib == "ndtrain, one text":  # other ids where the documents meet
                    same = "(another text)"
                rows.append((name, lib, r["version"], threads, r["mb_per_s"], same))
                print(f"  {name:13s} {lib:17s} {threads} thread(s): {r['mb_per_s']:7.2f} MB/s  ids as tokenizers': {same}",
                      flush=True)
    os.remove(listing)
    print("\n| tokenizer | library | version | threads | MB/s | ids equal tokenizers' |")
    print("|---|---|---|---|---|---|")
    for name, lib, version, threads, mbps, same in rows:
        print(f"| {name} | {lib} | {version} | {threads} | {mbps:.2f} | {same} |")


if __name__ == "__main__":
    main()
