#!/usr/bin/env python3
"""check_docs.py: does what README.md and docs/**/*.md quote still exist in the code?

    python3 tests/scripts/check_docs.py [--root DIR] [--repo DIR] [-v]

Prints one line per problem, `FILE:LINE: what is wrong`, then a summary line; exit 1 when
there is a problem, 0 when there is none. Python 3 standard library only. It checks:

 1. Repository paths. Inline code (`...`) whose words look like a path of this repository (it
    starts with a top-level folder, TOP_DIRS, or is a top-level file, TOP_FILES) must name a
    file or folder that exists. A trailing `:N` / `:N-M` and punctuation are stripped; a
    path without extension (`dist/mesh`) may name `dist/mesh.h` / `.cpp`; `*`, `<word>`,
    `{i}` and `...` are wildcards, `{a,b}` is expanded (each must exist), and a wildcard must
    match at least one file. EXCLUDED lists what is not checked and why; a missing path
    quoted just after another project's name ("llm.c's script (`scripts/x.sh`)",
    EXTERNAL_PROJECTS) is that project's. In a table row whose first cell is one folder
    (| `autograd/` | ... (`ops.h`) |), bare file names in the row are in that folder.
    Markdown links `[x](path)` must resolve relative to the .md file (http(s)/mailto and
    `#anchor`-only links are skipped; `file.md#anchor` must name a heading of file.md).
 2. `file.ext:N` and `file.ext:N-M` (inline code, plain text or fenced blocks): the file must
    exist (a name without folder is looked up by its base name) and have lines N and M.
    - Symbol heuristic: when the same Markdown line also holds an inline-code symbol
      (`Linear::forward`, `linear()`, `kMaxRanks`: an identifier, `::` allowed), the nearest
      one is taken as what the reference points at, and the last component of its name
      (`forward`) must occur as a word within lines N-3 .. M+3. If not, the message names
      the symbol and the lines where the file holds it now.
    - Error-location heuristic: a `[file.cpp:N]` inside a fenced block is where the quoted
      error message was raised (NDT_CHECK/NDT_FAIL report __LINE__, the line of the macro
      name), so of the file's statements the one that starts at line N must share the most
      string literal text (literals of 6+ characters) with that output line, and each of its
      literals must be in the quote. If not, the message names the line that does raise it.
    - Size claims: "`a/b.h` and `.cpp` (..., about N lines)" or "`a/b.h` (about N)": the
      files together must have N lines, within SIZE_TOLERANCE.
 3. Config keys: inline code of the form `section.key`, `section.key = value` or
    `--section.key [value]`, where section is one of train_gpt's config sections ([model],
    [data], ... read from the options_description tables of train/config.cpp, and [model]'s
    from the field table of models/gpt_config.h) or `plan`
    (its command-line-only options), must be a declared key; so must the `key = value` lines
    under a `[section]` header in a fenced block.
 4. Program options: a `--option` quoted on a command line (a fenced-block line, or inline
    code with a program in it) belongs to the nearest project program before it on that
    command (build/train_gpt, train_gpt, scripts/x.sh, python3 bench/y.py, ...) and must be
    declared by it; options before any project program belong to a launcher (mpirun, srun,
    env, python3, ...) and lines without a project program (cmake, ctest, git, pip, ...) are
    skipped. A lone inline `--option` must be declared by some project program, unless it is
    a known option of another program (EXTERNAL_OPTIONS) or a line within
    EXTERNAL_CONTEXT_LINES names such a program (EXTERNAL_PROGRAMS). What each program
    declares is read from its source: Boost.Program_options `add_options()` tables and
    `arg == "--x"` / strcmp comparisons for C++ (train_gpt: train/config.cpp, see
    PROGRAM_SOURCES), `case` patterns and `[[ $1 == --x ]]` for shell scripts (a script that
    passes "$@" on to a project program also takes that program's options; one that passes
    its own "$@" to anything else takes any option), argparse `add_argument` for Python;
    Google Benchmark programs take --benchmark_*, GoogleTest programs --gtest_*.
 5. (docs/design.md) Every folder holding sources, and every header directly in dist/, is
    named in the map of the code (check_design_map).
 6. Code names: inline code that is a qualified name (`Linear::forward`, `dist::parallelize`,
    also as a call, `kernels::gemm(a, ...)`) or a call without arguments (`stage_blocks()`,
    `leaf.grad()`) must name something in the C++ sources (SOURCE_EXTS under SOURCE_DIRS,
    comments and string literals left out): every part is an identifier there, and for each
    step `A::b` either `A::b` is written so in the code or b occurs in a file (a .h and its
    .cpp together) that declares A (class, struct, enum, namespace, using). For `x.y()` only
    y counts. EXTERNAL_NAMES lists the other projects' names the docs quote in this form.
 7. (README.md) The layout block, the fenced block under the `## Layout` heading, has one
    entry (a line starting with a path) per top-level folder: every entry exists, and every
    top-level folder that git tracks (not hidden) has one. Where an entry's description names
    subfolders of its folder (`fsdp/`, `tests/support/`), each exists and all of the folder's
    subfolders are named.
 8. Every page under docs/ has at most MAX_PAGE_LINES lines.
 9. Quoted output (with --build DIR). A fenced block right after a line `<!-- output-check -->`
    opens with `$ build/PROGRAM ...` (continued by a trailing `\`) and holds the rest of what
    that command prints. The command is run in the repository's root with `build/` standing
    for DIR (no shell; at most OUTPUT_TIMEOUT_S seconds) and its stdout must be the block's
    other lines: line for line, runs of spaces as one, every number within OUTPUT_REL_TOL of
    the printed one (or half a unit of the quoted figure's last digit); a line `...` stands for
    any lines. Mark only commands that are cheap and print the same figures on every machine
    (plans, not timings). Without --build the marked blocks are only checked for their form.

Placeholders are skipped: an option or key whose part is `key`, `sec`, `section`, `name`,
`...`, holds `<`, `>`, `{`, or is in capitals (`--section.key`, `--cluster.KEY`).

Its own test, on small fixture trees: tests/scripts/test_check_docs.py (test_docs.sh runs both).

--root DIR reads README.md and docs/ from DIR (default: this repository); --repo DIR is the
source tree the quotes are checked against (default: the repository holding this script).
"""
import argparse
import glob
import os
import re
import shlex
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_REPO = os.path.normpath(os.path.join(HERE, "..", ".."))

# top-level folders a repository path starts with
TOP_DIRS = ["tensor", "autograd", "nn", "dist", "models", "optim", "train", "tokenizer", "tests", "bench",
            "configs", "docs", "scripts", "examples", ".ci"]
# names that, alone in inline code, mean a top-level file
TOP_FILES = ["CMakeLists.txt", "CMakePresets.json", ".clang-format", ".clang-tidy", ".gitignore",
             ".gitattributes", "LICENSE", "Makefile", "pyproject.toml", "requirements.txt"]

# paths that are not checked (prefixes, relative to the repository root), with the reason
EXCLUDED = {
    "build": "build trees (build/, build-gpu/, build*/): made by cmake, not in git",
    "out/": "what a run writes (logs, traces, checkpoints, reports)",
    "data/": "prepared or downloaded data sets, git-ignored",
    "third_party/": "fetched by scripts/setup.sh, git-ignored",
    ".gpu-deps": "the GPU check's downloaded packages (scripts/gpu_deps.sh), git-ignored",
}
# a path quoted right after another project's name ("llm.c's GPT-2 script (`scripts/x.sh`)")
# is that project's, not ours (only consulted for a path that does not exist here)
EXTERNAL_PROJECTS = ["llm.c", "nanoGPT", "torchtitan", "Megatron-LM", "DeepSpeed", "llama.cpp",
                     "ggml", "PyTorch", "flash-attention"]
EXTERNAL_POSSESSIVE_WINDOW = 40  # characters between "X's" and the quoted path

# commands whose options are not ours: a lone `--option` near one of these names may be
# theirs (no common English words here: "make" or "env" nearby must not hide a drifted option)
EXTERNAL_PROGRAMS = ["mpirun", "mpiexec", "srun", "sbatch", "SBATCH", "salloc", "ctest", "cmake",
                     "git", "apt-get", "pip", "pip3", "torchrun", "compute-sanitizer", "nsys", "ncu",
                     "gdb", "valgrind", "docker", "ninja", "nvcc", "dpkg-deb", "curl", "wget", "ssh",
                     "pkill", "sysctl", "Open MPI", "OpenMPI", "Slurm", "PRRTE", "numactl", "taskset"]
# ... within this many lines of it (the line of a lone option, and as many before and after)
EXTERNAL_CONTEXT_LINES = 2
# options of those programs that the docs quote alone, with no program name nearby
EXTERNAL_OPTIONS = {
    "--allow-run-as-root", "--oversubscribe", "--bind-to", "--map-by", "--mca", "--host",
    "--hostfile", "--mpi", "--ntasks-per-node", "--signal",  # mpirun / srun / sbatch
    "--kernel-name", "--tool",  # compute-sanitizer
    "--output-on-failure", "--test-dir",  # ctest
}

# the source files that declare a program's options, where its main() does not
PROGRAM_SOURCES = {
    # train_gpt.cpp only calls train::train_main; the options are parsed in train/config.cpp
    "train_gpt": ["train/programs/train_gpt.cpp", "train/config.cpp"],
}
SIZE_TOLERANCE = 0.20  # "about N lines": the files' line count must be within 20% of N
SYMBOL_WINDOW = 3  # a symbol may be this many lines away from a quoted line
FILE_EXTS = "h|hpp|cpp|cc|c|cu|cuh|py|sh|ini|txt|cmake|md|json|yml|yaml|toml"
# `section.key` tokens whose "key" is a file extension name files, not keys (checkpoint.json)
NOT_KEYS = {"json", "bin", "safetensors", "h", "cpp", "py", "sh", "md", "ini", "txt", "html",
            "tmp", "lock", "log", "svg", "jsonl"}
PLACEHOLDER_PARTS = {"key", "sec", "section", "name", "KEY", "SECTION", "NAME", "..."}
SKIP_DIRS = {".git", "build", "out", "data", "third_party", ".gpu-deps", "__pycache__"}

FILE_LINE_RE = re.compile(
    r"(?<![\w/.@-])((?:[\w.-]+/)*[\w.-]*\w\.(?:" + FILE_EXTS + r")):(\d+)(?:-(\d+))?(?![\d\w])")
IDENT_RE = re.compile(r"^~?[A-Za-z_]\w*(?:::~?[A-Za-z_]\w*)*(?:\(\))?$")
OPTION_RE = re.compile(r"^--[A-Za-z][\w.-]*")
URL_RE = re.compile(r"\b(?:https?|file|ftp)://\S+|chrome://\S+")

# 6. code names: the folders whose C++ sources (SOURCE_EXTS) a quoted `A::b` or `name()` must name
SOURCE_DIRS = ["tensor", "autograd", "nn", "dist", "optim", "models", "train", "tokenizer", "tests", "bench",
               "examples"]
SOURCE_EXTS = (".h", ".cpp", ".cu", ".cuh")
# `A::b` (A::b(args) too) and `name()` / `obj.name()`: the inline code the check reads as a name
CODE_NAME_RE = re.compile(r"^(~?[A-Za-z_]\w*(?:::~?[A-Za-z_]\w*)+)(?:\(.*\))?$|"
                          r"^(~?[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)\((?:\.\.\.)?\)$")
# names quoted in that form that are not ours (another project's API: PyTorch's
# `torch.compile()`, transformers' `apply_chat_template()`, a Python function), each with its
# owner. Empty now: every such name the docs quote also occurs in our code (the NCCL and cuBLAS
# calls we make) or is quoted without the `()` form. A name of ours that went away is fixed in
# the docs, never listed here.
EXTERNAL_NAMES = {}
# 7. README.md's layout block: the fenced block under this heading lists the top-level folders
LAYOUT_HEADING = "Layout"
# 8. the most lines a page under docs/ may have: a page longer than this is two pages
MAX_PAGE_LINES = 600

# 9. quoted output: the marker line, how far a number may drift, how long a command may run
OUTPUT_MARKER = "<!-- output-check -->"
OUTPUT_REL_TOL = 0.005
OUTPUT_TIMEOUT_S = 120
NUMBER_RE = re.compile(r"-?\d+(?:\.\d+)?")


class Problems:
    def __init__(self):
        self.items = []
        self.seen = set()

    def add(self, path, line, msg):
        key = (path, line, msg)
        if key not in self.seen:
            self.seen.add(key)
            self.items.append(key)


# ---- the repository: files, programs, options ---------------------------------------------

class Repo:
    def __init__(self, root):
        self.root = root
        self.files = []  # repository-relative paths of every file (not under SKIP_DIRS)
        for d, dirs, names in os.walk(root):
            rel = os.path.relpath(d, root)
            dirs[:] = [x for x in dirs if not (rel == "." and (x in SKIP_DIRS or x.startswith("build")))
                       and x not in (".git", "__pycache__")]
            for n in names:
                self.files.append(os.path.normpath(os.path.join(rel, n)))
        self.by_base = {}
        for f in self.files:
            self.by_base.setdefault(os.path.basename(f), []).append(f)
        self._lines = {}

    def exists(self, rel):
        return os.path.exists(os.path.join(self.root, rel))

    def lines(self, rel):
        if rel not in self._lines:
            try:
                with open(os.path.join(self.root, rel), encoding="utf-8", errors="replace") as f:
                    self._lines[rel] = f.read().split("\n")
                if self._lines[rel] and self._lines[rel][-1] == "":
                    self._lines[rel].pop()
            except OSError:
                self._lines[rel] = None
        return self._lines[rel]

    def text(self, rel):
        ls = self.lines(rel)
        return None if ls is None else "\n".join(ls)


def add_options_names(text):
    """The option names of every Boost.Program_options add_options() chain in C++ text."""
    names = set()
    for m in re.finditer(r"add_options\(\)", text):
        i, depth, in_str = m.end(), 0, False
        start = i
        while i < len(text):
            ch = text[i]
            if in_str:
                if ch == "\\":
                    i += 1
                elif ch == '"':
                    in_str = False
            elif ch == '"':
                in_str = True
            elif ch == "(":
                depth += 1
            elif ch == ")":
                depth -= 1
            elif ch == ";" and depth == 0:
                break
            i += 1
        chain = text[start:i]
        for n in re.finditer(r'\(\s*"([A-Za-z][\w.\-]*)(?:,\w)?"\s*,', chain):
            names.add(n.group(1))
    return names


def model_field_keys(text):
    """model.<name> for every row of models/gpt_config.h's field table (Field{"name", ...}),
    which train/config.cpp turns into the [model] keys."""
    return {"model." + n for n in re.findall(r'Field\{\s*"([A-Za-z]\w*)"', text)}


def config_sections(text):
    """[section] names of train/config.cpp's options_description headers."""
    return set(re.findall(r'options_description\s+\w+\(\s*"\[(\w+)\]', text))


class Program:
    def __init__(self, name, source):
        self.name = name
        self.source = source
        self.options = set()  # "--x"
        self.prefixes = []  # "--gtest_": any option that starts so
        self.any = False  # takes any option (passes them on to something we do not parse)
        self.forwards = []  # names of project programs it passes "$@" to

    def declares(self, opt, programs, seen=None):
        if self.any or opt in self.options or any(opt.startswith(p) for p in self.prefixes):
            return True
        seen = seen or {self.name}
        for f in self.forwards:
            if f in programs and f not in seen:
                seen.add(f)
                if programs[f].declares(opt, programs, seen):
                    return True
        return False


def shell_function_lines(lines):
    """The indices of the lines inside shell function bodies (their "$@" is not the script's)."""
    inside, depth = set(), 0
    for i, l in enumerate(lines):
        code = re.sub(r"'[^']*'|\"(?:\\.|[^\"\\])*\"|#.*$", "", l)
        if depth == 0 and re.match(r"^\s*(?:function\s+)?[\w-]+\s*\(\)\s*\{", l):
            depth = code.count("{") - code.count("}")
            inside.add(i)
            continue
        if depth > 0:
            inside.add(i)
            depth += code.count("{") - code.count("}")
    return inside


def discover_programs(repo):
    progs = {}
    cpp_mains = []
    for pat in ("train/programs/*.cpp", "examples/*.cpp", "bench/*.cpp"):
        cpp_mains += sorted(glob.glob(os.path.join(repo.root, pat)))
    for path in cpp_mains:
        rel = os.path.relpath(path, repo.root)
        text = repo.text(rel) or ""
        if not re.search(r"\bint\s+main\s*\(", text):
            continue
        name = os.path.splitext(os.path.basename(rel))[0]
        p = Program(name, rel)
        for src in PROGRAM_SOURCES.get(name, [rel]):
            t = repo.text(src) or ""
            p.options |= {"--" + n for n in add_options_names(t)}
            if src == "train/config.cpp":  # the [model] keys come from the model's field table
                p.options |= {"--" + k for k in model_field_keys(repo.text("models/gpt_config.h") or "")}
            p.options |= set(re.findall(r'==\s*"(--[\w.-]+)"', t))
            p.options |= set(re.findall(r'strcmp\([^,]+,\s*"(--[\w.-]+)"\)', t))
        if "benchmark::Initialize" in text:
            p.prefixes.append("--benchmark_")
            p.options.add("--help")
        progs[name] = p
    for path in sorted(glob.glob(os.path.join(repo.root, "tests", "test_*.cpp"))):
        name = os.path.splitext(os.path.basename(path))[0]
        p = Program(name, os.path.relpath(path, repo.root))
        p.prefixes.append("--gtest_")
        p.options.add("--help")
        progs[name] = p
    for pat in ("scripts/*.sh", "bench/*.sh", "tests/scripts/*.sh"):
        for path in sorted(glob.glob(os.path.join(repo.root, pat))):
            if not os.path.isfile(path):
                continue
            rel = os.path.relpath(path, repo.root)
            name = os.path.basename(rel)
            lines = repo.lines(rel) or []
            p = Program(name, rel)
            funcs = shell_function_lines(lines)
            for i, l in enumerate(lines):
                m = re.match(r"""^\s*\(?\s*((?:["']?-{1,2}[\w-]+["']?\s*\|\s*)*["']?-{1,2}[\w-]+["']?)\s*\)""", l)
                if m:
                    for o in m.group(1).split("|"):
                        o = o.strip().strip("'\"")
                        if o.startswith("--"):
                            p.options.add(o)
                p.options |= set(re.findall(r"""(?:==?|!=)\s*["']?(--[\w][\w.-]*)""", l))
                if re.search(r'"\$@"|"\$\{@\}"|\$@', l) and not re.search(r"\bin\s+\"?\$@", l):
                    target = None
                    for tok in re.split(r"[\s;|&()]+", l):
                        b = os.path.basename(tok.strip("'\"")) if tok else ""
                        if b and b != name and (b in progs or re.search(r"\.(sh|py)$", b)) and "$@" not in tok:
                            target = b
                            break
                    if target:
                        p.forwards.append(target)
                    elif i not in funcs:
                        p.any = True
            progs[name] = p
    for pat in ("scripts/*.py", "bench/*.py"):
        for path in sorted(glob.glob(os.path.join(repo.root, pat))):
            rel = os.path.relpath(path, repo.root)
            text = repo.text(rel) or ""
            p = Program(os.path.basename(rel), rel)
            p.options.add("--help")
            for m in re.finditer(r"add_argument\(([^)]*)\)", text):
                p.options |= set(re.findall(r"""["'](--[\w][\w.-]*)["']""", m.group(1)))
            for l in text.split("\n"):  # hand-made parsing: sys.argv[1] in ("-h", "--help")
                if "sys.argv" in l:
                    p.options |= set(re.findall(r"""["'](--[\w][\w.-]*)["']""", l))
            progs[p.name] = p
    return progs


# ---- the C++ sources: identifiers and where names are declared ----------------------------

CPP_TOKEN_RE = re.compile(
    r'R"([^()\\\s]{0,16})\((?:.|\n)*?\)\1"'  # raw string
    r"|//[^\n]*|/\*(?:.|\n)*?\*/"  # comments
    r'|"(?:\\.|[^"\\\n])*"|' + r"'(?:\\.|[^'\\\n])+'"  # string and character literals
    r"|\d[\w'.]*"  # numbers (1'000, 0x1f, 1e-5f)
    r"|([A-Za-z_]\w*(?:\s*::\s*~?[A-Za-z_]\w*)*)")  # identifiers, qualified ones whole


class CodeIndex:
    """Every identifier of the C++ sources under SOURCE_DIRS (outside comments and literals), the
    qualified names written in them (`Linear::forward`, `dist::parallelize`), and per file the
    classes, structs, enums and namespaces it declares."""

    def __init__(self, root):
        self.idents = set()  # every identifier
        self.qualified = set()  # "A::b" for each adjacent pair of a qualified name
        self.declared_in = {}  # name -> files that declare a class/struct/enum/namespace/alias of it
        self.file_idents = {}  # file (without extension: a .h and its .cpp are one) -> identifiers
        for top in SOURCE_DIRS:
            for d, dirs, names in os.walk(os.path.join(root, top)):
                dirs[:] = sorted(x for x in dirs if x not in SKIP_DIRS and not x.startswith(("build", ".")))
                for n in sorted(names):
                    if n.endswith(SOURCE_EXTS):
                        self.add_file(os.path.relpath(os.path.join(d, n), root),
                                      open(os.path.join(d, n), encoding="utf-8", errors="replace").read())

    def add_file(self, rel, text):
        unit = os.path.splitext(rel)[0]
        mine = self.file_idents.setdefault(unit, set())
        toks = []  # each identifier, a qualified name as its parts
        for m in CPP_TOKEN_RE.finditer(text):
            if not m.group(2):
                continue
            parts = [p.strip().lstrip("~") for p in m.group(2).split("::")]
            toks.append(parts)
            mine.update(parts)
            for a, b in zip(parts, parts[1:]):
                self.qualified.add(a + "::" + b)
        self.idents |= mine
        for k in range(len(toks) - 1):  # class A, struct A, enum (class) A, namespace a::b, using A =
            if toks[k] in (["class"], ["struct"], ["enum"], ["namespace"], ["union"], ["using"]):
                target = toks[k + 1] if toks[k + 1] != ["class"] or k + 2 >= len(toks) else toks[k + 2]
                for part in target:
                    self.declared_in.setdefault(part, set()).add(unit)

    def resolves(self, name):
        """`a::B::c`: every part is an identifier, and each qualified step `A::b` is either
        written so in the code or b is an identifier of a file that declares A. `x.y`: y is an
        identifier (x is an object of the example)."""
        if "::" not in name:
            return name.split(".")[-1].lstrip("~") in self.idents
        parts = [p.lstrip("~") for p in name.split("::")]
        if not all(p in self.idents for p in parts):
            return False
        for a, b in zip(parts, parts[1:]):
            if a + "::" + b in self.qualified:
                continue
            if not any(b in self.file_idents.get(u, ()) for u in self.declared_in.get(a, ())):
                return False
        return True


def tracked_dirs(root):
    """(top-level folders, {top: its subfolders}) of the repository, not hidden: git's tracked
    and not-ignored files where root is a git checkout, else what is on disk outside SKIP_DIRS."""
    files = None
    try:
        top = subprocess.run(["git", "-C", root, "rev-parse", "--show-toplevel"], capture_output=True,
                             text=True, timeout=30)
        if top.returncode == 0 and os.path.realpath(top.stdout.strip()) == os.path.realpath(root):
            out = subprocess.run(["git", "-C", root, "ls-files", "-z", "-c", "-o", "--exclude-standard"],
                                 capture_output=True, text=True, timeout=60)
            if out.returncode == 0:
                files = [f for f in out.stdout.split("\0") if f]
    except (OSError, subprocess.SubprocessError):
        files = None
    if files is None:
        files = []
        for d, dirs, names in os.walk(root):
            rel = os.path.relpath(d, root)
            dirs[:] = [x for x in dirs if x not in SKIP_DIRS and not x.startswith(("build", "."))]
            files += [os.path.normpath(os.path.join(rel, n)) for n in names]
    tops, subs = set(), {}
    for f in files:
        parts = f.split("/")
        if len(parts) < 2 or parts[0].startswith("."):
            continue
        if not os.path.exists(os.path.join(root, f)):
            continue  # deleted, not yet committed
        tops.add(parts[0])
        if len(parts) >= 3 and not parts[1].startswith("."):
            subs.setdefault(parts[0], set()).add(parts[1])
    return tops, subs


# ---- Markdown ------------------------------------------------------------------------------

class Block:
    """A paragraph (consecutive non-blank lines outside fences) or a fenced block."""

    def __init__(self, kind, first_line, lines, info=""):
        self.kind = kind  # "para" or "fence"
        self.first = first_line  # 1-based line number of lines[0]
        self.lines = lines
        self.info = info
        self.text = "\n".join(lines)
        self.starts = []
        pos = 0
        for l in lines:
            self.starts.append(pos)
            pos += len(l) + 1

    def line_of(self, offset):
        lo = 0
        for i, s in enumerate(self.starts):
            if s <= offset:
                lo = i
        return self.first + lo


def md_blocks(lines):
    blocks, i = [], 0
    while i < len(lines):
        m = re.match(r"^\s*(```+|~~~+)\s*(\S*)", lines[i])
        if m:
            fence, info, j = m.group(1), m.group(2), i + 1
            while j < len(lines) and not lines[j].strip().startswith(fence):
                j += 1
            blocks.append(Block("fence", i + 2, lines[i + 1:j], info))
            i = j + 1
            continue
        if not lines[i].strip():
            i += 1
            continue
        j = i
        while j < len(lines) and lines[j].strip() and not re.match(r"^\s*(```|~~~)", lines[j]):
            j += 1
        blocks.append(Block("para", i + 1, lines[i:j]))
        i = j
    return blocks


def code_spans(text):
    """(content, start, end) of each inline code span; content's newlines become spaces."""
    spans, i = [], 0
    while True:
        m = re.compile(r"(?<!`)(`+)(?!`)").search(text, i)
        if not m:
            return spans
        ticks = m.group(1)
        close = re.compile(r"(?<!`)" + ticks + r"(?!`)").search(text, m.end())
        if not close:
            return spans
        body = text[m.end():close.start()]
        if "\n\n" not in body:
            content = body.replace("\n", " ")
            if len(ticks) > 1:
                content = content.strip()
            spans.append((content, m.start(), close.end()))
        i = close.end()


def mask(text, spans):
    out = list(text)
    for _, a, b in spans:
        for k in range(a, b):
            if out[k] != "\n":
                out[k] = " "
    return "".join(out)


def same_output_line(quoted, printed):
    """True when a quoted output line is the printed one: the same words, runs of spaces as one,
    `...` standing for any text, each number within OUTPUT_REL_TOL (or half a unit of the
    quoted figure's last digit)."""
    q, p = " ".join(quoted.split()), " ".join(printed.split())
    pattern = ".*?".join("".join(f"({NUMBER_RE.pattern})" if NUMBER_RE.fullmatch(t) else re.escape(t)
                                 for t in re.split(f"({NUMBER_RE.pattern})", piece) if t)
                         for piece in q.split("..."))
    m = re.fullmatch(pattern, p)
    if not m:
        return False
    for a, b in zip(NUMBER_RE.findall(q), m.groups()):
        digits = len(a.split(".")[1]) if "." in a else 0
        if abs(float(a) - float(b)) > max(OUTPUT_REL_TOL * abs(float(b)), 0.5 * 10 ** -digits):
            return False
    return True


def output_differences(quoted, printed):
    """(index in quoted, message) for each quoted line that the printed lines do not match, in
    order; a quoted `...` line matches any number of printed lines."""
    out, j = [], 0
    for n, q in enumerate(quoted):
        if q.strip() == "...":
            nxt = next((x for x in quoted[n + 1:] if x.strip() != "..."), None)
            while j < len(printed) and (nxt is None or not same_output_line(nxt, printed[j])):
                j += 1
            continue
        if j >= len(printed):
            out.append((n, f"the doc has '{q.strip()}', the command prints nothing more"))
            break
        if not same_output_line(q, printed[j]):
            out.append((n, f"the doc has '{q.strip()}', the command prints '{printed[j].strip()}'"))
        j += 1
    if j < len(printed) and not (quoted and quoted[-1].strip() == "..."):
        out.append((len(quoted) - 1, f"the command prints more: '{printed[j].strip()}'"))
    return out


def github_slug(heading, used):
    s = heading.strip().lower()
    s = re.sub(r"`", "", s)
    s = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", s)
    s = re.sub(r"[^\w\- ]", "", s)
    s = s.replace(" ", "-")
    n = used.get(s, 0)
    used[s] = n + 1
    return s if n == 0 else f"{s}-{n}"


def md_anchors(path):
    anchors, used, fence = set(), {}, None
    try:
        with open(path, encoding="utf-8") as f:
            for l in f:
                m = re.match(r"^\s*(```+|~~~+)", l)
                if m:
                    fence = None if fence and l.strip().startswith(fence) else (fence or m.group(1))
                    continue
                if fence:
                    continue
                m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", l)
                if m:
                    anchors.add(github_slug(m.group(1), used))
    except OSError:
        pass
    return anchors


# ---- the checks ---------------------------------------------------------------------------

class Checker:
    def __init__(self, docs_root, repo_root, build_dir=None):
        self.docs_root = docs_root
        self.build_dir = build_dir  # 9: where build/ is, to run the marked commands; None: not run
        self.repo = Repo(repo_root)
        self.programs = discover_programs(self.repo)
        cfg = self.repo.text("train/config.cpp") or ""
        self.sections = config_sections(cfg)
        declared = add_options_names(cfg) | model_field_keys(self.repo.text("models/gpt_config.h") or "")
        self.keys = {k for k in declared if "." in k}
        self.key_sections = self.sections | {k.split(".")[0] for k in self.keys}
        self.all_options = set()
        for p in self.programs.values():
            self.all_options |= p.options
        self.problems = Problems()
        self.counts = {"paths": 0, "links": 0, "line refs": 0, "keys": 0, "options": 0, "names": 0,
                       "outputs run": 0, "outputs not run (no --build)": 0}
        self._code = None  # CodeIndex, read on first use

    # -- helpers
    def report(self, md, line, msg):
        self.problems.add(md, line, msg)

    def excluded(self, path):
        return any(path.startswith(p) for p in EXCLUDED)

    def path_exists(self, rel):
        """rel: a repository-relative path, perhaps with wildcards; True if it names something."""
        rel = rel.rstrip("/") or "."
        alts = [rel]
        m = re.search(r"\{([^{}]*,[^{}]*)\}", rel)
        if m:
            alts = [rel[:m.start()] + x + rel[m.end():] for x in m.group(1).split(",")]
        return all(self.one_path_exists(a) for a in alts)  # fsdp.{h,cpp}: both

    def one_path_exists(self, rel):
        pat = re.sub(r"<[^<>/]*>|\{[^{}/]*\}|\.\.\.", "*", rel)
        for base in (self.repo.root, self.docs_root):
            if any(c in pat for c in "*?["):
                if glob.glob(os.path.join(base, pat)):
                    return True
            elif os.path.exists(os.path.join(base, pat)):
                return True
            elif "." not in os.path.basename(pat) and glob.glob(os.path.join(base, pat + ".*")):
                return True  # dist/mesh: dist/mesh.h and .cpp
        return False

    def looks_like_repo_path(self, tok):
        if tok in TOP_FILES:
            return True
        first = tok.split("/")[0]
        return "/" in tok and first in TOP_DIRS

    def clean_path(self, tok):
        tok = tok.strip("'\"()[],;")
        tok = re.sub(r"(:\d+(-\d+)?)+$", "", tok)
        tok = re.sub(r"[.,;:!?)]+$", "", tok) if not tok.endswith("/") else tok
        if tok.startswith("./"):
            tok = tok[2:]
        return tok

    def external_context(self, text, offset):
        before = text[max(0, offset - EXTERNAL_POSSESSIVE_WINDOW - 20):offset]
        for name in EXTERNAL_PROJECTS:
            i = before.rfind(name + "'s")
            if i >= 0 and len(before) - i <= EXTERNAL_POSSESSIVE_WINDOW + len(name) + 2:
                return True
        return False

    # -- 1. paths
    def check_path_token(self, md, line, tok, block_text=None, offset=None):
        if FILE_LINE_RE.search(tok):
            return  # path:N, the line reference's check has it
        tok = self.clean_path(tok)
        if not tok or not self.looks_like_repo_path(tok) or self.excluded(tok):
            return
        self.counts["paths"] += 1
        if not self.path_exists(tok):
            if block_text is not None and self.external_context(block_text, offset):
                return
            what = "matches no file" if re.search(r"[*<{]|\.\.\.", tok) else "does not exist"
            self.report(md, line, f"`{tok}` {what}")

    def check_links(self, md, block, prose):
        for m in re.finditer(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)", prose):
            target = m.group(1)
            if re.match(r"^[a-z][\w+.-]*:", target) or target.startswith("#"):
                continue
            line = block.line_of(m.start())
            self.counts["links"] += 1
            path, _, anchor = target.partition("#")
            md_dir = os.path.dirname(md)
            rel = os.path.normpath(os.path.join(md_dir, path))
            if rel.startswith(".."):
                self.report(md, line, f"link `{target}` points outside the repository")
                continue
            if not (os.path.exists(os.path.join(self.docs_root, rel)) or self.repo.exists(rel)):
                self.report(md, line, f"link `{target}` does not resolve ({rel} does not exist)")
                continue
            if anchor and rel.endswith(".md"):
                base = self.docs_root if os.path.exists(os.path.join(self.docs_root, rel)) else self.repo.root
                if anchor not in md_anchors(os.path.join(base, rel)):
                    self.report(md, line, f"link `{target}`: {rel} has no heading #{anchor}")

    # -- 2. file:line
    def resolve_file(self, name):
        if "/" in name:
            n = os.path.normpath(name)
            return [n] if self.repo.exists(n) and os.path.isfile(os.path.join(self.repo.root, n)) else []
        return sorted(self.repo.by_base.get(name, []))

    def check_file_line(self, md, line, m, md_line_spans=None, ref_span=None, message=None):
        name, n1 = m.group(1), int(m.group(2))
        n2 = int(m.group(3)) if m.group(3) else n1
        if self.excluded(name):
            return
        self.counts["line refs"] += 1
        ref = m.group(0)
        files = self.resolve_file(name)
        if not files:
            self.report(md, line, f"`{ref}`: no file {name} in the repository")
            return
        if n2 < n1:
            self.report(md, line, f"`{ref}`: the range ends before it starts")
            return
        fits = [f for f in files if len(self.repo.lines(f) or []) >= n2]
        if not fits:
            f = files[0]
            self.report(md, line, f"`{ref}`: {f} has only {len(self.repo.lines(f) or [])} lines")
            return
        if message is not None:
            self.check_error_location(md, line, ref, fits, n1, message)
            return
        sym = self.nearest_symbol(md_line_spans or [], ref_span) if md_line_spans is not None else None
        if not sym:
            return
        last = re.sub(r"\(\)$", "", sym).split("::")[-1].lstrip("~")
        word = re.compile(r"(?<![\w])" + re.escape(last) + r"(?!\w)")
        for f in fits:
            ls = self.repo.lines(f)
            lo, hi = max(1, n1 - SYMBOL_WINDOW), min(len(ls), n2 + SYMBOL_WINDOW)
            if any(word.search(ls[k - 1]) for k in range(lo, hi + 1)):
                return
        f = fits[0]
        ls = self.repo.lines(f)
        now = []
        if "::" in sym:  # the qualified name first (a definition), then the last component
            qual = re.compile(r"(?<![\w:])" + re.escape(re.sub(r"\(\)$", "", sym)) + r"(?!\w)")
            now = [str(k + 1) for k, l in enumerate(ls) if qual.search(l)]
        now = now or [str(k + 1) for k, l in enumerate(ls) if word.search(l)]
        where = ("it is now on line " + ", ".join(now[:6]) + (", ..." if len(now) > 6 else "")
                 if now else f"{f} no longer holds it")
        self.report(md, line, f"`{ref}`: `{sym}` is not at lines {n1}-{n2} (+-{SYMBOL_WINDOW}) of {f}; {where}")

    def nearest_symbol(self, spans, ref_span):
        """spans: (content, start, end) on the Markdown line; ref_span: (start, end) of the ref."""
        best, dist = None, None
        for content, a, b in spans:
            if a <= ref_span[0] < b:
                continue  # the span that holds the reference itself
            c = content.strip()
            if not IDENT_RE.match(c) or c.lower() in ("true", "false", "none") or "/" in c:
                continue
            d = ref_span[0] - b if b <= ref_span[0] else a - ref_span[1]
            if dist is None or d < dist:
                best, dist = c, d
        return best

    @staticmethod
    def statement_literals(ls, k):
        """String literals of the statement that starts at line k (0-based), up to its ';'."""
        text = ""
        for j in range(k, min(len(ls), k + 10)):
            text += ls[j] + "\n"
            if re.search(r";\s*(//.*)?$", ls[j]):
                break
        lits = [x.replace('\\"', '"').replace("\\\\", "\\") for x in re.findall(r'"((?:\\.|[^"\\])*)"', text)]
        return [x for x in lits if len(x.strip()) >= 6 and "\\" not in x]

    def check_error_location(self, md, line, ref, files, n1, message):
        # score: how many characters of the statement's literals the message holds; the
        # statement at n1 must score best in its file (and above 0)
        def score(ls, k):
            return sum(len(s.strip()) for s in self.statement_literals(ls, k) if s.strip() in message)

        best_lines = []
        for f in files:
            ls = self.repo.lines(f)
            scores = {k: score(ls, k) for k in range(len(ls)) if re.search(r"\b[A-Z][A-Z_]{2,}\(|\bthrow\b", ls[k])}
            best = max(scores.values(), default=0)
            here = score(ls, n1 - 1)
            if here > 0 and here >= best:
                # the right statement; its wording must still be the quoted one
                gone = [x.strip() for x in self.statement_literals(ls, n1 - 1) if x.strip() not in message]
                if gone:
                    self.report(md, line, f"`{ref}`: the quoted output lacks \"{gone[0]}\", which the "
                                f"message raised at {f}:{n1} holds")
                return
            best_lines += [(f, k + 1) for k, v in scores.items() if v == best and best > 0]
        f = files[0]
        if best_lines:
            where = "it is raised at " + ", ".join(f"{g}:{k}" for g, k in best_lines)
        else:
            where = f"no statement of {f} raises it"
        self.report(md, line, f"`{ref}`: line {n1} of {f} does not raise the quoted message; {where}")

    def check_size_claims(self, md, block, flat):
        # `a/b.h` and `.cpp` (..., about N lines)   |   `a/b.h` (about N)
        pat = re.compile(r"`([\w./-]+\.\w+)`(?:\s+and\s+`(\.\w+)`)?\s*\(([^()]*?)\babout\s+(\d+)(\s+lines)?\s*\)")
        for m in pat.finditer(flat):
            first = self.clean_path(m.group(1))
            if not self.looks_like_repo_path(first):
                continue
            files = [first]
            if m.group(2):
                files.append(os.path.splitext(first)[0] + m.group(2))
            if not all(self.repo.exists(f) for f in files):
                continue  # reported as a missing path
            count = sum(len(self.repo.lines(f) or []) for f in files)
            claim = int(m.group(4))
            if abs(count - claim) > SIZE_TOLERANCE * claim:
                line = block.line_of(m.start(4))
                self.report(md, line, f"{' and '.join(f'`{x}`' for x in files)} said to be about {claim} lines; they are {count}")

    # -- 3. config keys
    def key_of(self, content):
        m = re.match(r"^(--)?([a-z_]+)\.([A-Za-z_][\w]*)(?:\s*=.*|\s+.*)?$", content.strip())
        if not m or m.group(2) not in self.key_sections:
            return None
        if m.group(3) in NOT_KEYS or m.group(3) in PLACEHOLDER_PARTS or m.group(3).isupper():
            return None
        return m.group(2) + "." + m.group(3)

    def check_key(self, md, line, key):
        self.counts["keys"] += 1
        if key not in self.keys:
            sec, k = key.split(".", 1)
            near = sorted(x for x in self.keys if x.endswith("." + k))
            hint = f" (did you mean {', '.join(near)}?)" if near else ""
            self.report(md, line, f"`{key}` is not a config key of train_gpt (train/config.cpp){hint}")

    def check_ini_block(self, md, block):
        section = None
        for i, l in enumerate(block.lines):
            m = re.match(r"^\s*\[(\w+)\]\s*(?:[#;].*)?$", l)
            if m:
                section = m.group(1) if m.group(1) in self.sections else None
                continue
            m = re.match(r"^\s*([A-Za-z_]\w*)\s*=", l)
            if section and m and m.group(1) not in PLACEHOLDER_PARTS:
                self.check_key(md, block.first + i, section + "." + m.group(1))

    # -- 4. program options
    def program_of(self, tok):
        t = tok.strip("'\"")
        if not t or t.endswith(":"):
            return None
        b = os.path.basename(t)
        if b in self.programs and (not t.startswith("-")):
            return b
        return None

    def placeholder(self, opt):
        parts = re.split(r"[.]", opt[2:])
        return any(p in PLACEHOLDER_PARTS or re.search(r"[<>{}]", p) or (p.isupper() and len(p) > 1)
                   for p in parts) or "..." in opt

    def check_command(self, md, line, cmd):
        """A command line: options after a project program are checked against it. Returns
        True when the line ran a project program."""
        ran = False
        for part in re.split(r"\s(?:\|\||&&|\|)\s|;(?:\s|$)", cmd):  # pipes and lists; not f32|bf16
            toks = part.split()
            prog = None
            for k, t in enumerate(toks):
                p = self.program_of(t)
                if p:
                    prog, ran = p, True
                    self.check_path_token(md, line, t)
                    continue
                if prog and re.match(r"^[\w./-]+/", t.strip("'\"")):
                    self.check_path_token(md, line, t)
                m = OPTION_RE.match(t.strip("'\""))
                if not m or not prog:
                    continue
                opt = m.group(0).rstrip(".")
                if self.placeholder(opt):
                    continue
                self.counts["options"] += 1
                if not self.programs[prog].declares(opt, self.programs):
                    self.report(md, line, f"`{opt}`: {prog} ({self.programs[prog].source}) declares no such option")
        return ran

    def check_lone_options(self, md, line, content, context):
        for t in content.split():
            m = OPTION_RE.match(t.strip("'\""))
            if not m:
                continue
            opt = m.group(0).rstrip(".")
            if self.placeholder(opt):
                continue
            if self.key_of(opt):
                continue  # a `--section.key`: check 3 has it
            self.counts["options"] += 1
            if opt in self.all_options or any(p.declares(opt, self.programs) and not p.any
                                               for p in self.programs.values()):
                continue
            if opt in EXTERNAL_OPTIONS:
                continue
            if any(re.search(r"(?<![\w-])" + re.escape(e) + r"(?![\w-])", context) for e in EXTERNAL_PROGRAMS):
                continue
            self.report(md, line, f"`{opt}` is an option of none of the project's programs")

    # -- a file
    def check_md(self, md):
        with open(os.path.join(self.docs_root, md), encoding="utf-8") as f:
            lines = f.read().split("\n")
        marked = None  # the line of an output marker right before the next block
        for block in md_blocks(lines):
            if block.kind == "fence":
                self.check_fence(md, block)
                if marked is not None and marked == block.first - 2:
                    self.check_output(md, block)
                    marked = None
            else:
                self.check_para(md, block, lines)
            if marked is not None:
                self.report(md, marked, f"{OUTPUT_MARKER} must be the line right before a fenced block")
                marked = None
            if block.kind == "para" and block.lines[-1].strip() == OUTPUT_MARKER:
                marked = block.first + len(block.lines) - 1

    def check_fence(self, md, block):
        self.check_ini_block(md, block)
        joined, start = "", None
        for i, l in enumerate(block.lines):
            for m in FILE_LINE_RE.finditer(l):
                bracketed = l[max(0, m.start() - 1):m.start()] == "[" and l[m.end():m.end() + 1] == "]"
                self.check_file_line(md, block.first + i, m, message=l[:m.start()] if bracketed else None)
            code = re.sub(r"(^|\s)#.*$", "", l)
            code = re.sub(r"^\s*\$\s+", "", code)
            if start is None:
                start = block.first + i
            joined += code
            if code.rstrip().endswith("\\"):
                joined = joined.rstrip()[:-1] + " "
                continue
            self.check_command(md, start, joined)
            joined, start = "", None

    def check_para(self, md, block, all_lines):
        spans = code_spans(block.text)
        prose = mask(block.text, spans)
        prose_nourl = URL_RE.sub(lambda m: " " * len(m.group(0)), prose)
        self.check_links(md, block, prose)
        flat = block.text.replace("\n", " ")
        self.check_size_claims(md, block, flat)
        # spans per physical line, for the symbol heuristic
        by_line = {}
        for s in spans:
            by_line.setdefault(block.line_of(s[1]), []).append(s)
        for content, a, b in spans:
            line = block.line_of(a)
            for m in FILE_LINE_RE.finditer(content):
                self.check_file_line(md, line, m, md_line_spans=by_line.get(line, []), ref_span=(a, b))
            key = self.key_of(content)
            if key:
                self.check_key(md, line, key)
            toks = content.split()
            is_cmd = len(toks) > 1 and any(self.program_of(t) for t in toks)
            if is_cmd:
                self.check_command(md, line, content)
            elif content.strip().startswith("-"):
                near = all_lines[max(0, line - 1 - EXTERNAL_CONTEXT_LINES):line + EXTERNAL_CONTEXT_LINES]
                self.check_lone_options(md, line, content, "\n".join(near))
            for t in [] if is_cmd else toks:  # (a command's paths: check_command)
                self.check_path_token(md, line, t, block.text, a)
        self.check_table_rows(md, block)
        self.check_code_names(md, block, spans)
        for m in FILE_LINE_RE.finditer(prose_nourl):
            line = block.line_of(m.start())
            self.check_file_line(md, line, m, md_line_spans=by_line.get(line, []), ref_span=(m.start(), m.end()))

    def check_table_rows(self, md, block):
        """| `autograd/` | ... (`ops.h`, `recompute.h`) |: in a table row whose first cell is one
        folder, bare file and folder names (`name.ext`, `sub/`, `sub/*.cpp`) are in that folder."""
        for i, l in enumerate(block.lines):
            cells = [c.strip() for c in l.strip().strip("|").split("|")]
            if not l.lstrip().startswith("|") or len(cells) < 2:
                continue
            m = re.match(r"^`([\w./-]+/)`$", cells[0])
            if not m or not self.looks_like_repo_path(m.group(1)) or not self.repo.exists(m.group(1)):
                continue
            folder = m.group(1)
            for content, _, _ in code_spans(" | ".join(cells[1:])):
                c = content.strip()
                if not re.match(r"^[\w.*-]+(?:/[\w.*-]+)*(?:\.[A-Za-z]\w*|/)$", c) or self.looks_like_repo_path(c):
                    continue
                if c.split("/")[0] in TOP_DIRS:
                    continue
                self.counts["paths"] += 1
                if not self.path_exists(folder + c):
                    self.report(md, block.first + i, f"`{c}` in the row of `{folder}`: {folder}{c} does not exist")

    def run(self):
        mds = []
        if os.path.exists(os.path.join(self.docs_root, "README.md")):
            mds.append("README.md")
        for p in sorted(glob.glob(os.path.join(self.docs_root, "docs", "**", "*.md"), recursive=True)):
            mds.append(os.path.relpath(p, self.docs_root))
        for md in mds:
            self.check_md(md)
        self.check_design_map()
        self.check_layout_block()
        self.check_page_lengths(mds)
        return mds

    # -- 6. `A::b` and `name()` name something in the code
    def check_code_names(self, md, block, spans):
        for content, a, _ in spans:
            c = re.sub(r"::\s+", "::", content.strip())
            m = CODE_NAME_RE.match(c)
            if not m:
                continue
            name = m.group(1) or m.group(2)
            shown = name + ("()" if m.group(2) else "")
            if shown in EXTERNAL_NAMES or re.sub(r"\(.*\)$", "()", c) in EXTERNAL_NAMES:
                continue
            if self._code is None:
                self._code = CodeIndex(self.repo.root)
            self.counts["names"] += 1
            if not self._code.resolves(name):
                self.report(md, block.line_of(a), f"`{c}` names no identifier in the code (was it renamed?)")

    # -- 9. a command's output quoted in a fenced block is what the command prints
    def check_output(self, md, block):
        lines = block.lines
        if not lines or not lines[0].startswith("$ "):
            self.report(md, block.first, f"the block after {OUTPUT_MARKER} must open with `$ COMMAND`")
            return
        cmd, i = lines[0][2:], 1
        while cmd.rstrip().endswith("\\") and i < len(lines):
            cmd, i = cmd.rstrip()[:-1] + " " + lines[i].strip(), i + 1
        words = shlex.split(cmd)
        if not words or not re.match(r"^build/[\w.-]+$", words[0]) or any(w in ("|", ">", "&&", ";") for w in words):
            self.report(md, block.first, f"`{cmd}`: an output check runs one build/PROGRAM, without a shell")
            return
        if self.build_dir is None:
            self.counts["outputs not run (no --build)"] += 1
            return
        self.counts["outputs run"] += 1
        argv = [os.path.join(self.build_dir, words[0][len("build/"):])] + words[1:]
        try:
            r = subprocess.run(argv, cwd=self.repo.root, capture_output=True, text=True, timeout=OUTPUT_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as e:
            self.report(md, block.first, f"`{cmd}` could not be run: {e}")
            return
        if r.returncode != 0:
            last = (r.stderr.strip().split("\n") or [""])[-1]
            self.report(md, block.first, f"`{cmd}` exits {r.returncode}: {last}")
            return
        for n, msg in output_differences(lines[i:], r.stdout.rstrip("\n").split("\n"))[:3]:
            self.report(md, block.first + i + n, f"output of `{cmd}` drifted: {msg}")

    # -- 7. README.md's layout block lists the folders there are
    def layout_block(self):
        """(first line, lines) of the first fenced block under README.md's LAYOUT_HEADING."""
        path = os.path.join(self.docs_root, "README.md")
        if not os.path.exists(path):
            return None
        lines = open(path, encoding="utf-8").read().split("\n")
        under = False
        for b in md_blocks(lines):
            if b.kind == "para" and re.match(r"^#{1,6}\s+", b.lines[0]):
                under = re.sub(r"^#{1,6}\s+", "", b.lines[0]).strip() == LAYOUT_HEADING
            elif b.kind == "fence" and under:
                return b
        return None

    def check_layout_block(self):
        """Each entry (a line that starts with a path) must exist; every top-level folder
        tracked by git (not hidden) must be an entry; where an entry's description names
        subfolders of it (`sub/`, `top/sub/`), they must exist and be all of its subfolders."""
        md = "README.md"
        block = self.layout_block()
        if block is None:
            if os.path.exists(os.path.join(self.docs_root, md)):
                self.report(md, 1, f"no fenced block under a `## {LAYOUT_HEADING}` heading: the layout of the folders is missing")
            return
        tops, subs = tracked_dirs(self.repo.root)
        entries = {}  # top folder -> [line of its entry, description text]
        current = None
        for i, l in enumerate(block.lines):
            m = re.match(r"^([^\s]+)(\s.*)?$", l)
            if m:
                entry = m.group(1)
                self.counts["paths"] += 1
                if not self.repo.exists(entry.rstrip("/")):
                    self.report(md, block.first + i, f"layout: `{entry}` does not exist")
                current = entry.split("/")[0]
                entries[current] = [block.first + i, m.group(2) or ""]
            elif current:
                entries[current][1] += " " + l.strip()
        for t in sorted(tops):
            if t not in entries:
                self.report(md, block.first, f"layout: the top-level folder `{t}/` is not listed")
        for top, (line, desc) in sorted(entries.items()):
            named = set()
            for m in re.finditer(r"(?<![\w./-])((?:[\w-]+/)+)(?![\w])", desc):
                parts = m.group(1).rstrip("/").split("/")
                if parts[0] == top:
                    parts = parts[1:]
                if not parts:
                    continue
                self.counts["paths"] += 1
                if not os.path.isdir(os.path.join(self.repo.root, top, *parts)):
                    self.report(md, line, f"layout: `{m.group(1)}` in the entry of `{top}/`: {top}/{'/'.join(parts)}/ does not exist")
                named.add(parts[0])
            if named:
                for sub in sorted(subs.get(top, set()) - named):
                    self.report(md, line, f"layout: the entry of `{top}/` names its subfolders but not `{sub}/`")

    # -- 8. pages a user reads in one sitting
    def check_page_lengths(self, mds):
        for md in mds:
            if not md.startswith("docs" + os.sep):
                continue
            with open(os.path.join(self.docs_root, md), encoding="utf-8") as f:
                n = len(f.read().rstrip("\n").split("\n"))
            if n > MAX_PAGE_LINES:
                self.report(md, MAX_PAGE_LINES + 1, f"the page has {n} lines, more than {MAX_PAGE_LINES}: "
                            "split it by topic or cut what no longer describes the code")

    # -- 5. docs/design.md's map of the code covers the tree
    def check_design_map(self):
        """Every folder that holds C++/CUDA sources is named in docs/design.md (its path, or
        its last part as `name/` in its parent's row), and every header directly in dist/
        (a piece of the parallel core) as `dist/<stem>`, so the map cannot fall behind."""
        md = "docs/design.md"
        path = os.path.join(self.docs_root, md)
        if not os.path.exists(path):
            return
        text = open(path, encoding="utf-8").read()
        spans = set(re.findall(r"`([^`\n]+)`", text))
        src_ext = (".h", ".cpp", ".cu", ".cuh")
        skip = ("third_party", "build", "data", "out", ".git")
        for dirpath, dirnames, filenames in os.walk(self.repo.root):
            rel = os.path.relpath(dirpath, self.repo.root)
            dirnames[:] = [d for d in dirnames if not d.startswith(skip) and not d.startswith(".")]
            if rel == "." or not any(f.endswith(src_ext) for f in filenames):
                continue
            self.counts["paths"] += 1
            last = os.path.basename(rel)
            if not any(t == rel or t.startswith(rel + "/") or t.startswith(last + "/") for t in spans):
                self.report(md, 1, f"the folder `{rel}/` holds sources but the map of the code does not name it")
        for f in sorted(os.listdir(os.path.join(self.repo.root, "dist"))):
            if f.endswith(".h"):
                self.counts["paths"] += 1
                stem = "dist/" + f[:-2]
                if not ({stem, stem + ".h", stem + ".{h,cpp}"} & spans):
                    self.report(md, 1, f"`{stem}` is not in the map of the code (the dist/ table)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=DEFAULT_REPO, help="where README.md and docs/ are read (default: this repository)")
    ap.add_argument("--repo", default=None, help="the source tree to check against (default: the repository of this script)")
    ap.add_argument("-v", "--verbose", action="store_true", help="also print what was read from the sources")
    ap.add_argument("--build", default=None,
                    help="a build folder: run the commands whose output the docs quote (check 9) with its programs")
    args = ap.parse_args()
    root = os.path.abspath(args.root)
    repo = os.path.abspath(args.repo) if args.repo else DEFAULT_REPO
    if not os.path.isdir(os.path.join(repo, "train")):
        print(f"check_docs: {repo} does not look like the repository (no train/)", file=sys.stderr)
        return 2
    build = os.path.abspath(args.build) if args.build else None
    if build and not os.path.isdir(build):
        print(f"check_docs: --build {args.build}: no such folder", file=sys.stderr)
        return 2
    c = Checker(root, repo, build)
    if args.verbose:
        print(f"config sections: {sorted(c.sections)}; {len(c.keys)} dotted keys")
        for n, p in sorted(c.programs.items()):
            extra = (" + any" if p.any else "") + (f" + {p.prefixes}" if p.prefixes else "") + \
                    (f" + options of {p.forwards}" if p.forwards else "")
            print(f"program {n} ({p.source}): {len(p.options)} options{extra}")
    mds = c.run()
    c.problems.items.sort(key=lambda p: (p[0], p[1]))
    for path, line, msg in c.problems.items:
        print(f"{path}:{line}: {msg}")
    n = len(c.problems.items)
    checked = ", ".join(f"{v} {k}" for k, v in c.counts.items())
    if n:
        files = len({p for p, _, _ in c.problems.items})
        print(f"check_docs: {n} problem{'s' if n != 1 else ''} in {files} file{'s' if files != 1 else ''} "
              f"({len(mds)} Markdown files read; checked {checked})")
        return 1
    print(f"check_docs: OK, {len(mds)} Markdown files ({checked})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
