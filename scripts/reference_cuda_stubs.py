#!/usr/bin/env python3
"""scripts/reference_cuda_stubs.py: stub libraries for the CUDA libraries that PyPI's torch
links against, so that a CPU-only venv can `import torch` without ~3 GB of NVIDIA wheels.

   python3 scripts/reference_cuda_stubs.py SITE_PACKAGES     # writes the stubs, prints them

PyPI's Linux x86-64 torch is the CUDA build: libtorch_cuda.so, libtorch_python.so and
libtorch_nvshmem.so name cuBLAS, cuDNN, cuFFT, cuSPARSE(Lt), NCCL, NVSHMEM, cuFile and NVRTC
as NEEDED libraries, which the loader must find at `import torch` even when no GPU is ever
used. The real ones come as the nvidia-* wheels (torch's dependencies). This script reads
what torch's libraries ask of each missing one (its version nodes, and the symbols bound to
them or left unversioned) with binutils' readelf, and builds a stub of that soname with the C
compiler: every symbol is defined, a function aborts with a message naming itself, an object
is zeroed memory. The stubs go to torch/lib ($ORIGIN in torch's RPATH, searched after the
nvidia/* folders and before the system's libraries), with STUBS.txt listing them.

What stays real: libcudart and libcupti (torch's CPU library needs them, ~50 MB as wheels), so
torch.cuda.is_available() asks the real runtime and is False without a driver. A stub is
never called on a CPU-only run; on a machine with a GPU the venv is still CPU-only: hide the
GPU (CUDA_VISIBLE_DEVICES=""), which tests/scripts/hf_reference.py does.

Needs readelf and cc (Debian's binutils and gcc, in build-essential).
"""
import ctypes
import glob
import os
import re
import subprocess
import sys
import tempfile

# NVIDIA's libraries: the only ones stubbed (any other missing library is an error).
NVIDIA = re.compile(r"^lib(cu|nv|nccl)")


def readelf(*args):
    return subprocess.run(["readelf", "-W", *args], check=True, capture_output=True,
                          text=True).stdout


def needed(path):  # the NEEDED sonames, in order
    return re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]", readelf("-d", path))


def version_needs(path):  # {soname: [version names it must define]}
    out, cur = {}, None
    for line in readelf("-V", path).splitlines():
        m = re.search(r"File: (\S+)\s+Cnt:", line)
        if m:
            cur = out.setdefault(m.group(1), [])
            continue
        m = re.search(r"^\s+0x[0-9a-f]+:\s+Name: (\S+)\s+Flags:", line)
        if m and cur is not None:
            cur.append(m.group(1))
    return out


def dyn_syms(path):  # [(name, version or None, type, bind, defined)]
    syms = []
    for line in readelf("--dyn-syms", path).splitlines():
        f = line.split()
        if len(f) < 8 or not f[0].rstrip(":").isdigit():
            continue
        typ, bind, ndx, name = f[3], f[4], f[6], f[7]
        version = None
        if "@" in name:
            name, version = name.split("@", 1)[0], name.split("@")[-1]
        syms.append((name, version, typ, bind, ndx != "UND"))
    return syms


def loadable(soname):
    try:
        ctypes.CDLL(soname)
        return True
    except OSError:
        return False


def stem(soname):  # libcusparseLt.so.0 -> cusparselt: the prefix of its symbols, lower case
    return soname[3:].split(".so")[0].lower()


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    site = sys.argv[1]
    lib = os.path.join(site, "torch", "lib")
    entry = glob.glob(os.path.join(site, "torch", "_C.*.so"))
    if not os.path.isdir(lib) or not entry:
        sys.exit(f"no torch in {site}")
    # Where torch's RPATH finds real libraries: torch/lib and the nvidia/* wheel folders.
    real = {}
    for d in [lib, *glob.glob(os.path.join(site, "nvidia", "*", "lib"))]:
        for p in glob.glob(os.path.join(d, "*.so*")):
            real.setdefault(os.path.basename(p), p)
    stubbed = set()
    if os.path.exists(os.path.join(lib, "STUBS.txt")):  # a second run: ours are not real
        stubbed = set(open(os.path.join(lib, "STUBS.txt")).read().split())
        for s in stubbed:
            real.pop(s, None)

    # The libraries `import torch` loads: the NEEDED closure of torch._C.
    closure, todo, missing = [], [entry[0]], []
    while todo:
        p = todo.pop(0)
        if p in closure:
            continue
        closure.append(p)
        for n in needed(p):
            if n in real:
                todo.append(real[n])
            elif NVIDIA.match(n):
                if n not in missing:
                    missing.append(n)
            elif not loadable(n):
                sys.exit(f"{os.path.basename(p)} needs {n}, which is neither in the venv nor "
                         "on this system")
    if not missing:
        print("nothing to stub")
        return

    defined = set()
    for p in closure:
        defined.update(s[0] for s in dyn_syms(p) if s[4])
    process = ctypes.CDLL(None)  # Python itself and the C library

    # stub soname -> {"versions": [...], "syms": {name: (version, type)}}
    stubs = {n: {"versions": [], "syms": {}} for n in missing}
    for p in closure:
        vneeds = version_needs(p)
        ver_owner = {}
        for soname, vers in vneeds.items():
            if soname in stubs:
                for v in vers:
                    ver_owner[v] = soname
                    if v not in stubs[soname]["versions"]:
                        stubs[soname]["versions"].append(v)
        # An unversioned symbol goes to the stub whose name it starts with (ncclCommInitRank:
        # libnccl), else to the first unversioned stub p needs: which one defines it does not
        # matter to the loader, only that one does.
        mine = [n for n in needed(p) if n in stubs]
        fallback = next((n for n in mine if n not in vneeds), mine[0] if mine else None)
        for name, version, typ, bind, is_def in dyn_syms(p):
            if is_def or bind == "WEAK" or not name:
                continue
            if version in ver_owner:
                stubs[ver_owner[version]]["syms"][name] = (version, typ)
            elif version is None and name not in defined and fallback:
                if hasattr(process, name):  # Python's API, the C library
                    continue
                owner = max((n for n in mine if name.lower().startswith(stem(n))),
                            key=lambda n: len(stem(n)), default=fallback)
                stubs[owner]["syms"].setdefault(name, (None, typ))

    with tempfile.TemporaryDirectory() as tmp:
        for soname, st in stubs.items():
            c = os.path.join(tmp, "stub.c")
            with open(c, "w") as f:
                f.write("#include <stdlib.h>\n#include <unistd.h>\n#include <string.h>\n"
                        "static void ndt_stub(const char* s) {\n"
                        f'  const char m[] = "ndtrain reference venv: {soname} is a stub (CPU-only '
                        'torch, scripts/reference_cuda_stubs.py): called ";\n'
                        "  write(2, m, sizeof m - 1); write(2, s, strlen(s)); write(2, \"\\n\", 1);"
                        " abort();\n}\n")
                for i, (name, (_, typ)) in enumerate(sorted(st["syms"].items())):
                    if typ in ("OBJECT", "TLS"):
                        tls = "__thread " if typ == "TLS" else ""
                        f.write(f'{tls}char ndt_o{i}[256] __asm__("{name}");\n')
                    else:
                        f.write(f'void ndt_f{i}(void) __asm__("{name}");\n'
                                f'void ndt_f{i}(void) {{ ndt_stub("{name}"); }}\n')
            cmd = ["cc", "-shared", "-fPIC", "-O0", "-o", os.path.join(lib, soname),
                   f"-Wl,-soname,{soname}", c]
            if st["versions"]:
                vs = os.path.join(tmp, "stub.map")
                with open(vs, "w") as f:
                    for k, v in enumerate(st["versions"]):
                        names = [n for n, (ver, _) in st["syms"].items()
                                 if ver == v or (ver is None and k == 0)]
                        f.write(v + " {\n  global:\n" + "".join(f"  {n};\n" for n in names) +
                                ("  local: *;\n" if k == 0 else "") + "};\n")
                cmd.append(f"-Wl,--version-script={vs}")
            subprocess.run(cmd, check=True)
            print(f"{soname}: {len(st['syms'])} symbols"
                  + (f", versions {' '.join(st['versions'])}" if st["versions"] else ""))
    with open(os.path.join(lib, "STUBS.txt"), "w") as f:
        f.write("\n".join(sorted(set(missing) | stubbed)) + "\n")


if __name__ == "__main__":
    main()
