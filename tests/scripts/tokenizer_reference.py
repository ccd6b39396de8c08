#!/usr/bin/env python3
"""tests/scripts/tokenizer_reference.py: Hugging Face's `tokenizers` (and transformers) as the
reference for ndtrain's tokenizer (tokenizer/). Run it with the reference venv's python
(scripts/setup.sh --reference makes it; default ~/.cache/ndtrain/ref-venv, $NDT_REF_VENV):

  PY=~/.cache/ndtrain/ref-venv/bin/python
  $PY tests/scripts/tokenizer_reference.py train OUT CORPUS_FILE...
  $PY tests/scripts/tokenizer_reference.py encode TOKENIZER TEXT_FILE OUT.json
  $PY tests/scripts/tokenizer_reference.py documents TOKENIZER OUT.json FILE...
  $PY tests/scripts/tokenizer_reference.py regexes CASES.json OUT

Exit codes: 0 done; 3 with one line "tokenizers not available: ..." when tokenizers (or, for
train, transformers) cannot be imported (the C++ tests skip on it); 1 or 2 otherwise.

train OUT CORPUS_FILE...
  Trains tokenizers offline on the corpus files (read as UTF-8, errors="replace"), each in its
  own folder under OUT as tokenizer.json:
    gpt2/      GPT-2's pipeline: ByteLevel pre-tokenizer with GPT-2's regex, 4,096 tokens (all
               256 bytes) and <|endoftext|>; the merges in the "a b" form
    llama3/    Llama 3's: Split with Llama 3's regex (Unicode classes, a lookahead, (?i:...)),
               then ByteLevel without regex; ignore_merges; 70,000 tokens, then 256 special
               tokens from id 70,000 (<|begin_of_text|>, <|end_of_text|>, ..., reserved ones),
               so ids pass 65,535; TemplateProcessing puts <|begin_of_text|> first; merges as pairs
    unk/       no byte alphabet given (bytes the corpus lacks have no token), unk_token <unk>
               with fuse_unk; a Digits pre-tokenizer (each digit alone, as SmolLM's) before ByteLevel
    drop/      the same vocabulary without unk_token: unknown bytes are dropped
    added/     gpt2's model, an NFKC normalizer and added tokens with every flag: special and not,
               lstrip, rstrip, single_word, normalized (one whose NFKC form differs)
    splits/    gpt2's model behind splits of every behavior (Removed, MergedWithPrevious,
               MergedWithNext, Contiguous, invert, a String pattern) and add_prefix_space
    qwen2-tiny/   saved by transformers (save_pretrained) for a tiny random Qwen2: its Qwen2Tokenizer
               (NFC, Qwen2's regex) from a 3,000-token vocabulary, and the model's config.json
    llama3-tiny/  saved by transformers: PreTrainedTokenizerFast over llama3/'s tokenizer with
               bos <|begin_of_text|> and eos <|end_of_text|>, and a tiny Llama's config.json

encode TOKENIZER TEXT_FILE OUT.json
  TOKENIZER: a tokenizer.json or a folder holding one. The text file's bytes are read as Python
  reads them with errors="replace" (the tokenizers package takes str only). Writes
    ids            encode(text, add_special_tokens=False).ids
    ids_special    encode(text, add_special_tokens=True).ids
    ids_plain      the same as ids with encode_special_tokens=True (special tokens as text)
    decoded        decode(ids) (UTF-8 bytes as a list of ints), and decoded_skip with
                   skip_special_tokens=True; roundtrip: decode(ids) == the text
    vocab_size     get_vocab_size(with_added_tokens=True); versions

documents TOKENIZER OUT.json FILE...
  The token stream prepare_text --tokenizer writes: each file (errors="replace"; files with NUL
  bytes are skipped as binary) is one document, preceded by the tokenizer's BOS when its
  post-processor adds one (encode("", add_special_tokens=True)), else by <|endoftext|>; the text
  is encoded with encode_special_tokens=True. Writes {"ids": [...], "separator": [...]}.

regexes CASES.json OUT
  CASES.json: [{"name": ..., "pattern": ..., "text": ...}, ...]. For each, OUT/NAME/ holds a
  tokenizer.json whose pre-tokenizer is Split(Regex(pattern), isolated) then ByteLevel without
  regex, trained on the text (so that its pieces become whole tokens), and ref.json with
    ids      encode(text).ids
    pieces   the Split's pieces (pre_tokenize_str), as UTF-8 byte lists
  A pattern Oniguruma refuses gives ref.json {"error": "..."} and no tokenizer.json.
"""
import json
import os
import sys

GPT2_PATTERN = None  # ByteLevel(use_regex=True) applies it
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def need(*names):
    """Imports the modules or exits 3 with one line."""
    mods = []
    try:
        for n in names:
            mods.append(__import__(n))
    except Exception as e:  # ImportError, or a broken install failing in its own way
        msg = f"{type(e).__name__}: {e}".splitlines()[0]
        print(f"tokenizers not available: {msg} (python {sys.executable}; "
              "scripts/setup.sh --reference makes the venv)", flush=True)
        sys.exit(3)
    return mods


def read_text(path):
    with open(path, "rb") as f:
        return f.read().decode("utf-8", errors="replace")


def tokenizer_path(path):
    return os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f)


def train(out, corpus):
    (tokenizers,) = need("tokenizers")
    from tokenizers import Tokenizer, Regex, AddedToken, models, pre_tokenizers, decoders, trainers, processors

    texts = [read_text(p) for p in corpus]
    byte_level = pre_tokenizers.ByteLevel
    alphabet = byte_level.alphabet()

    def save(tok, name):
        os.makedirs(os.path.join(out, name), exist_ok=True)
        tok.save(os.path.join(out, name, "tokenizer.json"))

    def bpe_json(tok, pair_merges):
        """The model's JSON; merges as "a b" strings (GPT-2's files) or as pairs (newer files)."""
        j = json.loads(tok.to_str())
        if not pair_merges:
            j["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m for m in j["model"]["merges"]]
        return j

    # gpt2: ByteLevel with GPT-2's regex
    gpt2 = Tokenizer(models.BPE())
    gpt2.pre_tokenizer = byte_level(add_prefix_space=False)
    gpt2.decoder = decoders.ByteLevel()
    gpt2.post_processor = processors.ByteLevel(trim_offsets=False)
    gpt2.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=4096, initial_alphabet=alphabet,
                                                        special_tokens=["<|endoftext|>"], show_progress=False))
    gpt2_json = bpe_json(gpt2, pair_merges=False)
    save(Tokenizer.from_str(json.dumps(gpt2_json)), "gpt2")

    # llama3: Llama 3's regex, ignore_merges, special tokens after the vocabulary, BOS template
    llama = Tokenizer(models.BPE(ignore_merges=True))
    llama.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        byte_level(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    llama.decoder = decoders.ByteLevel()
    llama.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=70000, initial_alphabet=alphabet,
                                                         show_progress=False))
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                "<|reserved_special_token_1|>", "<|start_header_id|>", "<|end_header_id|>",
                "<|reserved_special_token_2|>", "<|eot_id|>"]
    specials += [f"<|reserved_special_token_{i}|>" for i in range(3, 251)]
    llama.add_special_tokens(specials)
    llama.post_processor = processors.Sequence([
        processors.ByteLevel(add_prefix_space=True, trim_offsets=False, use_regex=True),
        processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                      pair="<|begin_of_text|> $A <|begin_of_text|> $B:1",
                                      special_tokens=[("<|begin_of_text|>", llama.token_to_id("<|begin_of_text|>"))])])
    save(llama, "llama3")

    # unk: bytes outside the corpus have no token; unk_token fused; digits alone first
    unk = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True))
    unk.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 byte_level(add_prefix_space=False, use_regex=True)])
    unk.decoder = decoders.ByteLevel()
    unk.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=1000, special_tokens=["<unk>"],
                                                       show_progress=False))
    save(unk, "unk")
    drop_json = json.loads(unk.to_str())
    drop_json["model"]["unk_token"] = None
    save(Tokenizer.from_str(json.dumps(drop_json)), "drop")

    # added: every flag of added tokens, behind an NFKC normalizer
    added = Tokenizer.from_str(json.dumps(gpt2_json))
    from tokenizers import normalizers
    added.normalizer = normalizers.NFKC()
    added.add_special_tokens([AddedToken("<mask>", lstrip=True, rstrip=False, normalized=False, special=True),
                              AddedToken("[SEP]", lstrip=False, rstrip=True, normalized=False, special=True)])
    added.add_tokens([AddedToken("hello world", single_word=True, normalized=True),
                      AddedToken("\ufb01x", normalized=True),     # "ﬁx": NFKC makes it "fix"
                      AddedToken("New", single_word=True, lstrip=True, rstrip=True, normalized=False),
                      AddedToken("  ", normalized=False),
                      AddedToken("mo", normalized=True)])
    save(added, "added")

    # splits: every split behavior, invert, a String pattern, add_prefix_space
    splits = Tokenizer.from_str(json.dumps(gpt2_json))
    splits.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(" ", behavior="merged_with_previous"),
        pre_tokenizers.Split(Regex(r"\d+"), behavior="merged_with_next"),
        pre_tokenizers.Split(Regex(r"[aeiou]"), behavior="contiguous", invert=True),
        pre_tokenizers.Split(Regex(r"x"), behavior="removed"),
        pre_tokenizers.Split(Regex(r"[.,]"), behavior="isolated", invert=True),
        byte_level(add_prefix_space=True, use_regex=True)])
    save(splits, "splits")

    # saved by transformers for tiny random models
    (transformers,) = need("transformers")
    from transformers import Qwen2Tokenizer, PreTrainedTokenizerFast, Qwen2Config, LlamaConfig
    small = Tokenizer(models.BPE())
    small.pre_tokenizer = byte_level(add_prefix_space=False)
    small.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=3000, initial_alphabet=alphabet,
                                                         show_progress=False))
    sj = json.loads(small.to_str())
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in sj["model"]["merges"]]
    vocab = dict(sj["model"]["vocab"])
    qwen = Qwen2Tokenizer(vocab=vocab, merges=merges)
    qwen.save_pretrained(os.path.join(out, "qwen2-tiny"))
    Qwen2Config(vocab_size=len(qwen), hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2).save_pretrained(os.path.join(out, "qwen2-tiny"))
    fast = PreTrainedTokenizerFast(tokenizer_file=os.path.join(out, "llama3", "tokenizer.json"),
                                   bos_token="<|begin_of_text|>", eos_token="<|end_of_text|>")
    fast.save_pretrained(os.path.join(out, "llama3-tiny"))
    LlamaConfig(vocab_size=len(fast), hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2).save_pretrained(os.path.join(out, "llama3-tiny"))
    print(f"trained on {len(texts)} files ({sum(map(len, texts))} characters) into {out}; "
          f"tokenizers {tokenizers.__version__}, transformers {transformers.__version__}")


def encode(tok_path, text_path, out):
    (tokenizers,) = need("tokenizers")
    tok = tokenizers.Tokenizer.from_file(tokenizer_path(tok_path))
    text = read_text(text_path)
    ids = tok.encode(text, add_special_tokens=False).ids
    res = {"ids": ids, "ids_special": tok.encode(text, add_special_tokens=True).ids}
    tok.encode_special_tokens = True
    res["ids_plain"] = tok.encode(text, add_special_tokens=False).ids
    decoded = tok.decode(ids, skip_special_tokens=False)
    res["decoded"] = list(decoded.encode("utf-8"))
    res["decoded_skip"] = list(tok.decode(ids, skip_special_tokens=True).encode("utf-8"))
    res["roundtrip"] = decoded == text
    res["vocab_size"] = tok.get_vocab_size(with_added_tokens=True)
    res["tokenizers"] = tokenizers.__version__
    write_json(out, res)


def documents(tok_path, out, files):
    (tokenizers,) = need("tokenizers")
    tok = tokenizers.Tokenizer.from_file(tokenizer_path(tok_path))
    sep = tok.encode("", add_special_tokens=True).ids or [tok.token_to_id("<|endoftext|>")]
    tok.encode_special_tokens = True
    ids = []
    for p in files:
        with open(p, "rb") as f:
            raw = f.read()
        if b"\0" in raw:
            continue
        ids += sep + tok.encode(raw.decode("utf-8", errors="replace"), add_special_tokens=False).ids
    write_json(out, {"ids": ids, "separator": sep})


def regexes(cases_path, out):
    (tokenizers,) = need("tokenizers")
    from tokenizers import Tokenizer, Regex, models, pre_tokenizers, decoders, trainers

    with open(cases_path) as f:
        cases = json.load(f)
    for case in cases:
        folder = os.path.join(out, case["name"])
        os.makedirs(folder, exist_ok=True)
        try:
            split = pre_tokenizers.Split(Regex(case["pattern"]), behavior="isolated", invert=False)
        except Exception as e:  # Oniguruma refuses the pattern
            write_json(os.path.join(folder, "ref.json"), {"error": str(e)})
            continue
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            split, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        tok.decoder = decoders.ByteLevel()
        text = case["text"]
        tok.train_from_iterator([text] * 4, trainers.BpeTrainer(
            vocab_size=2000, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
        tok.save(os.path.join(folder, "tokenizer.json"))
        pieces = [list(p.encode("utf-8")) for p, _ in split.pre_tokenize_str(text)]
        write_json(os.path.join(folder, "ref.json"), {"ids": tok.encode(text).ids, "pieces": pieces})


def main():
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        return 0 if len(sys.argv) >= 2 else 2
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "train" and len(args) >= 2:
        train(args[0], args[1:])
    elif cmd == "encode" and len(args) == 3:
        encode(*args)
    elif cmd == "documents" and len(args) >= 3:
        documents(args[0], args[1], args[2:])
    elif cmd == "regexes" and len(args) == 2:
        regexes(*args)
    else:
        print(f"tokenizer_reference.py: bad arguments {sys.argv[1:]} (see --help)", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
