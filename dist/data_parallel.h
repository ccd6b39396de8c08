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
  DataParallel(const nn::FlatParams& params, Communicator& replicas, Communicator* tp = nullptr);
  std::string name() const override { return "DP"; }
  void begin_micro(bool sync) override { sync_ = sync; }
  void end_micro() override;
  void end_accumulation() override;

 private:
  Communicator& comm_;
  bool sync_ = true;
  std::vector<WorkPtr> pending_;
};

}  // namespace ndt::dist
