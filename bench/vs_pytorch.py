#!/usr/bin/env python3
"""ndtrain against PyTorch on the same CPU: the same GPT training step, interleaved rounds.

For every (config, dtype) it starts one PyTorch process (bench/pytorch_gpt2.py --serve) that
builds and warms up an eager and a torch.compile model once, then runs rounds: in each, one
bench_gpt_train process (fresh, with its own warm-up) and one timed batch of steps of each
PyTorch model, in an order that rotates from round to round, so that whatever else the
machine does slows all of them alike. Same model, batch, init scale, clipping and AdamW
(ndtrain's bf16 keeps an f32 master and f32 moments; PyTorch's bf16 is autocast, which keeps
f32 parameters), the same number of threads.

    bench/vs_pytorch.sh                                   # S, M, GPT-2 124M; f32 and bf16
    bench/vs_pytorch.sh --configs S --dtypes f32 --rounds 5
    bench/vs_pytorch.sh --configs S --contend 1           # with one busy-looping process beside
    bench/vs_pytorch.sh --configs LS,LM,L1B               # llamas: transformers' LlamaForCausalLM as the twin

Prints one markdown table: per implementation the median ms/step over rounds, the spread
(min-max), tokens/s, and "ndtrain speed-up": the median over rounds of that round's
(its ms / ndtrain's ms), so above 1 means ndtrain is faster. Then RESULT lines for scripts.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# bench_gpt_train's configs (tokens per step B * T) and defaults for a CPU run: GPT-2 124M at
# B 1 (1024 tokens), the others at their own batch
# (LS, LM and L1B: the llama family, against transformers' LlamaForCausalLM)
DEFAULT_BATCH = {"S": 8, "M": 8, "GPT2": 1, "LS": 8, "LM": 8, "L1B": 1}
DEFAULT_STEPS = {"S": 10, "M": 4, "GPT2": 2, "LS": 10, "LM": 4, "L1B": 2}
SEQ = {"S": 128, "M": 256, "GPT2": 1024, "LS": 128, "LM": 256, "L1B": 512}


def kv(key, line):
    m = re.search(r"(?:^|\s)" + key + r"=(\S+)", line)
    return m.group(1) if m else None


def per_config(text, default, what):
    """'S=10,GPT2=2' or a bare number for all: {config: int}"""
    out = dict(default)
    for item in filter(None, text.split(",")):
        if "=" in item:
            k, v = item.split("=", 1)
            if k not in out:
                sys.exit(f"vs_pytorch: {what}: unknown config {k!r} ({', '.join(SEQ)})")
            out[k] = int(v)
        else:
            out = {k: int(item) for k in out}
    return out


class Twin:
    """bench/pytorch_gpt2.py --serve: the PyTorch models, kept warm between rounds."""

    def __init__(self, python, config, dtype, threads, B, modes, env):
        cmd = [python, os.path.join(HERE, "pytorch_gpt2.py"), "--device", "cpu", "--config", config, "--dtype",
               dtype, "--threads", str(threads), "--serve", "--warmup", "2",
               "--runs", ",".join(f"{m}:{B}" for m in modes)]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        t = time.perf_counter()
        self.header = self._until_ready()
        self.warm_s = time.perf_counter() - t

    def _until_ready(self):
        lines = []
        for line in self.proc.stdout:
            line = line.strip()
            if line == "READY":
                return lines
            lines.append(line)
        sys.exit(f"vs_pytorch: the PyTorch process ended (exit {self.proc.wait()}); its output: {lines[-3:]}")

    def run(self, mode, steps):
        self.proc.stdin.write(f"{mode} {steps}\n")
        self.proc.stdin.flush()
        lines = self._until_ready()
        res = [l for l in lines if l.startswith("RESULT")]
        if not res or kv("ms", res[-1]) is None:
            sys.exit(f"vs_pytorch: PyTorch {mode}: no result in {lines}")
        return float(kv("ms", res[-1])), float(kv("final_loss", res[-1]))

    def close(self):
        try:
            self.proc.stdin.write("quit\n")
            self.proc.stdin.close()
        except BrokenPipeError:
            pass
        self.proc.wait(timeout=60)


def ndtrain(bench, config, dtype, threads, B, steps, env):
    cmd = [bench, config, str(threads), "cpu", "none", "--dtype", dtype, "--batch", str(B), "--steps", str(steps),
           "--warmup", "1"]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    res = [l for l in out.stdout.splitlines() if l.startswith("RESULT")]
    if out.returncode != 0 or not res:
        sys.exit(f"vs_pytorch: {' '.join(cmd)}: exit {out.returncode}: {out.stderr.strip()[-300:]}")
    return float(kv("ms", res[0])), float(kv("final_loss", res[0]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bench", default=os.path.join(HERE, "..", "build", "bench_gpt_train"),
                    help="ndtrain's bench_gpt_train (default build/bench_gpt_train)")
    ap.add_argument("--configs", default="S,M,GPT2")
    ap.add_argument("--dtypes", default="f32,bf16")
    ap.add_argument("--impls", default="ndtrain,eager,compile", help="any of ndtrain, eager, compile")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", default="", help="timed steps per round: a number, or S=10,M=4,GPT2=2 (the default)")
    ap.add_argument("--batch", default="", help="sequences per step: a number, or S=8,M=8,GPT2=1 (the default)")
    ap.add_argument("--contend", type=int, default=0,
                    help="this many single-threaded busy loops run beside the whole benchmark (a shared machine)")
    args = ap.parse_args()
    configs = [c for c in args.configs.split(",") if c]
    dtypes = [d for d in args.dtypes.split(",") if d]
    impls = [i for i in args.impls.split(",") if i]
    for c in configs:
        if c not in SEQ:
            ap.error(f"config {c!r}: want one of {', '.join(SEQ)}")
    for d in dtypes:
        if d not in ("f32", "bf16"):
            ap.error(f"dtype {d!r}: want f32 or bf16")
    for i in impls:
        if i not in ("ndtrain", "eager", "compile"):
            ap.error(f"impl {i!r}: want ndtrain, eager or compile")
    if "ndtrain" not in impls:
        ap.error("--impls must include ndtrain (the ratios are against it)")
    if args.rounds < 1 or args.threads < 1:
        ap.error("--rounds and --threads must be >= 1")
    steps = per_config(args.steps, DEFAULT_STEPS, "--steps")
    batch = per_config(args.batch, DEFAULT_BATCH, "--batch")
    bench = os.path.abspath(args.bench)
    if not os.access(bench, os.X_OK):
        sys.exit(f"vs_pytorch: {bench} is not built (cmake --build build --target bench_gpt_train)")

    env = dict(os.environ)
    import torch  # only for the version line; the models run in their own process

    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.contend)]
    rows, results = [], []
    try:
        print(f"torch {torch.__version__} ({torch.__config__.parallel_info().splitlines()[0]}), "
              f"{args.threads} threads, {args.rounds} rounds, {args.contend} busy loops beside", flush=True)
        for config in configs:
            for dtype in dtypes:
                B, n = batch[config], steps[config]
                modes = [i for i in impls if i != "ndtrain"]
                twin = Twin(sys.executable, config, dtype, args.threads, B, modes, env) if modes else None
                if twin:
                    print(f"{config} {dtype}: PyTorch built and warmed up ({', '.join(modes)}) in "
                          f"{twin.warm_s:.0f} s", flush=True)
                ms = {i: [] for i in impls}
                loss = {}
                for r in range(args.rounds):
                    order = impls[r % len(impls):] + impls[:r % len(impls)]
                    for impl in order:
                        if impl == "ndtrain":
                            t, l = ndtrain(bench, config, dtype, args.threads, B, n, env)
                        else:
                            t, l = twin.run(impl, n)
                        ms[impl].append(t)
                        loss[impl] = l
                    print(f"  round {r + 1}: " + ", ".join(f"{i} {ms[i][-1]:.1f} ms" for i in impls), flush=True)
                if twin:
                    twin.close()
                for impl in impls:
                    med = statistics.median(ms[impl])
                    ratio = statistics.median(a / b for a, b in zip(ms[impl], ms["ndtrain"]))
                    tok = B * SEQ[config] / (med / 1e3)
                    rows.append((config, dtype, B, impl, med, min(ms[impl]), max(ms[impl]), tok, ratio, loss[impl]))
                    results.append(f"RESULT config={config} dtype={dtype} B={B} impl={impl} median_ms={med:.2f} "
                                   f"min_ms={min(ms[impl]):.2f} max_ms={max(ms[impl]):.2f} tokens_per_s={tok:.0f} "
                                   f"ndtrain_speedup={ratio:.3f} final_loss={loss[impl]:.4f} "
                                   f"rounds={args.rounds} steps={n} contend={args.contend}")
    finally:
        for p in busy:
            p.kill()
            p.wait()
    print()
    print("| config | dtype | B | implementation | ms/step (median) | min-max | tokens/s | ndtrain speed-up | last loss |")
    print("|---|---|---:|---|---:|---:|---:|---:|---:|")
    names = {"ndtrain": "ndtrain", "eager": "PyTorch eager", "compile": "torch.compile"}
    for config, dtype, B, impl, med, lo, hi, tok, ratio, l in rows:
        print(f"| {config} | {dtype} | {B} | {names[impl]} | {med:.1f} | {lo:.1f}-{hi:.1f} | {tok:.0f} | "
              f"{'' if impl == 'ndtrain' else f'{ratio:.2f}x'} | {l:.3f} |")
    print()
    for line in results:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
