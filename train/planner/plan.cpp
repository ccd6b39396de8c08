// The plan of a training config: sizes from the described model, memory from what the ops
// save for backward, communication from the formulas the communicators count. Every count
// below names the code it follows; when that code changes, this file must change with it
// (tests/test_dist_plan.cpp compares the two under mpirun).
//
// Legend: train/planner/shapes.h (B, Tl, N, Ns, C, Cl, KVl, Q, H, NHl, Vl, L, a for this rank).
// Bytes of an element besides a (activations and the model's copy of the parameters): 4
// for statistics (LayerNorm's mean and rstd, RMSNorm's rstd, log-sum-exps), the f32 master, its gradient
// and AdamW's moments, r for FSDP's reduce-scatters (parallel.reduce_dtype under bfloat16,
// else 4).
#include "train/planner/plan.h"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

#include "dist/context_parallel/ring_attention.h"
#include "dist/parallelize.h"
#include "dist/tensor_parallel/tensor_parallel.h"
#include "models/gpt.h"
#include "nn/block_wrapper.h"
#include "nn/flat.h"
#include "tensor/checked.h"
#include "tensor/cpu/onednn_gemm.h"
#include "train/io/format.h"
#include "train/planner/pipeline.h"
#include "train/planner/shapes.h"

namespace ndt::train {
namespace {

constexpr int64_t kF = 4;  // bytes of a float32: statistics, the master, its gradient, AdamW

// A count of elements or bytes whose every +, - and * is checked (tensor/checked.h): sizes
// that do not fit int64 stop the plan with one config error instead of wrapping to
// nonsense ("= 0 ranks", "0 tokens per step"). It converts from int64_t, so the formulas
// below read as plain arithmetic; .v is the value.
struct Count {
  int64_t v = 0;
  Count(int64_t x = 0) : v(x) {}  // implicit on purpose
};
Count operator+(Count a, Count b) { return checked_add(a.v, b.v, "count"); }
Count operator*(Count a, Count b) { return checked_mul(a.v, b.v, "count"); }
Count operator-(Count a, Count b) {
  NDT_CHECK(a.v >= b.v, "internal: planned count ", a.v, " - ", b.v, " is negative");
  return a.v - b.v;
}
Count operator/(Count a, Count b) { return a.v / b.v; }
Count& operator+=(Count& a, Count b) { return a = a + b; }
bool operator<(Count a, Count b) { return a.v < b.v; }
bool operator>(Count a, Count b) { return a.v > b.v; }
bool operator==(Count a, Count b) { return a.v == b.v; }

// Bytes an all-reduce of `bytes` sends on n ranks (MpiCommunicator::all_reduce's counter).
Count all_reduce_bytes(Count bytes, Count n) { return n > 1 ? 2 * (n - 1) * bytes / n : 0; }

// What one block keeps for backward, and the most it holds on top of the blocks before it
// while its own backward runs (elements; the block's input belongs to the block before).
struct BlockMem {
  Count saved = 0;            // kept from its forward to its backward (its output included)
  Count during_backward = 0;  // live while its backward runs, besides the earlier blocks:
  Count mlp = 0, attn = 0;    // ... the larger of its MLP's and its attention's moments
};

// The attention core's saved tensors in bytes (autograd/ops/attention.cpp or, with cp > 1,
// the ring of dist/context_parallel/ring_attention.cpp), without the c_proj input. q is
// N Cl, k and v N KVl each (N Q together; KVl = Cl but under llama's grouped-query
// attention, where each kv head serves NHl / NKVl query heads in place, never copied per
// head). Off the cuDNN path the core computes in f32 under bf16 too (4-byte elements, w).
//   cpu_fused: gpt2: the fused kernel on the packed qkv (ndt::self_attention): its input
//              qkv (3 N Cl, as it came) and lse (N NHl); under bf16 also its f32 output y
//              (N Cl; in f32 y is the output, c_proj's input)
//              llama: the fused kernel of attention() on the rotated q, k, v: those (N Q, as
//              they came), its output o in f32 (N Cl: in f32 the output itself, which
//              heads_to_back copies for c_proj) and lse (N NHl)
//   cudnn:     q, k, v (heads_to_front's copies, N Q), the output o (N Cl), lse (N NHl)
//   composed:  q, k, v (contiguous copies in f32, N Q), the probabilities p (B NHl Tl^2),
//              the output o (N Cl)
//   ring:      per (query chunk, key chunk) pair that the causal mask leaves (2 cp + 1 of
//              them on every rank) the checkpointed attention keeps its K and V halves
//              (N KVl together: split_last copies them once per key chunk, 2 cp on rank 0),
//              both query halves (N Cl, shared), each pair's output and lse and each
//              merge's (2 cp + 1 and 2 cp - 1: 4 cp halves of N Cl / 2, as measured; 4 cp
//              lse of N NHl / 2); the
//              probabilities are recomputed per pair in backward (one (Tl/2)^2 block at a
//              time). Under bf16 each of the 2 cp - 1 merges keeps f32 copies of its two
//              inputs and its output (3 halves; in f32 those are the outputs themselves)
//   ring_fused: the same tensors (the CPU's fused pairs keep their inputs, output and lse
//              instead of a checkpoint's), and under bf16 each pair's f32 output too
//              (2 cp + 1 halves)
Count core_saved(const Shapes& s) {
  const Count B = s.B, Tl = s.Tl, N = s.N, Cl = s.Cl, KVl = s.KVl, Q = s.Q, NHl = s.NHl, cp = s.cp,
              a = s.act_bytes, w = kF;
  switch (s.core) {
    case AttentionCore::cpu_fused:
      if (s.llama()) return N * Q * a + N * Cl * w + N * NHl * kF;
      return 3 * N * Cl * a + N * NHl * kF + (a == w ? Count(0) : N * Cl * w);
    case AttentionCore::cudnn:
      return (N * Q + N * Cl) * a + N * NHl * kF;
    case AttentionCore::composed:
      return (N * Q + N * Cl + B * NHl * Tl * Tl) * w;
    case AttentionCore::ring:
    case AttentionCore::ring_fused:
      break;
  }
  const Count pairs = 2 * cp + 1, key_chunks = 2 * cp, lse = 2 * cp * N * NHl * kF;
  if (a == w) return (N * Cl + key_chunks * N * KVl + 4 * cp * N * Cl / 2) * w + lse;
  const Count outputs_f32 = s.core == AttentionCore::ring_fused ? pairs : Count(0);
  return (N * Cl + key_chunks * N * KVl) * a + (3 * (2 * cp - 1) + outputs_f32) * N * Cl / 2 * w + lse;
}
// The attention backward's own tensors, in bytes: fused, dq, dk, dv (N Q in f32: gpt2's
// dqkv; the score blocks are per-thread scratch of 64 x Tl), under bf16 also q, k, v and
// dout converted to f32 (N Q + N Cl) and dq, dk, dv rounded back (N Q); cuDNN, the
// contiguous dout and dq, dk, dv (N Cl + N Q); composed, dout, dv, dq, dk (N Cl + N Q) and
// ds (p's shape), in f32, under bf16 dq, dk, dv rounded back (N Q); with the ring one score
// block of (Tl/2)^2 per pair, recomputed, plus the pair's p; with the fused ring a pair's
// dq, dk, dv (halves of N Q), under bf16 also its q, k, v and dout in f32 (halves of N Q +
// N Cl) and dq, dk, dv rounded back (halves of N Q).
Count core_backward(const Shapes& s) {
  const Count B = s.B, Tl = s.Tl, N = s.N, Cl = s.Cl, Q = s.Q, NHl = s.NHl, a = s.act_bytes, w = kF;
  const bool mixed = !(a == w);
  switch (s.core) {
    case AttentionCore::cpu_fused:
      return N * Q * w + (mixed ? (N * Q + N * Cl) * w + N * Q * a : Count(0));
    case AttentionCore::cudnn:
      return (N * Cl + N * Q) * a;
    case AttentionCore::composed:
      return (N * Cl + N * Q + B * NHl * Tl * Tl) * w + (mixed ? N * Q * a : Count(0));
    case AttentionCore::ring_fused:
      return N * Q / 2 * w + (mixed ? (N * Q + N * Cl) / 2 * w + N * Q / 2 * a : Count(0));
    case AttentionCore::ring:
      break;
  }
  const Count Tc = Tl / 2;
  return (N * Cl + N * Q + 2 * B * NHl * Tc * Tc) * w;
}

// nn::Block::forward (gpt2) with the ops of autograd/ops/*.cpp, per mode (nn::ACMode):
//   none       ln_1: mean, rstd (2N); c_attn keeps its input ln_1(x) (N C); the core
//              (above) and c_proj's input (N Cl: the fused core's output, or heads_to_back's
//              copy); h = x + attn (N C, kept by ln_2) and ln_2's mean, rstd (2N); c_fc's
//              input (N C); GELU's input (N H) and c_proj's input, GELU's output (N H); the
//              block's output (N C, kept by the next block). (Composed, c_attn's (N, 3Cl)
//              output dies: split_last copies q, k, v out of it and keeps nothing.)
//   selective  the same but the core keeps only its input qkv (3 N Cl) and its output
//              (N Cl, c_proj's input); the rest of the core is made again in backward
//              (fused: a second output and lse, N Cl + N NHl, beside the kept qkv).
//   full       the output only (N C); the input is the block before's output.
// During backward, on top of the earlier blocks: the MLP's (everything saved but the
// output, which ln_f or the next block has released, plus the incoming gradient N C, the
// GELU's dx and input gradient 2 N H less the GELU output already released N H; the
// weight gradients go straight into the gradient buffers); then the attention's (ln_1's
// output and stats, the core, two gradients of N C on the residual, the core's backward).
// Full recomputes the block from its input inside backward: the saved set of `none`
// comes back for the duration, plus the incoming gradient. In bytes: a per activation (the
// compute dtype's), 4 per statistic.
//
// Sequence parallelism keeps the block's input, h, its output, the LayerNorms' statistics,
// the gradients on the residual and the column-parallel linears' inputs (ln_1's and ln_2's
// outputs: linear_shared_input keeps the part and gathers it again in backward) on Ns = N / tp
// rows; backward holds the incoming gradient gathered (N C) for each c_proj and the
// gathered input again (N C) for each column-parallel weight gradient.
BlockMem gpt2_block_mem(const Shapes& s, nn::ACMode mode) {
  const Count N = s.N, Ns = s.Ns, C = s.C, Cl = s.Cl, H = s.H, a = s.act_bytes, stats = 2 * Ns * kF;
  const Count gathered = Ns == N ? Count(0) : 2 * N * C * a;  // an incoming gradient, an input
  const Count mlp_part = (Ns * C /*h*/ + Ns * C /*ln_2 out*/ + 2 * N * H) * a + stats;
  const Count none_saved =
      Ns * C * a /*ln_1 out*/ + stats + core_saved(s) + N * Cl * a + mlp_part + Ns * C * a;
  auto mlp_moment = [&](Count saved) { return saved - Ns * C * a + (Ns * C + N * H) * a + gathered; };
  auto attn_moment = [&](Count core_live) {
    return Ns * C * a + stats + core_live + 2 * Ns * C * a + gathered + core_backward(s);
  };
  BlockMem m;
  switch (mode) {
    case nn::ACMode::none:
      m.saved = none_saved;
      m.mlp = mlp_moment(none_saved);
      m.attn = attn_moment(core_saved(s));
      break;
    case nn::ACMode::selective: {
      m.saved = Ns * C * a + stats + 3 * N * Cl * a + N * Cl * a + mlp_part + Ns * C * a;
      // the core made again in backward, besides its kept input
      const Count again =
          s.core == AttentionCore::cpu_fused ? core_saved(s) - 3 * N * Cl * a + N * Cl * a : core_saved(s);
      m.mlp = mlp_moment(m.saved);
      m.attn = attn_moment(3 * N * Cl * a + again);
      break;
    }
    case nn::ACMode::full:
      m.saved = Ns * C * a;
      m.mlp = Ns * C * a /*incoming gradient*/ + mlp_moment(none_saved);
      m.attn = Ns * C * a + attn_moment(core_saved(s));
      break;
  }
  m.during_backward = std::max(m.mlp, m.attn);
  return m;
}

// nn::LlamaBlock::forward (llama) with the same ops, per mode:
//   none       ln_1: rstd (N; RMSNorm has no mean); c_attn keeps its input ln_1(x) (N C);
//              c_attn's output qkv (N Q) dies: split_last copies q, k and v out of it,
//              rotary turns q and k into new tensors keeping only the angle tables (cos
//              and sin, B Tl hd, counted with the positions: one pair for every block) and
//              heads_to_front copies them for the core; the core (above) and c_proj's input
//              (N Cl, heads_to_back's copy of the core's output); h = x + attn (N C, kept by
//              ln_2) and ln_2's rstd (N); gate and up keep their one input, ln_2(h) (N C);
//              silu_mul keeps gate's and up's outputs (2 N H), down its product (N H); the
//              block's output (N C, kept by the next block).
//   selective  the same but the core (split, rotary, attention, heads_to_back) keeps only
//              its input qkv (N Q) and its output (N Cl, c_proj's input); in backward it runs
//              again beside them: its saved set, its output and its output's gradient
//              (2 N Cl).
//   full       the output only (N C), as gpt2.
// During backward, on top of the earlier blocks (the block's output released, its gradient
// N C arrived): the MLP's largest moment of down's backward (dm, N H; sequence parallel,
// the incoming gradient gathered, N C), silu_mul's (down's input released; dm, dgate and
// dup, 3 N H), up's and gate's (gate, up and down's input released; dgate, dup, an input
// gradient of N C, the gathered input; then the two input gradients and their sum); then
// the attention's: ln_1's output and rstd, the residual's gradient and the largest of
// c_proj's backward (its input and dy, 2 N Cl; the gathered incoming gradient), the
// core's (the core, its output's gradient N Cl, its backward) and after it the gradients
// of q, k and v on their way back through heads_to_front, rotary and split_last (2 N Q)
// and c_attn's (its output's gradient N Q, its input gradient N C, the gathered input).
BlockMem llama_block_mem(const Shapes& s, nn::ACMode mode) {
  const Count N = s.N, Ns = s.Ns, C = s.C, Cl = s.Cl, Q = s.Q, H = s.H, a = s.act_bytes, stat = Ns * kF;
  const Count sp = Ns == N ? Count(0) : N * C * a;  // a gathered incoming gradient or input
  const Count mlp_part =
      (Ns * C /*h*/ + Ns * C /*ln_2 out*/ + 3 * N * H /*gate, up, their product*/) * a + stat;
  const Count none_saved =
      Ns * C * a /*ln_1 out*/ + stat + core_saved(s) + N * Cl * a /*c_proj in*/ + mlp_part + Ns * C * a;
  // saved: the block's forward set; its output has gone and the output's gradient (Ns C) come
  auto mlp_moment = [&](Count saved) {
    const Count down = saved + N * H * a + sp, silu = saved + 2 * N * H * a;
    const Count released = saved - 3 * N * H * a;  // gate, up and their product
    const Count up_gate =
        released + std::max(2 * N * H * a + N * C * a + sp, N * H * a + N * C * a + Ns * C * a + sp);
    return std::max({down, silu, up_gate, released + 3 * Ns * C * a});
  };
  // core_kept: the core's tensors before its backward; core_again: those it makes again
  auto attn_moment = [&](Count core_kept, Count core_again) {
    const Count common = Ns * C * a /*ln_1 out*/ + stat + Ns * C * a /*the residual's gradient*/;
    const Count c_proj = core_kept + 2 * N * Cl * a + sp;
    const Count core = core_kept + core_again + N * Cl * a + core_backward(s);
    const Count after = std::max(2 * N * Q * a, (N * Q + N * C) * a + sp);
    return common + std::max({c_proj, core, after});
  };
  BlockMem m;
  switch (mode) {
    case nn::ACMode::none:
      m.saved = none_saved;
      m.mlp = mlp_moment(none_saved);
      m.attn = attn_moment(core_saved(s), 0);
      break;
    case nn::ACMode::selective:
      m.saved = Ns * C * a + stat + N * Q * a /*qkv*/ + N * Cl * a /*c_proj in*/ + mlp_part + Ns * C * a;
      m.mlp = mlp_moment(m.saved);
      m.attn = attn_moment(N * Q * a, core_saved(s) + 2 * N * Cl * a);
      break;
    case nn::ACMode::full:
      m.saved = Ns * C * a;
      m.mlp = Ns * C * a /*incoming gradient*/ + mlp_moment(none_saved);
      m.attn = Ns * C * a + attn_moment(core_saved(s), 0);
      break;
  }
  m.during_backward = std::max(m.mlp, m.attn);
  return m;
}

BlockMem block_mem(const Shapes& s, nn::ACMode mode) {
  return s.llama() ? llama_block_mem(s, mode) : gpt2_block_mem(s, mode);
}

// zb-h1 (autograd/defer.h): a linear's weight GEMM, dW = x^T dy, waits for W with its input
// x and its output gradient dy (autograd/ops/matmul.cpp), so a split B keeps what the
// unsplit backward frees once dW is made. What one block keeps from its B to its W: each
// linear's input as its forward saved it (under sequence parallelism the column-parallel
// ones' part, gathered again in W) and dy (c_fc's through GELU's backward). gpt2: c_attn
// (x Ns C, dy N Q), c_proj (N Cl, N C), c_fc (Ns C, N H), the MLP's c_proj (N H, N C);
// llama: c_attn, c_proj, gate and up (one input Ns C, dy N H each), down (N H, N C). In the
// compute dtype.
Count deferred_block(const Shapes& s) {
  const Count N = s.N, Ns = s.Ns, C = s.C, Cl = s.Cl, Q = s.Q, H = s.H, a = s.act_bytes;
  const Count inputs = 2 * Ns * C + N * Cl + N * H;
  const Count grads = N * Q + 2 * N * C + (s.llama() ? 2 : 1) * N * H;
  return (inputs + grads) * a;
}

// ... and inside the block's own split backward: in the MLP's, the input of its last
// linear (gpt2's c_proj: the GELU output; llama's down: the SwiGLU product, N H); in the
// attention's, the MLP's whole share of the above and c_proj's input (N Cl) with its output
// gradient gathered (N C, under sequence parallelism more than the Ns C the unsplit
// backward keeps).
BlockMem deferring(BlockMem m, const Shapes& s) {
  const Count N = s.N, Ns = s.Ns, C = s.C, Cl = s.Cl, H = s.H, a = s.act_bytes;
  const Count mlp_deferred = Ns * C + N * H + N * C + (s.llama() ? 2 : 1) * N * H;
  m.mlp += N * H * a;
  m.attn += (mlp_deferred + N * Cl + (N - Ns) * C) * a;
  m.during_backward = std::max(m.mlp, m.attn);
  return m;
}

}  // namespace

int64_t plan_world(const Config& c) {
  if (c.plan_world > 0) return c.plan_world;
  if (c.parallel.dp_shard_size == -1)
    throw ConfigError(
        "--plan with parallel.dp_shard_size = -1 needs the world size: add --plan.world N (the number of "
        "ranks the job would have)");
  try {
    return (Count(c.parallel.pp_size) * c.parallel.dp_replicate_size * c.parallel.dp_shard_size *
            c.parallel.cp_size * c.parallel.tp_size)
        .v;
  } catch (const Error& e) {
    throw ConfigError(
        std::string("--plan: the world, parallel.pp_size x dp_replicate_size x dp_shard_size x ") +
        "cp_size x tp_size, does not fit in 64 bits (" + e.what() + "); no job has that many ranks");
  }
}

namespace {

// The parameters: the described model, split as tensor parallelism splits it, laid out as
// FSDP shards it (rank 0 of each group; every rank holds the same sizes). Under pipeline
// parallelism only the stage's units (models::GPT::units of its part): its blocks, and of
// the embeddings what it uses (an empty unit on a middle stage).
struct UnitLayout {
  std::vector<nn::FlatUnit> units;
  Count emb_full = 0, block_full = 0;  // the whole (padded) embeddings, the largest whole block
};
// Under bf16 (nn::materialize with a compute dtype) the master, its gradient and AdamW's
// moments are f32 shards; the model computes with bf16 copies: unsharded a whole buffer and
// its gradient (full, full_grad), kept; sharded the shard's copy that FSDP gathers from
// (compute_shard), the whole buffers only while gathered.
UnitLayout plan_parameters(const models::GPTConfig& mc, Plan& p, const StageView& v) {
  const dist::ParallelDims& D = p.dims;
  Count params_global = 0;
  for (const nn::ParamSpec& s : models::GPT(mc).parameters()) params_global += numel_of(s.global_shape());
  p.params_global = params_global.v;
  models::GPT gpt(mc, v.part());
  dist::split_tensor_parallel(gpt, D.tp, 0);  // rank 0's shapes: every rank's are the same
  UnitLayout l;
  l.units = nn::flat_layout(gpt.units(), nn::ShardSpec{0, D.fsdp()});
  Count params_rank = 0, shard = 0;
  for (size_t i = 0; i < l.units.size(); ++i) {
    params_rank += l.units[i].param_count();
    shard += l.units[i].shard_numel;
    p.unit_numel.push_back(l.units[i].padded_numel);
    p.unit_shard_numel.push_back(l.units[i].shard_numel);
    if (i == 0)
      l.emb_full = l.units[i].padded_numel;
    else
      l.block_full = std::max(l.block_full, Count(l.units[i].padded_numel));
  }
  p.params_rank = params_rank.v;
  Count whole = 0;
  for (const nn::FlatUnit& u : l.units) whole += u.padded_numel;
  const Count a = p.act_bytes;
  const bool mixed = a.v != kF;
  p.param_bytes = (shard * kF + (mixed ? (D.sharded() ? shard : whole) * a : Count(0))).v;
  p.grad_bytes = (shard * kF + (mixed && !D.sharded() ? whole * a : Count(0))).v;
  p.optim_bytes = (2 * shard * kF).v;  // AdamW's m and v (optim/adamw.cpp), shard-sized
  return l;
}

// The blocks' activations over one micro-step, and the block whose backward holds the most
// on top of what was kept before it, with what FSDP holds whole then (bytes).
struct BlocksMem {
  Count saved = 0, worst = 0, worst_gathered = 0;
};

// The blocks of one chunk of this rank (all of them without a pipeline), their input
// (`input`: the embeddings' output, or the activation received from the previous stage)
// kept first. FSDP's whole buffers (dist/fsdp/fsdp.cpp) while the block of unit u runs its
// backward: the embeddings and their gradient (gathered for the whole step), unit u and
// unit u-1 (prefetched), u's whole gradient and, but for the chunk's last block (the first
// whose backward runs), u+1's, whose reduce-scatter is drained only when the next block's
// backward begins (so it may still be live; it is counted). That one is in the reduce
// dtype: under bf16 with float32 reduction its f32 copy, the bf16 one released. Activation
// checkpointing picks blocks by their index on the rank (the block wrapper's).
BlocksMem plan_blocks(const Config& c, const Plan& p, const UnitLayout& l, const Shapes& s,
                      const StageView& v, size_t chunk, Count input) {
  const nn::ACMode ac = ac_mode(c.train);
  const Count emb_full = l.emb_full, block_full = l.block_full, a = s.act_bytes, rd = p.reduce_bytes;
  const bool sharded = p.dims.sharded();
  const auto [first_unit, end_unit] = v.chunk_units(chunk);
  auto gathered_in_block = [&](int64_t u) -> Count {
    if (!sharded) return 0;
    return 2 * emb_full * a + block_full * a * (1 + (u > 1 ? 1 : 0)) +
           block_full * (a + (u + 1 < end_unit ? rd : 0));
  };
  BlocksMem blocks;
  Count prefix = input;
  // zb-h1: the later blocks of the chunk, whose B ran before this one's, keep their W inputs
  const Count later = v.split_backward ? Count(end_unit - first_unit) * deferred_block(s) : Count(0);
  for (int64_t u = first_unit; u < end_unit; ++u) {
    BlockMem m = block_mem(s, nn::block_checkpointing(ac, c.train.ac_every, u - 1));
    Count waiting = 0;
    if (v.split_backward) {
      m = deferring(m, s);
      waiting = later - Count(u - first_unit + 1) * deferred_block(s);
    }
    if (prefix + waiting + m.during_backward + gathered_in_block(u) > blocks.worst + blocks.worst_gathered) {
      blocks.worst = prefix + waiting + m.during_backward;
      blocks.worst_gathered = gathered_in_block(u);
    }
    prefix += m.saved;
    blocks.saved += m.saved;
  }
  return blocks;
}

// The moments along the schedule, from what each chunk's micro-batch holds (chunks), and the
// plan's peak: FSDP's units whole outside the chunk then (another chunk's, or zb-h1's blocks
// whose W is still to come) add theirs.
void plan_peak(Plan& p, const UnitLayout& l, const Shapes& s, const StageView& v,
               const std::vector<ChunkMemory>& chunks) {
  const dist::ParallelDims& D = p.dims;
  const bool sharded = D.sharded();
  const Count Ns = s.Ns, C = s.C, a = s.act_bytes, block_full = l.block_full;
  const Count persistent = Count(p.param_bytes) + p.grad_bytes + p.optim_bytes + p.other_bytes;
  const FsdpWalk fsdp = sharded && D.pp > 1 ? fsdp_walk(v, a.v != kF) : FsdpWalk{};
  auto outside = [&](size_t action, size_t chunk) -> int64_t {
    if (fsdp.whole_before.empty()) return 0;
    const auto [begin, end] = v.chunk_units(chunk);
    Count b = 0;
    for (size_t u = 1; u < fsdp.whole_before[action].size(); ++u)
      if (int64_t(u) < begin || int64_t(u) >= end)
        b += (Count(fsdp.whole_before[action][u]) + Count(fsdp.grad_before[action][u])) * block_full * a;
    return b.v;
  };
  const MemoryWalk walk = walk_memory(v, chunks, (Ns * C * a).v, persistent.v, outside);
  p.moments = walk.moments;
  p.held_bytes = walk.held;
  p.in_flight = walk.in_flight;
  auto top = std::max_element(p.moments.begin(), p.moments.end(),
                              [](const PlanMoment& a, const PlanMoment& b) { return a.total < b.total; });
  p.peak_bytes = top->total;
  p.peak_at = top->name;
  p.gathered_bytes = top->gathered;
}

// The activations of one micro-step (forward kept for backward), and the moments at which
// memory peaks: this rank's persistent buffers plus what each moment holds. Under pipeline
// parallelism the moments of each chunk's backward are walked along the schedule
// (walk_memory): the micro-batches held at once add their kept activations.
void plan_memory(const Config& c, Plan& p, const UnitLayout& l, const Shapes& s, const StageView& v,
                 const char*& stage) {
  const dist::ParallelDims& D = p.dims;
  const nn::ACMode ac = ac_mode(c.train);
  const Count emb_full = l.emb_full, block_full = l.block_full;
  stage = "the activations of one micro-step";
  const Count N = s.N, Ns = s.Ns, C = s.C, Vl = s.Vl, a = s.act_bytes;
  // a chunk's input, kept by its first block: on the first stage the embeddings x = wte(idx)
  // + wpe(pos) (llama: wte(idx)) (N C). Under TP the lookup is vocab_parallel_embedding:
  // the shard's rows (zeros for other ranks' ids), g sums; the lookup keeps only the ids.
  // On a later stage the activation received (the same shape). Sequence parallel: this
  // rank's part
  const Count input = Ns * C * a;
  const bool sharded = D.sharded();
  // ln_f: mean, rstd (2N; llama's RMSNorm rstd, N) and its output (N C, lm_head's input,
  // wte's or an untied lm_head's: the same (N, Vl) product); the logits (N Vl) are kept
  // by the cross-entropy (with its lse, N; with TP gmax and sumexp, 2N, and the targets).
  // (sequence parallel: ln_f's on Ns rows, its output gathered)
  const Count head_saved = (s.llama() ? Ns : 2 * Ns) * kF + N * C * a;
  const Count logits = N * Vl * a;
  const Count ce_saved = (D.tp > 1 ? 3 * N : N) * kF;
  // dlogits (N Vl): with TP the vocabulary-parallel loss allocates it in backward; otherwise
  // the fused classifier (cross_entropy_fused) writes it over the logits in the forward
  const Count dlogits = D.tp > 1 ? logits : 0;
  p.logits_bytes = v.last ? logits.v : 0;
  p.loss_temp_bytes = v.last ? (dlogits + ce_saved).v : 0;  // and the kept statistics
  // the batch (inputs and targets, B T i32 each; with CP this rank's copy too; a pipeline
  // holds the step's micro-batches, every stage) and positions; llama's rotary tables, cos
  // and sin (B Tl hd/2 each, in the compute dtype: every block's rotary keeps them;
  // models::GPT keeps them between steps but under CP)
  const Count rope_tables = s.llama() ? N * s.hd * a : 0;
  const Count batches = D.pp > 1 ? Count(p.accum) : Count(1);
  p.other_bytes =
      ((batches * (2 * Count(p.micro_batch) * p.seq_len + (D.cp > 1 ? 2 * N : 0)) + N) * 4 + rope_tables).v;
  p.block_activation_bytes =
      block_mem(s, nn::block_checkpointing(ac, c.train.ac_every, 1 % v.block_count())).saved.v;

  // at the end of forward the embeddings (and their gradient) and the last block are whole
  const Count g_fwd_end = sharded ? (2 * emb_full + block_full) * a : 0;
  p.gathered_max_bytes = sharded ? ((2 * emb_full + 3 * block_full) * a + block_full * p.reduce_bytes).v : 0;

  // ---- what one micro-batch holds on each chunk, and its backward's moments
  // bf16 GEMMs on a CPU without bf16 instructions (tensor/cpu/matmul.cpp) convert both
  // operands and the product to f32 for sgemm: the largest product's copies, while it runs
  const bool f32_gemms = p.bf16_gemms_in_f32;
  auto f32_copies = [&](Count m, Count k, Count n) {
    return f32_gemms ? (m * k + k * n + m * n) * kF : Count(0);
  };
  if (f32_gemms)
    p.notes.push_back(
        "this CPU's bf16 matrix products run in f32 (no bf16 instructions, or NDT_BF16_GEMM=f32): "
        "the peak counts their f32 copies");
  std::vector<ChunkMemory> chunks;
  Count activations = 0;
  for (size_t k = 0; k < v.chunks.size(); ++k) {
    const BlocksMem blocks = plan_blocks(c, p, l, s, v, k, input);
    const bool head = v.last_chunk(k);
    activations += input + blocks.saved + (head ? head_saved : Count(0));
    ChunkMemory m;
    m.kept = (input + blocks.saved + (head ? head_saved + logits + ce_saved : Count(0))).v;
    if (v.split_backward) m.deferred = (Count(v.chunks[k].second - v.chunks[k].first) * deferred_block(s)).v;
    auto moment = [&](const std::string& name, Count acts, Count gathered, Count transient) {
      m.backward.push_back({name, acts.v, gathered.v, transient.v, 0});
    };
    if (head) {
      // the loss's backward: every activation, the logits and their gradient
      moment("loss backward (logits and dlogits)", m.kept, g_fwd_end, dlogits);
      // lm_head's backward: dx (N C) and dwte (Vl C); with TP the logits are released and
      // dlogits takes their place, without it dlogits is the logits' memory
      moment("lm_head backward", m.kept, g_fwd_end, (N * C + Vl * C) * a + f32_copies(N, Vl, C));
    }
    // the blocks' backward, the worst block (earlier blocks' activations still kept)
    moment("block backward", blocks.worst, blocks.worst_gathered, f32_copies(N, C, s.H));
    chunks.push_back(m);
  }
  p.activation_bytes = activations.v;
  p.deferred_bytes = v.split_backward ? (Count(v.block_count()) * deferred_block(s)).v : 0;

  stage = "the peak memory";
  plan_peak(p, l, s, v, chunks);
}

// A line of the plan's communication, if it sends anything.
void add_comm(Plan& p, const std::string& dim, const std::string& what, const std::string& formula,
              Count bytes) {
  if (bytes > 0) p.comm.push_back({dim, what, formula, bytes.v});
}

// FSDP's all-gathers and reduce-scatters over its n ranks, and the all-reduces over the r
// replicas (HSDP's of the gradient shards, DP's of the whole gradients). Under pipeline
// parallelism FSDP's are counted along the schedule (fsdp_walk): a block is gathered again
// whenever an action needs it and it was released.
void plan_data_parallel_comm(Plan& p, const UnitLayout& l, const Shapes& s, const StageView& v) {
  const dist::ParallelDims& D = p.dims;
  const std::vector<nn::FlatUnit>& units = l.units;
  const Count emb_full = l.emb_full, a = s.act_bytes, rd = p.wire_reduce_bytes;
  const Count A = p.accum, n = D.fsdp(), r = D.dp_replicate;
  if (D.sharded() && D.pp > 1) {
    const FsdpWalk w = fsdp_walk(v, a.v != kF);
    const Count block = l.block_full;
    add_comm(p, "fsdp", "all-gather of the embeddings (once per step)", "(n-1)/n P_emb a",
             (n - 1) * (emb_full * a / n));
    add_comm(
        p, "fsdp",
        "all-gather of a block whenever an action needs it released (" + std::to_string(w.block_gathers) +
            " in the schedule: in each F, and in each B unless still whole)",
        std::to_string(w.block_gathers) + " (n-1)/n P_block a", w.block_gathers * (n - 1) * (block * a / n));
    add_comm(p, "fsdp",
             "reduce-scatter of a block's gradient whenever its gradient group fires (" +
                 std::to_string(w.block_reduces) + ": each B, under zb-h1 each W that leaves none to come)",
             std::to_string(w.block_reduces) + " (n-1)/n P_block r'",
             w.block_reduces * (n - 1) * (block * rd / n));
    add_comm(p, "fsdp",
             w.emb_reduces == 1 ? "reduce-scatter of the embeddings' gradient (once per step)"
                                : "reduce-scatter of the embeddings' gradient (after each B and W)",
             std::to_string(w.emb_reduces) + " (n-1)/n P_emb r'",
             w.emb_reduces * (n - 1) * (emb_full * rd / n));
    if (r > 1) {
      Count b = Count(w.emb_replica_reduces) * all_reduce_bytes(Count(units[0].shard_numel) * kF, r);
      for (size_t i = 1; i < units.size(); ++i) b += all_reduce_bytes(Count(units[i].shard_numel) * kF, r);
      add_comm(p, "replicate", "HSDP all-reduce of every gradient shard", "2 (r-1)/r sum P/n", b);
    }
    return;
  }
  if (D.sharded()) {
    Count blocks_full = 0, blocks_but_last = 0;  // elements
    for (size_t i = 1; i < units.size(); ++i) {
      blocks_full += units[i].padded_numel;
      if (i + 1 < units.size()) blocks_but_last += units[i].padded_numel;
    }
    add_comm(p, "fsdp", "all-gather of the embeddings (once per step)", "(n-1)/n P_emb a",
             (n - 1) * (emb_full * a / n));
    add_comm(p, "fsdp", "all-gather of every block (forward, each micro-step)", "accum (n-1)/n sum P_block a",
             A * (n - 1) * (blocks_full * a / n));
    add_comm(p, "fsdp", "all-gather of every block but the last (backward)",
             "accum (n-1)/n sum P_block[<L] a", A * (n - 1) * (blocks_but_last * a / n));
    add_comm(p, "fsdp", "reduce-scatter of every block's gradient", "accum (n-1)/n sum P_block r'",
             A * (n - 1) * (blocks_full * rd / n));
    add_comm(p, "fsdp", "reduce-scatter of the embeddings' gradient (last micro-step)", "(n-1)/n P_emb r'",
             (n - 1) * (emb_full * rd / n));
  }
  if (r > 1) {
    Count b = 0;
    for (const nn::FlatUnit& u : units) b += all_reduce_bytes(Count(u.shard_numel) * kF, r);
    if (D.sharded())
      add_comm(p, "replicate", "HSDP all-reduce of every gradient shard", "2 (r-1)/r sum P/n", b);
    else
      add_comm(p, "replicate", "DP all-reduce of every gradient buffer (last micro-step)", "2 (r-1)/r sum P",
               b);
  }
}

// "(6L+2)": a count of k per block and c more, as the formulas write it
std::string per_block(int64_t k, int64_t c) {
  std::ostringstream os;
  os << "(" << k << "L";
  if (c) os << "+" << c;
  os << ")";
  return os.str();
}

// Tensor parallelism's f and g over its t ranks (again in the blocks full checkpointing
// recomputes), sequence parallel's sum of the unsplit gradients, and the
// vocabulary-parallel loss's statistics. f runs once per column-parallel linear: c_attn
// and the MLP's m = 1 (gpt2's c_fc) or 2 (llama's gate and up, each its own
// linear_shared_input: each sums its input gradient, and under sequence parallelism each
// gathers its input, in forward and again in backward), and lm_head's input. L: the
// rank's blocks; the embedding's g (e = 1) on the first stage, lm_head's f and the loss
// (h = 1) on the last (both without a pipeline).
void plan_tensor_parallel_comm(Plan& p, const UnitLayout& l, const Shapes& s, const StageView& v,
                               int64_t full_blocks) {
  const Count N = s.N, C = s.C, a = s.act_bytes, A = p.accum, t = p.dims.tp;
  const int64_t L = v.block_count(), m = s.mlp_inputs(), e = v.first ? 1 : 0, h = v.last ? 1 : 0;
  const bool whole = v.first && v.last;      // the formulas as the single process's plan words them
  const Count columns = Count(L) * (1 + m);  // the blocks' column-parallel linears
  // the formulas in the plan's words: gpt2's m = 1 gives 2L, 6L + 2, 2 (2L+1)
  const std::string f_ops = m == 1 ? "2L" : std::to_string(1 + m) + "L";
  if (t > 1 && p.sequence_parallel) {
    // f and g as all-gathers of the parts (a: raw values) and reduce-scatters into them
    // (a': what the reduction moves), each (t-1)/t of the whole N C
    const Count gather = (t - 1) * (N / t) * C * a, scatter = (t - 1) * (N / t) * C * p.wire_act_reduce_bytes;
    // forward: before each column-parallel linear and lm_head; backward: the gradient after
    // each attention, MLP and the embedding (g's), and each column-parallel linear's input
    // again for its weight gradient
    const Count gathers = (columns + h) + (2 * L + e) + columns;
    add_comm(p, "tp",
             m == 1
                 ? "sequence parallel: all-gather before each attention, MLP and lm_head (forward), of the "
                   "gradient after each attention, MLP and the embedding, and of the attention's and the "
                   "MLP's input again for their weight gradients (backward)"
                 : "sequence parallel: all-gather before each attention, gate, up and lm_head (forward), of "
                   "the gradient after each attention, MLP and the embedding, and of the attention's, gate's "
                   "and up's input again for their weight gradients (backward)",
             "accum " + per_block(2 * (1 + m) + 2, e + h) + " (t-1)/t N C a", A * gathers * gather);
    // forward: after each attention, MLP and the embedding; backward: each column-parallel
    // linear's input gradient and lm_head's
    const Count scatters = (2 * L + e) + (columns + h);
    add_comm(
        p, "tp",
        m == 1
            ? "sequence parallel: reduce-scatter after each attention, MLP and the embedding (forward) and "
              "of the input gradient of each attention, MLP and lm_head (backward)"
            : "sequence parallel: reduce-scatter after each attention, MLP and the embedding (forward) and "
              "of the input gradient of each attention, gate, up and lm_head (backward)",
        m == 1 && whole ? "accum 2 (2L+1) (t-1)/t N C a'"
                        : "accum " + per_block(3 + m, e + h) + " (t-1)/t N C a'",
        A * scatters * scatter);
    if (full_blocks)
      add_comm(p, "tp", "the gathers and reduce-scatters again in the blocks full checkpointing recomputes",
               m == 1 ? "accum 2 L_full (t-1)/t N C (a + a')"
                      : "accum L_full (t-1)/t N C (" + std::to_string(1 + m) + " a + 2 a')",
               A * full_blocks * ((1 + m) * gather + 2 * scatter));
    // the unsplit parameters' partial gradients (this rank's shards of them), summed once
    Count unsplit = 0;
    for (const nn::FlatUnit& u : l.units)
      for (const nn::FlatParam& q : u.params)
        if (!q.spec.tp.split()) unsplit += nn::shard_part(u, q).size();
    p.sp_grad_numel = unsplit.v;
    add_comm(
        p, "tp",
        "sequence parallel: all-reduce of the LayerNorms', biases' and wpe's gradients (last micro-step)",
        "2 (t-1)/t P_unsplit 4", all_reduce_bytes(unsplit * kF, t));
  } else if (t > 1) {
    const Count x = N * C * p.wire_act_reduce_bytes;
    add_comm(p, "tp",
             whole || e ? "g: all-reduce after each attention and MLP, and the embedding (forward)"
                        : "g: all-reduce after each attention and MLP (forward)",
             "accum " + per_block(2, e) + " 2 (t-1)/t N C a'", A * (2 * L + e) * all_reduce_bytes(x, t));
    if (full_blocks)
      add_comm(p, "tp", "g again in the blocks full checkpointing recomputes",
               "accum 2 L_full 2 (t-1)/t N C a'", A * 2 * full_blocks * all_reduce_bytes(x, t));
    const std::string f_what = m == 1 ? "f: all-reduce of the input gradient of each attention, MLP"
                                      : "f: all-reduce of the input gradient of each attention, gate, up";
    add_comm(p, "tp", f_what + (h ? " and lm_head (backward)" : " (backward)"),
             "accum (" + f_ops + (h ? "+1" : "") + ") 2 (t-1)/t N C a'",
             A * (columns + h) * all_reduce_bytes(x, t));
  }
  if (t > 1 && h)
    add_comm(p, "tp", "vocabulary-parallel cross-entropy: max, sum of exponentials, target logit",
             "accum 3 2 (t-1)/t N 4", A * 3 * all_reduce_bytes(N * kF, t));
}

// The pipeline's messages (dist/pipeline_parallel/comm.h): per micro-batch, each chunk but
// the last stage's sends its output activation forward (F) and each but the first stage's
// the gradient of its input back (B), B x Tl (x 1/tp sequence parallel) x C in the compute
// dtype, counted as the tensor's bytes (a send). The tied embeddings' gradient (the shard
// FSDP keeps, f32) is summed between the first and the last stage once per step, an
// all-reduce over two.
void plan_pipeline_comm(const Config& c, Plan& p, const UnitLayout& l, const StageView& v) {
  if (p.dims.pp == 1) return;
  int64_t sends = 0;
  for (size_t k = 0; k < v.chunks.size(); ++k)
    sends += (v.last_chunk(k) ? 0 : 1) + (v.first_chunk(k) ? 0 : 1);
  add_comm(p, "pp",
           sends == 1 ? (v.first ? "activation of each micro-batch to the next stage (F)"
                                 : "gradient of each micro-batch back to the previous stage (B)")
                      : "activations to the next stage (F) and gradients back to the previous one (B), each "
                        "micro-batch",
           "accum " + std::to_string(sends) + (p.sequence_parallel ? " B Tl/t C a" : " B Tl C a"),
           Count(p.accum) * sends * p.io_bytes);
  if (c.model.tied() && (v.first || v.last))
    add_comm(p, "pp", "the tied embeddings' gradient, summed between the first and the last stage",
             "2 (2-1)/2 P_emb/n 4", all_reduce_bytes(Count(l.units[0].shard_numel) * kF, 2));
}

// The communication per optimizer step (the communicators' counters, dist/comm/mpi.cpp).
// Under bf16 FSDP gathers the bf16 copies and reduce-scatters in the reduce dtype; DP's and
// HSDP's all-reduces run on the f32 gradients (folded first); TP's and the ring's traffic
// is activations (a bytes) but for the loss's f32 statistics. A reduction moves its wire
// dtype's bytes (Plan::wire_*: on CPU ranks MPI reduces bf16 in f32): r' for FSDP's
// reduce-scatter, a' for TP's all-reduces. Ranks: n of the FSDP group, r replicas, t of
// tensor parallelism, cp of context parallelism; A micro-steps; L the rank's blocks.
void plan_communication(const Config& c, Plan& p, const UnitLayout& l, const Shapes& s, const StageView& v) {
  const dist::ParallelDims& D = p.dims;
  const nn::ACMode ac = ac_mode(c.train);
  const Count N = s.N, a = s.act_bytes;
  const int64_t L = v.block_count();
  const Count A = p.accum, n = D.fsdp(), t = D.tp, cp = D.cp;
  plan_data_parallel_comm(p, l, s, v);
  // recomputed blocks run their forward communication again in backward
  int64_t full_blocks = 0, recomputed_cores = 0;
  for (int64_t i = 0; i < L; ++i) {
    const nn::ACMode m = nn::block_checkpointing(ac, c.train.ac_every, i);
    if (m == nn::ACMode::full) ++full_blocks;
    if (m != nn::ACMode::none) ++recomputed_cores;
  }
  plan_tensor_parallel_comm(p, l, s, v, full_blocks);
  if (cp > 1) {
    // K and V of this rank's two chunks: only the kv heads travel (KVl = Cl but under
    // grouped-query attention)
    const Count block = 2 * N * Count(s.KVl) * a;
    add_comm(p, "cp", "ring: K/V blocks forward and their gradients back, every block",
             "accum L 2 (cp-1) 2 N KVl a", A * L * 2 * (cp - 1) * block);
    if (recomputed_cores)
      add_comm(p, "cp", "ring again in the attention that checkpointing recomputes",
               "accum L_ac (cp-1) 2 N KVl a", A * recomputed_cores * (cp - 1) * block);
  }
  plan_pipeline_comm(c, p, l, v);
  // scalars (f64, Communicator::all_reduce_scalar): the loss over dp then cp ranks, the
  // gradient norm's sum of squares over the FSDP group (FSDP/HSDP) and the tp group; with a
  // pipeline the loss's sum and the norm's over the stages
  Count scalars = all_reduce_bytes(8, D.dp()) + all_reduce_bytes(8, cp) + all_reduce_bytes(8, t);
  if (D.sharded()) scalars += all_reduce_bytes(8, n);
  scalars += 2 * all_reduce_bytes(8, D.pp);
  add_comm(p, "scalars",
           D.pp > 1 ? "loss mean and gradient norm (and their sums over the stages)"
                    : "loss mean and gradient norm",
           "2 (k-1)/k 8 per group", scalars);
  Count comm_bytes = 0;
  for (const PlanComm& x : p.comm) comm_bytes += x.bytes;
  p.comm_bytes = comm_bytes.v;
}

// Fills in the sizes, memory and communication of p, whose layout (p.dims) is resolved and
// checked, for the pipeline stage v (the whole model without a pipeline); `stage` names what
// is being computed, for the message when a count overflows.
void plan_sizes(const Config& c, Plan& p, const StageView& v, const char*& stage) {
  const dist::ParallelDims& D = p.dims;
  p.strategy = D.strategy() + (p.sequence_parallel ? " + SP" : "");  // SP: sequence parallel
  const nn::ACMode ac = ac_mode(c.train);
  p.ac = c.train.activation_checkpointing;
  p.ac_every = c.train.ac_every;
  const models::GPTConfig& mc = c.model;
  p.n_layer = mc.n_layer;
  p.n_head = mc.n_head;
  p.n_embd = mc.n_embd;
  p.padded_vocab = mc.padded_vocab();
  p.arch = mc.arch;
  p.n_kv_head = mc.kv_heads();
  p.mlp_hidden = mc.mlp_hidden();
  p.qkv_bias = !mc.llama() || mc.attention_bias;
  p.pp_schedule = v.schedule;
  p.pp_virtual = v.v;
  p.pp_blocks = v.blocks;
  p.stage = v.stage;
  p.chunks = v.chunks;
  p.first_stage = v.first;
  p.last_stage = v.last;

  // ---- the batch (Trainer::materialize): micro x accum x dp sequences
  stage = "the batch (train.micro_batch_size x grad_accum_steps x data-parallel ranks x seq_len)";
  p.micro_batch = c.train.micro_batch_size;
  p.seq_len = c.train.seq_len;
  p.local_seq = c.train.seq_len / D.cp;
  p.accum = c.train.grad_accum_steps;
  p.sequences = (Count(p.micro_batch) * p.accum * D.dp()).v;
  p.tokens = (Count(p.sequences) * p.seq_len).v;

  // the dtypes (Trainer: bf16 computes over an f32 master; FSDP reduces in reduce_dtype)
  const bool bf16 = c.train.dtype == "bfloat16";
  p.dtype = c.train.dtype;
  p.act_bytes = bf16 ? 2 : kF;
  p.reduce_bytes = bf16 && c.parallel.reduce_dtype == "bfloat16" ? 2 : kF;
  const bool mpi = c.train.device == "cpu";  // MPI reduces bf16 in f32; NCCL in bf16
  p.wire_reduce_bytes = mpi ? kF : p.reduce_bytes;
  p.wire_act_reduce_bytes = mpi ? kF : p.act_bytes;
  stage = "the parameters";
  const UnitLayout l = plan_parameters(mc, p, v);
  // the shapes one micro-step computes with on this rank
  stage = "the activations of one micro-step";
  const Shapes s = shapes_of(p, c.train.device);
  p.io_bytes =
      D.pp > 1 ? (Count(s.Ns) * s.C * s.act_bytes).v : 0;  // (B, Tl, C), sequence parallel (B, Tl/t, C)
  plan_memory(c, p, l, s, v, stage);
  stage = "the communication per step";
  plan_communication(c, p, l, s, v);
  // ---- notes
  if (D.tp > 1 && mc.n_head % D.tp) p.notes.push_back("n_head does not divide by tp");
  if (ac != nn::ACMode::none && c.train.ac_every > 1)
    p.notes.push_back("activation checkpointing on blocks 0, " + std::to_string(c.train.ac_every) + ", " +
                      std::to_string(2 * c.train.ac_every) + ", ...; the others keep everything" +
                      (D.pp > 1 ? " (counted on each stage's own blocks)" : ""));
  if (D.cp > 1)
    p.notes.push_back("context parallelism: the numbers are rank 0's, which keeps the most ring blocks");
  if (v.split_backward)
    p.notes.push_back(
        "zb-h1: between a micro-batch's B and its W each block keeps its linears' inputs and "
        "output gradients for the deferred weight GEMMs (" +
        io::format_bytes(double(p.deferred_bytes)) + " a micro-batch on this stage)");
}

}  // namespace

Plan plan_stage(const Config& c, int64_t world, int64_t stage) {
  if (c.train.dtype != "float32" && c.train.dtype != "bfloat16")
    throw ConfigError("train_gpt --plan models train.dtype float32 or bfloat16, got " + c.train.dtype);
  Plan p;
  StageView v;
  try {
    p.dims =
        dist::ParallelDims::resolve(c.parallel.pp_size, c.parallel.dp_replicate_size,
                                    c.parallel.dp_shard_size, c.parallel.cp_size, c.parallel.tp_size, world);
    c.model.validate();
    // the trainer's rules (Trainer::describe): tp, cp and sequence parallelism against the
    // model, enough blocks for the stages, the split and the schedule
    dist::check_parallel_model(c.model, p.dims, c.train.seq_len, c.parallel.sequence_parallel);
    p.sequence_parallel = c.parallel.sequence_parallel && p.dims.tp > 1;
    NDT_CHECK(stage >= 0 && stage < p.dims.pp, "internal: stage ", stage, " of ", p.dims.pp);
    v = stage_view(c, p.dims, stage);
    // bf16 on CPU ranks: the matrix products on this CPU's bf16 units, or through f32
    // (NDT_BF16_GEMM; a bad value is refused here as in training)
    p.bf16_gemms_in_f32 =
        c.train.dtype == "bfloat16" && c.train.device == "cpu" && !cpu::bf16_gemm_on_onednn();
  } catch (const ConfigError&) {
    throw;
  } catch (const Error& e) {
    throw ConfigError(e.what());
  }
  const char* what = "the plan";
  try {
    plan_sizes(c, p, v, what);
  } catch (const Error& e) {
    throw ConfigError(std::string("--plan: a count of ") + what + " does not fit in 64 bits (" + e.what() +
                      "); no machine holds such a run: lower the model's or the batch's sizes or the world");
  }
  return p;
}

Plan plan(const Config& c, int64_t world) {
  Plan first = plan_stage(c, world, 0);
  if (first.dims.pp == 1) return first;
  std::vector<Plan> all;
  all.push_back(std::move(first));
  for (int64_t s = 1; s < all.front().dims.pp; ++s) all.push_back(plan_stage(c, world, s));
  size_t worst = 0;
  for (size_t s = 1; s < all.size(); ++s)
    if (all[s].peak_bytes > all[worst].peak_bytes) worst = s;
  std::vector<PlanStage> stages;
  for (const Plan& x : all)
    stages.push_back({x.stage, x.chunks, x.first_stage, x.last_stage, x.params_rank,
                      x.param_bytes + x.grad_bytes + x.optim_bytes + x.other_bytes, x.activation_bytes,
                      x.in_flight, x.held_bytes, x.peak_bytes, x.peak_at, x.comm_bytes});
  Plan out = std::move(all[worst]);
  out.stages = std::move(stages);
  out.notes.push_back("pipeline: the plan is stage " + std::to_string(out.stage) +
                      "'s, whose peak is the highest; the stages' lines list them all");
  return out;
}

}  // namespace ndt::train
