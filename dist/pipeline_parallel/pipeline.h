// ndtrain: pipeline parallelism (PP). The blocks are cut into stages (stages.h) on the
// pipeline's ranks, the step's micro-batches flow through them, and each rank runs its
// part of a schedule (schedule.h: GPipe, 1F1B, interleaved, zero-bubble): a table of
// forwards (F), backwards (B) and, for zero-bubble, deferred weight gradients (W), one list
// per rank, that this class executes in order. Between stages only activations and their
// gradients travel (comm.h), point to point.
//
//   F(j, c)  chunk c of this rank on micro-batch j: from the tokens (the first stage) or the
//            activation received from the previous stage; the output goes to the next
//            stage, or (the last stage) is the micro-batch's loss
//   B(j, c)  its backward: from the loss (last stage) or the gradient received from the
//            next stage, d loss / d output; the gradient of its input goes back. Under a
//            zero-bubble schedule only that: the linears' weight gradients wait for ...
//   W(j, c)  ... this pass, which computes them (autograd/defer.h) where the stage would
//            otherwise idle
//
// One stage is a pipeline too: its schedule F0 B0 F1 B1 ... is plain gradient accumulation,
// so every layout's step runs here (dist::ParallelModel::train).
//
// The model stays single-device code: each rank's models::GPT holds only its blocks
// (models::PipelinePart) and GPT::forward_chunk runs one chunk. Data parallelism, FSDP, TP
// and CP work inside each stage as they do without a pipeline: the strategy (strategy.h)
// is told before each forward and backward, and syncs a chunk's units in the backward of
// its last micro-batch.
//
//   dist::Pipeline pipe(gpt, mesh.pp(), *strategy, pp::make_schedule(pp::Kind::kOneFOneB, p, m),
//                       io_shape, DType::f32, trace);
//   double loss_sum = pipe.train(batches, 1.0 / m);   // every rank, every stage
//   strategy->end_accumulation(); ...                 // then the usual end of the step
//
// Loss and gradients are those of the same micro-batches on one process: the schedules
// change only the order of independent computations. A mixture-of-experts model's
// load-balancing loss couples every stage's layers (nn/moe.h): its router statistics go
// forward beside each activation, and the whole model's come back beside each gradient.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "autograd/defer.h"
#include "dist/comm/communicator.h"
#include "dist/pipeline_parallel/comm.h"
#include "dist/pipeline_parallel/schedule.h"
#include "dist/strategy.h"
#include "dist/trace.h"
#include "models/gpt.h"

namespace ndt::dist {

class Pipeline {
 public:
  // One micro-batch: this rank's tokens (B, T) i32 (CP: its chunks), on the device; docs
  // (B, T) i32: packed rows' documents (CP: the whole rows'), given to every stage's
  // forward_chunk (or undefined).
  // weight: its loss's share against the step's other micro-batches (packed documents train
  // unequal numbers of tokens: ParallelModel weighs them); 1 where all train as many.
  struct Batch {
    Tensor idx, targets, docs;
    double weight = 1.0;
  };
  // The activation between stages for a micro-batch's idx: (B, T, C), or with sequence
  // parallelism (B, T/tp, C).
  using IoShape = std::function<Shape(const Tensor& idx)>;

  // pp: the pipeline's communicator (member s % p holds virtual stage s). io_dtype: the
  // dtype the blocks compute in (the activations' and their gradients').
  Pipeline(const models::GPT& gpt, Communicator& pp, Strategy& strategy, pp::Schedule schedule,
           IoShape io_shape, DType io_dtype, Trace* trace = nullptr);

  // One step's forwards and backwards, in the schedule's order; each micro-batch's loss
  // weighs loss_scale in the gradients. Returns the sum of the micro-batches' losses, the
  // same on every rank of the pipeline. on_micro(j) is told which micro-batch runs next.
  double train(const std::vector<Batch>& micro, double loss_scale,
               const std::function<void(int64_t)>& on_micro = {});
  // Forwards only, without gradients (evaluation): the sum of the losses, on every rank.
  double evaluate(const std::vector<Batch>& micro);
  // Sampling: the (B, Vp) logits of the token after each row of idx (B, T) at positions
  // pos_offset.., the same on every rank of the pipeline (sent from the last stage).
  Tensor next_token_logits(const Tensor& idx, int64_t pos_offset);

  const pp::Schedule& schedule() const { return schedule_; }
  // Tests: post receives grouped with the previous send, as over NCCL (comm.h), on any transport.
  void set_grouped_exchange(bool on) { comm_.set_grouped(on); }

 private:
  // What a rank keeps between a forward and its backward.
  struct Slot {
    Tensor in;   // the received activation, a leaf whose gradient goes back (undefined on stage 0)
    Tensor out;  // the chunk's output, or the loss on the last stage
    std::shared_ptr<nn::RouterLoss> router;  // MoE: the micro-batch's router statistics (or none)
  };
  int rank_of_stage(int s) const { return s % schedule_.p; }
  int last_stage() const { return schedule_.p * schedule_.v - 1; }
  // The input an action receives: from whom (-1: none), and what, for the record.
  int source_of(const pp::Action& a, std::string& what) const;
  void run(const std::vector<pp::Action>& actions, const std::vector<Batch>& micro, bool training,
           double loss_scale, const std::function<void(int64_t)>& on_micro);
  // A message between stages for a micro-batch's idx: the activation (or its gradient), and
  // the router statistics when they travel (routes_)
  StageComm::Layout message(const Tensor& idx) const;
  StageComm::Message with_router(const Tensor& t, const Slot& slot) const;
  // One action on `in` (what it received); returns what it sends and to whom (-1: nothing).
  StageComm::Message act(const pp::Action& a, const Batch& b, const StageComm::Message& in, bool training,
                         double loss_scale, int& to, std::string& what);
  double sum_losses();

  const models::GPT& gpt_;
  StageComm comm_;
  Strategy& strategy_;
  pp::Schedule schedule_;
  IoShape io_shape_;
  DType io_dtype_;
  Trace* trace_;
  int rank_;
  bool routes_ = false;                       // this run's messages carry the router statistics
  std::map<std::pair<int, int>, Slot> live_;  // (micro, chunk) between F and B
  // zero-bubble: (micro, chunk) between B and W, the weight gradients B deferred
  std::map<std::pair<int, int>, autograd::DeferredWeightGrads> deferred_;
  std::vector<std::pair<Tensor, double>> losses_;  // the last stage's, this step, with their weights
};

}  // namespace ndt::dist
