// The NCCL backend of a build without CUDA or without NCCL: says how to get one.
#include "dist/comm/nccl.h"

namespace ndt::dist {

bool nccl_compiled() { return false; }

std::shared_ptr<Communicator> nccl_communicator(const std::shared_ptr<Communicator>&, int,
                                                std::function<void(const std::string&)>) {
  NDT_FAIL(
      "this ndtrain build has no NCCL backend: build with the CUDA backend (-DNDT_CUDA=ON) where "
      "NCCL is installed, or train on cpu");
}

}  // namespace ndt::dist
