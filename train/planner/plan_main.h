// ndtrain: `train_gpt --plan` and its options, the planner's command line.
//
//   train_gpt --config gpt.ini --plan [--json]                       memory and bytes per rank
//   train_gpt --config gpt.ini --plan --cluster.preset h100-sxm-8    ... and the step time
//   train_gpt --config gpt.ini --plan --plan.search --cluster c.ini  every layout, ranked
//   mpirun -np 4 train_gpt --config gpt.ini --plan --plan.calibrate c.ini   measure a cluster
//
// Nothing trains and nothing is allocated; only --plan.calibrate starts MPI and runs work.
#pragma once

#include <ostream>

#include "train/config.h"

namespace ndt::train {

// Runs what c's --plan options ask for and prints it to `out` (on the launcher's rank 0
// only: `quiet` on the others, which print nothing). Returns the exit code: 0, or 2 with
// one "config error" line on `err`.
int plan_main(const Config& c, bool quiet, std::ostream& out, std::ostream& err);

}  // namespace ndt::train
