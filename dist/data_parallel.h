// ndtrain: data parallel (DP). Every rank holds the whole model and reads its own batch;
// after backward the gradients are averaged over the ranks, so every replica takes the
// same optimizer step and stays identical.
//
// The average of a unit (one flat buffer: one all-reduce) starts as soon as that unit's
// gradients are complete -- its GradGroup fires during backward -- and overlaps the
// backward of the units before it. With gradient accumulation only the last micro-step
// communicates; the others accumulate locally.
//
//   dist::DataParallel dp(params, mesh.replicate());  // installs the gradient hooks
//   dp.begin_micro(/*sync=*/last);  // ... forward, backward ...
//   dp.end_micro();
//   dp.end_accumulation();          // after the last micro-step: waits for the all-reduces
//
// Communication per step: one all-reduce of every gradient buffer, 2 (n-1)/n of its bytes.
// Under expert parallelism a unit's expert slices are summed over the replicas holding the
// same experts instead (packed apart from the unit's other gradients), then divided by the replicas.
#pragma once

#include <vector>

#include "dist/comm/communicator.h"
#include "dist/strategy.h"

namespace ndt::dist {

class DataParallel : public Strategy {
 public:
  // Every unit except unit 0 (the embeddings: wte gets gradients at both ends of the model)
  // gets a GradGroup that starts its all-reduce.
  // tp: the tensor-parallel group, for the global norm (nullptr: none).
  // ep_data (expert parallelism): the replicas that hold the same experts as this rank; the
  // experts' gradients are summed over them and divided by all the replicas (nullptr: none).
  DataParallel(const nn::FlatParams& params, Communicator& replicas, Communicator* tp = nullptr,
               Communicator* ep_data = nullptr);
  std::string name() const override { return "DP"; }
  void begin_micro(bool sync) override { sync_ = sync; }
  void end_micro() override;
  void end_accumulation() override;

 private:
  // A unit with expert slices, reduced in two packed copies: its other parameters' gradients
  // (views into the unit's gradient) averaged over the replicas, and its experts' summed over
  // the replicas that hold the same experts
  struct UnitSums {
    std::vector<Tensor> dense, experts;
    Tensor packed_dense, packed_experts;
  };
  void start_expert_sum(const nn::FlatUnit& u);
  Communicator& comm_;
  Communicator* ep_data_;
  bool sync_ = true;
  std::vector<WorkPtr> pending_;
  std::vector<UnitSums> sums_;
};

}  // namespace ndt::dist
