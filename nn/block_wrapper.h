// ndtrain: wrappers around a model's transformer blocks, installed from outside.
//
// The model stays single-device code: GPT::forward runs block i as wrap(i, fn, x), where fn
// is the block's own forward. A wrapper may do anything around fn -- recompute it in
// backward (activation checkpointing), gather the block's sharded parameters before it and
// free them after (FSDP), time it -- as long as it returns fn's result. Wrappers compose:
// the first one added is the innermost.
//
//   gpt.add_block_wrapper(nn::activation_checkpointing());          // inner
//   gpt.add_block_wrapper([&](int64_t i, const nn::BlockFn& fn, const Tensor& x) {
//     gather(i);                                                   // outer
//     Tensor y = fn(x);
//     release(i);
//     return y;
//   });
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "tensor/tensor.h"

namespace ndt::nn {

using BlockFn = std::function<Tensor(const Tensor&)>;
using BlockWrapper = std::function<Tensor(int64_t block, const BlockFn& fn, const Tensor& x)>;

// What activation checkpointing recomputes in backward (train.activation_checkpointing):
//   none       nothing: every op keeps what its backward needs.
//   full       the whole block (autograd/recompute.h): only its input is kept.
//   selective  only the parts of the block that its layers route through recompute_selected()
//              (in GPT's blocks: the attention core, Megatron-LM's "selective activation
//              recomputation", Korthikanti et al. 2022); every other op keeps its tensors,
//              so no linear layer runs twice.
enum class ACMode { none, full, selective };

// What checkpointing does to block `block` when train.activation_checkpointing is `mode` on
// every `every`-th block: `mode` on blocks 0, every, 2*every, ..., none on the others. The
// wrappers below and the planner (train/planner/) ask here, so they agree on which blocks.
ACMode block_checkpointing(ACMode mode, int64_t every, int64_t block);

// The setting in words, for the run's start: "full (the whole block recomputed in backward)
// in every block" (none: "").
std::string describe_checkpointing(ACMode mode, int64_t every);

// Recompute the block in backward instead of keeping its activations (autograd/recompute.h).
// With `every` = k, only blocks 0, k, 2k, ... are recomputed.
BlockWrapper activation_checkpointing(int64_t every = 1);
// The wrapper for `mode` on blocks 0, every, 2*every, ... (none: a pass-through).
BlockWrapper activation_checkpointing(ACMode mode, int64_t every);

// Inside a block that selective checkpointing wraps (on this thread), autograd::recompute
// of fn at x: only x is kept and fn runs again in backward. Anywhere else, fn(x). A layer
// passes through here the part of its forward that is cheap to recompute but holds much
// memory; fn is called again in backward, after this call returned, so it must own (or
// point to long-lived) state and be deterministic.
Tensor recompute_selected(const std::function<Tensor(const Tensor&)>& fn, const Tensor& x);

// fn wrapped by every wrapper of `wrappers` (the first innermost), for block `block`.
BlockFn wrap_block(const std::vector<BlockWrapper>& wrappers, int64_t block, BlockFn fn);

}  // namespace ndt::nn
