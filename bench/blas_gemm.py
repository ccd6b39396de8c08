#!/usr/bin/env python3
"""Which BLAS is fastest here: cblas_sgemm at a GPT step's linear shapes, library by library.

Every linear of a block (qkv, attention projection, MLP up and down) and the lm_head, each as
its three GEMMs of a training step (forward Y = X W^T, dX = dY W, dW = dY^T X), row-major as
tensor/cpu/matmul.cpp calls them, on random data; rounds interleaved between the libraries,
so that a busy machine slows them alike. Each library is loaded by path into its own process
(two BLAS libraries in one process would fight over the symbol names).

    python3 bench/blas_gemm.py                      # Debian's OpenBLAS and whatever of the others is installed
    python3 bench/blas_gemm.py --config GPT2 --rounds 5
    python3 bench/blas_gemm.py --lib mine=/path/libblas.so --lib other=/path/libx.so:prefix_
    python3 bench/blas_gemm.py --lib onednn=/usr/lib/x86_64-linux-gnu/libdnnl.so:dnnl

Found by default: Debian's OpenBLAS (OpenMP build, what ndtrain links), Debian's BLIS
(`apt-get install libblis4-openmp`: its Zen kernels), oneDNN's f32 GEMM (Debian's libdnnl,
which ndtrain already links for bf16; called through dnnl_sgemm, row-major), and from
bench/vs_pytorch.sh's venv (~/.cache/ndtrain/torch-venv, or $NDT_BLAS_VENV; `pip install mkl
scipy-openblas32` there): Intel MKL (libmkl_rt) and a current OpenBLAS (scipy-openblas32,
whose symbols carry a scipy_ prefix). A PREFIX of "dnnl" means oneDNN's dnnl_sgemm instead of
a CBLAS.
Prints per library the median over rounds of the whole list's time and GFLOP/s, and each
shape's GFLOP/s (the median round's).
"""
import argparse
import ctypes
import glob
import os
import statistics
import subprocess
import sys
import time

CONFIGS = {"M": (2048, 384, 4096), "GPT2": (1024, 768, 50304), "S": (1024, 256, 512)}  # rows B*T, C, vocab


def measure(path, prefix, config, seconds):
    """In a child process: one pass over the list; prints 'name seconds flops' per GEMM."""
    import numpy as np

    lib = ctypes.CDLL(path)
    i32, i64, f32, ptr, char = ctypes.c_int, ctypes.c_int64, ctypes.c_float, ctypes.c_void_p, ctypes.c_char
    row_major, no_t, t = 101, 111, 112
    if prefix == "dnnl":  # dnnl_sgemm(transa, transb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc): row-major
        fn = lib.dnnl_sgemm
        fn.restype = i32
        fn.argtypes = [char, char, i64, i64, i64, f32, ptr, i64, ptr, i64, f32, ptr, i64]

        def gemm(ta, tb, m, n, k, a, b, c):
            status = fn(b"N" if ta == no_t else b"T", b"N" if tb == no_t else b"T", m, n, k, 1.0, a.ctypes.data,
                        k if ta == no_t else m, b.ctypes.data, n if tb == no_t else k, 0.0, c.ctypes.data, n)
            if status != 0:
                raise RuntimeError(f"dnnl_sgemm returned {status}")
    else:
        fn = getattr(lib, prefix + "cblas_sgemm")
        fn.restype = None
        fn.argtypes = [i32, i32, i32, i32, i32, i32, f32, ptr, i32, ptr, i32, f32, ptr, i32]

        def gemm(ta, tb, m, n, k, a, b, c):
            fn(row_major, ta, tb, m, n, k, 1.0, a.ctypes.data, k if ta == no_t else m, b.ctypes.data,
               n if tb == no_t else k, 0.0, c.ctypes.data, n)

    R, C, V = CONFIGS[config]
    rng = np.random.default_rng(0)
    for fan_in, fan_out in [(C, 3 * C), (C, C), (C, 4 * C), (4 * C, C), (C, V)]:
        X = rng.standard_normal((R, fan_in), dtype=np.float32)
        W = rng.standard_normal((fan_out, fan_in), dtype=np.float32)
        dY = rng.standard_normal((R, fan_out), dtype=np.float32)
        Y, dX, dW = (np.empty(s, np.float32) for s in [(R, fan_out), (R, fan_in), (fan_out, fan_in)])
        for name, f, out, want in [("fwd", lambda: gemm(no_t, t, R, fan_out, fan_in, X, W, Y), Y, lambda: X @ W.T),
                                   ("dX", lambda: gemm(no_t, no_t, R, fan_in, fan_out, dY, W, dX), dX, lambda: dY @ W),
                                   ("dW", lambda: gemm(t, no_t, fan_out, fan_in, R, dY, X, dW), dW, lambda: dY.T @ X)]:
            f()
            ref = want().astype(np.float64)  # a wrong call must not be timed as a fast one
            err = np.abs(out - ref).max() / np.abs(ref).max()
            if not err < 1e-4:
                sys.exit(f"{path}: {fan_in}x{fan_out}:{name} differs from numpy's product by {err:.2e} (relative)")
            n, t0 = 0, time.perf_counter()
            while n < 2 or time.perf_counter() - t0 < seconds:
                f()
                n += 1
            print(f"{fan_in}x{fan_out}:{name} {(time.perf_counter() - t0) / n:.6f} {2.0 * R * fan_in * fan_out:.0f}")


def default_libs():
    libs = []
    for p in ["/usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.so.0",
              "/usr/lib/x86_64-linux-gnu/libopenblas.so.0"]:
        if os.path.exists(p):
            libs.append(("Debian OpenBLAS", p, ""))
            break
    for p in ["/usr/lib/x86_64-linux-gnu/blis-openmp/libblis.so.4", "/usr/lib/x86_64-linux-gnu/libblis.so.4"]:
        if os.path.exists(p):
            libs.append(("Debian BLIS", p, ""))
            break
    for p in sorted(glob.glob("/usr/lib/x86_64-linux-gnu/libdnnl.so.*"))[:1]:
        libs.append(("oneDNN f32 (Debian)", p, "dnnl"))
    venv = os.environ.get("NDT_BLAS_VENV", os.environ.get("NDT_TORCH_VENV", os.path.expanduser("~/.cache/ndtrain/torch-venv")))
    for p in sorted(glob.glob(f"{venv}/lib/python3*/site-packages/scipy_openblas32/lib/libscipy_openblas.so")):
        libs.append(("OpenBLAS (scipy-openblas32)", p, "scipy_"))
    for p in sorted(glob.glob(f"{venv}/lib/libmkl_rt.so*"))[:1]:
        libs.append(("Intel MKL (PyPI)", p, ""))
    return libs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="M", choices=sorted(CONFIGS))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=0.3, help="time per GEMM per round")
    ap.add_argument("--lib", action="append", default=[], help="LABEL=PATH[:SYMBOL_PREFIX] (instead of the defaults)")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        measure(args.child[0], args.child[1], args.config, args.seconds)
        return 0
    libs = []
    for spec in args.lib:
        label, _, rest = spec.partition("=")
        path, _, prefix = rest.partition(":")
        if not label or not os.path.exists(path):
            ap.error(f"--lib {spec!r}: want LABEL=PATH[:PREFIX] with an existing PATH")
        libs.append((label, path, prefix))
    libs = libs or default_libs()
    if not libs:
        sys.exit("blas_gemm: no BLAS library found (--lib LABEL=PATH)")
    env = dict(os.environ)
    for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS"):
        env[k] = str(args.threads)
    rounds = {label: [] for label, _, _ in libs}
    for _ in range(args.rounds):
        for label, path, prefix in libs:
            out = subprocess.run([sys.executable, __file__, "--config", args.config, "--seconds", str(args.seconds),
                                  "--child", path, prefix], capture_output=True, text=True, env=env)
            if out.returncode != 0:
                sys.exit(f"blas_gemm: {label} ({path}): {out.stderr.strip()[-300:]}")
            rounds[label].append([(n, float(s), float(f)) for n, s, f in (l.split() for l in out.stdout.splitlines())])
    R, C, V = CONFIGS[args.config]
    print(f"config {args.config} (rows {R}, n_embd {C}, vocab {V}), {args.threads} threads, {args.rounds} rounds\n")
    print("| library | path | list ms (median) | min-max | GFLOP/s |")
    print("|---|---|---:|---:|---:|")
    medians = {}
    for label, path, _ in libs:
        totals = [sum(s for _, s, _ in r) for r in rounds[label]]
        flops = sum(f for _, _, f in rounds[label][0])
        med = statistics.median(totals)
        medians[label] = sorted(zip(totals, range(len(totals))))[len(totals) // 2][1]
        print(f"| {label} | {path} | {med * 1e3:.1f} | {min(totals) * 1e3:.1f}-{max(totals) * 1e3:.1f} | "
              f"{flops / med / 1e9:.1f} |")
    print("\nGFLOP/s per GEMM (each library's median round):\n")
    print("| GEMM | " + " | ".join(label for label, _, _ in libs) + " |")
    print("|---|" + "---:|" * len(libs))
    names = [n for n, _, _ in rounds[libs[0][0]][0]]
    for j, n in enumerate(names):
        cells = []
        for label, _, _ in libs:
            _, s, f = rounds[label][medians[label]][j]
            cells.append(f"{f / s / 1e9:.1f}")
        print(f"| {n} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
