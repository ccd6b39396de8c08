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
#pragma once

#include <ostream>

namespace ndt::train {

int train_main(int argc, const char* const* argv, std::ostream& out, std::ostream& err);

}  // namespace ndt::train
