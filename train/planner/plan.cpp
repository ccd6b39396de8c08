// The plan of a training config: sizes from the described model, memory from what the ops
// save for backward, communication from the formulas the communicators count. Every count
// below names the code it follows; when that code changes, this file must change with it
// (tests/test_dist_plan.cpp compares the two under mpirun).
//
// Legend: train/planner/shapes.h (B, Tl, N, Ns, C, Cl, KVl, Q, H, NHl, Vl, L, a for this rank).
// What a block keeps and holds is its kind's (train/planner/block_kinds.h: described op by op
// in its family's train/families/<arch>.cpp).
// Bytes of an element besides a (activations and the model's copy of the parameters): 4
// for statistics (LayerNorm's mean and rstd, RMSNorm's rstd, log-sum-exps), the f32 master, its gradient
// and AdamW's moments, r for FSDP's reduce-scatters (parallel.reduce_dtype under bfloat16,
// else 4).
#include "train/planner/plan.h"

#include "models/family.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

#include "dist/context_parallel/ring_attention.h"
#include "dist/expert_parallel/expert_parallel.h"
#include "dist/parallelize.h"
#include "dist/tensor_parallel/tensor_parallel.h"
#include "models/gpt.h"
#include "nn/block_wrapper.h"
#include "nn/flat.h"
#include "nn/moe.h"
#include "tensor/checked.h"
#include "tensor/cpu/onednn_gemm.h"
#include "train/io/format.h"
#include "train/planner/block_kinds.h"
#include "train/planner/count.h"
#include "train/planner/pipeline.h"
#include "train/planner/shapes.h"

namespace ndt::train {
namespace {

// Bytes an all-reduce of `bytes` sends on n ranks (MpiCommunicator::all_reduce's counter).
Count all_reduce_bytes(Count bytes, Count n) { return n > 1 ? 2 * (n - 1) * bytes / n : 0; }

// zb-h1 (autograd/defer.h): a linear's weight GEMM, dW = x^T dy, waits for W with its input
// x and its output gradient dy (autograd/ops/matmul.cpp), so a split B keeps what the
// unsplit backward frees once dW is made. What one block keeps from its B to its W: each
// linear's input as its forward saved it (under sequence parallelism the column-parallel
// ones' part, gathered again in W) and dy: c_attn (x Ns C, dy N Q), c_proj (N Cl, N C) and
// the MLP's, its kind's (BlockKind::deferred_mlp). In the compute dtype.
Count deferred_block(const Shapes& s) {
  const Count N = s.N, Ns = s.Ns, C = s.C, Cl = s.Cl, Q = s.Q, a = s.act_bytes;
  return (Ns * C + N * Q + N * Cl + N * C + s.kind->deferred_mlp(s)) * a;
}

// The W inputs of the model's blocks [begin, end) (a MoE block's own: moe_block).
Count deferred_blocks(const Config& c, const Shapes& s, int64_t begin, int64_t end) {
  Count n = 0;
  for (int64_t i = begin; i < end; ++i) n += deferred_block(c.model.moe_layer(i) ? moe_block(s) : s);
  return n;
}

// ... and inside the block's own split backward: in the MLP's, the input of its last
// linear (gpt2's c_proj: the GELU output; llama's down: the SwiGLU product, N H); in the
// attention's, the MLP's whole share of the above and c_proj's input (N Cl) with its output
// gradient gathered (N C, under sequence parallelism more than the Ns C the unsplit
// backward keeps).
BlockMem deferring(BlockMem m, const Shapes& s) {
  const Count N = s.N, Ns = s.Ns, C = s.C, Cl = s.Cl, H = s.H, a = s.act_bytes;
  m.mlp += N * (s.moe ? s.Hs : H) * a;  // a MoE block: its shared expert's down (grouped GEMMs defer nothing)
  m.attn += (s.kind->deferred_mlp(s) + N * Cl + (N - Ns) * C) * a;
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
            c.parallel.cp_size * c.parallel.sp_size * c.parallel.tp_size)
        .v;
  } catch (const Error& e) {
    throw ConfigError(
        std::string("--plan: the world, parallel.pp_size x dp_replicate_size x dp_shard_size x ") +
        "cp_size x sp_size x tp_size, does not fit in 64 bits (" + e.what() +
        "); no job has that many ranks");
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
  // the largest whole block gradient: a block's experts over an expert shard group of one rank
  // (ep = the FSDP ranks that hold them) are not gathered, FSDP's whole buffer borrows the
  // rank's own shard (dist/fsdp/fsdp.cpp), but their whole gradient is its own buffer
  Count block_grad_full = 0;
};
// Under bf16 (nn::materialize with a compute dtype) the master, its gradient and AdamW's
// moments are f32 shards; the model computes with bf16 copies: unsharded a whole buffer and
// its gradient (full, full_grad), kept; sharded the shard's copy that FSDP gathers from
// (compute_shard), the whole buffers only while gathered.
// LoRA: the base's parameters only (frozen: nn::materialize gives it no gradients, AdamW no
// moments), then the adapters (dist/adapters.h): whole on every rank (TP: split with their
// linears), f32 master, gradient and moments, with bf16 copies of them and of their gradient
// under bf16 (models::GPT::adapter_units, materialized unsharded).
void plan_adapters(const models::GPT& gpt, Plan& p) {
  const Count a = p.act_bytes;
  const bool mixed = a.v != kF;
  Count n = 0;
  for (const nn::FlatUnit& u : nn::flat_layout(gpt.adapter_units())) n += u.padded_numel;
  p.lora_rank = gpt.lora_config.rank;
  p.lora_adapters = gpt.lora.empty() ? 0 : static_cast<int64_t>(gpt.lora.front()->adapters.size());
  p.adapter_params = n.v;
  p.grad_bytes = (n * kF + (mixed ? n * a : Count(0))).v;  // the base: none
  p.param_bytes = (Count(p.param_bytes) + n * kF + (mixed ? n * a : Count(0))).v;
  p.optim_bytes = (2 * n * kF).v;
}

UnitLayout plan_parameters(const Config& c, Plan& p, const StageView& v) {
  const models::GPTConfig& mc = c.model;
  const dist::ParallelDims& D = p.dims;
  Count params_global = 0;
  for (const nn::ParamSpec& s : models::GPT(mc).parameters()) params_global += numel_of(s.global_shape());
  p.params_global = params_global.v;
  models::GPT gpt(mc, v.part());
  if (c.lora.on()) gpt.add_lora(c.lora);      // before TP, which splits them with their linears
  dist::split_tensor_parallel(gpt, D.tp, 0);  // rank 0's shapes: every rank's are the same
  // expert parallelism: each rank's parameters hold E / ep experts of every MoE layer
  // (dist::split_experts); inside FSDP in units of their own, sharded over the fsdp / ep ranks
  // that hold the same experts (models::GPT::units(experts_apart))
  if (D.ep > 1) dist::split_experts(gpt, D.ep, 0);
  nn::ShardSpec shard_spec{0, D.fsdp()};
  if (D.experts_apart()) shard_spec.experts = {0, D.expert_shards()};
  UnitLayout l;
  l.units = nn::flat_layout(gpt.units(D.experts_apart()), shard_spec);
  Count params_rank = 0, shard = 0;
  for (const nn::FlatUnit& u : l.units) {
    params_rank += u.param_count();
    shard += u.shard_numel;
    if (u.experts) continue;  // after every block's unit: placed below
    p.unit_numel.push_back(u.padded_numel);
    p.unit_shard_numel.push_back(u.shard_numel);
  }
  p.experts_numel.assign(p.unit_numel.size(), 0);
  p.experts_shard_numel.assign(p.unit_numel.size(), 0);
  for (const nn::FlatUnit& u : l.units)
    for (size_t b = 1; u.experts && b < p.unit_numel.size(); ++b)
      if (u.name == l.units[b].name + ".experts") {
        p.experts_numel[b] = u.padded_numel;
        p.experts_shard_numel[b] = u.shard_numel;
      }
  l.emb_full = p.unit_numel[0];
  const bool experts_borrowed = D.experts_apart() && D.expert_shards() == 1;
  for (size_t b = 1; b < p.unit_numel.size(); ++b) {  // a block and its experts are whole together
    l.block_full =
        std::max(l.block_full, Count(p.unit_numel[b] + (experts_borrowed ? 0 : p.experts_numel[b])));
    l.block_grad_full = std::max(l.block_grad_full, Count(p.unit_numel[b] + p.experts_numel[b]));
  }
  p.params_rank = params_rank.v;
  Count whole = 0;
  for (const nn::FlatUnit& u : l.units) whole += u.padded_numel;
  const Count a = p.act_bytes;
  const bool mixed = a.v != kF;
  p.param_bytes = (shard * kF + (mixed ? (D.sharded() ? shard : whole) * a : Count(0))).v;
  p.grad_bytes = (shard * kF + (mixed && !D.sharded() ? whole * a : Count(0))).v;
  p.optim_bytes = (2 * shard * kF).v;  // AdamW's m and v (optim/adamw.cpp), shard-sized
  if (c.lora.on()) plan_adapters(gpt, p);
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
  const Count emb_full = l.emb_full, block_full = l.block_full, grad_full = l.block_grad_full,
              a = s.act_bytes, rd = p.reduce_bytes;
  const bool sharded = p.dims.sharded();
  const auto [first_unit, end_unit] = v.chunk_units(chunk);
  const bool lora = p.lora_rank > 0;  // a frozen base: FSDP gathers no gradient of it
  auto gathered_in_block = [&](int64_t u) -> Count {
    if (!sharded) return 0;
    if (lora) return emb_full * a + block_full * a * (1 + (u > 1 ? 1 : 0));
    return 2 * emb_full * a + block_full * a * (1 + (u > 1 ? 1 : 0)) +
           grad_full * (a + (u + 1 < end_unit ? rd : 0));
  };
  // LoRA: each adapter's x A^T (N, r), kept by its matmul with B (nn::LoraAdapter::forward;
  // the linear's input it keeps for A's gradient is the one a trained linear keeps for its
  // weight's); recomputed in backward under full checkpointing
  const Count adapters = Count(p.lora_adapters) * s.N * p.lora_rank * a;
  BlocksMem blocks;
  Count prefix = input;
  // zb-h1: the later blocks of the chunk, whose B ran before this one's, keep their W inputs
  // a MoE block (models::GPTConfig::moe_layer of its index in the model) its own shapes
  auto shapes_of_unit = [&](int64_t u) {
    return c.model.moe_layer(v.chunks[chunk].first + (u - first_unit)) ? moe_block(s) : s;
  };
  Count later = 0;
  for (int64_t u = first_unit; v.split_backward && u < end_unit; ++u)
    later += deferred_block(shapes_of_unit(u));
  for (int64_t u = first_unit; u < end_unit; ++u) {
    const nn::ACMode mode = nn::block_checkpointing(ac, c.train.ac_every, u - 1);
    const Shapes bs = shapes_of_unit(u);
    BlockMem m = bs.kind->memory(bs, mode);
    if (mode != nn::ACMode::full) m.saved += adapters;
    m.during_backward += adapters;
    Count waiting = 0;
    if (v.split_backward) {
      m = deferring(m, bs);
      later = later - deferred_block(bs);
      waiting = later;
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
  const Count Ns = s.Ns, C = s.C, a = s.act_bytes, block_full = l.block_full, grad_full = l.block_grad_full;
  const Count persistent = Count(p.param_bytes) + p.grad_bytes + p.optim_bytes + p.other_bytes;
  const FsdpWalk fsdp = sharded && D.pp > 1 ? fsdp_walk(v, a.v != kF) : FsdpWalk{};
  auto outside = [&](size_t action, size_t chunk) -> int64_t {
    if (fsdp.whole_before.empty()) return 0;
    const auto [begin, end] = v.chunk_units(chunk);
    Count b = 0;
    for (size_t u = 1; u < fsdp.whole_before[action].size(); ++u)
      if (int64_t(u) < begin || int64_t(u) >= end)
        b += (Count(fsdp.whole_before[action][u]) * block_full +
              Count(fsdp.grad_before[action][u]) * grad_full) *
             a;
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

// bf16 GEMMs on a CPU without bf16 instructions (tensor/cpu/matmul.cpp) convert both
// operands and the product to f32 for sgemm: the largest product's copies, while it runs.
Count f32_gemm_copies(const Plan& p, Count m, Count k, Count n) {
  return p.bf16_gemms_in_f32 ? (m * k + k * n + m * n) * kF : Count(0);
}

// FSDP's whole buffers at the end of forward (returned: the embeddings, their gradient and the
// last block) and at most (Plan::gathered_max_bytes); LoRA: no gradient of the frozen base,
// and the adapters' x A^T the blocks keep (Plan::adapter_activation_bytes).
Count plan_gathered_and_adapters(const Config& c, Plan& p, const UnitLayout& l, const Shapes& s,
                                 const StageView& v) {
  const Count emb_full = l.emb_full, block_full = l.block_full, grad_full = l.block_grad_full,
              a = s.act_bytes, N = s.N;
  const bool sharded = p.dims.sharded(), lora = p.lora_rank > 0;
  const nn::ACMode ac = ac_mode(c.train);
  p.gathered_max_bytes =
      !sharded ? 0
      : lora   ? ((emb_full + 2 * block_full) * a).v
               : ((2 * emb_full + 2 * block_full + grad_full) * a + grad_full * p.reduce_bytes).v;
  for (int64_t b = 0; lora && b < v.block_count(); ++b)  // the adapters' x A^T, blocks that keep it
    if (nn::block_checkpointing(ac, c.train.ac_every, b) != nn::ACMode::full)
      p.adapter_activation_bytes += (Count(p.lora_adapters) * N * p.lora_rank * a).v;
  return sharded ? ((lora ? 1 : 2) * emb_full + block_full) * a : Count(0);
}

// The activations of one micro-step (forward kept for backward), and the moments at which
// memory peaks: this rank's persistent buffers plus what each moment holds. Under pipeline
// parallelism the moments of each chunk's backward are walked along the schedule
// (walk_memory): the micro-batches held at once add their kept activations.
void plan_memory(const Config& c, Plan& p, const UnitLayout& l, const Shapes& s, const StageView& v,
                 const char*& stage) {
  const dist::ParallelDims& D = p.dims;
  const nn::ACMode ac = ac_mode(c.train);
  stage = "the activations of one micro-step";
  const Count N = s.N, Ns = s.Ns, C = s.C, Vl = s.Vl, a = s.act_bytes;
  // a chunk's input, kept by its first block: on the first stage the embeddings x = wte(idx)
  // + wpe(pos) (llama: wte(idx)) (N C). Under TP the lookup is vocab_parallel_embedding:
  // the shard's rows (zeros for other ranks' ids), g sums; the lookup keeps only the ids.
  // On a later stage the activation received (the same shape). Sequence parallel: this
  // rank's part
  const Count input = Ns * C * a;
  // ln_f: its statistics (the kind's norm_stats per row: LayerNorm's mean and rstd, 2N;
  // RMSNorm's rstd, N) and its output (N C, lm_head's input,
  // wte's or an untied lm_head's: the same (N, Vl) product); the logits (N Vl) are kept
  // by the cross-entropy (with its lse, N; with TP gmax and sumexp, 2N, and the targets).
  // (sequence parallel: ln_f's on Ns rows, its output gathered)
  const Count head_saved = s.kind->norm_stats * Ns * kF + N * C * a;
  const Count logits = N * Vl * a;
  const Count ce_saved = (D.tp > 1 ? 3 * N : N) * kF;
  // dlogits (N Vl): with TP the vocabulary-parallel loss allocates it in backward; otherwise
  // the fused classifier (cross_entropy_fused) writes it over the logits in the forward
  const Count dlogits = D.tp > 1 ? logits : 0;
  p.logits_bytes = v.last ? logits.v : 0;
  p.loss_temp_bytes = v.last ? (dlogits + ce_saved).v : 0;  // and the kept statistics
  // the batch (inputs and targets, B T i32 each; with CP or SP this rank's copy too; a pipeline
  // holds the step's micro-batches, every stage) and positions; the tables the blocks'
  // positions keep (the kind's: llama's rotary cos and sin)
  const Count position_tables = s.kind->position_tables(s);
  const Count batches = D.pp > 1 ? Count(p.accum) : Count(1);
  p.other_bytes =
      ((batches * (2 * Count(p.micro_batch) * p.seq_len + (D.cp * D.sp > 1 ? 2 * N : 0)) + N) * 4 +
       position_tables)
          .v;
  p.block_activation_bytes =
      s.kind->memory(s, nn::block_checkpointing(ac, c.train.ac_every, 1 % v.block_count())).saved.v;

  const bool lora = p.lora_rank > 0;
  const Count g_fwd_end = plan_gathered_and_adapters(c, p, l, s, v);

  // ---- what one micro-batch holds on each chunk, and its backward's moments
  auto f32_copies = [&](Count m, Count k, Count n) { return f32_gemm_copies(p, m, k, n); };
  if (p.bf16_gemms_in_f32)
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
    if (v.split_backward) m.deferred = deferred_blocks(c, s, v.chunks[k].first, v.chunks[k].second).v;
    auto moment = [&](const std::string& name, Count acts, Count gathered, Count transient) {
      m.backward.push_back({name, acts.v, gathered.v, transient.v, 0});
    };
    if (head) {
      // the loss's backward: every activation, the logits and their gradient
      moment("loss backward (logits and dlogits)", m.kept, g_fwd_end, dlogits);
      // lm_head's backward: dx (N C) and dwte (Vl C); with TP the logits are released and
      // dlogits takes their place, without it dlogits is the logits' memory
      // (LoRA: the head is frozen, no dwte)
      moment("lm_head backward", m.kept, g_fwd_end,
             (N * C + (lora ? Count(0) : Vl * C)) * a + f32_copies(N, Vl, C));
    }
    // the blocks' backward, the worst block (earlier blocks' activations still kept)
    moment("block backward", blocks.worst, blocks.worst_gathered, f32_copies(N, C, s.H));
    chunks.push_back(m);
  }
  p.activation_bytes = activations.v;
  Count deferred = 0;
  for (const auto& [begin, end] : v.chunks) deferred += deferred_blocks(c, s, begin, end);
  p.deferred_bytes = v.split_backward ? deferred.v : 0;

  stage = "the peak memory";
  plan_peak(p, l, s, v, chunks);
}

// A line of the plan's communication, if it sends anything.
void add_comm(Plan& p, const std::string& dim, const std::string& what, const std::string& formula,
              Count bytes) {
  if (bytes > 0) p.comm.push_back({dim, what, formula, bytes.v});
}

// The elements of unit u's expert slices (dist::Strategy::expert_grads), and of its others.
Count expert_numel(const nn::FlatUnit& u) {
  Count n = 0;
  for (const nn::FlatParam& q : u.params)
    if (q.spec.tp.experts) n += nn::shard_part(u, q).size();
  return n;
}
Count dense_numel(const nn::FlatUnit& u) {
  Count n = 0;
  for (const nn::FlatParam& q : u.params)
    if (!q.spec.tp.experts) n += nn::shard_part(u, q).size();
  return n;
}

// Expert parallelism inside FSDP: every block's experts in units of their own, gathered and
// reduced with their block over the m ranks that hold them (n / ep; n when ep lies over the
// replicas: dist/fsdp/fsdp.h): `gathers` (and `reduces`) whole sets of them, as often as the
// blocks' are (`but_last`: every set but the last block's, forward's order), and their shards
// averaged over their replicas (HSDP: r, or r / ep when ep lies over the replicas)
void plan_expert_units(Plan& p, const Shapes& s, Count gathers, Count but_last, Count reduces) {
  const dist::ParallelDims& D = p.dims;
  if (!D.experts_apart()) return;
  const Count a = s.act_bytes, rd = p.wire_reduce_bytes, m = D.expert_shards(), re = D.expert_replicas();
  Count all = 0, last = 0, shards = 0;
  for (size_t b = 1; b < p.experts_numel.size(); ++b) {
    all += p.experts_numel[b];
    if (p.experts_numel[b] > 0) last = p.experts_numel[b];
    shards += all_reduce_bytes(Count(p.experts_shard_numel[b]) * kF, re);
  }
  add_comm(p, "ep_shard", "all-gather of the blocks' experts over the m ranks holding them",
           "(gathers sum - but-last) (m-1)/m P_experts a",
           (m - 1) * ((gathers * all - but_last * last) * a / m));
  if (p.lora_rank > 0) return;  // a frozen base: gathered, never reduced
  add_comm(p, "ep_shard", "reduce-scatter of the blocks' experts' gradients over the m ranks holding them",
           "reduces (m-1)/m sum P_experts r'", reduces * (m - 1) * (all * rd / m));
  add_comm(p, "ep_replicate", "HSDP all-reduce of the experts' gradient shards over their replicas",
           "2 (r_e-1)/r_e sum P_experts/m", shards);
}

// FSDP's collectives under pipeline parallelism, counted along the schedule (fsdp_walk): a
// block is gathered again whenever an action needs it and it was released.
void plan_pipelined_fsdp_comm(Plan& p, const UnitLayout& l, const Shapes& s, const StageView& v) {
  const dist::ParallelDims& D = p.dims;
  const std::vector<nn::FlatUnit>& units = l.units;
  const Count emb_full = l.emb_full, a = s.act_bytes, rd = p.wire_reduce_bytes;
  const Count n = D.fsdp(), r = D.dp_replicate;
  const size_t nb = p.unit_numel.size();
  const FsdpWalk w = fsdp_walk(v, a.v != kF);
  Count block = 0;  // the largest block without its experts
  for (size_t b = 1; b < nb; ++b) block = std::max(block, Count(p.unit_numel[b]));
  add_comm(p, "fsdp", "all-gather of the embeddings (once per step)", "(n-1)/n P_emb a",
           (n - 1) * (emb_full * a / n));
  add_comm(p, "fsdp",
           "all-gather of a block whenever an action needs it released (" + std::to_string(w.block_gathers) +
               " in the schedule: in each F, and in each B unless still whole)",
           std::to_string(w.block_gathers) + " (n-1)/n P_block a",
           w.block_gathers * (n - 1) * (block * a / n));
  const Count blocks = Count(std::max<int64_t>(int64_t(nb) - 1, 1));  // the walk's counts: every block's
  plan_expert_units(p, s, Count(w.block_gathers) / blocks, 0, Count(w.block_reduces) / blocks);
  if (p.lora_rank > 0) return;  // a frozen base: gathered, never reduced (dist/adapters.h)
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
    for (size_t i = 1; i < nb; ++i) b += all_reduce_bytes(Count(p.unit_shard_numel[i]) * kF, r);
    add_comm(p, "replicate", "HSDP all-reduce of every gradient shard", "2 (r-1)/r sum P/n", b);
  }
}

// FSDP's all-gathers and reduce-scatters over its n ranks, and the all-reduces over the r
// replicas (HSDP's of the gradient shards, DP's of the whole gradients); under pipeline
// parallelism plan_pipelined_fsdp_comm's. The blocks' experts under expert parallelism inside
// FSDP: plan_expert_units.
void plan_data_parallel_comm(Plan& p, const UnitLayout& l, const Shapes& s, const StageView& v) {
  const dist::ParallelDims& D = p.dims;
  const std::vector<nn::FlatUnit>& units = l.units;
  const Count emb_full = l.emb_full, a = s.act_bytes, rd = p.wire_reduce_bytes;
  const Count A = p.accum, n = D.fsdp(), r = D.dp_replicate;
  const size_t nb = p.unit_numel.size();  // the embeddings and the blocks: units [0, nb)
  if (D.sharded() && D.pp > 1) return plan_pipelined_fsdp_comm(p, l, s, v);
  if (D.sharded()) {
    Count blocks_full = 0, blocks_but_last = 0;  // elements
    for (size_t i = 1; i < nb; ++i) {
      blocks_full += p.unit_numel[i];
      if (i + 1 < nb) blocks_but_last += p.unit_numel[i];
    }
    add_comm(p, "fsdp", "all-gather of the embeddings (once per step)", "(n-1)/n P_emb a",
             (n - 1) * (emb_full * a / n));
    add_comm(p, "fsdp", "all-gather of every block (forward, each micro-step)", "accum (n-1)/n sum P_block a",
             A * (n - 1) * (blocks_full * a / n));
    add_comm(p, "fsdp", "all-gather of every block but the last (backward)",
             "accum (n-1)/n sum P_block[<L] a", A * (n - 1) * (blocks_but_last * a / n));
    plan_expert_units(p, s, 2 * A, A, A);
    if (p.lora_rank > 0) return;  // a frozen base: gathered, never reduced (dist/adapters.h)
    add_comm(p, "fsdp", "reduce-scatter of every block's gradient", "accum (n-1)/n sum P_block r'",
             A * (n - 1) * (blocks_full * rd / n));
    add_comm(p, "fsdp", "reduce-scatter of the embeddings' gradient (last micro-step)", "(n-1)/n P_emb r'",
             (n - 1) * (emb_full * rd / n));
  }
  if (r > 1 && p.lora_rank == 0) {
    Count b = 0, experts = 0;
    for (size_t i = 0; i < nb; ++i) {
      const Count e = expert_numel(units[i]);
      if (e.v == 0 || D.ep == 1 || D.sharded() || i == 0) {
        b += all_reduce_bytes(Count(units[i].shard_numel) * kF, r);
        continue;
      }
      // expert parallelism over replicas (dist::DataParallel): the other parameters packed and
      // averaged over the replicas, the experts over ep_data, the r / ep replicas that hold them
      b += all_reduce_bytes(dense_numel(units[i]) * kF, r);
      experts += all_reduce_bytes(e * kF, r / D.ep);
    }
    if (D.ep > 1 && !D.sharded())
      add_comm(p, "replicate",
               "EP: all-reduce of the experts' gradients over the replicas that hold them "
               "(last micro-step)",
               "2 (r/ep-1)/(r/ep) P_experts/ep 4", experts);
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

// Of this rank's shards, the elements of the parameters `which` picks.
template <typename Which>
Count shard_numel_of(const UnitLayout& l, Which which) {
  Count n = 0;
  for (const nn::FlatUnit& u : l.units)
    for (const nn::FlatParam& q : u.params)
      if (which(q)) n += nn::shard_part(u, q).size();
  return n;
}

// MoE blocks without a shared expert, whose MLP tensor parallelism leaves whole (the router and the
// routed experts on every rank: nn::MoeBlock::tensor_parallel_plan): all of the rank's, and those
// full checkpointing recomputes. L_mlp = L - blocks: the blocks whose MLP is split.
struct RoutedOnly {
  int64_t blocks = 0, full = 0;
};

// Tensor parallelism's f and g over its t ranks (again in the blocks full checkpointing
// recomputes) and sequence parallel's sum of the unsplit gradients (the vocabulary-parallel
// loss's statistics: plan_communication). f runs once per column-parallel linear: c_attn
// and the MLP's m = 1 (gpt2's c_fc) or 2 (llama's gate and up, each its own
// linear_shared_input: each sums its input gradient, and under sequence parallelism each
// gathers its input, in forward and again in backward), and lm_head's input. L: the
// rank's blocks; the embedding's g (e = 1) on the first stage, lm_head's f and the loss
// (h = 1) on the last (both without a pipeline).
void plan_tensor_parallel_comm(Plan& p, const UnitLayout& l, const Shapes& s, const StageView& v,
                               int64_t full_blocks, const RoutedOnly& routed) {
  const Count N = s.N, C = s.C, a = s.act_bytes, A = p.accum, t = p.dims.tp;
  const int64_t L = v.block_count(), m = s.kind->mlp_inputs, e = v.first ? 1 : 0, h = v.last ? 1 : 0;
  const bool whole = v.first && v.last;  // the formulas as the single process's plan words them
  const int64_t Lm = L - routed.blocks, Lm_full = full_blocks - routed.full;
  const Count columns = Count(L) + Count(Lm) * m;  // the blocks' column-parallel linears
  // the formulas in the plan's words: gpt2's m = 1 gives 2L, 6L + 2, 2 (2L+1)
  const std::string f_ops = m == 1 ? "2L" : std::to_string(1 + m) + "L";
  if (t > 1 && p.sequence_parallel) {
    // f and g as all-gathers of the parts (a: raw values) and reduce-scatters into them
    // (a': what the reduction moves), each (t-1)/t of the whole N C
    const Count gather = (t - 1) * (N / t) * C * a, scatter = (t - 1) * (N / t) * C * p.wire_act_reduce_bytes;
    // forward: before each column-parallel linear and lm_head; backward: the gradient after
    // each attention, MLP and the embedding (g's), and each column-parallel linear's input
    // again for its weight gradient
    const Count gathers = (columns + h) + (L + Lm + e) + columns;
    add_comm(p, "tp",
             m == 1
                 ? "sequence parallel: all-gather before each attention, MLP and lm_head (forward), of the "
                   "gradient after each attention, MLP and the embedding, and of the attention's and the "
                   "MLP's input again for their weight gradients (backward)"
                 : "sequence parallel: all-gather before each attention, gate, up and lm_head (forward), of "
                   "the gradient after each attention, MLP and the embedding, and of the attention's, gate's "
                   "and up's input again for their weight gradients (backward)",
             Lm < L ? "accum " + std::to_string(gathers.v) + " (t-1)/t N C a (a MoE block's routed MLP: none)"
                    : "accum " + per_block(2 * (1 + m) + 2, e + h) + " (t-1)/t N C a",
             A * gathers * gather);
    // forward: after each attention, MLP and the embedding; backward: each column-parallel
    // linear's input gradient and lm_head's
    const Count scatters = (L + Lm + e) + (columns + h);
    add_comm(
        p, "tp",
        m == 1
            ? "sequence parallel: reduce-scatter after each attention, MLP and the embedding (forward) and "
              "of the input gradient of each attention, MLP and lm_head (backward)"
            : "sequence parallel: reduce-scatter after each attention, MLP and the embedding (forward) and "
              "of the input gradient of each attention, gate, up and lm_head (backward)",
        Lm < L ? "accum " + std::to_string(scatters.v) + " (t-1)/t N C a' (a MoE block's routed MLP: none)"
        : m == 1 && whole ? "accum 2 (2L+1) (t-1)/t N C a'"
                          : "accum " + per_block(3 + m, e + h) + " (t-1)/t N C a'",
        A * scatters * scatter);
    if (full_blocks)
      add_comm(
          p, "tp", "the gathers and reduce-scatters again in the blocks full checkpointing recomputes",
          m == 1 ? "accum 2 L_full (t-1)/t N C (a + a')"
                 : "accum L_full (t-1)/t N C (" + std::to_string(1 + m) + " a + 2 a')",
          A * ((Count(full_blocks) + Count(Lm_full) * m) * gather + Count(full_blocks + Lm_full) * scatter));
    // the unsplit parameters' partial gradients (this rank's shards of them), summed once
    const Count unsplit = shard_numel_of(l, [](const nn::FlatParam& q) { return !q.spec.tp.split(); });
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
             Lm < L ? "accum (L+L_mlp" + std::string(e ? "+1" : "") + ") 2 (t-1)/t N C a'"
                    : "accum " + per_block(2, e) + " 2 (t-1)/t N C a'",
             A * (L + Lm + e) * all_reduce_bytes(x, t));
    if (full_blocks)
      add_comm(p, "tp", "g again in the blocks full checkpointing recomputes",
               Lm < L ? "accum (L_full+L_mlp_full) 2 (t-1)/t N C a'" : "accum 2 L_full 2 (t-1)/t N C a'",
               A * (full_blocks + Lm_full) * all_reduce_bytes(x, t));
    const std::string f_what = m == 1 ? "f: all-reduce of the input gradient of each attention, MLP"
                                      : "f: all-reduce of the input gradient of each attention, gate, up";
    add_comm(p, "tp", f_what + (h ? " and lm_head (backward)" : " (backward)"),
             Lm < L ? "accum (L+" + std::to_string(m) + " L_mlp" + (h ? "+1" : "") + ") 2 (t-1)/t N C a'"
                    : "accum (" + f_ops + (h ? "+1" : "") + ") 2 (t-1)/t N C a'",
             A * (columns + h) * all_reduce_bytes(x, t));
    // q_norm's and k_norm's partial gradients (model.qk_norm: each rank's heads), summed once
    const Count partial = shard_numel_of(l, [](const nn::FlatParam& q) { return q.spec.tp.partial_grad; });
    p.sp_grad_numel = partial.v;
    if (partial.v > 0)
      add_comm(p, "tp", "all-reduce of q_norm's and k_norm's gradients, each rank's heads' (last micro-step)",
               "2 (t-1)/t P_partial 4", all_reduce_bytes(partial * kF, t));
  }
}

// Ulysses' all-to-alls over its sp ranks (dist/ulysses/ulysses.cpp), each block and
// micro-step: q, k and v to (B, NHl/sp, T/cp, hd) before the core, the output back after it
// (forward), the same four the other way in backward, and the forward's again in the cores
// that checkpointing recomputes. An all-to-all of a tensor of X bytes sends sp - 1 of its sp
// pieces (Communicator::sendrecv's counter: X/sp each): q and the output N Cl a, k and v
// N KVr a, KVr the kv channels as sent: KVl, or sp hd when a tp rank's kv heads are fewer
// than sp and each is replicated to sp / (n_kv_head / tp) ranks.
void plan_ulysses_comm(Plan& p, const Shapes& s, int64_t L, int64_t recomputed_cores) {
  const Count sp = s.sp, a = s.act_bytes, N = s.N, A = p.accum;
  if (s.sp == 1) return;
  const bool replicated = s.KVl < s.sp * s.hd;
  const Count KVr = replicated ? Count(s.sp) * s.hd : Count(s.KVl);
  auto sent = [&](Count x) { return (sp - 1) * (x / sp); };
  const Count layer = 2 * sent(N * s.Cl * a) + 2 * sent(N * KVr * a);  // q, output; k, v
  const std::string kv = replicated ? "2 N sp hd" : "2 N KVl";
  add_comm(p, "sp",
           std::string("all-to-alls of q, k, v and the output around every attention, forward and backward") +
               (replicated ? " (each kv head replicated to sp / (n_kv_head/tp) ranks)" : ""),
           "accum L 2 (sp-1)/sp (2 N Cl + " + kv + ") a", A * L * 2 * layer);
  if (recomputed_cores)
    add_comm(p, "sp", "the forward's all-to-alls again in the attention that checkpointing recomputes",
             "accum L_ac (sp-1)/sp (2 N Cl + " + kv + ") a", A * recomputed_cores * layer);
}

// Mixture of experts. Expert parallelism over its ep ranks (dist/expert_parallel/), per MoE
// block and micro-step: the all-gather of every member's rows per expert (E i32), the
// all-to-all-v of the routed rows to their experts' ranks (dispatch) and back (combine), the
// same two in backward, and the forward's again in the blocks full checkpointing recomputes.
// An all-to-all-v counts the bytes sent to the other members: with perfectly balanced routing
// (ep-1)/ep of the M rows each way, x plan.ep_imbalance. The router's statistics (every MoE
// layer's rows, E counts, E probability sums and z-sum, f64; under a pipeline the earlier
// stages' totals as one more layer) are all-reduced once per micro-step on the stage with the
// loss, over the cp, sp and data ranks (and tp's under sequence parallelism): dist::
// ParallelModel::reduce_router_stats.
void plan_expert_comm(const Config& c, Plan& p, const Shapes& s, const StageView& v) {
  if (p.n_experts == 0) return;
  const dist::ParallelDims& D = p.dims;
  const Count A = p.accum, E = p.n_experts, ep = D.ep, a = s.act_bytes;
  const nn::ACMode ac = ac_mode(c.train);
  int64_t moe = 0, moe_full = 0;  // this rank's MoE blocks, and those full checkpointing recomputes
  int64_t rank_block = 0;
  for (const auto& [begin, end] : v.chunks)
    for (int64_t i = begin; i < end; ++i, ++rank_block)
      if (c.model.moe_layer(i)) {
        ++moe;
        if (nn::block_checkpointing(ac, c.train.ac_every, rank_block) == nn::ACMode::full) ++moe_full;
      }
  if (D.ep > 1 && moe > 0) {
    const Shapes m = moe_block(s);
    const Count gather = (ep - 1) * E * 4;
    const Count rows =
        Count(static_cast<int64_t>(std::ceil(p.ep_imbalance * double(((ep - 1) * m.M() / ep).v))));
    const Count exchange = rows * m.C * a;
    add_comm(p, "ep",
             "all-gather of every member's rows per expert, each MoE block (and again where recomputed)",
             "accum (L_moe + L_moe_full) (ep-1) E 4", A * (moe + moe_full) * gather);
    add_comm(
        p, "ep",
        "all-to-all-v of the routed rows to their experts and back, forward and backward, each MoE block",
        "accum L_moe 4 imbalance (ep-1)/ep M C a", A * moe * 4 * exchange);
    if (moe_full)
      add_comm(p, "ep", "the forward's all-to-alls again in the MoE blocks full checkpointing recomputes",
               "accum L_moe_full 2 imbalance (ep-1)/ep M C a", A * moe_full * 2 * exchange);
  }
  if (p.router_stats && v.last) {
    const Count values = (Count(p.moe_blocks) + (D.pp > 1 ? 1 : 0)) * (2 * E + 2) * 8;
    Count b =
        all_reduce_bytes(values, D.cp) + all_reduce_bytes(values, D.sp) + all_reduce_bytes(values, D.dp());
    if (p.sequence_parallel) b += all_reduce_bytes(values, D.tp);
    add_comm(p, "scalars", "all-reduce of the router's statistics, each micro-step",
             "accum 2 (k-1)/k (L_moe + 1_pp) (2E+2) 8 per group", A * b);
  }
}

// The pipeline's messages (dist/pipeline_parallel/comm.h): per micro-batch, each chunk but
// the last stage's sends its output activation forward (F) and each but the first stage's
// the gradient of its input back (B), B x Tl (x 1/tp sequence parallel) x C in the compute
// dtype, counted as the tensor's bytes (a send). The tied embeddings' gradient (the shard
// FSDP keeps, f32) is summed between the first and the last stage once per step, an
// all-reduce over two. With the router's statistics (a load-balancing or z-loss) each message
// carries their totals beside the tensor, (2E + 4) f64 (RouterLoss::totals).
void plan_pipeline_comm(const Config& c, Plan& p, const UnitLayout& l, const StageView& v) {
  if (p.dims.pp == 1) return;
  int64_t sends = 0;
  for (size_t k = 0; k < v.chunks.size(); ++k)
    sends += (v.last_chunk(k) ? 0 : 1) + (v.first_chunk(k) ? 0 : 1);
  add_comm(
      p, "pp",
      sends == 1 ? (v.first ? "activation of each micro-batch to the next stage (F)"
                            : "gradient of each micro-batch back to the previous stage (B)")
                 : "activations to the next stage (F) and gradients back to the previous one (B), each "
                   "micro-batch",
      "accum " + std::to_string(sends) + (p.sequence_parallel ? " B Tl/t C a" : " B Tl C a") +
          (p.router_stats ? " + the router's totals (2E+4) 8" : ""),
      Count(p.accum) * sends * (Count(p.io_bytes) + (p.router_stats ? (2 * Count(p.n_experts) + 4) * 8 : 0)));
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
  const Count a = s.act_bytes;
  const int64_t L = v.block_count();
  const Count A = p.accum, n = D.fsdp(), t = D.tp, cp = D.cp;
  plan_data_parallel_comm(p, l, s, v);
  if (p.lora_rank > 0 && D.dp() * cp > 1)  // dist::AdapterParallel: DataParallel over dp x cp
    add_comm(p, "lora", "all-reduce of the adapters' gradients over the data x cp ranks (last micro-step)",
             "2 (d-1)/d P_adapters 4", all_reduce_bytes(Count(p.adapter_params) * kF, Count(D.dp()) * cp));
  // recomputed blocks run their forward communication again in backward
  int64_t full_blocks = 0, recomputed_cores = 0;
  RoutedOnly routed;
  std::vector<int64_t> blocks;  // the rank's blocks' indices in the model
  for (const auto& [begin, end] : v.chunks)
    for (int64_t i = begin; i < end; ++i) blocks.push_back(i);
  for (int64_t i = 0; i < L; ++i) {
    const nn::ACMode m = nn::block_checkpointing(ac, c.train.ac_every, i);
    const bool plain = c.model.moe_layer(blocks[size_t(i)]) && c.model.shared_expert_intermediate_size == 0;
    if (m == nn::ACMode::full) ++full_blocks, routed.full += plain;
    if (m != nn::ACMode::none) ++recomputed_cores;
    routed.blocks += plain;
  }
  plan_tensor_parallel_comm(p, l, s, v, full_blocks, routed);
  if (t > 1 && v.last)
    add_comm(p, "tp", "vocabulary-parallel cross-entropy: max, sum of exponentials, target logit",
             "accum 3 2 (t-1)/t N 4", A * 3 * all_reduce_bytes(Count(s.N) * kF, t));
  plan_ulysses_comm(p, s, L, recomputed_cores);
  if (cp > 1) {
    // K and V of this rank's two chunks: only the kv heads travel (KVl = Cl but under
    // grouped-query attention); under Ulysses (USP) the ring runs inside the all-to-alls, on
    // this rank's kv heads of the cp rank's T / cp tokens (ulysses_view)
    const Shapes r = ulysses_view(s);
    const Count block = 2 * Count(r.N) * Count(r.KVl) * a;
    const bool usp = D.sp > 1;
    add_comm(p, "cp", "ring: K/V blocks forward and their gradients back, every block",
             usp ? "accum L 2 (cp-1) 2 sp N max(KVl/sp, hd) a" : "accum L 2 (cp-1) 2 N KVl a",
             A * L * 2 * (cp - 1) * block);
    if (recomputed_cores)
      add_comm(p, "cp", "ring again in the attention that checkpointing recomputes",
               usp ? "accum L_ac (cp-1) 2 sp N max(KVl/sp, hd) a" : "accum L_ac (cp-1) 2 N KVl a",
               A * recomputed_cores * (cp - 1) * block);
  }
  plan_pipeline_comm(c, p, l, v);
  plan_expert_comm(c, p, s, v);
  // scalars (f64, Communicator::all_reduce_scalar): the loss over dp then cp then sp ranks,
  // the gradient norm's sum of squares over the FSDP group (FSDP/HSDP) and the tp group; with
  // a pipeline the loss's sum and the norm's over the stages
  Count scalars = all_reduce_bytes(8, D.dp()) + all_reduce_bytes(8, cp) + all_reduce_bytes(8, D.sp) +
                  all_reduce_bytes(8, t);
  if (D.sharded()) scalars += all_reduce_bytes(8, n);
  scalars += 2 * all_reduce_bytes(8, D.pp);
  // the sliced experts' squares, over ep where the FSDP group does not hold the ep ranks (DP, or
  // ep over the replicas with dp_shard 1: dist::parallelize's read_experts)
  if (D.ep > 1 && !(D.sharded() && D.dp_shard > 1)) scalars += all_reduce_bytes(8, D.ep);
  // MoE: the load-balancing and z-loss values for the log, from the last stage (summed over the
  // stages), then averaged as the loss (ParallelModel::train)
  const int64_t router_losses =
      c.model.moe() ? (c.model.router_aux_loss_coef > 0 ? 1 : 0) + (c.model.router_z_loss_coef > 0 ? 1 : 0)
                    : 0;
  scalars += router_losses * (all_reduce_bytes(8, D.pp) + all_reduce_bytes(8, D.dp()) +
                              all_reduce_bytes(8, cp) + all_reduce_bytes(8, D.sp));
  add_comm(p, "scalars",
           D.pp > 1 ? "loss mean and gradient norm (and their sums over the stages)"
                    : "loss mean and gradient norm",
           "2 (k-1)/k 8 per group", scalars);
  Count comm_bytes = 0;
  for (const PlanComm& x : p.comm) comm_bytes += x.bytes;
  p.comm_bytes = comm_bytes.v;
}

// The mixture of experts' sizes (model.n_experts > 0), the stage's MoE blocks among its own.
void plan_experts(const Config& c, Plan& p, const StageView& v) {
  const models::GPTConfig& mc = c.model;
  if (!mc.moe()) return;
  p.n_experts = mc.n_experts;
  p.experts_per_tok = mc.n_experts_per_tok;
  p.expert_hidden = mc.moe_intermediate_size;
  p.shared_hidden = mc.shared_expert_intermediate_size;
  for (const auto& [begin, end] : v.chunks)
    for (int64_t i = begin; i < end; ++i) {
      p.block_moe.push_back(mc.moe_layer(i));
      p.moe_blocks += mc.moe_layer(i) ? 1 : 0;
    }
  p.router_stats = mc.router_aux_loss_coef > 0 || mc.router_z_loss_coef > 0;
  p.router_z = mc.router_z_loss_coef > 0;
  p.ep_imbalance = c.plan_ep_imbalance;
}

// Fills in the sizes, memory and communication of p, whose layout (p.dims) is resolved and
// checked, for the pipeline stage v (the whole model without a pipeline); `stage` names what
// is being computed, for the message when a count overflows.
void plan_sizes(const Config& c, Plan& p, const StageView& v, const char*& stage) {
  const dist::ParallelDims& D = p.dims;
  // SP: TP's sequence parallelism; the mesh's own SP is Ulysses' (then "SP over tp" for TP's)
  p.strategy = D.strategy() + (p.sequence_parallel ? (D.sp > 1 ? " + SP over tp" : " + SP") : "");
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
  p.qkv_bias = mc.family().qkv_bias(mc);
  p.head_dim = mc.head_dim();
  p.qk_norm = mc.qk_norm;
  plan_experts(c, p, v);
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
  p.local_seq = c.train.seq_len / (D.cp * D.sp);  // Ulysses: this rank's part of the cp rank's
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
  const UnitLayout l = plan_parameters(c, p, v);
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
  if (D.sp > 1)
    p.notes.push_back(
        "Ulysses: " + std::to_string(p.local_seq) + " tokens a rank outside attention; inside it " +
        std::to_string(mc.n_head / (D.tp * D.sp)) + " heads over " + std::to_string(c.train.seq_len / D.cp) +
        " tokens" + (mc.kv_heads() / D.tp < D.sp ? ", the kv heads replicated to one a rank" : ""));
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
    p.dims = dist::ParallelDims::resolve(c.parallel, world);
    c.model.validate();
    // the trainer's rules (dist::plan_layout): tp, cp and sequence parallelism against the
    // model; stage_view: enough blocks for the stages, the split and the schedule
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
