#!/usr/bin/env python3
"""LoRA against full fine-tuning, in ndtrain and in PyTorch + PEFT: step time and peak memory.

The same llama shape (bench_gpt_train's LS, LM or L1B: transformers' LlamaForCausalLM as the
PyTorch twin), batch, random tokens, clipping at 1.0 and AdamW, on this CPU, with the same
number of threads. Four ways to train it, each run in a fresh process, rounds interleaved so
that whatever else the machine does slows them alike:

    ndtrain full    build/bench_gpt_train LM THREADS cpu none --batch B
    ndtrain LoRA    the same with --lora R: rank-R adapters on every linear of every block
                    (lora.targets = all-linear), the base frozen
    PEFT full       transformers' LlamaForCausalLM, every weight trained (eager; --compile adds
    PEFT LoRA       torch.compile); peft.get_peft_model(LoraConfig(r=R, lora_alpha=2R,
                    target_modules="all-linear", lora_dropout=0)): PEFT's own "all-linear",
                    every linear of the blocks (not lm_head), the base frozen

    bench/bench_lora.py                                  # LM, r 16, B 8, 2 threads, 3 rounds
    bench/bench_lora.py --config LS --rounds 1 --steps 2 # a quick check
    bench/bench_lora.py --compile                        # torch.compile's PEFT runs too
    bench/bench_lora.py --ndtrain-only --targets q_proj,v_proj   # PEFT's default targets, ndtrain alone

Memory, two figures per run: "peak RSS" is the process's resident-set high-water mark
(getrusage of the child, whatever allocated it) minus its RSS before the model was built
(the interpreter and torch's libraries for PyTorch; next to nothing for ndtrain), so both
count parameters, gradients, AdamW moments, activations and workspaces alike; "allocator
peak" is ndtrain's own allocator's peak over the step (bench_gpt_train's total peak), which
PyTorch does not report on a CPU.

Prints a markdown table (median ms/step over rounds, min-max, the ratios the LoRA issue asks
about: LoRA / full in ndtrain and PEFT LoRA / ndtrain LoRA, and the most CPU other processes
took during any of its runs, in cores: bench/idle.py) and RESULT lines. On a shared machine
read the ratios of one round's neighbours, not the absolute times.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from idle import OthersMeter  # noqa: E402  (bench/idle.py: other processes' CPU time during a run)


def kv(key, line):
    m = re.search(rf"\b{key}=(\S+)", line)
    return m.group(1) if m else None


def run_child(cmd, env):
    """Runs cmd; returns its stdout and stderr (exits with its message when it fails)."""
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.exit(f"bench_lora: {' '.join(cmd)}: exit {p.returncode}: {p.stderr.strip()[-400:]}")
    return p.stdout, p.stderr


def ndtrain(args, lora):
    cmd = [args.bench, args.config, str(args.threads), "cpu", "none", "--batch", str(args.batch), "--steps",
           str(args.steps), "--warmup", "1"] + (["--lora", str(args.rank), "--lora-targets", args.targets]
                                                 if lora else [])
    # bench_lora_twin.py --rss-of: runs the command and prints its peak RSS (ru_maxrss of that child)
    out, err = run_child([sys.executable, os.path.join(HERE, "bench_lora_twin.py"), "--rss-of", "--"] + cmd,
                         dict(os.environ))
    res = [l for l in out.splitlines() if l.startswith("RESULT")]
    rss = [l for l in out.splitlines() if l.startswith("RSS")]
    if not res or not rss:
        sys.exit(f"bench_lora: {' '.join(cmd)}: no RESULT line: {out[-400:]} {err[-400:]}")
    return dict(ms=float(kv("ms", res[0])), rss=float(kv("peak_mib", rss[0])),
                alloc=float(kv("total_peak_mib", res[0])), loss=float(kv("final_loss", res[0])))


def pytorch(args, lora, mode):
    cmd = [args.python, os.path.join(HERE, "bench_lora_twin.py"), "--config", args.config, "--threads",
           str(args.threads), "--batch", str(args.batch), "--steps", str(args.steps), "--mode", mode,
           "--rank", str(args.rank if lora else 0), "--targets", args.targets]
    out, err = run_child(cmd, dict(os.environ))
    res = [l for l in out.splitlines() if l.startswith("RESULT")]
    if not res:
        sys.exit(f"bench_lora: {' '.join(cmd)}: no RESULT line: {out[-400:]} {err[-400:]}")
    return dict(ms=float(kv("ms", res[0])), rss=float(kv("peak_rss_mib", res[0])), alloc=None,
                loss=float(kv("final_loss", res[0])), trainable=int(kv("trainable", res[0])))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bench", default=os.path.join(HERE, "..", "build", "bench_gpt_train"))
    ap.add_argument("--python", default=os.path.expanduser("~/.cache/ndtrain/ref-venv/bin/python"),
                    help="a Python with torch, transformers and peft (default: the reference venv)")
    ap.add_argument("--config", default="LM", choices=["LS", "LM", "L1B"])
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--targets", default="all-linear",
                    help="the adapters' linears: all-linear (default) or comma-separated (q_proj,v_proj: PEFT's default)")
    ap.add_argument("--ndtrain-only", action="store_true", help="ndtrain's full and LoRA runs only (no PyTorch)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=3, help="timed steps per run (after 1 warm-up step)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--compile", action="store_true", help="also PEFT under torch.compile")
    args = ap.parse_args()
    args.bench = os.path.abspath(args.bench)
    if not os.access(args.bench, os.X_OK):
        sys.exit(f"bench_lora: {args.bench} is not built (cmake --build build --target bench_gpt_train)")
    if not args.ndtrain_only and not os.access(args.python, os.X_OK):
        sys.exit(f"bench_lora: {args.python} not found; give --python with torch, transformers and peft")
    impls = [("ndtrain", "full"), ("ndtrain", "lora")]
    if not args.ndtrain_only:
        impls += [("eager", "full"), ("eager", "lora")]
    if args.compile and not args.ndtrain_only:
        impls += [("compile", "full"), ("compile", "lora")]
    got = {i: [] for i in impls}
    for r in range(args.rounds):
        order = impls[r % len(impls):] + impls[:r % len(impls)]
        for impl, kind in order:
            with OthersMeter() as meter:
                res = (ndtrain(args, kind == "lora") if impl == "ndtrain" else pytorch(args, kind == "lora", impl))
            res["others"] = meter.cores
            got[(impl, kind)].append(res)
            print(f"  round {r + 1}: {impl} {kind}: {res['ms']:.1f} ms/step, peak RSS {res['rss']:.0f} MiB, "
                  f"loss {res['loss']:.4f}, others took {meter.cores:.2f} cores", flush=True)
    med = {i: statistics.median(x["ms"] for x in got[i]) for i in impls}
    names = {"ndtrain": "ndtrain", "eager": "PEFT eager", "compile": "PEFT torch.compile"}
    print(f"\n{args.config}, B {args.batch}, r {args.rank} {args.targets}, {args.threads} threads, "
          f"{args.rounds} rounds of {args.steps} steps, f32\n")
    print("| implementation | training | ms/step (median) | min-max | peak RSS MiB | allocator peak MiB | "
          "vs ndtrain full | vs ndtrain LoRA | others (max cores) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for i in impls:
        ms = [x["ms"] for x in got[i]]
        rss = statistics.median(x["rss"] for x in got[i])
        alloc = got[i][0]["alloc"]
        print(f"| {names[i[0]]} | {'LoRA r ' + str(args.rank) if i[1] == 'lora' else 'full'} | {med[i]:.1f} | "
              f"{min(ms):.1f}-{max(ms):.1f} | {rss:.0f} | {'' if alloc is None else f'{alloc:.0f}'} | "
              f"{med[i] / med[('ndtrain', 'full')]:.2f}x | {med[i] / med[('ndtrain', 'lora')]:.2f}x | "
              f"{max(x['others'] for x in got[i]):.2f} |")
    print()
    for i in impls:
        print(f"RESULT config={args.config} B={args.batch} rank={args.rank} impl={i[0]} training={i[1]} "
              f"median_ms={med[i]:.2f} peak_rss_mib={statistics.median(x['rss'] for x in got[i]):.1f} "
              f"final_loss={got[i][-1]['loss']:.4f}")
    # the ratios of each round's own runs (neighbours in time share the machine's load), their median
    def ratio(a, b):
        return statistics.median(got[a][r]["ms"] / got[b][r]["ms"] for r in range(args.rounds))
    nl = ("ndtrain", "lora")
    pairs = [("lora_over_full_ndtrain", nl, ("ndtrain", "full"))]
    if not args.ndtrain_only:
        pairs += [("peft_eager_lora_over_ndtrain_lora", ("eager", "lora"), nl),
                  ("peft_eager_full_over_ndtrain_full", ("eager", "full"), ("ndtrain", "full")),
                  ("lora_over_full_peft_eager", ("eager", "lora"), ("eager", "full"))]
    if args.compile and not args.ndtrain_only:
        pairs.append(("peft_compile_lora_over_ndtrain_lora", ("compile", "lora"), nl))
    print("\nper-round ratios (median over rounds): " +
          ", ".join(f"{name} {ratio(a, b):.2f}" for name, a, b in pairs))
    print("RATIO " + " ".join(f"{name}={ratio(a, b):.3f}" for name, a, b in pairs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
