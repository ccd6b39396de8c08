// ndtrain: one rank's optimizer step replayed in time, in the order the trainer runs it
// (the engine of predict_time, train/planner/time.h).
//
//   StepReplay replay(plan, cluster, shapes_of(plan, config.train.device));
//   replay.run();
//   replay.timeline().now();      // the step's seconds
//   replay.timeline().exposed();  // of them, the waits on communication, by dimension
//
// For each micro-step of gradient accumulation (under pipeline parallelism each micro-batch
// through the stage's chunks: what the stage computes, timed by chunk for the schedule's
// simulation): the embeddings (on the first stage); each block's forward, with
// FSDP's all-gather of the next block prefetched under it, TP's f and g around the
// attention and the MLP, ring attention's steps under CP (inside Ulysses' all-to-alls
// under SP); the loss; each block's backward
// in reverse, after activation checkpointing's recompute, with the column-parallel
// linears' input-gradient sums under their weight gradients and FSDP's reduce-scatter
// drained one block later; the embeddings' backward (first stage). Then the step's end: sequence
// parallel's sum of the unsplit gradients, the loss's and the norm's scalars, AdamW.
//
// Each piece of compute costs its matrix products' FLOPs at the cluster's reached rate
// (for the training dtype) plus its element-wise passes (elements read and written, a
// bytes each) at its memory bandwidth; the optimizer's passes are over f32 (the master).
// Collectives run on the timeline (train/planner/timeline.h). Legend:
// train/planner/shapes.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <utility>
#include <vector>

#include "nn/block_wrapper.h"
#include "train/planner/block_kinds.h"
#include "train/planner/cluster.h"
#include "train/planner/plan.h"
#include "train/planner/shapes.h"
#include "train/planner/timeline.h"

namespace ndt::train {

// The step's pieces: a block's, and those around the blocks.
struct StepWork {
  BlockWork block;                // a dense block's
  BlockWork moe_block;            // a MoE block's (a model with experts: model.n_experts > 0)
  Work embeddings, embeddings_b;  // the lookup (BlockKind::embeddings); its backward's scatter
  Work head, head_b;              // ln_f, lm_head and the loss; lm_head's backward
  Work optimizer, fold;           // over f32 values: AdamW; bf16 gradients folded into f32 ones
};

StepWork step_work(const Plan& plan, const Shapes& shapes);

// A pipeline stage's compute per micro-batch, by chunk (seconds, on its timeline: its
// stage's collectives included), and what its step does after the last backward.
struct StageCosts {
  std::vector<double> f, b;  // per chunk: its F, its whole B (averaged over the micro-batches)
  std::vector<double> w;     // per chunk: of b, the blocks' weight GEMMs (zb-h1's W)
  double tail = 0;           // the step's end: the last reductions, the scalars, AdamW
};

class StepReplay {
 public:
  // plan and cluster are kept by reference: they outlive the replay
  StepReplay(const Plan& plan, const Cluster& cluster, const Shapes& shapes);
  // The whole step, once: each micro-step's forward and backward through every chunk of the
  // plan's stage (the whole model without a pipeline), then the step's end. The per-chunk
  // times are the pipeline's costs (predict_time simulates the schedule with them).
  void run();
  const StageCosts& costs() const { return costs_; }

  const Timeline& timeline() const { return timeline_; }
  const Links& links() const { return links_; }

 private:
  // the step (Trainer's), in order
  void micro_step(bool first, bool last);
  void forward(size_t chunk, bool first_micro_step);
  void loss_forward();
  void loss_backward();
  void backward(size_t chunk, bool last_micro_step);
  void embeddings_backward();
  void micro_step_end(bool last_micro_step);
  void step_end();
  // the block of unit `unit` (nn::Block, and what checkpointing does to it), timed as its kind:
  // dense or MoE (Plan::block_moe)
  bool moe(int64_t unit) const;
  const BlockWork& work_of(int64_t unit) const;
  void block_forward(int64_t unit, bool again);
  void block_backward(int64_t unit, nn::ACMode mode);
  void attention_core_forward(bool again);
  void attention_core_backward();
  // tensor parallelism (dist/tensor_parallel): f and g, and their collective
  void f_forward();
  void g_forward();
  void f_backward();
  void g_backward();
  void tp_collective(bool reduce);
  // expert parallelism: one all-to-all of a MoE block's routed rows (dispatch or combine),
  // waited for
  void experts_exchange();
  void column_parallel_backward(const Work& input_grad, const Work& weight_grad);
  // FSDP (dist/fsdp) and DP (dist/data_parallel.h): unit 0 the embeddings, unit u block u - 1
  void prefetch(int64_t unit);
  int64_t expert_shards() const;  // the ranks a unit of experts is sharded over
  void wait_gathered(int64_t unit);
  void reduce_gradient(int64_t unit);
  void drain(size_t keep, bool last_micro_step);
  void wait_for_replicas();
  // the cost of a piece of work: over activations, over values of `bytes_each`, one ring step's share
  Piece piece(const Work& work) const;
  Piece piece_of(const Work& work, double bytes_each) const;
  Piece ring_step(const Work& work) const;
  double grouped_rate() const;  // FLOP/s of a MoE MLP's grouped GEMMs

  const Plan& plan_;
  const Cluster& cluster_;
  const Shapes shapes_;
  const StepWork work_;
  const Links links_;
  const nn::ACMode checkpointing_;
  const bool sharded_;
  const int64_t units_;
  std::vector<std::pair<int64_t, int64_t>> chunk_units_;  // each chunk's units [begin, end)
  StageCosts costs_;
  // bytes: TP's all-reduces (an activation or its gradient, in the dtype the reduction
  // moves); an all-gather of an activation (the raw values); the ring's K and V of this
  // rank's two chunks
  const double tp_reduce_bytes_, tp_gather_bytes_, kv_bytes_;
  // seconds: Ulysses' all-to-alls of q, k and v, and of the output (0 without it)
  const double a2a_in_s_, a2a_out_s_;
  Timeline timeline_;
  std::vector<Ticket> gathered_;  // FSDP's all-gathers, by unit
  // (unit, its reduce-scatter) not drained yet; -unit: the unit of its experts
  std::deque<std::pair<int64_t, Ticket>> reducing_;
  std::vector<Ticket> replica_done_;  // the all-reduces over dp_replicate
};

}  // namespace ndt::train
