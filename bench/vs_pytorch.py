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
    bench/vs_pytorch.sh --configs MS --impls ndtrain,eager/eager,eager/grouped_mm,compile/grouped_mm
                                                          # MoE: Qwen3MoeForCausalLM, per experts implementation

A PyTorch implementation is eager or compile, and for the MoE config (MS) optionally
/eager, /grouped_mm or /batched_mm after it: transformers' experts implementation
(config._experts_implementation; bare: grouped_mm). Dense configs ignore the suffix.

Whether the machine was idle is measured, not assumed (bench/idle.py): around every timed run
it reads the machine's CPU time from /proc/stat (including time stolen by the hypervisor) and
subtracts what the benchmark's own processes used, so what is left is the CPU time other
processes took, in cores over the run. A round where any run saw more than
--idle-max cores of others is run again, up to --redo times, and then kept but marked; the
medians are over the clean rounds (over all of them, said so, when none was clean).

It also records what torch.compile generated: the instruction set inductor's probe picked
(isa=none: the probe failed and every kernel is scalar C++, so compile is no fair opponent:
said in the output) and how many generated kernels are vectorized.

Prints one markdown table: per implementation the median ms/step over clean rounds, the spread
(min-max), tokens/s, and "ndtrain speed-up": the median over clean rounds of that round's
(its ms / ndtrain's ms), so above 1 means ndtrain is faster; the clean rounds and the most
CPU other processes took in a kept round. Then RESULT lines for scripts.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from idle import OthersMeter  # noqa: E402  (bench/idle.py: other processes' CPU time during a run)
# bench_gpt_train's configs (tokens per step B * T) and defaults for a CPU run: GPT-2 124M at
# B 1 (1024 tokens), the others at their own batch
# (LS, LM and L1B: the llama family, against transformers' LlamaForCausalLM)
# (MS: a Qwen3-MoE, against transformers' Qwen3MoeForCausalLM)
DEFAULT_BATCH = {"S": 8, "M": 8, "GPT2": 1, "LS": 8, "LM": 8, "L1B": 1, "MS": 4}
DEFAULT_STEPS = {"S": 10, "M": 4, "GPT2": 2, "LS": 10, "LM": 4, "L1B": 2, "MS": 3}
SEQ = {"S": 128, "M": 256, "GPT2": 1024, "LS": 128, "LM": 256, "L1B": 512, "MS": 256}
EXPERTS_IMPLS = ("eager", "grouped_mm", "batched_mm")  # transformers' (bench/pytorch_gpt2.py)


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
        inductor = [l for l in self.header if l.startswith("INDUCTOR")]
        self.isa = kv("isa", inductor[0]) if inductor else None
        self.kernels = (int(kv("kernels", inductor[0])), int(kv("vectorized", inductor[0]))) if inductor else None

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
    ap.add_argument("--impls", default="ndtrain,eager,compile",
                    help="any of ndtrain, eager, compile; for MS eager/batched_mm etc. (experts implementation)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", default="", help="timed steps per round: a number, or S=10,M=4,GPT2=2 (the default)")
    ap.add_argument("--batch", default="", help="sequences per step: a number, or S=8,M=8,GPT2=1 (the default)")
    ap.add_argument("--contend", type=int, default=0,
                    help="this many single-threaded busy loops run beside the whole benchmark (a shared machine)")
    ap.add_argument("--idle-max", type=float, default=0.10,
                    help="a round is clean when no run in it saw other processes take more than this many cores")
    ap.add_argument("--redo", type=int, default=2, help="times a round that was not clean is run again")
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
        base, _, experts = i.partition("/")
        if base not in ("ndtrain", "eager", "compile") or (experts and (base == "ndtrain" or
                                                                         experts not in EXPERTS_IMPLS)):
            ap.error(f"impl {i!r}: want ndtrain, eager or compile (MoE: eager/X or compile/X, X one of "
                     f"{', '.join(EXPERTS_IMPLS)})")
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
                if twin and twin.isa is not None:
                    vec = f"{twin.kernels[1]} of {twin.kernels[0]} kernels vectorized"
                    if twin.isa == "none":
                        print(f"{config} {dtype}: WARNING: inductor's ISA probe failed here: torch.compile's "
                              f"kernels are scalar C++ ({vec}); its figures are not a fair opponent", flush=True)
                    else:
                        print(f"{config} {dtype}: torch.compile generated code for {twin.isa} ({vec})", flush=True)
                own_pids = ([twin.proc.pid] if twin else []) + [p.pid for p in busy]
                kept = []  # per round: ({impl: ms}, {impl: loss}, most cores others took)
                for r in range(args.rounds):
                    order = impls[r % len(impls):] + impls[:r % len(impls)]
                    for attempt in range(args.redo + 1):
                        ms, loss, others = {}, {}, 0.0
                        for impl in order:
                            with OthersMeter(own_pids) as meter:
                                if impl == "ndtrain":
                                    ms[impl], loss[impl] = ndtrain(bench, config, dtype, args.threads, B, n, env)
                                else:
                                    ms[impl], loss[impl] = twin.run(impl, n)
                            others = max(others, meter.cores)
                        clean = others <= args.idle_max
                        note = "" if clean else (f"  NOT CLEAN: others took {others:.2f} cores" +
                                                 (", run again" if attempt < args.redo else ", kept and marked"))
                        print(f"  round {r + 1}: " + ", ".join(f"{i} {ms[i]:.1f} ms" for i in impls) +
                              f" (others {others:.2f} cores){note}", flush=True)
                        if clean or attempt == args.redo:
                            kept.append((ms, loss, others, clean))
                            break
                if twin:
                    twin.close()
                use = [k for k in kept if k[3]] or kept
                n_clean = sum(k[3] for k in kept)
                worst = max(k[2] for k in kept)
                for impl in impls:
                    times = [k[0][impl] for k in use]
                    med = statistics.median(times)
                    ratio = statistics.median(k[0][impl] / k[0]["ndtrain"] for k in use)
                    tok = B * SEQ[config] / (med / 1e3)
                    last_loss = use[-1][1][impl]
                    rows.append((config, dtype, B, impl, med, min(times), max(times), tok, ratio, last_loss,
                                 n_clean, len(kept), worst))
                    isa = twin.isa if (twin and impl.startswith("compile") and twin.isa) else ""
                    results.append(f"RESULT config={config} dtype={dtype} B={B} impl={impl} median_ms={med:.2f} "
                                   f"min_ms={min(times):.2f} max_ms={max(times):.2f} tokens_per_s={tok:.0f} "
                                   f"ndtrain_speedup={ratio:.3f} final_loss={last_loss:.4f} "
                                   f"rounds={len(kept)} clean_rounds={n_clean} others_max_cores={worst:.2f} "
                                   f"steps={n} contend={args.contend}" + (f" inductor_isa={isa}" if isa else ""))
    finally:
        for p in busy:
            p.kill()
            p.wait()
    print()
    print("| config | dtype | B | implementation | ms/step (median) | min-max | tokens/s | ndtrain speed-up | "
          "last loss | clean rounds | others (max) |")
    print("|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    names = {"ndtrain": "ndtrain", "eager": "PyTorch eager", "compile": "torch.compile"}
    for i in impls:
        base, _, experts = i.partition("/")
        if experts:
            names[i] = f"{names[base]} (experts {experts})"
    for config, dtype, B, impl, med, lo, hi, tok, ratio, l, n_clean, n_kept, worst in rows:
        print(f"| {config} | {dtype} | {B} | {names[impl]} | {med:.1f} | {lo:.1f}-{hi:.1f} | {tok:.0f} | "
              f"{'' if impl == 'ndtrain' else f'{ratio:.2f}x'} | {l:.3f} | {n_clean}/{n_kept} | {worst:.2f} cores |")
    print(f"\n(medians over clean rounds: no other process took more than {args.idle_max:.2f} cores during any "
          f"run of the round; where no round was clean, over all, as the column shows)")
    print()
    for line in results:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
