// ndtrain: running the backward pass.
//
//   Tensor loss = ...;           // a scalar built from ops on tensors requiring grad
//   ndt::backward(loss);         // every leaf's .grad += d loss / d leaf
//
// Nodes run in reverse creation order (a valid reverse topological order), gradients
// flowing into one tensor from several uses are summed first, and each node's saved
// tensors are released as soon as it has run (unless retain_graph).
#pragma once

#include <functional>
#include <vector>

#include "tensor/tensor.h"

namespace ndt {

// loss: a one-element tensor; its gradient is 1.
void backward(const Tensor& loss, bool retain_graph = false);
// outputs[i] receives gradient grads[i] (same shape).
void backward(const std::vector<Tensor>& outputs, const std::vector<Tensor>& grads,
              bool retain_graph = false);

namespace autograd {
// Runs fn as one backward pass for the gradient groups (autograd/hooks.h): the groups its
// gradients reach are flushed when the outermost pass ends, or reset if fn throws. backward()
// is one; deferred weight gradients (autograd/defer.h) run as another.
void as_backward_pass(const std::function<void()>& fn);
}  // namespace autograd

}  // namespace ndt
