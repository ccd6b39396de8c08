// ndtrain: what the training loop asks of a data-parallel strategy.
//
// The trainer does not know which strategy runs; it calls these at fixed points of a step:
//
//   s.begin_step();                          // a new optimizer step
//   for (micro = 0; micro < accum; ++micro) {
//     s.begin_micro(micro == accum - 1);     // true: this backward synchronizes gradients
//     backward(model.forward(...).loss);     // units gather/reduce through the wrappers
//     s.end_micro();                         // this micro-step's reductions are done
//   }
//   double norm = s.grad_norm();             // global, every element counted once
//   opt.step(lr, clip_scale(norm, max));     // on this rank's shards
//   s.end_step();                            // gathered copies are stale now: dropped
//
// and around forwards without gradients (evaluation, sampling):
//
//   s.begin_forward_only(); ... model.forward(...) ...; s.end_forward_only();
//
// Implementations: NoParallelism (one process, or TP/CP only: nothing to reduce here),
// DataParallel (dist/data_parallel.h), FullyShardedDataParallel (dist/fsdp/fsdp.h, also
// HSDP).
#pragma once

#include <memory>
#include <string>

#include "dist/comm/communicator.h"
#include "nn/flat.h"

namespace ndt::dist {

class Strategy {
 public:
  virtual ~Strategy() = default;
  // Tensor parallelism: gradients of split parameters live on different tp ranks; the
  // global norm sums over them (replicated parameters counted once).
  void set_tensor_parallel(Communicator* tp) { tp_ = tp; }
  virtual std::string name() const = 0;
  virtual void begin_step() {}
  virtual void begin_micro(bool sync) {}
  virtual void end_micro() {}
  virtual double grad_norm() = 0;
  virtual void end_step() {}
  virtual void begin_forward_only() {}
  virtual void end_forward_only() {}

 protected:
  // sqrt of the sum of squares over this rank's gradient shards, summed over `shards` (the
  // ranks that hold different parts of each buffer; nullptr: none) and the tp group.
  double global_norm(const nn::FlatParams& params, Communicator* shards);
  Communicator* tp_ = nullptr;
};

// Gradients stay where backward put them: one process.
class NoParallelism : public Strategy {
 public:
  explicit NoParallelism(const nn::FlatParams& params) : params_(params) {}
  std::string name() const override { return "single process"; }
  void end_micro() override;  // mixed precision: the micro-step's gradients into the master's
  double grad_norm() override;

 private:
  const nn::FlatParams& params_;
};

}  // namespace ndt::dist
