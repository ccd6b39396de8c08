// ndtrain: what the training loop asks of a data-parallel strategy.
//
// The trainer does not know which strategy runs; it calls these at fixed points of a step:
//
//   for (micro = 0; micro < accum; ++micro) {
//     s.begin_micro(micro == accum - 1);     // true: this backward synchronizes gradients
//     backward(model.forward(...).loss);     // units gather/reduce through the wrappers
//     s.end_micro();                         // this micro-step's reductions are done
//   }
//   s.end_accumulation();                    // the step's last reductions (the embeddings')
//   double norm = s.grad_norm();             // global, every element counted once
//   opt.step(lr, clip_scale(norm, max));     // on this rank's shards
//   s.end_step();                            // gathered copies are stale now: dropped
//
// and around forwards without gradients (evaluation, sampling):
//
//   s.begin_forward_only(); ... model.forward(...) ...; s.end_forward_only();
//
// Implementations: NoParallelism (one process, or TP only: nothing to reduce here; CP
// ranks reduce like data-parallel ones, so CP alone runs FSDP over the cp group),
// DataParallel (dist/data_parallel.h), FullyShardedDataParallel (dist/fsdp/fsdp.h, also
// HSDP). dist/parallelize.h picks one for a mesh.
//
// The loop above is what dist::Pipeline (dist/pipeline_parallel/) runs for one stage, the
// schedule F0 B0 F1 B1 ... Under pipeline parallelism the forwards and backwards of
// different micro-batches interleave: begin_micro comes before each of them (but a backward
// right after its own forward, which continues its micro-step), end_micro after each
// backward, and sync is true for the backward of a model chunk's last micro-batch: the last
// that reaches the chunk's units, whose reductions then are the step's.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "dist/comm/communicator.h"
#include "dist/sequence_split.h"
#include "nn/flat.h"

namespace ndt::dist {

class Strategy {
 public:
  virtual ~Strategy() = default;
  virtual std::string name() const = 0;
  // sync: the units this backward reaches get no more gradient in this step (their last
  // micro-batch)
  virtual void begin_micro(bool sync) {}
  virtual void end_micro() {}
  // After the step's last end_micro: what is reduced once per step whatever the units
  // (the embeddings' gradients, sequence parallelism's partial sums), all of it complete on
  // return.
  virtual void end_accumulation() {}
  // sqrt of the sum of squares of every gradient element, counted once: over this rank's
  // gradient shards, summed over the shard group and the tp group (replicated parameters
  // of the tp ranks counted once), and over the pipeline's stages. The same number on every rank.
  double grad_norm() const;
  // Pipeline parallelism: the stages, over which the norm sums too, and the weight of unit 0
  // in this stage's sum (1/2 where the first and the last stage both hold the tied
  // embeddings, so that they count once).
  void read_pipeline(Communicator* pp, double unit0_weight) { pp_ = pp, unit0_weight_ = unit0_weight; }
  // Expert parallelism: the ep group, over whose members the experts' gradients differ (each
  // holds its own experts), so that the norm counts every expert once (nullptr: none).
  void read_experts(Communicator* ep) { ep_ = ep; }
  virtual void end_step() {}
  virtual void begin_forward_only() {}
  virtual void end_forward_only() {}
  // Sequence parallelism (dist/tensor_parallel/tensor_parallel.h): the gradients of the
  // parameters tensor parallelism does not split are partial on each tp rank, which saw only
  // its part of every sequence; end_micro of the last micro-step then sums them over the tp
  // group, after the data-parallel reductions (a sum commutes with their mean); so, with or
  // without it, are those marked TpSlice::partial_grad (used by each rank's heads only). split:
  // ParallelModel's setting (dist/sequence_split.h), which must outlive the strategy.
  void read_sequence_split(const SequenceSplit* split) { split_ = split; }

 protected:
  // params: this rank's buffers. shard_group: the ranks that hold different parts of each buffer
  // (FSDP's group; nullptr: none). tp: the tensor-parallel group, whose ranks hold different
  // slices of the split parameters (nullptr: none).
  Strategy(const nn::FlatParams& params, Communicator* shard_group, Communicator* tp)
      : params_(params), norm_group_(shard_group), tp_(tp) {}
  const nn::FlatParams& params_;
  // Unit u's expert slices (TpSlice::experts): their part of this rank's gradient shard
  static std::vector<Tensor> expert_grads(const nn::FlatUnit& u);
  // Called by end_accumulation: the sum above, one all-reduce of every such parameter's part
  // of this rank's shards, packed (a no-op without it).
  void sum_partial_grads_over_tp() const;

 private:
  Communicator* const norm_group_;  // the shard group, over which the norm sums
  Communicator* const tp_;
  const SequenceSplit* split_ = nullptr;  // nullptr: no sequence parallelism
  Communicator* pp_ = nullptr;            // nullptr: no pipeline
  Communicator* ep_ = nullptr;            // nullptr: no expert parallelism
  double unit0_weight_ = 1.0;
};

// Gradients stay where backward put them: one process (or TP alone).
class NoParallelism : public Strategy {
 public:
  explicit NoParallelism(const nn::FlatParams& params, Communicator* tp = nullptr)
      : Strategy(params, nullptr, tp) {}
  std::string name() const override { return "single process"; }
  void end_micro() override;  // mixed precision: the micro-step's gradients into the master's
  void end_accumulation() override { sum_partial_grads_over_tp(); }
};

}  // namespace ndt::dist
