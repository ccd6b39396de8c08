// ndtrain: recompute in backward (the mechanism of activation checkpointing; "checkpoint"
// elsewhere in ndtrain means the files of train/checkpoint/).
//
//   auto outs = autograd::recompute([&](const std::vector<Tensor>& in) {
//     return std::vector<Tensor>{block.forward(in[0])};
//   }, {x});
//
// The forward runs fn without recording a graph, so its intermediate activations are freed
// at once; only the inputs are kept. In backward, fn runs again with grad enabled and the
// gradients flow through the recomputed graph, into the inputs and into any parameter fn
// uses. fn must be deterministic (same inputs -> same outputs).
#pragma once

#include <functional>
#include <vector>

#include "tensor/tensor.h"

namespace ndt::autograd {

using RecomputeFn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;
std::vector<Tensor> recompute(const RecomputeFn& fn, const std::vector<Tensor>& inputs);

}  // namespace ndt::autograd
