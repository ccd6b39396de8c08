#!/usr/bin/env python3
"""bench/bench_lora.py's PyTorch side: one training run of transformers' LlamaForCausalLM
(bench/pytorch_gpt2.py's Llama, bench_gpt_train's shapes), full or with PEFT's LoRA.

    python bench/bench_lora_twin.py --config LM --rank 16 --mode eager --threads 2 --batch 8
    python bench/bench_lora_twin.py --rss-of -- build/bench_gpt_train LM 2   # a command's peak RSS

One warm-up step (the compile under --mode compile), then --steps timed steps (f32, clipping at
1.0, AdamW lr 1e-4, betas 0.9/0.95, over the trained parameters only). Prints
    RESULT mode=eager rank=16 ms=... peak_rss_mib=... trainable=... final_loss=...
peak_rss_mib: this process's RSS high-water mark minus its RSS once torch, transformers and
peft were imported (before the model was built). --rss-of runs a command instead, passes its
output through and prints "RSS peak_mib=..." (getrusage of that child; os.wait4).
"""
import argparse
import os
import resource
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def rss_now_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def rss_of(cmd):
    p = subprocess.Popen(cmd)
    _, status, usage = os.wait4(p.pid, 0)
    code = os.waitstatus_to_exitcode(status)
    print(f"RSS peak_mib={usage.ru_maxrss / 1024:.1f}", flush=True)
    return code


def main():
    if "--rss-of" in sys.argv:
        return rss_of(sys.argv[sys.argv.index("--") + 1:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="LM", choices=["LS", "LM", "L1B", "ltiny"])
    ap.add_argument("--rank", type=int, default=16, help="LoRA rank (0: full fine-tuning)")
    ap.add_argument("--targets", default="all-linear",
                    help="PEFT's target_modules: all-linear or comma-separated names (q_proj,v_proj)")
    ap.add_argument("--mode", default="eager", choices=["eager", "compile"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()
    import torch
    sys.path.insert(0, HERE)
    from pytorch_gpt2 import CONFIGS, Llama, padded_vocab
    import peft  # noqa: F401  (imported before the baseline, as the libraries are)
    torch.set_num_threads(args.threads)
    base_rss = rss_now_mib()
    cfg = CONFIGS[args.config]
    torch.manual_seed(1337)
    model = Llama(cfg, padded_vocab(cfg["vocab"]))
    if args.rank > 0:
        model.model = peft.get_peft_model(model.model, peft.LoraConfig(
            r=args.rank, lora_alpha=2 * args.rank, target_modules=args.targets if args.targets == "all-linear" else args.targets.split(","), lora_dropout=0.0))
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0, fused=True)
    step_model = torch.compile(model, dynamic=False) if args.mode == "compile" else model
    gen = torch.Generator().manual_seed(0)
    T, V = cfg["T"], cfg["vocab"]

    def step():
        x = torch.randint(0, V, (args.batch, T), generator=gen)
        y = torch.randint(0, V, (args.batch, T), generator=gen)
        opt.zero_grad(set_to_none=True)
        loss = step_model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        return loss.item()

    step()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        loss = step()
    ms = (time.perf_counter() - t0) / args.steps * 1e3
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - base_rss
    print(f"RESULT mode={args.mode} rank={args.rank} config={args.config} B={args.batch} T={T} ms={ms:.2f} "
          f"peak_rss_mib={peak:.1f} trainable={sum(p.numel() for p in params)} final_loss={loss:.4f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
