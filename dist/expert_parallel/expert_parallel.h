// ndtrain: expert parallelism (EP), as torchtitan lays it out: the ep ranks of a group (ep
// consecutive data ranks, DeviceMesh::ep) each hold n_experts / ep experts of every MoE layer,
// a slice along dim 0 of mlp.experts.{gate,up,down}_proj; the router and everything else stay
// as without EP. Each rank routes its own tokens, then:
//
//   r    = moe_sort(choices, E)             rows sorted by expert: member j's experts contiguous
//   all  = gather_counts(r.counts, ep)      every member's rows per expert
//   xr   = dispatch_to_experts(x[r], ...)   all-to-all-v: (R, C) rows for this rank's experts,
//                                           grouped by source member, then local expert
//   ye   = experts(xr in local-expert order, counts of the local experts)   grouped GEMMs
//   y    = combine_from_experts(ye in source order, ...)  the inverse all-to-all-v: (N k, C)
//   out  = moe_combine(y, weights, r)       (N, C), weighted by this rank's routing weights
//
// An expert's gradient on its owner then sums every member's tokens; the strategy sums it
// further over the ranks that hold the same experts (DeviceMesh::ep_data) and divides by the
// data ranks, as it averages every other gradient (dist/data_parallel.h).
//
//   dist::apply_expert_parallel(gpt, mesh.ep());   // before materialize: the slices, the hook
#pragma once

#include "dist/comm/communicator.h"
#include "dist/mesh.h"
#include "models/gpt.h"
#include "nn/moe.h"

namespace ndt::dist {

// parallel.ep_size against the model: a model with experts, n_experts divisible by ep.
void check_expert_parallel(const models::GPTConfig& cfg, const ParallelDims& dims);

// Slices every MoE layer's experts (this rank's n_experts / ep) and installs expert_parallel_mlp
// as their ExpertsFn.
void apply_expert_parallel(models::GPT& gpt, Communicator& ep);
void apply_expert_parallel(nn::MoeMLP& mlp, Communicator& ep);  // one layer's

// The ExpertsFn under EP: xf (N, C), weights (N, k), choices (N, k) i32 -> (N, C); experts holds
// this rank's slice (El = E / ep experts).
Tensor expert_parallel_mlp(const nn::Experts& experts, const Tensor& xf, const Tensor& weights,
                           const Tensor& choices, Communicator& ep);

}  // namespace ndt::dist
