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
#include <string>

namespace ndt::train {

int train_main(int argc, const char* const* argv, std::ostream& out, std::ostream& err);

// A step line's speed: "MFU n%" of peak_flops (one device's dense peak FLOP/s for the
// training dtype: log.peak_tflops, or the GPU's own by its name, planner/cluster.h) when it
// is known, else "n GFLOP/s" per rank (CPU ranks, or a GPU whose peak is not known).
std::string speed_text(double gflops_per_rank, double peak_flops);
// What MFU is measured against, said once at the start of a GPU run: the device and its
// peak, or that MFU cannot be computed for it and which key to set.
std::string mfu_peak_line(const std::string& gpu_name, double peak_flops, const std::string& dtype);

}  // namespace ndt::train
