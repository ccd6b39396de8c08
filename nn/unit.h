// ndtrain: wrappers around a model's units (its transformer blocks), installed from outside.
//
// The model stays single-device code: GPT::forward runs block i as wrap(i, fn, x), where fn
// is the block's own forward. A wrapper may do anything around fn -- recompute it in
// backward (activation checkpointing), gather the block's sharded parameters before it and
// free them after (FSDP), time it -- as long as it returns fn's result. Wrappers compose:
// the first one added is the innermost.
//
//   gpt.add_unit_wrapper(nn::activation_checkpointing());          // inner
//   gpt.add_unit_wrapper([&](int64_t i, const nn::UnitFn& fn, const Tensor& x) {
//     gather(i);                                                   // outer
//     Tensor y = fn(x);
//     release(i);
//     return y;
//   });
#pragma once

#include <cstdint>
#include <functional>

#include "tensor/tensor.h"

namespace ndt::nn {

using UnitFn = std::function<Tensor(const Tensor&)>;
using UnitWrapper = std::function<Tensor(int64_t unit, const UnitFn& fn, const Tensor& x)>;

// Recompute the unit in backward instead of keeping its activations (autograd/checkpoint.h).
// With `every` = k, only units 0, k, 2k, ... are recomputed.
UnitWrapper activation_checkpointing(int64_t every = 1);

// fn wrapped by every wrapper of `wrappers` (the first innermost), for unit `unit`.
UnitFn wrap_unit(const std::vector<UnitWrapper>& wrappers, int64_t unit, UnitFn fn);

}  // namespace ndt::nn
