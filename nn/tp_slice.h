// ndtrain: the part of a whole parameter that a tensor-parallel rank holds, and the index
// arithmetic between the rank's elements and the whole parameter's. Everything that maps
// one to the other (the initialization, the FSDP shards of a TP slice, gathering a
// parameter whole, reading a checkpoint written by other ranks) goes through these.
//
//   spec.tp = TpSlice{/*dim=*/1, /*parts=*/2, /*rank=*/1, /*groups=*/3, global};  // c_attn
//   for_each_tp_run(spec, 0, numel_of(spec.shape), [](int64_t local, int64_t global, int64_t n) {
//     // this rank's elements [local, local + n) are the whole parameter's [global, global + n)
//   });
#pragma once

#include <cstdint>
#include <functional>
#include <utility>

#include "tensor/tensor.h"

namespace ndt::nn {

struct ParamSpec;

// A tensor-parallel slice of a parameter: this rank holds part `rank` of `parts` along
// dimension `dim`. With groups > 1 the dimension is made of `groups` equal blocks (c_attn's
// q, k and v columns) and the rank holds its part of each block:
//   global index along dim = g * (L / groups) + rank * (L / (groups * parts)) + j
// for the j-th element of the rank's g-th block (L the global length of dim).
struct TpSlice {
  int dim = -1;  // -1: replicated (every tensor-parallel rank holds all of it)
  int64_t parts = 1, rank = 0, groups = 1;
  Shape global;  // the whole parameter's shape
  // replicated (dim -1), but each rank's gradient is a partial sum that the strategy sums
  // over the tp group (a layer applied to this rank's heads only: Qwen3's q_norm, k_norm)
  bool partial_grad = false;
  // split over the expert-parallel group rather than the tensor-parallel one (an MoE layer's
  // experts, dim 0: dist/expert_parallel/); the index arithmetic is the same
  bool experts = false;
  bool split() const { return dim >= 0 && parts > 1; }
};

// The global flat index of this rank's element i (flat, in its slice) of parameter s, and
// how many elements from i on stay contiguous in the whole parameter (a run).
std::pair<int64_t, int64_t> tp_global_run(const ParamSpec& s, int64_t i);
// The inverse: which tensor-parallel rank holds global element g of parameter s (any
// rank's spec of it), and at which flat index of that rank's slice.
std::pair<int64_t, int64_t> tp_local_of(const ParamSpec& s, int64_t g);
// fn(local index, global index, length) for every run of this rank's elements [begin, end)
// of s, in order: within a run both indices are contiguous.
void for_each_tp_run(const ParamSpec& s, int64_t begin, int64_t end,
                     const std::function<void(int64_t local, int64_t global, int64_t len)>& fn);

}  // namespace ndt::nn
