// ndtrain: the train_gpt program as a function, so tests can run it in-process.
//
//   const char* argv[] = {"train_gpt", "--config", "configs/fortunes_char.ini"};
//   int rc = train::train_main(3, argv, std::cout, std::cerr);
//
// Exit codes: 0 done; 2 a bad config key or value (or a checkpoint that does not fit it);
// 1 any other error (data, checkpoint, weights, device, a non-finite step, a failed write);
// 3 (kExitPreempted, train/guard.h) stopped by SIGINT or SIGTERM after finishing the
// current step and saving a checkpoint: resume with checkpoint.resume = true. A second
// signal kills the process at once. Every error is one line on `err` naming what is wrong.
// While it runs, train_main owns the SIGINT and SIGTERM handlers (restored on return).
//
// train_main (train/train_main.cpp) reads the config, starts the world of ranks and hands
// each rank's run to run_trainer (train/trainer.cpp): setup -> describe -> parallelize ->
// materialize -> the loop.
#pragma once

#include <memory>
#include <ostream>

#include "dist/comm/communicator.h"
#include "dist/flight.h"
#include "train/config.h"
#include "train/guard.h"

namespace ndt::train {

int train_main(int argc, const char* const* argv, std::ostream& out, std::ostream& err);

// One rank's run, once the world of ranks is up: its exit code, or an exception (the caller
// ends the job). out: rank 0 prints there.
int run_trainer(const Config& c, std::shared_ptr<dist::Communicator> world, std::ostream& out,
                Watchdog& watchdog, dist::FlightRecorder& flight);

}  // namespace ndt::train
