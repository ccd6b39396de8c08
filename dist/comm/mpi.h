// ndtrain: the world communicator, over MPI between processes (or a group of one).
//
//   auto world = dist::init_world();   // under mpirun: MPI; started alone: a local group
//   auto dp = world->split(color, key, "dp");
//
// MPI is process-wide: it is initialized once (thread level SERIALIZED or better) and
// finalized at exit. One communication thread per process makes every MPI call and polls
// the requests in flight (MPI_Test), so a collective progresses while the compute thread
// works: Open MPI advances non-blocking collectives only inside MPI calls, and a compute
// thread that makes none would otherwise leave them waiting until it calls wait().
#pragma once

#include <memory>

#include "dist/comm/communicator.h"

namespace ndt::dist {

// MPI_COMM_WORLD as a Communicator named "world". Throws if MPI cannot start.
std::shared_ptr<Communicator> mpi_world();

// The world of this job: mpi_world() when launched with several ranks (or when `force_mpi`),
// else a local group of one, so a single process never needs an MPI launcher.
std::shared_ptr<Communicator> init_world(bool force_mpi = false);

}  // namespace ndt::dist
