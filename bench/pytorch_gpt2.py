#!/usr/bin/env python3
"""PyTorch twin of bench_gpt_train: the same GPT training step, timed.

Model (as models/gpt.cpp builds it): learned position embeddings, pre-LayerNorm blocks
(LayerNorm with bias), GELU (tanh approximation), tied token embedding / lm_head, causal
attention through F.scaled_dot_product_attention (PyTorch's fused kernels on GPU and CPU),
GPT-2 init (N(0, 0.02), residual projections N(0, 0.02 / sqrt(2 n_layer)), zero biases).
Configs are bench_gpt_train's: S, M (CPU), GPT2 (124M, vocab 50257 padded to 50304), and
tiny (a check of the script). Step: forward and cross-entropy (under bf16 autocast with
--dtype bf16: parameters, gradients and AdamW state stay f32, as ndtrain's bf16 keeps an f32
master), backward, global-norm clipping at 1.0, AdamW (fused=True, on CPU too; lr 1e-4,
betas 0.9/0.95, eps 1e-8, weight decay 0.1 on 2-D weights). Random tokens, as
bench_gpt_train draws them.

    python3 bench/pytorch_gpt2.py --batch 8,16 --mode eager,compile       # GPT-2 bf16 on a GPU
    python3 bench/pytorch_gpt2.py --runs eager:16,compile:16              # these, in this order
    python3 bench/pytorch_gpt2.py --device cpu --config S --dtype f32 --threads 2 --runs eager:8
    python3 bench/pytorch_gpt2.py --device cpu --tiny                     # a check without GPU
    python3 bench/pytorch_gpt2.py --device cpu --config MS --runs eager/grouped_mm:4,compile/eager:4

Llama configs (LS, LM, L1B) run transformers' LlamaForCausalLM; MoE configs (MS) its
Qwen3MoeForCausalLM, whose experts run as the mode's suffix says: /eager (a loop over the
experts that have tokens), /grouped_mm (torch._grouped_mm over rows sorted by expert; the
default) or /batched_mm (each token's k experts' weights gathered, batched matmuls).

Prints one line per (mode, batch) after warm-up steps (timed with torch.cuda.synchronize()
on a GPU):
    RESULT impl=pytorch mode=eager config=GPT2 dtype=bf16 B=8 T=1024 ms=... tokens_per_s=...
tokens_per_s counts B*T tokens per optimizer step; MFU uses bench_gpt_train's FLOP count
(6 per parameter per token, token embeddings excluded but the lm_head counted, plus
12 * n_layer * T * n_embd for attention) against 989 TFLOP/s (H100/H200 SXM dense bf16).
With --budget-s, runs that would start after that many seconds are reported as skipped.

--serve keeps the models between rounds, for bench/vs_pytorch.py's interleaved rounds: it
builds and warms up (compiles) one model per --mode, prints READY, then for each line
"MODE STEPS" on stdin runs one warm-up and STEPS timed steps of that model and prints its
RESULT line and READY again; "quit" or end of input ends it. With a compiled model on CPU it
first prints what inductor generated: "INDUCTOR isa=avx512+avx512_vnni kernels=N
vectorized=M" (isa=none: its ISA probe failed and every kernel is scalar).
"""
import argparse
import math
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

PEAK_BF16_TFLOPS = 989.0

# bench_gpt_train's cases: vocab is what token ids are drawn from, padded the embedding rows
CONFIGS = {
    "S": dict(n_layer=4, n_head=4, n_embd=256, vocab=512, B=8, T=128),
    "M": dict(n_layer=6, n_head=6, n_embd=384, vocab=4096, B=8, T=256),
    "GPT2": dict(n_layer=12, n_head=12, n_embd=768, vocab=50257, B=16, T=1024),
    "tiny": dict(n_layer=2, n_head=2, n_embd=64, vocab=512, B=2, T=64),
    # the llama family (bench_gpt_train's LS, LM, L1B): Hugging Face transformers' own
    # LlamaForCausalLM with SDPA attention, as a user would train it
    "LS": dict(n_layer=4, n_head=4, n_embd=256, vocab=512, B=8, T=128, n_kv_head=2, inter=688, tied=False),
    "LM": dict(n_layer=6, n_head=6, n_embd=384, vocab=4096, B=8, T=256, n_kv_head=2, inter=1024, tied=False),
    "L1B": dict(n_layer=2, n_head=32, n_embd=2048, vocab=128256, B=1, T=512, n_kv_head=8, inter=8192, tied=True),
    "ltiny": dict(n_layer=2, n_head=4, n_embd=64, vocab=512, B=2, T=64, n_kv_head=2, inter=176, tied=False),
    # mixture of experts (bench_gpt_train's MS): transformers' Qwen3MoeForCausalLM, every layer's
    # MLP 16 experts of 128 hidden units, top 4 with their weights divided by their sum
    "MS": dict(n_layer=4, n_head=8, n_embd=256, vocab=2048, B=4, T=256, n_kv_head=4, inter=512, tied=False,
               experts=16, k=4, moe_inter=128),
    "mtiny": dict(n_layer=2, n_head=4, n_embd=64, vocab=512, B=2, T=64, n_kv_head=2, inter=176, tied=False,
                  experts=4, k=2, moe_inter=32),
}
# transformers' implementations of the experts' loop (config._experts_implementation)
EXPERTS_IMPLS = ("eager", "grouped_mm", "batched_mm")


def padded_vocab(vocab):  # bench_gpt_train: vocab_multiple 128 above 4096, else none
    return (vocab + 127) // 128 * 128 if vocab > 4096 else vocab


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


class Llama(nn.Module):
    """transformers' LlamaForCausalLM (SDPA attention, its own init: N(0, 0.02)) with the
    bench's loss: cross-entropy of the logits against the given targets (no shift)."""

    def __init__(self, cfg, vocab):
        super().__init__()
        try:
            from transformers import LlamaConfig, LlamaForCausalLM
        except ImportError:
            sys.exit("pytorch_gpt2: the llama configs need transformers (pip install transformers)")
        self.cfg, self.V = cfg, vocab
        hf = LlamaConfig(vocab_size=vocab, hidden_size=cfg["n_embd"], intermediate_size=cfg["inter"],
                         num_hidden_layers=cfg["n_layer"], num_attention_heads=cfg["n_head"],
                         num_key_value_heads=cfg["n_kv_head"], max_position_embeddings=cfg["T"],
                         rms_norm_eps=1e-5, tie_word_embeddings=cfg["tied"], attention_bias=False,
                         rope_theta=500000.0)
        hf._attn_implementation = "sdpa"
        self.model = LlamaForCausalLM(hf)

    def forward(self, idx, targets):
        logits = self.model(input_ids=idx, use_cache=False).logits
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))

    def flops_per_token(self, T, vocab):  # bench_gpt_train's count (GPT::flops_per_token, llama)
        C, L, I = float(self.cfg["n_embd"]), float(self.cfg["n_layer"]), float(self.cfg["inter"])
        kv = C / self.cfg["n_head"] * self.cfg["n_kv_head"]
        n = L * (C * (C + 2 * kv) + C * C + 3 * C * I + 2 * C) + vocab * C
        return 6.0 * n + 12.0 * L * T * C


class Qwen3Moe(Llama):
    """transformers' Qwen3MoeForCausalLM (SDPA attention, q/k norms, every layer's MLP a mixture
    of experts) with the bench's loss; its experts run as `experts_impl` (EXPERTS_IMPLS). No
    load-balancing loss (output_router_logits off), as bench_gpt_train's MS."""

    def __init__(self, cfg, vocab, experts_impl):
        nn.Module.__init__(self)
        try:
            from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
        except ImportError:
            sys.exit("pytorch_gpt2: the MoE configs need transformers >= 5 (pip install transformers)")
        self.cfg, self.V = cfg, vocab
        hf = Qwen3MoeConfig(vocab_size=vocab, hidden_size=cfg["n_embd"], intermediate_size=cfg["inter"],
                            moe_intermediate_size=cfg["moe_inter"], num_experts=cfg["experts"],
                            num_experts_per_tok=cfg["k"], norm_topk_prob=True, num_hidden_layers=cfg["n_layer"],
                            num_attention_heads=cfg["n_head"], num_key_value_heads=cfg["n_kv_head"],
                            head_dim=cfg["n_embd"] // cfg["n_head"], max_position_embeddings=cfg["T"],
                            rms_norm_eps=1e-5, tie_word_embeddings=cfg["tied"], rope_theta=500000.0,
                            output_router_logits=False)
        hf._attn_implementation = "sdpa"
        hf._experts_implementation = experts_impl
        self.model = Qwen3MoeForCausalLM(hf)

    def flops_per_token(self, T, vocab):  # the active parameters: k of E experts, the router
        C, L = float(self.cfg["n_embd"]), float(self.cfg["n_layer"])
        kv = C / self.cfg["n_head"] * self.cfg["n_kv_head"]
        mlp = 3 * C * self.cfg["moe_inter"] * self.cfg["k"] + C * self.cfg["experts"]
        n = L * (C * (C + 2 * kv) + C * C + mlp + 2 * C) + vocab * C
        return 6.0 * n + 12.0 * L * T * C


def split_mode(mode):
    """'compile/grouped_mm' -> ('compile', 'grouped_mm'); a bare 'eager' -> ('eager', 'grouped_mm')"""
    step, _, experts = mode.partition("/")
    return step, experts or "grouped_mm"


class Trainer:
    """One model, its optimizer and its (possibly compiled) step, for one mode and batch."""

    def __init__(self, mode, B, device, cfg, dtype):
        torch.manual_seed(1337)
        self.mode, self.B, self.device, self.cfg, self.dtype = mode, B, device, cfg, dtype
        self.V = padded_vocab(cfg["vocab"])
        if "experts" in cfg:
            self.model = Qwen3Moe(cfg, self.V, split_mode(mode)[1]).to(device)
        elif "n_kv_head" in cfg:
            self.model = Llama(cfg, self.V).to(device)
        else:
            self.model = GPT(cfg["n_layer"], cfg["n_head"], cfg["n_embd"], self.V, cfg["T"]).to(device)
        decay = [p for p in self.model.parameters() if p.dim() >= 2]
        no_decay = [p for p in self.model.parameters() if p.dim() < 2]
        groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
        try:  # the fused kernel exists for CPU too since torch 2.4
            self.opt = torch.optim.AdamW(groups, lr=1e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)
        except (RuntimeError, TypeError):
            self.opt = torch.optim.AdamW(groups, lr=1e-4, betas=(0.9, 0.95), eps=1e-8, foreach=True)
        if split_mode(mode)[0] == "compile":
            # a fresh compile per model, static shapes: without the reset, a second batch size
            # recompiles the cached code with a dynamic batch dimension (dynamic=None's default)
            torch._dynamo.reset()
            self.step_model = torch.compile(self.model, dynamic=False)
        else:
            self.step_model = self.model
        self.gen = torch.Generator().manual_seed(0)
        self.loss = float("nan")

    def batch(self):
        T, V = self.cfg["T"], self.cfg["vocab"]  # ids from the real vocabulary, as bench_gpt_train draws them
        x = torch.randint(0, V, (self.B, T), generator=self.gen)
        y = torch.randint(0, V, (self.B, T), generator=self.gen)
        return x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)

    def step(self, x, y):
        self.opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type=self.device.type, dtype=torch.bfloat16, enabled=self.dtype == "bf16"):
            loss = self.step_model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        return loss

    def sync(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def warm(self, steps):
        """Untimed steps (the first compiles under torch.compile); returns their seconds."""
        t = time.perf_counter()
        for _ in range(steps):
            self.loss = self.step(*self.batch()).item()
        self.sync()
        return time.perf_counter() - t

    def timed(self, steps):
        """Mean seconds per step over `steps` steps on batches made beforehand."""
        data = [self.batch() for _ in range(steps)]
        self.sync()
        t0 = time.perf_counter()
        for x, y in data:
            loss = self.step(x, y)
        self.sync()
        dt = (time.perf_counter() - t0) / steps
        self.loss = loss.item()
        return dt

    def result(self, dt, warm_s, config):
        T = self.cfg["T"]
        tok_s = self.B * T / dt
        mfu = self.model.flops_per_token(T, self.V) * tok_s / (PEAK_BF16_TFLOPS * 1e12) * 100
        peak = torch.cuda.max_memory_allocated(self.device) / 2**20 if self.device.type == "cuda" else 0.0
        return (f"RESULT impl=pytorch mode={self.mode} config={config} dtype={self.dtype} B={self.B} T={T} "
                f"ms={dt * 1e3:.2f} tokens_per_s={tok_s:.0f} mfu_pct={mfu:.2f} peak_mib={peak:.1f} "
                f"warmup_s={warm_s:.1f} final_loss={self.loss:.4f}")


def inductor_report():
    """What torch.compile generated on this CPU: the ISA inductor's probe picked (empty when the
    probe failed: then every kernel is scalar C++) and, over the generated C++ kernels in its
    cache folder, how many use at::vec::Vectorized. One line: INDUCTOR isa=... kernels=N vectorized=M"""
    import glob
    import os
    from torch._inductor import cpu_vec_isa
    from torch._inductor.runtime.cache_dir_utils import cache_dir
    isa = str(cpu_vec_isa.pick_vec_isa()).replace(" ", "+") or "none"
    n = vec = 0
    for path in glob.glob(os.path.join(cache_dir(), "**", "*.cpp"), recursive=True):
        with open(path, errors="replace") as f:
            text = f.read()
        if "kernel(" not in text:  # the ISA probe's own file, not a model kernel
            continue
        n += 1
        vec += "at::vec::Vectorized" in text
    return f"INDUCTOR isa={isa} kernels={n} vectorized={vec} cache={cache_dir()}"


def run(args, mode, B, device, cfg):
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    t = Trainer(mode, B, device, cfg, args.dtype)
    warm_s = t.warm(args.warmup)
    dt = t.timed(args.steps)
    print(t.result(dt, warm_s, args.config), flush=True)
    del t
    if device.type == "cuda":
        torch.cuda.empty_cache()


def serve(args, runs, device, cfg):
    """The models of `runs` kept warm; one timed round per "MODE STEPS" line on stdin."""
    trainers, warm_s = {}, {}
    for mode, B in runs:
        trainers[mode] = Trainer(mode, B, device, cfg, args.dtype)
        warm_s[mode] = trainers[mode].warm(max(args.warmup, 1))
    if device.type == "cpu" and any(split_mode(m)[0] == "compile" for m in trainers):
        print(inductor_report(), flush=True)
    print("READY", flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words or words[0] == "quit":
            break
        mode, steps = words[0], int(words[1]) if len(words) > 1 else args.steps
        if mode not in trainers:
            print(f"RESULT impl=pytorch mode={mode} error=not_served", flush=True)
        else:
            t = trainers[mode]
            t.warm(1)  # what bench_gpt_train's warm-up does for a fresh process: caches, pages
            print(t.result(t.timed(steps), warm_s[mode], args.config), flush=True)
        print("READY", flush=True)
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--config", default="GPT2", choices=sorted(CONFIGS), help="bench_gpt_train's config (default GPT2)")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "f32"],
                    help="bf16: autocast with f32 master weights (default); f32: no autocast")
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: PyTorch's default)")
    ap.add_argument("--batch", default="8,16", help="comma-separated batch sizes")
    ap.add_argument("--mode", default="eager,compile",
                    help="eager, compile or both (comma-separated); MoE configs: eager/batched_mm etc. picks "
                         "transformers' experts implementation (default grouped_mm)")
    ap.add_argument("--steps", type=int, default=10, help="timed steps")
    ap.add_argument("--warmup", type=int, default=3, help="warm-up steps (compilation happens here)")
    ap.add_argument("--tiny", action="store_true", help="--config tiny: a 2-layer model at T 64 (checks the script)")
    ap.add_argument("--ltiny", action="store_true", help="--config ltiny: the same for the llama twin")
    ap.add_argument("--budget-s", type=float, default=0, help="start no run after this many seconds (0: no limit)")
    ap.add_argument("--runs", default="", help="mode:B pairs in order, e.g. eager:16,compile:16 (instead of --mode x --batch)")
    ap.add_argument("--serve", action="store_true", help="keep the models of --runs warm, one round per stdin line")
    args = ap.parse_args()
    if args.tiny or args.ltiny:
        args.config = "tiny" if args.tiny else "ltiny"
    if args.runs:
        try:
            runs = [(m, int(b)) for m, b in (r.split(":") for r in args.runs.split(",") if r)]
        except ValueError:
            ap.error(f"--runs {args.runs!r}: want mode:B pairs, e.g. eager:16,compile:16")
    else:
        runs = [(m, int(b)) for m in args.mode.split(",") if m for b in args.batch.split(",") if b]
    for m, _ in runs:
        step, experts = split_mode(m)
        if step not in ("eager", "compile") or experts not in EXPERTS_IMPLS:
            ap.error(f"mode {m!r}: want eager or compile (MoE configs: /{'|/'.join(EXPERTS_IMPLS)} after it)")
    if args.serve and len({m for m, _ in runs}) != len(runs):
        ap.error("--serve: one batch size per mode")

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            print("pytorch_gpt2: no CUDA device visible to PyTorch", file=sys.stderr)
            return 2
        # TF32 for any f32 matmul left outside autocast. set_float32_matmul_precision, not the
        # allow_tf32 flags: those are deprecated since torch 2.9, and mixing them with the new
        # fp32_precision API (which inductor reads) has broken torch.compile (pytorch#166387)
        if args.dtype == "bf16":
            torch.set_float32_matmul_precision("high")
        print(f"pytorch_gpt2: torch {torch.__version__}, {torch.cuda.get_device_name(device)}", flush=True)
    else:
        print(f"pytorch_gpt2: torch {torch.__version__}, cpu, {torch.get_num_threads()} threads", flush=True)
    cfg = CONFIGS[args.config]
    if args.serve:
        return serve(args, runs, device, cfg)
    start = time.perf_counter()
    rc = 0
    for mode, B in runs:
        if args.budget_s > 0 and time.perf_counter() - start > args.budget_s:
            print(f"RESULT impl=pytorch mode={mode} config={args.config} B={B} T={cfg['T']} skipped=time_budget",
                  flush=True)
            continue
        try:
            run(args, mode, B, device, cfg)
        except Exception as e:  # an OOM or a compile failure ends this run, not the others
            print(f"RESULT impl=pytorch mode={mode} config={args.config} B={B} T={cfg['T']} error={type(e).__name__}: "
                  f"{str(e).splitlines()[0] if str(e) else ''}", flush=True)
            rc = 1
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return rc


if __name__ == "__main__":
    sys.exit(main())
