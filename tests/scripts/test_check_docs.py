#!/usr/bin/env python3
"""The docs check's own test: check_docs.py on small fixture trees (a README.md, a docs page and
a few C++ files in a temporary folder) must exit 1 with the expected message for each kind of
drift, and 0 on the clean tree. Python 3 standard library only; run by test_docs.sh.

    python3 tests/scripts/test_check_docs.py
"""
import os
import shutil
import subprocess
import sys
import tempfile

CHECKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "check_docs.py")

# the clean tree: every name the README quotes is in the code, the layout lists every folder
SOURCES = {
    "nn/layers.h": """// the layers
namespace ndt::nn {
class LinearComm {};
class Linear {
 public:
  int forward(int x) const;   // "before" in a comment or a string does not count
  const LinearComm* comm = nullptr;
};
}  // namespace ndt::nn
""",
    "nn/layers.cpp": '#include "nn/layers.h"\nnamespace ndt::nn {\nint Linear::forward(int x) const { return x; }\n}\n',
    "dist/comm/mpi.cpp": "namespace ndt::dist {\nint all_reduce(int x) { return x; }\n}\n",
    "dist/pipeline_parallel/stages.cpp": "namespace ndt::dist {\nint stage_blocks(int n) { return n; }\n}\n",
    # `before` is an identifier here, but not of Linear: `Linear::before` must still fail
    "train/trainer.cpp": "int step(int before) { return before + 1; }\n",
    "train/config.cpp": "// no options in this fixture\n",
}
README = """# fixture

The layers: `nn::Linear`, `Linear::forward`, `Linear::comm` (an `nn::LinearComm`), and
`dist::stage_blocks()`; stages are cut by `stage_blocks()`.

## Layout

```
nn/        modules
dist/      communicators (comm/), pipeline_parallel/
train/     the trainer
docs/      guides
```
"""
PAGE = "# A guide\n\nSee [the README](../README.md).\n"


def make_tree(base, readme=README, extra=None, page=PAGE):
    root = os.path.join(base, "repo")
    if os.path.exists(root):
        shutil.rmtree(root)
    files = dict(SOURCES)
    files["README.md"] = readme
    files["docs/guide.md"] = page
    files.update(extra or {})
    for rel, text in files.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    return root


def run(root):
    r = subprocess.run([sys.executable, CHECKER, "--root", root, "--repo", root], capture_output=True, text=True)
    return r.returncode, r.stdout + r.stderr


failures = []


def expect(what, root, code, message=None):
    rc, out = run(root)
    ok = rc == code and (message is None or message in out)
    print(("ok    " if ok else "FAIL  ") + what)
    if not ok:
        failures.append(what)
        print(f"      expected exit {code}" + (f" and {message!r}" if message else "") + f"; got exit {rc}:")
        print("      " + out.strip().replace("\n", "\n      "))


def main():
    base = tempfile.mkdtemp(prefix="ndt_test_check_docs_")
    try:
        expect("a clean tree passes", make_tree(base), 0, "check_docs: OK")

        expect("a stale `A::b` (the member is gone from its class)",
               make_tree(base, README.replace("`Linear::comm`", "`Linear::before`")), 1,
               "README.md:3: `Linear::before` names no identifier in the code (was it renamed?)")
        expect("a stale qualifier (`Dense::forward`: no Dense in the code)",
               make_tree(base, README.replace("`Linear::forward`", "`Dense::forward`")), 1,
               "README.md:3: `Dense::forward` names no identifier in the code (was it renamed?)")
        expect("a stale `name()`",
               make_tree(base, README.replace("cut by `stage_blocks()`", "cut by `cut_stages()`")), 1,
               "README.md:4: `cut_stages()` names no identifier in the code (was it renamed?)")
        expect("a name only in a comment does not count",
               make_tree(base, README + "\nOnly in a comment: `Linear::before`.\n"), 1,
               "`Linear::before` names no identifier in the code")

        expect("the layout block lacks a top-level folder",
               make_tree(base, extra={"tokenizer/bpe.cpp": "int merge() { return 0; }\n"}), 1,
               "README.md:9: layout: the top-level folder `tokenizer/` is not listed")
        expect("the layout block names a folder that does not exist",
               make_tree(base, README.replace("train/     the trainer\n",
                                              "train/     the trainer\nmodels/    GPT-2\n")), 1,
               "README.md:12: layout: `models/` does not exist")
        expect("the layout block names some of a folder's subfolders but not all",
               make_tree(base, README.replace(", pipeline_parallel/", "")), 1,
               "README.md:10: layout: the entry of `dist/` names its subfolders but not `pipeline_parallel/`")
        expect("the layout block names a subfolder that does not exist",
               make_tree(base, README.replace("(comm/)", "(comm/, fsdp/)")), 1,
               "layout: `fsdp/` in the entry of `dist/`: dist/fsdp/ does not exist")
        expect("a README without a layout block",
               make_tree(base, README.replace("## Layout", "## Folders")), 1,
               "no fenced block under a `## Layout` heading")

        expect("a docs page over 600 lines",
               make_tree(base, page=PAGE + "line\n" * 600), 1,
               "docs/guide.md:601: the page has 603 lines, more than 600")
        expect("a docs page of 600 lines passes",
               make_tree(base, page=PAGE + "line\n" * 597), 0, "check_docs: OK")
    finally:
        shutil.rmtree(base, ignore_errors=True)
    if failures:
        print(f"test_check_docs: {len(failures)} of the checks failed")
        return 1
    print("test_check_docs: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
