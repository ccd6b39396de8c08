#!/usr/bin/env python3
"""The library's functions are short: none over 80 lines, option tables excepted.

Reads every .h, .cpp and .cu of the library's folders (not tests/, bench/, examples/ or the
programs' mains), drops comments and literals, and follows the braces: a brace opened at
namespace or class level after a parenthesis is a function body; its length runs from the
line of that brace to the line of its match.

  python3 tests/scripts/function_lengths.py            # one line per long function; exit 1 if any
  python3 tests/scripts/function_lengths.py --limit 60
"""
import argparse
import glob
import os
import re
import sys

FOLDERS = ["tensor", "autograd", "nn", "models", "optim", "dist", "train", "tokenizer"]
# Option tables: one declaration per key, long by nature (--help is made from them).
EXEMPT = {("train/config.cpp", "describe")}


def strip(src):
    """The source without comments and string or character literals (line breaks kept)."""
    keep_lines = lambda m: "\n" * m.group(0).count("\n")
    src = re.sub(r"//[^\n]*", "", src)
    src = re.sub(r"/\*.*?\*/", keep_lines, src, flags=re.S)
    src = re.sub(r'R"([^(]*)\((.*?)\)\1"', lambda m: '""' + keep_lines(m), src, flags=re.S)
    src = re.sub(r'"(\\.|[^"\\\n])*"', '""', src)
    return re.sub(r"'(\\.|[^'\\\n])*'", "''", src)


def functions(src):
    """(first line, last line, name) of every function body at namespace or class level."""
    stack, head, line = [], "", 1
    for ch in strip(src):
        if ch == "\n":
            line += 1
        if ch == "{":
            outer = all(kind == "scope" for kind in stack)
            text = head.strip()
            if outer and (re.search(r"\b(namespace|struct|class|union|enum)\b[^;()]*$", text) or text.endswith('""')):
                stack.append("scope")
            elif outer and "(" in text and not text.endswith("="):
                name = re.findall(r"([~\w]+)\s*\(", text)
                stack.append((line, name[0] if name else "?"))
            else:
                stack.append("block")
            head = ""
        elif ch == "}":
            if stack:
                top = stack.pop()
                if isinstance(top, tuple):
                    yield top[0], line, top[1]
            head = ""
        elif ch == ";":
            head = ""
        else:
            head += ch


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=int, default=80)
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
    a = ap.parse_args()
    root = os.path.abspath(a.root)
    long = []
    for folder in FOLDERS:
        for ext in ("h", "cpp", "cu", "cuh"):
            for path in sorted(glob.glob(os.path.join(root, folder, "**", "*." + ext), recursive=True)):
                rel = os.path.relpath(path, root)
                if rel.startswith("train/programs/"):
                    continue
                with open(path, errors="replace") as f:
                    src = f.read()
                for first, last, name in functions(src):
                    n = last - first + 1
                    if n > a.limit and (rel, name) not in EXEMPT:
                        long.append((n, rel, first, name))
    for n, rel, first, name in sorted(long, reverse=True):
        print(f"{rel}:{first}: {name} is {n} lines (the limit is {a.limit}): split it into named steps")
    if long:
        print(f"function_lengths: {len(long)} function(s) over {a.limit} lines")
        return 1
    print(f"function_lengths: OK, no library function over {a.limit} lines")
    return 0


if __name__ == "__main__":
    sys.exit(main())
