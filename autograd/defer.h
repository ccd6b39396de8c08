// ndtrain: deferred weight gradients, for zero-bubble pipeline schedules.
//
// A zero-bubble schedule (Qi et al. 2023; dist/pipeline_parallel/schedule.h) splits each
// backward in two: B, the gradients of the inputs (what the previous pipeline stage waits
// for), and W, the gradients of the weights (which nobody waits for), run later to fill the
// pipeline's idle time. While a DeferredWeightGrads::Scope lives on this thread, a linear
// layer's backward (autograd/ops/matmul.cpp) computes the input's gradient and the bias's as
// usual, and queues the weight's GEMM, dW = x^T @ dy, with the x and dy it needs; run()
// later computes the queued GEMMs in the order backward queued them and delivers each
// gradient exactly as the unsplit backward would have (added into the weight's .grad, its
// GradGroup told), so the gradients are bit-identical to one unsplit backward.
//
//   autograd::DeferredWeightGrads w;
//   {
//     autograd::DeferredWeightGrads::Scope defer(w);
//     ndt::backward({y}, {dy});   // B: x.grad is ready; the linears' weights have no gradient yet
//   }
//   send(x.grad());               // the previous stage goes on
//   w.run();                      // W: the weights' gradients, as backward would have made them
//
// A gradient group (autograd/hooks.h) with a deferred gradient fires only after run()
// delivered it, so FSDP's reduce-scatter and DP's all-reduce see the whole gradient.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "tensor/tensor.h"

namespace ndt::autograd {

class DeferredWeightGrads {
 public:
  DeferredWeightGrads() = default;
  DeferredWeightGrads(DeferredWeightGrads&&) = default;
  DeferredWeightGrads& operator=(DeferredWeightGrads&&) = default;
  ~DeferredWeightGrads();  // queued gradients never run are forgotten (their groups reset)

  // Queues a leaf's gradient: `compute` returns it (or adds it into the leaf's .grad in place
  // and returns that .grad, as a GEMM with beta 1 does).
  void push(std::shared_ptr<TensorImpl> leaf, std::function<Tensor()> compute);
  // Computes and delivers every queued gradient, in order, as one backward pass (the gradient
  // groups it completes fire; it ends like a backward does).
  void run();
  bool empty() const { return queue_.empty(); }
  size_t size() const { return queue_.size(); }

  // While alive, linear layers' weight gradients on this thread go to `q` (scopes nest: the
  // innermost wins).
  class Scope {
   public:
    explicit Scope(DeferredWeightGrads& q);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    DeferredWeightGrads* prev_;
  };

 private:
  struct Item {
    std::shared_ptr<TensorImpl> leaf;
    std::function<Tensor()> compute;
  };
  std::vector<Item> queue_;
};

// The queue of the innermost live Scope on this thread, or nullptr.
DeferredWeightGrads* deferring();

}  // namespace ndt::autograd
