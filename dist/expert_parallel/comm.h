// ndtrain: the communication of expert parallelism, as autograd ops named after the math.
//
//   std::vector<int64_t> all = gather_counts(r.counts, ep);   // every member's rows per expert
//   Tensor xr = dispatch_to_experts(xs, send, recv, ep);      // rows to the ranks of their experts
//   Tensor y  = combine_from_experts(yr, send, recv, ep);     // their outputs back (the inverse)
//
// Both exchanges are one all-to-all-v of rows (Communicator::all_to_all_v: MPI_Alltoallv, NCCL
// grouped sends and receives); the backward of each is the other's exchange of the gradients.
//
// Shape legend: M rows this rank routes (N tokens x k choices), R rows it receives, C channels,
// E experts, n members of the ep group.
#pragma once

#include <cstdint>
#include <vector>

#include "dist/comm/communicator.h"
#include "tensor/tensor.h"

namespace ndt::dist {

// counts (E) this rank's rows per expert -> (n*E): member j's count of expert e at j*E + e (an
// all-gather, so that each rank knows what it sends and what it receives, both ways)
std::vector<int64_t> gather_counts(const std::vector<int64_t>& counts, Communicator& ep);

// x (M, C), send[j] rows to member j (in member order) -> (R, C), recv[j] rows from member j.
// Backward: the rows' gradients travel back the other way.
Tensor dispatch_to_experts(const Tensor& x, const std::vector<int64_t>& send,
                           const std::vector<int64_t>& recv, Communicator& ep);
// The inverse: y (R, C) back to the members they came from -> (M, C). Backward: forward's exchange.
Tensor combine_from_experts(const Tensor& y, const std::vector<int64_t>& send,
                            const std::vector<int64_t>& recv, Communicator& ep);

}  // namespace ndt::dist
