// One rank's step replayed in time (train/planner/replay.h). Legend: train/planner/shapes.h;
// A accumulation steps, U flat units (the embeddings, then the blocks); kF the 4 bytes of a
// float32 (train/planner/count.h). A block's work is its kind's (train/planner/block_kinds.h).
#include "train/planner/replay.h"

#include <algorithm>

namespace ndt::train {
namespace {

// The plan's checkpointing mode (Plan::ac, a train.activation_checkpointing word).
nn::ACMode checkpointing_of(const Plan& plan) {
  TrainSection train;
  train.activation_checkpointing = plan.ac;
  return ac_mode(train);
}

// Ulysses' all-to-alls around the core, one after the other (dist/ulysses: each waited for):
// q, k and v (the kv heads as sent: replicated to sp hd channels when fewer), or the output;
// their gradients the same the other way
double ulysses_s(const Shapes& s, const Plan& plan, const Links& links, bool output) {
  if (s.sp == 1) return 0.0;
  const double N = double(s.N), a = double(plan.act_bytes);
  const double kv = double(std::max(s.KVl, s.sp * s.hd));
  if (output) return all_to_all_s(N * double(s.Cl) * a, s.sp, links.sp);
  return all_to_all_s(N * double(s.Cl) * a, s.sp, links.sp) + 2 * all_to_all_s(N * kv * a, s.sp, links.sp);
}

// Whether tensor parallelism splits a block's MLP: not a MoE block's without a shared expert
// (the router and the routed experts whole on every rank, no f or g around them).
bool mlp_split(const Shapes& s, bool moe) { return !(moe && s.Hs == 0); }

}  // namespace

StepWork step_work(const Plan& plan, const Shapes& shapes) {
  StepWork work;
  work.block = shapes.kind->work(shapes);
  if (plan.moe_blocks > 0) work.moe_block = shapes.kind->work(moe_block(shapes));
  const double N = double(shapes.N), C = double(shapes.C), Vl = double(shapes.Vl), a = double(plan.act_bytes);
  // the embeddings: their kind's (gpt2 adds the positions' wpe(pos))
  const EmbeddingsWork embeddings = shapes.kind->embeddings(shapes);
  work.embeddings = embeddings.forward;
  work.embeddings_b = embeddings.backward;
  // ln_f, lm_head 2 N C Vl, the fused cross-entropy's passes over the logits (max,
  // exponentials, the gradient written)
  work.head = {2 * N * C * Vl, 2 * N * C + 3 * N * Vl};
  // lm_head's backward, and its weight gradient added into the tied embeddings' (an untied
  // llama's lm_head's) (3 Vl C)
  work.head_b = {4 * N * C * Vl, 3 * Vl * C + N * C};
  // AdamW on this rank's shard (read p g m v, write p m v), the norm and the clip's scale;
  // under bf16 also the copies made again from the master (read f32, write bf16) and, per
  // micro-step without FSDP, the bf16 gradients folded into the f32 ones (nn::fold_grad:
  // read both, write the f32 and zero the bf16)
  const bool mixed = plan.act_bytes != int64_t(kF);
  double owned = 0, whole = 0;
  for (int64_t n : plan.unit_shard_numel) owned += double(n);
  for (int64_t n : plan.unit_numel) whole += double(n);
  work.optimizer = {0, 12 * owned + (mixed ? owned * (kF + a) / kF : 0.0)};
  work.fold = {0, mixed && !plan.dims.sharded() ? whole * (2 * a + 2 * kF) / kF : 0.0};
  return work;
}

// ---- the replay -----------------------------------------------------------------------------

StepReplay::StepReplay(const Plan& plan, const Cluster& cluster, const Shapes& shapes)
    : plan_(plan),
      cluster_(cluster),
      shapes_(shapes),
      work_(step_work(plan, shapes)),
      links_(links_of(plan.dims, cluster)),
      checkpointing_(checkpointing_of(plan)),
      sharded_(plan.dims.sharded()),
      units_(static_cast<int64_t>(plan.unit_numel.size())),
      tp_reduce_bytes_(double(shapes.N) * double(shapes.C) * double(plan.wire_act_reduce_bytes)),
      tp_gather_bytes_(double(shapes.N) * double(shapes.C) * double(plan.act_bytes)),
      kv_bytes_(2 * double(ulysses_view(shapes).N) * double(ulysses_view(shapes).KVl) *
                double(plan.act_bytes)),
      // Ulysses: q, k and v (kv replicated to one head a rank when fewer), the output
      a2a_in_s_(ulysses_s(shapes, plan, links_, false)),
      a2a_out_s_(ulysses_s(shapes, plan, links_, true)),
      timeline_(links_),
      gathered_(static_cast<size_t>(units_)) {
  int64_t unit = 1;
  for (const auto& [begin, end] : plan.chunks) {
    chunk_units_.emplace_back(unit, unit + end - begin);
    unit += end - begin;
  }
  NDT_CHECK(unit == units_, "internal: a plan's chunks hold ", unit - 1, " blocks of its ", units_ - 1);
}

void StepReplay::run() {
  const size_t chunks = chunk_units_.size();
  costs_.f.assign(chunks, 0.0);
  costs_.b.assign(chunks, 0.0);
  costs_.w.assign(chunks, 0.0);
  for (int64_t micro = 0; micro < plan_.accum; ++micro) micro_step(micro == 0, micro + 1 == plan_.accum);
  // the weight gradients' GEMMs (dW = x^T dy: the forward's FLOPs of every linear), each block's kind's
  for (size_t c = 0; c < chunks; ++c) {
    costs_.f[c] /= double(plan_.accum);
    costs_.b[c] /= double(plan_.accum);
    double dw = 0;
    for (int64_t unit = chunk_units_[c].first; unit < chunk_units_[c].second; ++unit) {
      const BlockWork& block = work_of(unit);
      dw += (block.attn_in.flops + block.attn_out.flops + block.mlp.flops) / cluster_.flops +
            block.mlp.grouped_flops / grouped_rate();
    }
    costs_.w[c] = std::min(costs_.b[c], dw);
  }
  const double before = timeline_.now();
  step_end();
  costs_.tail = timeline_.now() - before;
}

// One micro-batch's forward and backward through the stage's chunks; the last one's
// gradients are reduced for the step.
void StepReplay::micro_step(bool first, bool last) {
  for (size_t c = 0; c < chunk_units_.size(); ++c) {
    const double t0 = timeline_.now();
    forward(c, first && c == 0);
    costs_.f[c] += timeline_.now() - t0;
  }
  for (size_t c = chunk_units_.size(); c-- > 0;) {
    const double t0 = timeline_.now();
    backward(c, last);
    if (c == 0) micro_step_end(last);
    costs_.b[c] += timeline_.now() - t0;
  }
}

void StepReplay::forward(size_t chunk, bool first_micro_step) {
  const auto [begin, end] = chunk_units_[chunk];
  if (sharded_) {
    if (first_micro_step) {  // the embeddings, gathered once for the whole step
      prefetch(0);
      wait_gathered(0);
    }
    if (begin < end) prefetch(begin);
  }
  if (plan_.first_stage && chunk == 0) {
    timeline_.run(piece(work_.embeddings), false);
    g_forward();  // the vocabulary-parallel embedding's sum
  }
  for (int64_t unit = begin; unit < end; ++unit) {
    if (sharded_) {
      wait_gathered(unit);
      if (unit + 1 < end) prefetch(unit + 1);
    }
    block_forward(unit, false);
  }
  if (plan_.last_stage && chunk + 1 == chunk_units_.size()) loss_forward();
}

// ln_f, lm_head and the vocabulary-parallel cross-entropy (its max, sum and target logit
// all-reduced over tp) ...
void StepReplay::loss_forward() {
  f_forward();  // before lm_head
  timeline_.run(piece(work_.head), false);
  if (plan_.dims.tp > 1)
    for (int i = 0; i < 3; ++i)
      timeline_.sync("tp", all_reduce_s(double(shapes_.N) * kF, plan_.dims.tp, links_.tp));
}

// ... and back to lm_head's input gradient
void StepReplay::loss_backward() {
  timeline_.run(piece(work_.head_b), false);
  f_backward();  // lm_head's input gradient
}

// The blocks' backward, last block first: FSDP drains the reduce-scatter of the block
// before, waits for this block's all-gather and prefetches the next one's
void StepReplay::backward(size_t chunk, bool last_micro_step) {
  const auto [begin, end] = chunk_units_[chunk];
  if (plan_.last_stage && chunk + 1 == chunk_units_.size()) loss_backward();
  for (int64_t unit = end - 1; unit >= begin; --unit) {
    if (sharded_) {
      drain(1, last_micro_step);
      if (unit + 1 < units_) {  // the rank's last block stayed whole; a chunk's last is gathered again
        if (unit + 1 == end) prefetch(unit);
        wait_gathered(unit);
      }
      if (unit > begin) prefetch(unit - 1);
    }
    block_backward(unit, nn::block_checkpointing(checkpointing_, plan_.ac_every, unit - 1));
    if (sharded_ || last_micro_step) reduce_gradient(unit);
  }
  if (plan_.first_stage && chunk == 0) embeddings_backward();
}

// The embeddings' backward
void StepReplay::embeddings_backward() {
  g_backward();  // the embedding's output gradient
  timeline_.run(piece(work_.embeddings_b), false);
}

// The micro-step's end: bf16 gradients folded into f32, and every gradient's collective done
void StepReplay::micro_step_end(bool last_micro_step) {
  timeline_.run(piece_of(work_.fold, kF), false);
  if (last_micro_step) reduce_gradient(0);
  if (sharded_) drain(0, last_micro_step);
  wait_for_replicas();
}

// Sequence parallel's sum over tp of the unsplit parameters' partial gradients; the loss
// over dp and cp, the gradient norm over the shards and tp; AdamW
void StepReplay::step_end() {
  const dist::ParallelDims& dims = plan_.dims;
  if (plan_.sp_grad_numel > 0 && dims.tp > 1)  // (without it: q_norm's and k_norm's)
    timeline_.sync("tp", all_reduce_s(double(plan_.sp_grad_numel) * kF, dims.tp, links_.tp));
  timeline_.sync("scalars", all_reduce_s(8, dims.dp(), links_.dp) + all_reduce_s(8, dims.cp, links_.cp) +
                                all_reduce_s(8, dims.sp, links_.sp));
  timeline_.sync("scalars", (sharded_ ? all_reduce_s(8, dims.fsdp(), links_.fsdp) : 0) +
                                all_reduce_s(8, dims.tp, links_.tp));
  timeline_.run(piece_of(work_.optimizer, kF), false);
}

// ---- a block ------------------------------------------------------------------------------

// Unit u holds the stage's block u - 1 (in its chunks' order)
bool StepReplay::moe(int64_t unit) const {
  const auto b = static_cast<size_t>(unit - 1);
  return b < plan_.block_moe.size() && plan_.block_moe[b];
}
const BlockWork& StepReplay::work_of(int64_t unit) const { return moe(unit) ? work_.moe_block : work_.block; }

void StepReplay::block_forward(int64_t unit, bool again) {
  const BlockWork& block = work_of(unit);
  const bool moe_mlp = moe(unit);
  f_forward();  // before c_attn
  timeline_.run(piece(block.attn_in), again);
  attention_core_forward(again);
  timeline_.run(piece(block.attn_out), again);
  g_forward();  // after the attention
  const bool split = mlp_split(shapes_, moe_mlp);
  for (int64_t i = 0; split && i < shapes_.kind->mlp_inputs; ++i) f_forward();  // before c_fc (gate, up)
  if (moe_mlp) experts_exchange();  // EP: the routed rows to their experts (the MLP's piece computes them)
  timeline_.run(piece(block.mlp), again);
  if (moe_mlp) experts_exchange();  // ... and back
  if (split) g_forward();           // after the MLP
}

// Full checkpointing runs the block's forward again first, selective the attention core
void StepReplay::block_backward(int64_t unit, nn::ACMode mode) {
  const BlockWork& block = work_of(unit);
  const bool moe_mlp = moe(unit);
  if (mode == nn::ACMode::full) block_forward(unit, true);
  const bool split = mlp_split(shapes_, moe_mlp);
  if (split) g_backward();          // the MLP's output gradient
  if (moe_mlp) experts_exchange();  // EP: the combine's gradient to the experts' ranks
  for (const auto& [input_grad, weight_grad] : block.mlp_in) {  // and the MLP's input gradients summed
    if (split) {
      column_parallel_backward(input_grad, weight_grad);
      continue;
    }
    timeline_.run(piece(input_grad), false);
    timeline_.run(piece(weight_grad), false);
  }
  if (moe_mlp) experts_exchange();  // ... the dispatch's back
  timeline_.run(piece(block.ln_2_b), false);
  g_backward();  // the attention's output gradient
  timeline_.run(piece(block.attn_out_b), false);
  if (mode == nn::ACMode::selective) attention_core_forward(true);
  attention_core_backward();
  column_parallel_backward(block.attn_in_b, block.attn_in_dw);  // and the attention's input gradient summed
  timeline_.run(piece(block.ln_1_b), false);
}

// Ring attention (dist/context_parallel): cp steps, each computing on one rank's K/V while
// the next travels; under Ulysses inside its all-to-alls (q, k, v in, the output back)
void StepReplay::attention_core_forward(bool again) {
  const int64_t cp = plan_.dims.cp;
  timeline_.sync("sp", a2a_in_s_);
  if (cp == 1) {
    timeline_.run(piece(work_.block.core), again);
    return timeline_.sync("sp", a2a_out_s_);
  }
  for (int64_t step = 0; step < cp; ++step) {
    const Ticket next_kv = step + 1 < cp ? timeline_.start("cp", exchange_s(kv_bytes_, links_.cp)) : Ticket{};
    timeline_.run(ring_step(work_.block.core), again);
    if (step + 1 < cp) timeline_.wait("cp", next_kv);
  }
  timeline_.sync("sp", a2a_out_s_);
}

// Its backward: each pass's K/V gradient goes back to the rank it came from (the other way
// round the ring), waited for at once by the pass's backward node; the K/V were kept (off
// the CPU's fused kernel each pair's attention runs again first: autograd::recompute)
void StepReplay::attention_core_backward() {
  const int64_t cp = plan_.dims.cp;
  const BlockWork& block = work_.block;
  timeline_.sync("sp", a2a_out_s_);  // Ulysses: the output's gradient in, dq, dk, dv back after
  if (cp == 1) {
    timeline_.run(piece(block.core_b), false);
    return timeline_.sync("sp", a2a_in_s_);
  }
  for (int64_t step = 0; step < cp; ++step) {
    if (!fused(shapes_.inner))
      timeline_.run(ring_step(Work{0, 0, block.core.core_flops, 2 * block.scores}),
                    true);  // not the ring's copies
    timeline_.run(ring_step(block.core_b), false);
    if (step + 1 < cp) timeline_.sync("cp", exchange_s(kv_bytes_, links_.cp));
  }
  timeline_.sync("sp", a2a_in_s_);
}

// ---- tensor parallelism -------------------------------------------------------------------

// TP's f and g: plain TP, g's all-reduce in forward and f's in backward; sequence parallel,
// f all-gathers in forward and reduce-scatters in backward, g the other way round (the same
// bytes, at twice the places). Each is waited for where it runs, but f's backward in a
// block's column-parallel linears (column_parallel_backward)
void StepReplay::f_forward() {
  if (plan_.sequence_parallel) tp_collective(false);
}
void StepReplay::g_forward() { tp_collective(true); }
void StepReplay::f_backward() { tp_collective(true); }  // lm_head's: the tied wte's gradient waits for it
void StepReplay::g_backward() {
  if (plan_.sequence_parallel) tp_collective(false);
}

// the rows as plan.cpp counts them: imbalance x M rows of C, (ep-1)/ep of them leaving
void StepReplay::experts_exchange() {
  if (plan_.dims.ep == 1) return;
  const Shapes m = moe_block(shapes_);
  const double bytes = m.imbalance * double(m.M()) * double(m.C) * double(plan_.act_bytes);
  timeline_.sync("ep", all_to_all_s(bytes, plan_.dims.ep, links_.ep));
}

// reduce: an all-reduce (a reduce-scatter under sequence parallel); else an all-gather
void StepReplay::tp_collective(bool reduce) {
  const int64_t tp = plan_.dims.tp;
  if (tp == 1) return;
  if (!plan_.sequence_parallel) return timeline_.sync("tp", all_reduce_s(tp_reduce_bytes_, tp, links_.tp));
  timeline_.sync("tp", gather_s(reduce ? tp_reduce_bytes_ : tp_gather_bytes_, tp, links_.tp));
}

// A column-parallel linear's backward (ops::linear_shared_input): with sequence parallel
// its input is gathered again (for dW) while its input gradient is made; that gradient's
// sum over tp (f's backward) runs while the weight gradient is made, waited for after it
void StepReplay::column_parallel_backward(const Work& input_grad, const Work& weight_grad) {
  const int64_t tp = plan_.dims.tp;
  const bool sp = plan_.sequence_parallel;
  if (tp == 1) {
    timeline_.run(piece(input_grad), false);
    return timeline_.run(piece(weight_grad), false);
  }
  Ticket gathered_input;
  if (sp) gathered_input = timeline_.start("tp", gather_s(tp_gather_bytes_, tp, links_.tp));
  timeline_.run(piece(input_grad), false);
  const Ticket summed = timeline_.start(
      "tp", sp ? gather_s(tp_reduce_bytes_, tp, links_.tp) : all_reduce_s(tp_reduce_bytes_, tp, links_.tp));
  if (sp) timeline_.wait("tp", gathered_input);
  timeline_.run(piece(weight_grad), false);
  timeline_.wait("tp", summed);
}

// ---- FSDP and DP ----------------------------------------------------------------------------

// FSDP's all-gather of unit u's whole buffer (dist/fsdp/fsdp.cpp), in the compute dtype; under
// expert parallelism with its experts' unit, over the fsdp / ep ranks that hold them (the
// FSDP group's links), queued behind it
void StepReplay::prefetch(int64_t unit) {
  const auto u = static_cast<size_t>(unit);
  if (plan_.unit_numel[u] == 0) return;  // a middle stage's embeddings
  const double a = double(plan_.act_bytes), bytes = double(plan_.unit_numel[u]) * a;
  gathered_[u] = timeline_.start("fsdp", gather_s(bytes, plan_.dims.fsdp(), links_.fsdp));
  if (plan_.experts_numel[u] > 0)
    gathered_[u] =
        timeline_.start("fsdp", gather_s(double(plan_.experts_numel[u]) * a, expert_shards(), links_.fsdp));
}

int64_t StepReplay::expert_shards() const { return plan_.dims.expert_shards(); }

void StepReplay::wait_gathered(int64_t unit) { timeline_.wait("fsdp", gathered_[static_cast<size_t>(unit)]); }

// A unit's gradient is ready: FSDP's reduce-scatter (in the dtype the reduction moves), or
// DP's all-reduce (f32) at once
void StepReplay::reduce_gradient(int64_t unit) {
  const double numel = double(plan_.unit_numel[static_cast<size_t>(unit)]);
  if (numel == 0) return;  // a middle stage's embeddings
  if (sharded_) {
    const double bytes = numel * double(plan_.wire_reduce_bytes);
    reducing_.emplace_back(unit, timeline_.start("fsdp", gather_s(bytes, plan_.dims.fsdp(), links_.fsdp)));
    const double experts = double(plan_.experts_numel[static_cast<size_t>(unit)]);
    if (experts > 0)  // its experts' gradient group fires with it (the same backward)
      reducing_.emplace_back(
          -unit, timeline_.start("fsdp", gather_s(experts * double(plan_.wire_reduce_bytes), expert_shards(),
                                                  links_.fsdp)));
  } else if (plan_.dims.dp_replicate > 1) {
    replica_done_.push_back(
        timeline_.start("replicate", all_reduce_s(numel * kF, plan_.dims.dp_replicate, links_.replicate)));
  }
}

// FullyShardedDataParallel::drain: wait for all but `keep` reduce-scatters; on the last
// micro-step HSDP then all-reduces each f32 gradient shard over the replicas
void StepReplay::drain(size_t keep, bool last_micro_step) {
  const int64_t replicas = plan_.dims.dp_replicate;
  while (reducing_.size() > keep) {
    const auto [unit, done] = reducing_.front();
    reducing_.pop_front();
    timeline_.wait("fsdp", done);
    // (-u: unit u's experts, averaged over the replicas that hold them)
    const auto u = static_cast<size_t>(std::abs(unit));
    const int64_t r = unit >= 0 ? replicas : plan_.dims.expert_replicas();
    if (last_micro_step && r > 1) {
      const double shard_bytes =
          double(unit >= 0 ? plan_.unit_shard_numel[u] : plan_.experts_shard_numel[u]) * kF;
      replica_done_.push_back(timeline_.start("replicate", all_reduce_s(shard_bytes, r, links_.replicate)));
    }
  }
}

void StepReplay::wait_for_replicas() {
  for (const Ticket& done : replica_done_) timeline_.wait("replicate", done);
  replica_done_.clear();
}

// ---- the cost of a piece of work ------------------------------------------------------------

Piece StepReplay::piece(const Work& work) const { return piece_of(work, double(plan_.act_bytes)); }

// An element-wise pass over bf16 values runs at its own rate: a CPU computes each in f32
// (a conversion in, one out) and moves half the bytes in about the time of an f32 pass. The
// attention core's products and its passes over the scores run at the cluster's rates for
// the CPU's fused kernel where it has them; otherwise at `flops`, and a pass as one over an
// activation's values
Piece StepReplay::piece_of(const Work& work, double bytes_each) const {
  const double bf16_bps = cluster_.bf16_memory_bps > 0 ? cluster_.bf16_memory_bps : cluster_.memory_bps;
  const double pass_s = cluster_.score_pass_s > 0
                            ? cluster_.score_pass_s
                            : bytes_each / (bytes_each < kF ? bf16_bps : cluster_.memory_bps);
  Piece cost;
  cost.gemm_s = work.flops / cluster_.flops +
                work.core_flops / (cluster_.attention_flops > 0 ? cluster_.attention_flops : cluster_.flops) +
                work.grouped_flops / grouped_rate();
  cost.s = cost.gemm_s + work.floats * bytes_each / (bytes_each < kF ? bf16_bps : cluster_.memory_bps) +
           work.score_passes * pass_s;
  return cost;
}

// A MoE MLP's grouped GEMMs: at the rate the cluster measured them reach, else at `flops`
double StepReplay::grouped_rate() const {
  return cluster_.expert_flops > 0 ? cluster_.expert_flops : cluster_.flops;
}

// One of ring attention's cp steps: 1/cp of the core's work
Piece StepReplay::ring_step(const Work& work) const {
  const double share = 1.0 / double(plan_.dims.cp);
  return piece(
      Work{work.flops * share, work.floats * share, work.core_flops * share, work.score_passes * share});
}

}  // namespace ndt::train
