// ndtrain: the shapes one rank computes with in a micro-step, as both of the planner's
// models see them: the memory plan (train/planner/plan.cpp) and the step's replay in time
// (train/planner/replay.cpp); which attention core runs on them; and the kind of block
// (train/planner/block_kinds.h), whose description turns them into memory and work.
//
//   const Shapes s = shapes_of(plan, config.train.device);   // once plan() has the sizes
//   s.N * s.C          // elements of one activation: B Tl rows of n_embd
//   fused(s.core)      // the CPU's fused attention kernel (alone, or in the ring's pairs)
//
// Legend (this rank's view):
//   B   micro-batch (sequences)          T    sequence length
//   Tl  = T / (cp sp) tokens of a sequence   N    = B Tl rows
//   Ns  rows of the regions between the attention and the MLP (LayerNorms, residuals): N,
//       or N / tp with sequence parallelism
//   C   = n_embd                         Cl   = NHl hd query (and output) channels: C / tp
//                                             unless llama's model.head_dim says otherwise
//   H   MLP hidden units: 4 C / tp (gpt2), intermediate_size / tp (llama's SwiGLU)
//   NHl = n_head / tp query heads        hd   = the head size (C / n_head, or model.head_dim)
//   KVl = n_kv_head hd / tp key (and value) channels: Cl for gpt2; fewer under grouped-
//         query attention (llama's n_kv_head < n_head)
//   Q   = Cl + 2 KVl columns of c_attn's q, k, v on this rank (3 Cl for gpt2)
//   Vl  = Vp / tp vocabulary rows (Vp: padded)
//   L   blocks                           cp, tp  the context- and tensor-parallel degrees
//   sp  Ulysses' degree: outside attention a rank holds T / (cp sp) tokens; its attention core
//       runs on ulysses_view(s): NHl / sp heads (kv heads: KVl / sp, at least one head, as
//       the all-to-all replicates them) over the cp rank's T / cp tokens
//   a   bytes of an activation (the compute dtype's: 4, or 2 under bfloat16)
// Mixture of experts (model.n_experts > 0; nn::MoeBlock, whose MLP the kind describes when
// `moe` is set for the block at hand):
//   E   experts of a layer (router C -> E)   k    experts per token
//   Ie  each expert's hidden units           Hs   the shared expert's: its size / tp (or 0)
//   Nr  rows the router sees: Ns (under sequence parallelism each tp rank routes its part)
//   M   = Nr k rows dispatched to experts    ep   the expert-parallel degree
//   El  experts this rank computes with: E / ep
//   R   rows its experts compute: M, or under ep > 1 the rows it receives, imbalance x M
//       (plan.ep_imbalance: 1 is perfectly balanced routing)
// The sizes divide: plan() refuses a layout where they do not, as the trainer does.
#pragma once

#include <cstdint>
#include <string>

#include "train/planner/plan_types.h"

namespace ndt::train {

// Which attention core a rank runs (autograd/ops/attention.cpp; with cp > 1 the ring of
// dist/context_parallel/ring_attention.cpp).
enum class AttentionCore {
  cpu_fused,   // the CPU's fused kernel (ndt::self_attention): the scores made again in backward
  cudnn,       // a GPU in bf16: cuDNN's flash attention (for the head sizes it supports: GPT's)
  composed,    // a GPU otherwise: the composed ops
  ring,        // cp > 1 on a GPU: composed pairs, each recomputed in backward
  ring_fused,  // cp > 1 on the CPU: the fused kernel's pairs
  ulysses,     // sp > 1: all-to-alls around one of the above, on ulysses_view's shapes
};

// The core of train.device `device` ("cpu", "cuda", "cuda:N") in train.dtype `dtype` with cp
// ranks (and sp Ulysses ranks around it).
AttentionCore attention_core(const std::string& device, const std::string& dtype, int64_t cp, int64_t sp = 1);
// The CPU's fused kernel, alone or in the ring's pairs (under Ulysses: the inner core's).
bool fused(AttentionCore core);

// What the planner knows of the block the model is made of (train/planner/block_kinds.h).
struct BlockKind;

struct Shapes {
  const BlockKind* kind = nullptr;  // block_kind(model.arch)
  int64_t B = 0, Tl = 0, N = 0, Ns = 0;
  int64_t C = 0, Cl = 0, KVl = 0, Q = 0, H = 0, NHl = 0, hd = 0, Vl = 0;
  int64_t cp = 1, tp = 1, sp = 1;
  int64_t act_bytes = 4;  // a
  bool qkv_bias = true;   // c_attn's bias (gpt2; llama with model.attention_bias)
  bool qk_norm = false;   // llama's q_norm and k_norm (model.qk_norm: Qwen3)
  AttentionCore core = AttentionCore::cpu_fused;
  AttentionCore inner = AttentionCore::cpu_fused;  // under Ulysses, the core inside the all-to-alls
  // mixture of experts (legend above): set for a MoE block (shapes_of leaves it unset;
  // moe_block(s) sets it); E = 0 for a dense model
  bool moe = false;
  int64_t E = 0, k = 0, Ie = 0, Hs = 0, ep = 1;
  bool router_z = false;  // the z-loss keeps the router's logits
  double imbalance = 1;   // R / M under ep > 1
  int64_t Nr() const { return Ns; }
  int64_t M() const { return Ns * k; }
  int64_t El() const { return E / ep; }
  int64_t R() const;
};

// The shapes of the plan's rank on train.device `device`: from the plan's layout, batch,
// model and dtype (plan() fills those first). The products are checked (tensor/checked.h): one that does
// not fit int64 throws ndt::Error.
Shapes shapes_of(const Plan& plan, const std::string& device);
// Ulysses (s.sp > 1): the shapes the attention core runs on between the all-to-alls, the cp
// rank's Tl sp tokens (N sp rows) of NHl / sp query heads and max(KVl / sp, hd) kv channels
// (fewer kv heads than sp ranks: each replicated, one a rank), its core s.inner, sp = 1.
// The same shapes without Ulysses. Per rank N Cl, the query and output elements, stay the same.
Shapes ulysses_view(const Shapes& s);
// The shapes of one of the model's MoE blocks (moe set; s.E > 0).
Shapes moe_block(const Shapes& s);

}  // namespace ndt::train
