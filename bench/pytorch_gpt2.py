#!/usr/bin/env python3
"""PyTorch reference for bench_gpt_train: the same GPT-2 124M training step, timed.

Model: n_layer 12, n_head 12, n_embd 768, vocab 50304 (GPT-2's 50257 padded to a multiple of
128, as bench_gpt_train pads it), T 1024, learned position embeddings, pre-LayerNorm blocks
(LayerNorm with bias), GELU (tanh approximation), tied token embedding / lm_head, causal
attention through F.scaled_dot_product_attention (PyTorch's fused kernels). Step: forward
and cross-entropy under bf16 autocast (parameters, gradients and AdamW state stay f32),
backward, global-norm clipping at 1.0, AdamW (fused=True on CUDA; lr 1e-4, betas 0.9/0.95,
weight decay 0.1 on 2-D weights). Random tokens, as bench_gpt_train uses.

    python3 bench/pytorch_gpt2.py --batch 8,16 --mode eager,compile       # on a GPU
    python3 bench/pytorch_gpt2.py --runs eager:16,compile:16              # these, in this order
    python3 bench/pytorch_gpt2.py --device cpu --tiny                     # a check without GPU

Prints one line per (mode, batch) after warm-up steps, timed with torch.cuda.synchronize():
    RESULT impl=pytorch mode=eager B=8 T=1024 ms=... tokens_per_s=... mfu_pct=... peak_mib=...
tokens_per_s counts B*T tokens per optimizer step; MFU uses bench_gpt_train's FLOP count
(6 per parameter per token, token embeddings excluded but the lm_head counted, plus
12 * n_layer * T * n_embd for attention) against 989 TFLOP/s (H100/H200 SXM dense bf16).
With --budget-s, runs that would start after that many seconds are reported as skipped.
"""
import argparse
import math
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

PEAK_BF16_TFLOPS = 989.0


class Block(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.n_head = n_head
        self.ln_1 = nn.LayerNorm(n_embd)
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.c_fc = nn.Linear(n_embd, 4 * n_embd)
        self.mlp_proj = nn.Linear(4 * n_embd, n_embd)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        x = x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))
        return x


class GPT(nn.Module):
    def __init__(self, n_layer, n_head, n_embd, vocab, block_size):
        super().__init__()
        self.n_layer, self.n_embd = n_layer, n_embd
        self.wte = nn.Embedding(vocab, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.h = nn.ModuleList([Block(n_embd, n_head) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # tied
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * n_layer) if name.endswith(("c_proj.weight", "mlp_proj.weight")) else 0.02
                nn.init.normal_(p, mean=0.0, std=std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        B, T = idx.shape
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))

    def flops_per_token(self, T, vocab):
        C, L = float(self.n_embd), float(self.n_layer)
        n = L * (12.0 * C * C + 13.0 * C) + vocab * C  # bench_gpt_train's count (GPT::flops_per_token)
        return 6.0 * n + 12.0 * L * T * C


def run(args, mode, B, device, cfg):
    torch.manual_seed(1337)
    model = GPT(cfg["n_layer"], cfg["n_head"], cfg["n_embd"], cfg["vocab"], cfg["T"]).to(device)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    fused = device.type == "cuda"
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-4, betas=(0.9, 0.95), eps=1e-8, fused=fused)
    if mode == "compile":
        # a fresh compile per batch size, static shapes: without the reset, the second batch size
        # recompiles the cached code with a dynamic batch dimension (dynamic=None's default)
        torch._dynamo.reset()
        step_model = torch.compile(model, dynamic=False)
    else:
        step_model = model
    T, V = cfg["T"], cfg["vocab"]
    V_ids = cfg.get("vocab_real", V)  # ids and targets from the real vocabulary, as bench_gpt_train draws them
    gen = torch.Generator().manual_seed(0)

    def batch():
        x = torch.randint(0, V_ids, (B, T), generator=gen)
        y = torch.randint(0, V_ids, (B, T), generator=gen)
        return x.to(device, non_blocking=True), y.to(device, non_blocking=True)

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
            loss = step_model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    t_first = time.perf_counter()
    for _ in range(args.warmup):  # the first compiles under torch.compile
        loss = step(*batch())
    sync()
    warm_s = time.perf_counter() - t_first
    data = [batch() for _ in range(args.steps)]
    sync()
    t0 = time.perf_counter()
    for x, y in data:
        loss = step(x, y)
    sync()
    dt = (time.perf_counter() - t0) / args.steps
    tok_s = B * T / dt
    mfu = model.flops_per_token(T, V) * tok_s / (PEAK_BF16_TFLOPS * 1e12) * 100
    peak = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else 0.0
    print(f"RESULT impl=pytorch mode={mode} B={B} T={T} ms={dt * 1e3:.2f} tokens_per_s={tok_s:.0f} "
          f"mfu_pct={mfu:.2f} peak_mib={peak:.1f} warmup_s={warm_s:.1f} final_loss={loss.item():.4f}", flush=True)
    del model, opt, step_model, data
    if device.type == "cuda":
        torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--batch", default="8,16", help="comma-separated batch sizes")
    ap.add_argument("--mode", default="eager,compile", help="eager, compile or both (comma-separated)")
    ap.add_argument("--steps", type=int, default=10, help="timed steps")
    ap.add_argument("--warmup", type=int, default=3, help="warm-up steps (compilation happens here)")
    ap.add_argument("--tiny", action="store_true", help="a 2-layer model at T 64 (checks the script, no speed)")
    ap.add_argument("--budget-s", type=float, default=0, help="start no run after this many seconds (0: no limit)")
    ap.add_argument("--runs", default="", help="mode:B pairs in order, e.g. eager:16,compile:16 (instead of --mode x --batch)")
    args = ap.parse_args()
    if args.runs:
        try:
            runs = [(m, int(b)) for m, b in (r.split(":") for r in args.runs.split(",") if r)]
        except ValueError:
            ap.error(f"--runs {args.runs!r}: want mode:B pairs, e.g. eager:16,compile:16")
    else:
        runs = [(m, int(b)) for m in args.mode.split(",") if m for b in args.batch.split(",") if b]
    for m, _ in runs:
        if m not in ("eager", "compile"):
            ap.error(f"mode {m!r}: want eager or compile")

    device = torch.device(args.device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            print("pytorch_gpt2: no CUDA device visible to PyTorch", file=sys.stderr)
            return 2
        # TF32 for any f32 matmul left outside autocast. set_float32_matmul_precision, not the
        # allow_tf32 flags: those are deprecated since torch 2.9, and mixing them with the new
        # fp32_precision API (which inductor reads) has broken torch.compile (pytorch#166387)
        torch.set_float32_matmul_precision("high")
        print(f"pytorch_gpt2: torch {torch.__version__}, {torch.cuda.get_device_name(device)}", flush=True)
    else:
        print(f"pytorch_gpt2: torch {torch.__version__}, cpu", flush=True)
    cfg = dict(n_layer=12, n_head=12, n_embd=768, vocab=50304, vocab_real=50257, T=1024)
    if args.tiny:
        cfg = dict(n_layer=2, n_head=2, n_embd=64, vocab=512, T=64)
    start = time.perf_counter()
    rc = 0
    for mode, B in runs:
        if args.budget_s > 0 and time.perf_counter() - start > args.budget_s:
            print(f"RESULT impl=pytorch mode={mode} B={B} T={cfg['T']} skipped=time_budget", flush=True)
            continue
        try:
            run(args, mode, B, device, cfg)
        except Exception as e:  # an OOM or a compile failure ends this run, not the others
            print(f"RESULT impl=pytorch mode={mode} B={B} T={cfg['T']} error={type(e).__name__}: "
                  f"{str(e).splitlines()[0] if str(e) else ''}", flush=True)
            rc = 1
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return rc


if __name__ == "__main__":
    sys.exit(main())
