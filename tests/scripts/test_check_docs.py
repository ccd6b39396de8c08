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

# 9. quoted output: a page quoting what a program of the fixture's build folder prints
PLAN_PROGRAM = """#!/bin/sh
[ "$1" = --fail ] && { echo "plan: no such layout" >&2; exit 3; }
echo "plan: 2 ranks (TP)"
echo "step 1 | mem 6.3 MiB (peak 50.56 MiB)"
echo "total 12 ranks"
"""
OUTPUT_PAGE = """# Output

<!-- output-check -->
```
$ build/plan
plan: 2 ranks (TP)
step 1 | mem 6.3 MiB (peak 50.6 MiB)
total 12 ranks
```
"""


def make_output_tree(base, page):
    """A tree whose docs page is `page` and whose build/plan prints PLAN_PROGRAM's lines."""
    root = make_tree(base, page=page)
    prog = os.path.join(root, "build", "plan")
    os.makedirs(os.path.dirname(prog), exist_ok=True)
    with open(prog, "w", encoding="utf-8") as f:
        f.write(PLAN_PROGRAM)
    os.chmod(prog, 0o755)
    return root


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


def run(root, args=()):
    r = subprocess.run([sys.executable, CHECKER, "--root", root, "--repo", root, *args], capture_output=True,
                       text=True)
    return r.returncode, r.stdout + r.stderr


failures = []


def expect(what, root, code, message=None, args=()):
    rc, out = run(root, args)
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

        def build(root):
            return ["--build", os.path.join(root, "build")]

        root = make_output_tree(base, OUTPUT_PAGE)
        expect("quoted output that the command prints passes (50.6 for 50.56)", root, 0, "1 outputs run",
               build(root))
        drifted = OUTPUT_PAGE.replace("peak 50.6 MiB", "peak 58.0 MiB")
        root = make_output_tree(base, drifted)
        expect("a quoted figure that drifted from the command's output", root, 1,
               "docs/guide.md:7: output of `build/plan` drifted: the doc has 'step 1 | mem 6.3 MiB (peak 58.0 MiB)', "
               "the command prints 'step 1 | mem 6.3 MiB (peak 50.56 MiB)'", build(root))
        expect("...is not run without --build", root, 0, "1 outputs not run (no --build)")
        root = make_output_tree(base, OUTPUT_PAGE.replace("peak 50.6 MiB", "peak 50.9 MiB"))
        expect("a figure off by more than its rounding and 0.5%", root, 1, "docs/guide.md:7: output of", build(root))
        root = make_output_tree(base, OUTPUT_PAGE.replace("2 ranks (TP)", "2 ranks (DP)"))
        expect("a quoted word the command no longer prints", root, 1,
               "the doc has 'plan: 2 ranks (DP)', the command prints 'plan: 2 ranks (TP)'", build(root))
        root = make_output_tree(base, OUTPUT_PAGE.replace("total 12 ranks\n", ""))
        expect("a line the command prints that the doc lacks", root, 1,
               "the command prints more: 'total 12 ranks'", build(root))
        root = make_output_tree(base, OUTPUT_PAGE.replace("total 12 ranks\n", "total 12 ranks\nbest: TP\n"))
        expect("a quoted line the command does not print", root, 1,
               "the doc has 'best: TP', the command prints nothing more", build(root))
        root = make_output_tree(base, OUTPUT_PAGE.replace("step 1 | mem 6.3 MiB (peak 50.6 MiB)\n", "...\n")
                                .replace("(TP)", "(...)"))
        expect("`...` stands for lines, and for text in a line", root, 0, "1 outputs run", build(root))
        root = make_output_tree(base, OUTPUT_PAGE.replace("$ build/plan", "$ build/plan --fail"))
        expect("a command that fails", root, 1, "`build/plan --fail` exits 3: plan: no such layout", build(root))
        root = make_output_tree(base, OUTPUT_PAGE.replace("<!-- output-check -->\n", "<!-- output-check -->\n\n"))
        expect("a marker that is not right before a fenced block", root, 1,
               "docs/guide.md:3: <!-- output-check --> must be the line right before a fenced block", build(root))
        root = make_output_tree(base, OUTPUT_PAGE.replace("$ build/plan", "$ build/plan | head -2"))
        expect("a marked command that needs a shell", root, 1,
               "an output check runs one build/PROGRAM, without a shell", build(root))

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
