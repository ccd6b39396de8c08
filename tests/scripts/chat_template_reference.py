#!/usr/bin/env python3
"""tests/scripts/chat_template_reference.py: transformers' own chat-template rendering as the
reference for ndtrain's (tokenizer/chat_template.h). Run it with the reference venv's python
(scripts/setup.sh --reference makes it; default ~/.cache/ndtrain/ref-venv, $NDT_REF_VENV):

  PY=~/.cache/ndtrain/ref-venv/bin/python
  $PY tests/scripts/chat_template_reference.py CASES.json OUT

CASES.json: [{"folder": MODEL_FOLDER, "messages": [{"role", "content"}, ...],
              "add_generation_prompt": bool, "extra": {...}}, ...]
(or "template": TEXT in place of "folder": that template, with no bos or eos token)
For each case the folder's template (chat_template.jinja, else tokenizer_config.json's
chat_template, a string or the "default" of a list) is rendered by
transformers.utils.chat_template_utils.render_jinja_template (what
tokenizer.apply_chat_template(tokenize=False) calls) with the folder's bos_token and
eos_token and the case's extra variables. OUT/tokenizer.json is a small byte-level BPE
trained here on the rendered texts, with the templates' control tokens (<|eot_id|>,
<|im_start|>, [INST], </s>, ...) as special tokens; OUT/ref.json holds per case
  {"text": ..., "ids": PreTrainedTokenizerFast.encode(text, add_special_tokens=False)}
or {"error": the exception's message} when the template raises.

Exit codes: 0 done; 3 with one line "transformers not available: ..." when transformers,
jinja2 or tokenizers cannot be imported (the C++ tests skip on it); 1 or 2 otherwise.
"""
import json
import os
import sys

SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
            "<|eom_id|>", "<|python_tag|>", "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<s>", "</s>", "[INST]",
            "[/INST]"]


def need():
    try:
        import tokenizers  # noqa: F401
        import transformers  # noqa: F401
        from transformers.utils.chat_template_utils import render_jinja_template  # noqa: F401
    except Exception as e:  # ImportError, or a broken install failing in its own way
        msg = f"{type(e).__name__}: {e}".splitlines()[0]
        print(f"transformers not available: {msg} (python {sys.executable}; "
              "scripts/setup.sh --reference makes the venv)", flush=True)
        sys.exit(3)


def load(folder):
    cfg = {}
    path = os.path.join(folder, "tokenizer_config.json")
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            cfg = json.load(f)
    jinja_path = os.path.join(folder, "chat_template.jinja")
    if os.path.exists(jinja_path):
        with open(jinja_path, encoding="utf-8") as f:
            template = f.read()
    else:
        template = cfg["chat_template"]
        if isinstance(template, list):
            template = {t["name"]: t["template"] for t in template}["default"]
    tokens = {}
    for key in ("bos_token", "eos_token"):
        v = cfg.get(key)
        if isinstance(v, dict):
            v = v.get("content")
        if v is not None:
            tokens[key] = v
    return template, tokens


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    need()
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers
    from transformers import PreTrainedTokenizerFast
    from transformers.utils.chat_template_utils import render_jinja_template
    with open(sys.argv[1], encoding="utf-8") as f:
        cases = json.load(f)
    out_dir = sys.argv[2]
    os.makedirs(out_dir, exist_ok=True)
    results = []
    for case in cases:
        template, tokens = load(case["folder"]) if "folder" in case else (case["template"], {})
        try:
            rendered, _ = render_jinja_template(conversations=[case["messages"]], chat_template=template,
                                                add_generation_prompt=case["add_generation_prompt"],
                                                **{**tokens, **case.get("extra", {})})
            results.append({"text": rendered[0]})
        except Exception as e:
            results.append({"error": str(e)})
    texts = [r["text"] for r in results if "text" in r]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(texts * 3, trainers.BpeTrainer(vocab_size=700, show_progress=False,
                                                            initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    bpe.add_special_tokens(SPECIALS)
    tok_path = os.path.join(out_dir, "tokenizer.json")
    bpe.save(tok_path)
    fast = PreTrainedTokenizerFast(tokenizer_file=tok_path)
    for r in results:
        if "text" in r:
            r["ids"] = fast.encode(r["text"], add_special_tokens=False)
    with open(os.path.join(out_dir, "ref.json"), "w", encoding="utf-8") as f:
        json.dump(results, f, ensure_ascii=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
