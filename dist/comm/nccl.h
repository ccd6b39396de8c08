// ndtrain: the NCCL backend, for CUDA tensors (one process per GPU).
//
//   auto world = dist::init_world();                            // MPI carries NCCL's unique id
//   auto gpu_world = dist::nccl_communicator(world, /*device=*/dist::local_rank());
//   gpu_world->all_reduce(grad_on_gpu, dist::ReduceOp::kAvg)->wait();
//
// Collectives run on the communicator's own CUDA stream. Each starts after the work already
// queued on the device's compute stream (an event), and wait() makes the compute stream wait
// for it (another event): the host does not block, and compute overlaps communication.
// dist/comm/nccl.cpp is the one file of dist/ that includes CUDA and NCCL headers; it is
// built only with the CUDA backend and a found NCCL (nccl_none.cpp otherwise).
#pragma once

#include <memory>

#include "dist/comm/communicator.h"

namespace ndt::dist {

bool nccl_compiled();
// A communicator over the same ranks as `group` (collective: every rank of group calls it).
std::shared_ptr<Communicator> nccl_communicator(const std::shared_ptr<Communicator>& group, int device);

}  // namespace ndt::dist
