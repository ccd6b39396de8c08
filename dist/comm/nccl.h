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
//
// Deadlines: the host never blocks in an NCCL collective (it only queues it), so a stuck
// peer would show as a host blocked later, in a copy or a synchronize. The communicators are
// non-blocking (ncclConfig_t blocking = 0) and a watch thread follows every operation's
// completion event and each communicator's asynchronous error (ncclCommGetAsyncError). An
// operation not complete `group->timeout()` seconds after it was queued, or an asynchronous
// error, aborts every communicator of the watch (ncclCommAbort: kernels waiting for a peer
// return) and calls `on_failure` with one line naming the operation, its group in words,
// where the job was, its bytes and the wait; it must end the process (train_gpt prints the
// line, writes the flight record and ends the job with exit code 6). The group's timeout and
// flight recorder carry over to the NCCL communicator and to those split from it.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "dist/comm/communicator.h"

namespace ndt::dist {

bool nccl_compiled();
// A communicator over the same ranks as `group` (collective: every rank of group calls it).
// Without on_failure, a missed deadline prints the line and ends the process (exit code 1).
std::shared_ptr<Communicator> nccl_communicator(const std::shared_ptr<Communicator>& group, int device,
                                                std::function<void(const std::string&)> on_failure = {});

}  // namespace ndt::dist
