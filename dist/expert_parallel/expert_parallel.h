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

// Every MoE layer's experts described as rank `rank` of `parts` holds them (before materialize;
// also to rebuild another layout's buffers, as a sharded checkpoint's reader does).
void split_experts(models::GPT& gpt, int64_t parts, int64_t rank);

// Installs expert_parallel_mlp as every MoE layer's ExpertsFn. slice: each rank's parameters
// hold only its n_experts / ep experts (data parallelism); otherwise the experts stay whole
// parameters, which FSDP shards like any other, and each rank computes with its rows of them.
void apply_expert_parallel(models::GPT& gpt, Communicator& ep, bool slice = true);
void apply_expert_parallel(nn::MoeMLP& mlp, Communicator& ep, bool slice = true);  // one layer's

// The ExpertsFn under EP: xf (N, C), weights (N, k), choices (N, k) i32 -> (N, C); experts holds
// this rank's slice (El = E / ep experts) or all E of them (it computes with its El).
Tensor expert_parallel_mlp(const nn::Experts& experts, const Tensor& xf, const Tensor& weights,
                           const Tensor& choices, Communicator& ep);

}  // namespace ndt::dist
