#!/usr/bin/env python3
"""tests/scripts/hf_reference.py: Hugging Face transformers as the reference for ndtrain's Llama,
Qwen2 and Qwen3 models. Run it with the reference venv's python (scripts/setup.sh --reference makes
it; default ~/.cache/ndtrain/ref-venv, $NDT_REF_VENV):

  PY=~/.cache/ndtrain/ref-venv/bin/python
  $PY tests/scripts/hf_reference.py make OUT --arch llama [--dtype float64] [--seed 0] [--stock]
  $PY tests/scripts/hf_reference.py eval MODEL_DIR --tokens val.bin --seq-len 16 \\
      --batch-size 2 --batches 3 [--dtype float32]
  $PY tests/scripts/hf_reference.py generate MODEL_DIR --prompt TEXT --text TEXT --new N
  $PY tests/scripts/hf_reference.py packed OUT --arch llama|gpt2 [--seed 0]
  $PY tests/scripts/hf_reference.py peft BASE ADAPTER MERGED --inputs IN --out OUT
  $PY tests/scripts/hf_reference.py peft-make BASE ADAPTER --targets q_proj,v_proj --r 4 --alpha 6 \\
      [--rslora] [--dropout 0.05] --inputs IN --out OUT

Exit codes: 0 done; 3 with the one line "transformers/torch not available: ..." when torch,
transformers or safetensors cannot be imported (the C++ tests skip on it); 1 or 2 otherwise.

make OUT --arch llama|qwen2|qwen3|qwen3_moe|qwen2_moe|mixtral [--dtype float64|float32] [--seed N] [--stock]
  A random tiny model built by transformers (LlamaForCausalLM, Qwen2ForCausalLM or
  Qwen3ForCausalLM, eager attention): hidden 64, 2 layers, 4 query heads and 2 key/value heads
  (head_dim 16), intermediate 176, vocab 96, max_position_embeddings 128, rms_norm_eps 1e-5,
  untied lm_head.
    llama: rope_theta 500000 with llama3 scaling (factor 8, low_freq_factor 1, high_freq_factor 4,
           original_max_position_embeddings 64: of the 8 frequencies, 1 is kept, 1 smoothed and 6
           divided by 8, so every branch of the scaling is exercised; checked, see reference.json)
    qwen2: rope_theta 1e6, default rope; biases on q, k and v (none on o_proj)
    qwen3: rope_theta 1e6, default rope; head_dim 24 (not hidden / heads: q has 96 channels,
           k and v 48), q_norm and k_norm, no biases, the lm_head tied to the embeddings
    qwen3_moe: qwen3's attention (untied); layer 0 a mixture of 4 experts (top 2, moe_intermediate_size
           40, not renormalised), layer 1 dense (mlp_only_layers); output_router_logits with
           router_aux_loss_coef 0.25
    qwen2_moe: qwen2's attention (biases on q, k and v); layer 0 a mixture of 4 experts (top 2,
           moe_intermediate_size 40, not renormalised) beside a shared expert (SwiGLU of 56) gated by
           sigmoid(shared_expert_gate), layer 1 dense (mlp_only_layers); output_router_logits with
           router_aux_loss_coef 0.25
    mixtral: rope_theta 1e6; both layers 4 experts of intermediate_size 48, top 2, renormalised;
           output_router_logits with router_aux_loss_coef 0.25
  MoE: the loss is the cross-entropy + router_aux_loss_coef x the load-balancing loss (written as
  aux_loss), as the model computes it with labels; the experts' gradients are written under the
  folder's per-expert names (transformers 5 keeps them fused in memory). float64 also patches the
  router's softmax and the load-balancing loss's sums (float32 in transformers).
  Every parameter is drawn from torch.Generator(seed): weights and embeddings N(0, 0.1^2),
  biases N(0, 0.1^2), norm weights U(0.5, 1.5) (not 1: norms cannot be skipped unnoticed).
  Writes
    OUT/model/                 save_pretrained: config.json + model.safetensors (in the dtype)
    OUT/reference.safetensors  inputs (B,T) int32, targets (B,T) int32, logits (B,T,V) in the
                               dtype, loss (1,) in the dtype, and grad.<name> for every parameter
                               <name> of the model (the HF name, e.g. grad.lm_head.weight)
    OUT/reference.json         loss, arch, dtype, seed, B, T, the parameter names and shapes, the
                               rope frequencies, what was patched, torch and transformers versions
  The batch: x = randint(0, V, (B=2, T+1=17)) from torch.Generator(seed + 1); inputs x[:, :-1],
  targets x[:, 1:]; loss = the mean over all B*T positions of cross_entropy(logits[b,t],
  targets[b,t]) (computed on the logits, not through labels=), then backward.

  float64: transformers computes three things in float32 even in a float64 model: RMSNorm's
  normalisation, RoPE's angles and cos/sin, and the eager softmax. Unless --stock, the script
  patches those three to run in float64 (the same formulas; inv_freq is transformers' formula in
  float64, checked against transformers' own float32 values), so a float64 reference is exact to
  rounding (~1e-15) rather than ~1e-7. reference.json records the patches and the largest
  difference of the patched logits from the stock float64 model's (~1e-7: the patches change
  precision only). float32: never patched.

eval MODEL_DIR --tokens FILE --seq-len T --batch-size B --batches N [--dtype float32|float64]
  Loads MODEL_DIR with AutoModelForCausalLM.from_pretrained (eager attention, the dtype; float64
  patched as above unless --stock) and prints one line `loss <value>` (%.17g): the mean
  cross-entropy over all N*B*T positions of the batches ndtrain's DataLoader gives on that one
  shard with shuffle off and one rank: batch k reads tokens [k*B*T, k*B*T + B*T + 1); row b of
  it is inputs tokens[k*B*T + b*T + t], targets the next token (t < T). That is, windows of T+1
  tokens starting at j*T (consecutive windows share one token), j = 0 .. N*B-1, which needs
  N*B*T + 1 tokens. This equals ndtrain's val_loss with train.eval_steps N, micro batch B and
  seq_len T on that file (the mean of equal-sized batch means).
  FILE is an ndtrain / llm.c token shard (train/data/data.h): int32 header[256] with
  header[0] = 20240520, header[1] = 1, header[2] = the token count, then that many uint16 tokens.

generate MODEL_DIR --prompt TEXT --text TEXT --new N
  The folder as transformers users take it, from the folder alone (float32, eager):
  AutoTokenizer's ids of the prompt and of TEXT, N greedy tokens of AutoModelForCausalLM after
  the prompt (argmax of the whole sequence's last logits, no stopping), and what
  pipeline("text-generation") writes for the prompt (greedy, N new tokens at most, stopping at
  the folder's end-of-text). One JSON line: prompt_ids, text_ids, greedy, pipeline, decoded
  (the prompt and greedy ids decoded, special tokens skipped).

packed OUT --arch llama|gpt2 [--seed N]
  Fine-tuning's loss over documents, each run alone: a random float64 model (llama: make's,
  patched as above; gpt2: GPT2LMHeadModel, n_embd 64, 2 layers, 4 heads, vocab 96, n_positions
  64, learned positions, tied head: nothing in it computes in float32) saved to OUT/model, and
  9 documents of PACKED_LENGTHS tokens (ids from torch.Generator(seed + 1), each token trained
  with probability 0.7). Each document goes through the model alone (input_ids of its own
  tokens, positions from 0); the loss is the mean, over every token j > 0 of a document that is
  trained, of cross_entropy(logits[j - 1], ids[j]). Laid end to end the documents are the
  window of 2 rows x PACKED_T tokens (+1) that ndtrain's loader reads, the second row starting
  with a document. Writes OUT/packed.json: T, rows, documents (ids and trained, 0 or 1, per
  token), loss, targets (how many terms the mean has).
"""
import argparse
import json
import os
import struct
import sys

# The reference runs on the CPU: the venv may hold stub CUDA libraries (scripts/
# reference_cuda_stubs.py), and a float64 reference wants the CPU anyway.
os.environ["CUDA_VISIBLE_DEVICES"] = ""
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # local folders only: never ask the hub
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

SIZES = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=176, vocab_size=96, max_position_embeddings=128,
             rms_norm_eps=1e-5, tie_word_embeddings=False)
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64}
B, T = 2, 16
SHARD_MAGIC, SHARD_VERSION, HEADER_INTS = 20240520, 1, 256


def imports():
    """torch, transformers, safetensors.torch -- or exit 3 with one line."""
    try:
        import torch
        import transformers
        import safetensors.torch
    except Exception as e:  # ImportError, or a broken install failing in its own way
        msg = f"{type(e).__name__}: {e}".splitlines()[0]
        print(f"transformers/torch not available: {msg} (python {sys.executable}; "
              "scripts/setup.sh --reference makes the venv)", flush=True)
        sys.exit(3)
    return torch, transformers, safetensors.torch


# ---- float64 throughout: the three places transformers computes in float32 ----

def patch_float64(torch, modules):
    """Replaces, in each modeling module (llama, qwen2), RMSNorm.forward, the rotary
    embedding's forward and eager_attention_forward by the same formulas in the input's dtype.
    Returns the list of what was patched."""

    def rms_forward(self, h):  # transformers: h.to(float32), normalise, .to(input dtype)
        return self.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))

    def rope_forward(self, x, position_ids):  # transformers: angles, cos and sin in float32
        inv = self.ndt_inv_freq64.to(device=x.device)
        freqs = position_ids[..., None].to(torch.float64) * inv
        emb = torch.cat((freqs, freqs), dim=-1)
        return ((emb.cos() * self.attention_scaling).to(x.dtype),
                (emb.sin() * self.attention_scaling).to(x.dtype))

    def make_eager(mod):
        def eager_attention_forward(module, query, key, value, attention_mask, scaling,
                                    dropout=0.0, **kwargs):  # transformers: softmax in float32
            k = mod.repeat_kv(key, module.num_key_value_groups)
            v = mod.repeat_kv(value, module.num_key_value_groups)
            w = torch.matmul(query, k.transpose(2, 3)) * scaling
            if attention_mask is not None:
                w = w + attention_mask
            w = torch.nn.functional.softmax(w, dim=-1, dtype=query.dtype)
            w = torch.nn.functional.dropout(w, p=dropout, training=module.training)
            return torch.matmul(w, v).transpose(1, 2).contiguous(), w
        return eager_attention_forward

    done = []
    for mod in modules:
        prefix = PREFIXES[mod.__name__.rsplit(".", 1)[-1]]
        getattr(mod, prefix + "RMSNorm").forward = rms_forward
        getattr(mod, prefix + "RotaryEmbedding").forward = rope_forward
        mod.eager_attention_forward = make_eager(mod)
        done += [f"{mod.__name__}.{prefix}RMSNorm.forward",
                 f"{mod.__name__}.{prefix}RotaryEmbedding.forward",
                 f"{mod.__name__}.eager_attention_forward"]
        if hasattr(mod, prefix + "TopKRouter"):
            done += patch_router_float64(torch, mod, prefix)
    return done


def patch_router_float64(torch, mod, prefix):
    """The MoE router's softmax (transformers: float32) and load_balancing_loss_func's sums
    (float32) in the input's dtype: the same formulas."""
    router = getattr(mod, prefix + "TopKRouter")
    mixtral = prefix == "Mixtral"

    def router_forward(self, hidden_states):
        h = hidden_states.reshape(-1, self.hidden_dim)
        logits = torch.nn.functional.linear(h, self.weight)
        probs = torch.nn.functional.softmax(logits, dim=-1)
        top, idx = torch.topk(probs, self.top_k, dim=-1)
        if mixtral or self.norm_topk_prob:
            top = top / top.sum(dim=-1, keepdim=True)
        return logits, top, idx

    def load_balancing_loss_func(gate_logits, num_experts=None, top_k=2, attention_mask=None):
        assert attention_mask is None
        counts, sums, rows = 0, 0, 0
        for g in gate_logits:
            p = torch.nn.functional.softmax(g, dim=-1)
            _, sel = torch.topk(p, top_k, dim=-1)
            counts = counts + torch.nn.functional.one_hot(sel.reshape(-1), num_experts).to(p.dtype).sum(0)
            sums = sums + p.sum(0)
            rows += p.shape[0]
        return torch.sum((counts / rows) * (sums / rows)) * num_experts

    router.forward = router_forward
    mod.load_balancing_loss_func = load_balancing_loss_func
    return [f"{mod.__name__}.{prefix}TopKRouter.forward", f"{mod.__name__}.load_balancing_loss_func"]


def inv_freq64(config):
    """transformers' inverse frequencies (default, or llama3-scaled) evaluated in float64:
    [dim/2] list of floats. Same formulas as transformers.modeling_rope_utils."""
    import math
    rp = rope_params(config)
    dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    inv = [1.0 / (rp["rope_theta"] ** (i / dim)) for i in range(0, dim, 2)]
    if rp.get("rope_type", "default") == "default":
        return inv
    assert rp["rope_type"] == "llama3", rp
    factor, lo, hi = rp["factor"], rp["low_freq_factor"], rp["high_freq_factor"]
    old = rp["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old / lo, old / hi
    out = []
    for f in inv:
        wavelen = 2 * math.pi / f
        g = f / factor if wavelen > low_wavelen else f
        if not wavelen < high_wavelen and not wavelen > low_wavelen:  # the medium band
            s = (old / wavelen - lo) / (hi - lo)
            g = (1 - s) * g / factor + s * g
        out.append(g)
    return out


def rope_params(config):  # transformers 5: rope_parameters; 4: rope_theta + rope_scaling
    rp = getattr(config, "rope_parameters", None)
    if rp:
        return dict(rp)
    rp = dict(getattr(config, "rope_scaling", None) or {"rope_type": "default"})
    rp.setdefault("rope_type", rp.get("type", "default"))
    rp["rope_theta"] = config.rope_theta
    return rp


def rotary_modules(model):
    return [m for m in model.modules() if type(m).__name__.endswith("RotaryEmbedding")]


def set_inv_freq64(torch, model):
    """Gives each rotary module its float64 inv_freq; checks it against transformers' own
    (float32) inv_freq. Returns (inv64 list, transformers' float32 list)."""
    inv = inv_freq64(model.config)
    ref = None
    for m in rotary_modules(model):
        ref = m.inv_freq.to(torch.float64).cpu()
        mine = torch.tensor(inv, dtype=torch.float64)
        rel = ((mine - ref).abs() / ref.abs()).max().item()
        if rel > 1e-6:
            sys.exit(f"float64 inv_freq differs from transformers' by {rel:.3g} (relative): "
                     f"{inv} vs {ref.tolist()}")
        m.ndt_inv_freq64 = mine
    return inv, (ref.tolist() if ref is not None else None)


PREFIXES = {"modeling_llama": "Llama", "modeling_qwen2": "Qwen2", "modeling_qwen3": "Qwen3",
            "modeling_qwen3_moe": "Qwen3Moe", "modeling_qwen2_moe": "Qwen2Moe", "modeling_mixtral": "Mixtral"}


def modeling_modules(transformers):
    from transformers.models.llama import modeling_llama
    from transformers.models.qwen2 import modeling_qwen2
    from transformers.models.qwen3 import modeling_qwen3
    from transformers.models.qwen3_moe import modeling_qwen3_moe
    from transformers.models.qwen2_moe import modeling_qwen2_moe
    from transformers.models.mixtral import modeling_mixtral
    return [modeling_llama, modeling_qwen2, modeling_qwen3, modeling_qwen3_moe, modeling_qwen2_moe,
            modeling_mixtral]


def dtype_of(torch, name):
    return {"float64": torch.float64, "float32": torch.float32}[name]


def from_pretrained_kwargs(transformers, torch_dtype):
    # transformers 5 calls it dtype, 4 torch_dtype
    major = int(transformers.__version__.split(".")[0])
    kwargs = {"dtype" if major >= 5 else "torch_dtype": torch_dtype, "attn_implementation": "eager"}
    if major >= 5:  # mixtures of experts: the loop over experts (grouped_mm has no float64)
        kwargs["experts_implementation"] = "eager"
    return kwargs


# ---- peft ----

def peft_logits(args):
    """float64 logits of PeftModel.from_pretrained(BASE, ADAPTER) and of the MERGED folder on
    IN's `inputs` (B, T) int32; OUT: safetensors with peft and merged (B, T, V) float64."""
    torch, transformers, st = imports()
    try:
        import peft
    except Exception as e:
        print(f"peft not available: {type(e).__name__}: {e}".splitlines()[0] +
              f" (python {sys.executable}; scripts/setup.sh --reference installs it)", flush=True)
        sys.exit(3)
    patch_float64(torch, modeling_modules(transformers))
    x = st.load_file(args.inputs)["inputs"].to(torch.int64)

    def load(path):
        model = transformers.AutoModelForCausalLM.from_pretrained(
            path, **from_pretrained_kwargs(transformers, torch.float64))
        if rotary_modules(model):  # llama; GPT-2 has learned positions
            set_inv_freq64(torch, model)
        return model.eval()

    adapted = peft.PeftModel.from_pretrained(load(args.base), args.adapter).to(torch.float64).eval()
    with torch.no_grad():
        out = {"peft": adapted(input_ids=x, use_cache=False).logits.contiguous(),
               "merged": load(args.merged)(input_ids=x, use_cache=False).logits.contiguous()}
    st.save_file(out, args.out)
    print(f"peft {peft.__version__}: logits {tuple(out['peft'].shape)} -> {args.out}", flush=True)


def peft_make(args):
    """A PEFT adapter made by PEFT on BASE (float64, init_lora_weights=False: A and B random, so B
    matters), saved with save_pretrained to ADAPTER; OUT: its float64 logits on IN's inputs."""
    torch, transformers, st = imports()
    try:
        import peft
    except Exception as e:
        print(f"peft not available: {type(e).__name__}: {e}".splitlines()[0], flush=True)
        sys.exit(3)
    patch_float64(torch, modeling_modules(transformers))
    base = transformers.AutoModelForCausalLM.from_pretrained(
        args.base, **from_pretrained_kwargs(transformers, torch.float64))
    if rotary_modules(base):
        set_inv_freq64(torch, base)
    torch.manual_seed(args.seed)
    config = peft.LoraConfig(r=args.r, lora_alpha=args.alpha, target_modules=args.targets.split(","),
                             use_rslora=args.rslora, lora_dropout=args.dropout, init_lora_weights=False,
                             task_type="CAUSAL_LM")
    model = peft.get_peft_model(base, config).to(torch.float64).eval()
    model.save_pretrained(args.adapter)
    x = st.load_file(args.inputs)["inputs"].to(torch.int64)
    with torch.no_grad():
        st.save_file({"peft": model(input_ids=x, use_cache=False).logits.contiguous()}, args.out)
    print(f"peft {peft.__version__}: made {args.adapter}", flush=True)


# ---- make ----

def build_config(transformers, arch):
    if arch == "llama":
        return transformers.LlamaConfig(**SIZES, rope_theta=500000.0, rope_scaling=dict(LLAMA3),
                                        attention_bias=False, mlp_bias=False)
    if arch == "qwen3":
        return transformers.Qwen3Config(**dict(SIZES, tie_word_embeddings=True), head_dim=24, rope_theta=1e6,
                                        attention_bias=False, use_sliding_window=False)
    if arch == "qwen3_moe":  # layer 1 dense (mlp_only_layers), the routing weights not renormalised
        return transformers.Qwen3MoeConfig(**SIZES, head_dim=24, rope_theta=1e6, attention_bias=False,
                                           use_sliding_window=False, num_experts=4, num_experts_per_tok=2,
                                           moe_intermediate_size=40, norm_topk_prob=False, mlp_only_layers=[1],
                                           output_router_logits=True, router_aux_loss_coef=0.25)
    if arch == "qwen2_moe":  # a shared expert beside the routed ones; layer 1 dense (mlp_only_layers)
        return transformers.Qwen2MoeConfig(**SIZES, rope_theta=1e6, qkv_bias=True, use_sliding_window=False,
                                           num_experts=4, num_experts_per_tok=2, moe_intermediate_size=40,
                                           shared_expert_intermediate_size=56, norm_topk_prob=False,
                                           mlp_only_layers=[1], output_router_logits=True,
                                           router_aux_loss_coef=0.25)
    if arch == "mixtral":  # every layer MoE, renormalised, experts of intermediate_size
        return transformers.MixtralConfig(**dict(SIZES, intermediate_size=48), rope_theta=1e6, num_local_experts=4,
                                          num_experts_per_tok=2, output_router_logits=True,
                                          router_aux_loss_coef=0.25)
    return transformers.Qwen2Config(**SIZES, rope_theta=1e6, use_sliding_window=False)


def per_expert_grads(model, name, grad):
    """transformers 5 keeps an MoE layer's experts fused: gate_up_proj (E, 2I, C), down_proj
    (E, C, I); a folder names each expert's matrices (and Mixtral's MoE block_sparse_moe, which
    transformers 5 calls mlp in memory). The gradient under the folder's names."""
    mixtral = type(model).__name__.startswith("Mixtral")
    if mixtral and ".mlp." in name:
        name = name.replace(".mlp.", ".block_sparse_moe.")
    if name.endswith("experts.gate_up_proj"):
        base, I = name[: -len("gate_up_proj")], grad.shape[1] // 2
        out = {}
        for e in range(grad.shape[0]):
            out[f"{base}{e}.{'w1' if mixtral else 'gate_proj'}.weight"] = grad[e, :I].contiguous()
            out[f"{base}{e}.{'w3' if mixtral else 'up_proj'}.weight"] = grad[e, I:].contiguous()
        return out
    if name.endswith("experts.down_proj"):
        base = name[: -len("down_proj")]
        return {f"{base}{e}.{'w2' if mixtral else 'down_proj'}.weight": grad[e].contiguous()
                for e in range(grad.shape[0])}
    return {name: grad.contiguous()}


def randomise(torch, model, seed):
    """Every parameter from one generator, in named_parameters order (see the top)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or name.split(".")[-2].startswith("ln_"):  # GPT-2's ln_1, ln_f
                v = 0.5 + torch.rand(p.shape, generator=g, dtype=torch.float64)
            else:
                v = 0.1 * torch.randn(p.shape, generator=g, dtype=torch.float64)
            p.copy_(v)


MOE_ARCHS = ("qwen3_moe", "qwen2_moe", "mixtral")


def make(args):
    torch, transformers, st = imports()
    torch.manual_seed(args.seed)
    dtype = dtype_of(torch, args.dtype)
    config = build_config(transformers, args.arch)
    config._attn_implementation = "eager"
    if args.arch in MOE_ARCHS:
        config._experts_implementation = "eager"  # the loop over experts: grouped_mm has no float64
    cls = {"llama": transformers.LlamaForCausalLM, "qwen2": transformers.Qwen2ForCausalLM,
           "qwen3": transformers.Qwen3ForCausalLM, "qwen3_moe": transformers.Qwen3MoeForCausalLM,
           "qwen2_moe": transformers.Qwen2MoeForCausalLM, "mixtral": transformers.MixtralForCausalLM}[args.arch]
    model = cls(config).to(dtype)
    model.config._attn_implementation = "eager"
    if args.arch in MOE_ARCHS:
        model.config._experts_implementation = "eager"
    randomise(torch, model, args.seed)
    model.train()  # dropout is 0 in both configs; train() only so nothing is cached

    rp = rope_params(model.config)
    inv_scaled, inv_tf = set_inv_freq64(torch, model)
    rope = {"params": rp, "inv_freq": inv_scaled, "inv_freq_transformers_f32": inv_tf}
    if rp.get("rope_type") == "llama3":
        unscaled = inv_freq64(type(config)(**SIZES, rope_theta=rp["rope_theta"]))
        kept = sum(1 for a, b in zip(inv_scaled, unscaled) if a == b)
        divided = sum(1 for a, b in zip(inv_scaled, unscaled) if abs(a * rp["factor"] - b) <= 1e-15 * b)
        smoothed = len(unscaled) - kept - divided
        rope.update(inv_freq_unscaled=unscaled, kept=kept, smoothed=smoothed, divided=divided)
        if not (kept and smoothed and divided):
            sys.exit(f"llama3 scaling does not exercise every branch: kept {kept}, smoothed "
                     f"{smoothed}, divided {divided}")

    g = torch.Generator().manual_seed(args.seed + 1)
    x = torch.randint(0, config.vocab_size, (B, T + 1), generator=g)
    inputs, targets = x[:, :-1].contiguous(), x[:, 1:].contiguous()

    moe = args.arch in MOE_ARCHS

    def forward():
        return model(input_ids=inputs, use_cache=False).logits

    def aux_loss():  # the load-balancing loss, as transformers adds it with labels
        return model(input_ids=inputs, use_cache=False, output_router_logits=True).aux_loss

    patched, stock_diff = [], None
    if dtype == torch.float64 and not args.stock:
        with torch.no_grad():
            stock = forward()
        patched = patch_float64(torch, modeling_modules(transformers))
        with torch.no_grad():
            stock_diff = (forward() - stock).abs().max().item()
        if stock_diff > 1e-4:
            sys.exit(f"the float64 patches moved the logits by {stock_diff:.3g}: not a precision change")

    model.zero_grad(set_to_none=True)
    logits = forward()
    V = logits.shape[-1]
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, V), targets.reshape(-1))
    aux = None
    if moe:  # loss + router_aux_loss_coef * aux, as the model's forward with labels computes it
        aux = aux_loss()
        loss = loss + config.router_aux_loss_coef * aux
    loss.backward()

    os.makedirs(args.out, exist_ok=True)
    save_kwargs = {}
    import inspect
    if "safe_serialization" in inspect.signature(model.save_pretrained).parameters:
        save_kwargs["safe_serialization"] = True  # transformers 4; 5 always writes safetensors
    model.save_pretrained(os.path.join(args.out, "model"), **save_kwargs)

    tensors = {"inputs": inputs.to(torch.int32), "targets": targets.to(torch.int32),
               "logits": logits.detach().to(dtype).contiguous(),
               "loss": loss.detach().reshape(1).to(dtype)}
    params = []
    if aux is not None:
        tensors["aux_loss"] = aux.detach().reshape(1).to(dtype)
    for name, p in model.named_parameters():
        if p.grad is None:
            sys.exit(f"no gradient for {name}")
        for hf_name, g in per_expert_grads(model, name, p.grad.detach()).items():
            tensors["grad." + hf_name] = g
        params.append({"name": name, "shape": list(p.shape)})
    st.save_file(tensors, os.path.join(args.out, "reference.safetensors"),
                 metadata={"arch": args.arch, "dtype": args.dtype, "seed": str(args.seed)})
    info = {"loss": loss.item(), "arch": args.arch, "dtype": args.dtype, "seed": args.seed,
            "B": B, "T": T, "vocab_size": config.vocab_size, "parameters": params,
            "rope": rope, "float64_patches": patched,
            "patched_vs_stock_logits_max_abs_diff": stock_diff,
            "torch": torch.__version__, "transformers": transformers.__version__}
    with open(os.path.join(args.out, "reference.json"), "w") as f:
        json.dump(info, f, indent=2)
        f.write("\n")
    print(f"{args.arch} {args.dtype}: loss {loss.item():.17g}, {len(params)} parameters -> {args.out}")


# ---- eval ----

def read_shard(path):
    with open(path, "rb") as f:
        header = f.read(HEADER_INTS * 4)
        if len(header) != HEADER_INTS * 4:
            sys.exit(f"{path}: shorter than the 1024-byte header")
        magic, version, ntok = struct.unpack("<3i", header[:12])
        if magic != SHARD_MAGIC or version != SHARD_VERSION:
            sys.exit(f"{path}: not a token shard (magic {magic}, version {version}; want "
                     f"{SHARD_MAGIC}, {SHARD_VERSION})")
        data = f.read()
    if len(data) != 2 * ntok:
        sys.exit(f"{path}: header says {ntok} tokens, the file holds {len(data) // 2}")
    return data


def evaluate(args):
    torch, transformers, _ = imports()
    dtype = dtype_of(torch, args.dtype)
    if dtype == torch.float64 and not args.stock:
        patch_float64(torch, modeling_modules(transformers))
    model = transformers.AutoModelForCausalLM.from_pretrained(
        args.model_dir, **from_pretrained_kwargs(transformers, dtype))
    model.eval()
    if dtype == torch.float64 and not args.stock:
        set_inv_freq64(torch, model)
    data = read_shard(args.tokens)
    Bn, Tn, N = args.batch_size, args.seq_len, args.batches
    need = N * Bn * Tn + 1
    if len(data) // 2 < need:
        sys.exit(f"{args.tokens}: {len(data) // 2} tokens, {N} batches of {Bn} x {Tn} need {need}")
    import numpy as np
    tok = torch.from_numpy(np.frombuffer(data, dtype="<u2", count=need).astype(np.int64))
    V = model.config.vocab_size
    if int(tok.max()) >= V:
        sys.exit(f"{args.tokens}: token {int(tok.max())} >= vocab_size {V}")
    total = 0.0
    with torch.no_grad():
        for k in range(N):
            s = tok[k * Bn * Tn: k * Bn * Tn + Bn * Tn + 1]
            x, y = s[:-1].reshape(Bn, Tn), s[1:].reshape(Bn, Tn)
            logits = model(input_ids=x, use_cache=False).logits
            total += torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]).to(torch.float64), y.reshape(-1)).item()
    print(f"loss {total / N:.17g}", flush=True)


# ---- generate ----

def generate(args):
    """A whole exported folder as transformers users take it: AutoTokenizer and
    AutoModelForCausalLM from the folder alone, and pipeline("text-generation")."""
    torch, transformers, _ = imports()
    tok = transformers.AutoTokenizer.from_pretrained(args.model_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        args.model_dir, **from_pretrained_kwargs(transformers, torch.float32))
    model.eval()
    prompt = tok(args.prompt)["input_ids"]
    ids = list(prompt)
    with torch.no_grad():  # greedy, every step on the whole sequence, no stopping
        for _ in range(args.new):
            logits = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0, -1]
            ids.append(int(torch.argmax(logits)))
    pipe = transformers.pipeline("text-generation", model=args.model_dir, device="cpu")
    text = pipe(args.prompt, max_new_tokens=args.new, do_sample=False)[0]["generated_text"]
    print(json.dumps({"prompt_ids": prompt, "text_ids": tok(args.text)["input_ids"],
                      "greedy": ids[len(prompt):], "pipeline": text,
                      "decoded": tok.decode(ids, skip_special_tokens=True)}), flush=True)


# ---- packed ----

PACKED_T = 24
# row 0 holds T tokens; row 1 T + 1, its last the window's extra token (a target only)
PACKED_LENGTHS = [6, 1, 10, 7, 3, 9, 1, 7, 5]


def build_gpt2(transformers):
    return transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=SIZES["vocab_size"],
                                   n_positions=64, activation_function="gelu_new", layer_norm_epsilon=1e-5,
                                   resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                   bos_token_id=None, eos_token_id=None)  # not GPT-2's 50256: vocab 96


def packed(args):
    torch, transformers, _ = imports()
    if sum(PACKED_LENGTHS) != 2 * PACKED_T + 1 or sum(PACKED_LENGTHS[:4]) != PACKED_T:
        sys.exit("PACKED_LENGTHS must fill two rows of PACKED_T tokens (+1), a document starting each")
    if args.arch == "llama":
        config, cls = build_config(transformers, "llama"), transformers.LlamaForCausalLM
    else:
        config, cls = build_gpt2(transformers), transformers.GPT2LMHeadModel
    config._attn_implementation = "eager"
    model = cls(config).to(torch.float64)
    model.config._attn_implementation = "eager"
    randomise(torch, model, args.seed)
    model.eval()
    if args.arch == "llama":
        set_inv_freq64(torch, model)
        patch_float64(torch, modeling_modules(transformers))
    g = torch.Generator().manual_seed(args.seed + 1)
    docs, total, count = [], 0.0, 0
    with torch.no_grad():
        for n in PACKED_LENGTHS:
            ids = torch.randint(0, config.vocab_size, (n,), generator=g)
            trained = (torch.rand(n, generator=g, dtype=torch.float64) < 0.7).to(torch.int64)
            docs.append({"ids": ids.tolist(), "trained": trained.tolist()})
            if n < 2:
                continue
            logits = model(input_ids=ids[None], use_cache=False).logits[0]  # (n, V)
            ce = torch.nn.functional.cross_entropy(logits[:-1], ids[1:], reduction="none")
            total += (ce * trained[1:]).sum().item()
            count += int(trained[1:].sum())
    os.makedirs(args.out, exist_ok=True)
    model.save_pretrained(os.path.join(args.out, "model"))
    info = {"arch": args.arch, "seed": args.seed, "T": PACKED_T, "rows": 2, "documents": docs,
            "loss": total / count, "targets": count,
            "torch": torch.__version__, "transformers": transformers.__version__}
    with open(os.path.join(args.out, "packed.json"), "w") as f:
        json.dump(info, f)
        f.write("\n")
    print(f"{args.arch} packed: loss {total / count:.17g} over {count} trained targets of "
          f"{len(docs)} documents -> {args.out}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make", help="a random tiny model and its logits, loss and gradients")
    m.add_argument("out")
    m.add_argument("--arch", choices=["llama", "qwen2", "qwen3", "qwen3_moe", "qwen2_moe", "mixtral"], required=True)
    m.add_argument("--dtype", choices=["float64", "float32"], default="float64")
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--stock", action="store_true",
                   help="float64: keep transformers' float32 RMSNorm, RoPE and softmax")
    e = sub.add_parser("eval", help="a model folder's mean loss on a token shard")
    e.add_argument("model_dir")
    e.add_argument("--tokens", required=True)
    e.add_argument("--seq-len", type=int, required=True)
    e.add_argument("--batch-size", type=int, default=1)
    e.add_argument("--batches", type=int, required=True)
    e.add_argument("--dtype", choices=["float64", "float32"], default="float32")
    e.add_argument("--stock", action="store_true",
                   help="float64: keep transformers' float32 RMSNorm, RoPE and softmax")
    g = sub.add_parser("generate", help="AutoTokenizer, AutoModelForCausalLM and pipeline on a folder")
    g.add_argument("model_dir")
    g.add_argument("--prompt", required=True)
    g.add_argument("--text", required=True)
    g.add_argument("--new", type=int, required=True)
    k = sub.add_parser("packed", help="a random model and its loss over documents run one at a time")
    k.add_argument("out")
    k.add_argument("--arch", choices=["llama", "gpt2"], required=True)
    k.add_argument("--seed", type=int, default=0)
    f = sub.add_parser("peft", help="float64 logits of a PEFT adapter on its base, and of a merged folder")
    f.add_argument("base")
    f.add_argument("adapter")
    f.add_argument("merged")
    f.add_argument("--inputs", required=True)
    f.add_argument("--out", required=True)
    q = sub.add_parser("peft-make", help="a PEFT-made adapter folder on a base, and its float64 logits")
    q.add_argument("base")
    q.add_argument("adapter")
    q.add_argument("--targets", required=True)
    q.add_argument("--r", type=int, required=True)
    q.add_argument("--alpha", type=float, required=True)
    q.add_argument("--rslora", action="store_true")
    q.add_argument("--dropout", type=float, default=0.0)
    q.add_argument("--seed", type=int, default=0)
    q.add_argument("--inputs", required=True)
    q.add_argument("--out", required=True)
    args = p.parse_args()
    {"make": make, "eval": evaluate, "generate": generate, "packed": packed, "peft": peft_logits,
     "peft-make": peft_make}[args.cmd](args)


if __name__ == "__main__":
    main()
