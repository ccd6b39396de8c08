// Shared by the distributed tests (run under mpirun by tests/dist/dist_main.cpp).
#pragma once

#include <memory>

#include "dist/comm/communicator.h"

namespace ndt::testing {
std::shared_ptr<dist::Communicator> world();  // MPI_COMM_WORLD
}  // namespace ndt::testing
