// ndtrain: the autograd graph.
//
// Every differentiable op computes its result and then calls record() with a closure that
// maps output gradients to input gradients -- forward and backward side by side:
//
//   Tensor scale2(const Tensor& x) {
//     Tensor out = ...;                                        // forward: out = 2x
//     autograd::record("scale2", {out}, {x}, [](const Grads& g) -> Grads {
//       return {times2(g[0])};                                 // so dx = 2*dout
//     });
//     return out;
//   }
//
// Closures save what the backward needs as detached tensors (Tensor::detach) so the graph
// never holds a cycle; they are released after backward runs (saved tensors freed).
// Gradient contract: an op's closure returns (writes) activation gradients; only leaves
// accumulate (+=) into their .grad, which may be a view into a flat gradient buffer (an op
// may add a leaf's gradient there itself: see grad_to_accumulate_into below).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace ndt::autograd {

using Grads = std::vector<Tensor>;  // one per output (in) or per input (out); may be undefined
using BackwardFn = std::function<Grads(const Grads& grad_outputs)>;

struct Edge {
  std::shared_ptr<Node> node;  // null when that input needs no gradient
  int input_nr = 0;            // which grad_outputs slot of `node` this feeds
};

class Node {
 public:
  Node(std::string name, int num_outputs, std::vector<Edge> next, BackwardFn fn);
  virtual ~Node() = default;

  // Runs the backward closure. Missing gradients of outputs are passed as undefined tensors.
  virtual Grads apply(const Grads& grad_outputs);
  void release() { fn_ = nullptr; }  // free saved tensors

  const std::string& name() const { return name_; }
  uint64_t seq() const { return seq_; }
  int num_outputs() const { return num_outputs_; }
  const std::vector<Edge>& next() const { return next_; }
  // Shapes, dtypes and devices of the outputs, so a missing gradient can be made zeros.
  struct OutputMeta {
    Shape shape;
    DType dtype;
    Device device;
  };
  std::vector<OutputMeta> output_meta;

 private:
  std::string name_;
  uint64_t seq_;  // creation order; backward runs nodes in decreasing seq
  int num_outputs_;
  std::vector<Edge> next_;
  BackwardFn fn_;
};

// The sink for a leaf that requires grad: adds the incoming gradient into leaf.grad
// (allocating it as zeros first if undefined), then tells the leaf's GradGroup, if any.
class AccumulateGrad : public Node {
 public:
  explicit AccumulateGrad(std::shared_ptr<TensorImpl> leaf);
  Grads apply(const Grads& grad_outputs) override;
  const std::shared_ptr<TensorImpl>& leaf() const { return leaf_; }

 private:
  std::shared_ptr<TensorImpl> leaf_;
};

// An op that adds an input's gradient into the leaf's .grad itself (a linear's weight: the
// GEMM adds x^T @ dy onto w.grad with beta 1: no fresh dW, no zeroing pass, no separate
// add). At record time, accumulation_leaf(w) is w's impl when w is a leaf that requires grad
// (its gradient goes to its AccumulateGrad), else null. In backward,
// grad_to_accumulate_into(leaf, ...) is that leaf's .grad when it can take the gradient in
// place (contiguous, of the gradient's shape, dtype and device; allocated uninitialized
// when it had none, and then *beta = 0, else 1), or an undefined tensor: return the
// gradient as usual. The op returns that .grad itself as the input's gradient: the engine
// and AccumulateGrad read it as "already added" and only tell the leaf's GradGroup.
std::shared_ptr<TensorImpl> accumulation_leaf(const Tensor& t);
Tensor grad_to_accumulate_into(const std::shared_ptr<TensorImpl>& leaf, const Shape& shape, DType dtype,
                               Device device, double* beta);
// True when g is what grad_to_accumulate_into gave for the leaf behind `node` (an
// AccumulateGrad): a gradient already in that leaf's .grad.
bool already_accumulated(const Node* node, const Tensor& g);

// Grad mode: on by default, per thread.
bool grad_enabled();
class NoGradGuard {
 public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool prev_;
};
class EnableGradGuard {
 public:
  EnableGradGuard();
  ~EnableGradGuard();
  EnableGradGuard(const EnableGradGuard&) = delete;
  EnableGradGuard& operator=(const EnableGradGuard&) = delete;

 private:
  bool prev_;
};

// True when grad mode is on and some input requires grad.
bool needs_grad(const std::vector<Tensor>& inputs);

// Attaches a backward node to `outputs` if needs_grad(inputs); marks them requires_grad.
// fn receives one gradient per output (undefined where none flowed) and returns one per
// input (undefined where the input needs none).
void record(const char* name, const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
            BackwardFn fn);

// record() without the needs_grad test: always attaches (checkpoint uses it, since the
// parameters inside its function may need gradients when no input does).
void attach(const char* name, const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
            BackwardFn fn);

// The edge an input's gradient takes: its grad_fn, its AccumulateGrad, or none.
Edge edge_of(const Tensor& t);

}  // namespace ndt::autograd
