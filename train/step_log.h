// ndtrain: what train_gpt says about each step, on its console line and in metrics.jsonl.
//
//   StepLog s{...};                       // one step's numbers, as the trainer measured them
//   out << step_line(s) << std::endl;    // step    1/2000 | loss 4.7312 | ... | eta 3m12s
//   metrics.write_line(step_json(s).dump());
//   tensorboard.write_scalars(s.step + 1, step_scalars(s));
//
// Throughput: tokens/s, and the model FLOPs per second per rank as MFU against one
// device's dense peak (GPU; log.peak_tflops or the GPU's own, train/planner/cluster.h),
// else as GFLOP/s (CPU ranks, or a GPU whose peak is not known).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "tensor/storage.h"
#include "train/io/tensorboard.h"

namespace ndt::train {

struct StepLog {
  int64_t step = 0, steps = 0;        // this step (0-based) of the run's train.steps
  double loss = 0, lr = 0, norm = 0;  // the mean loss, the learning rate, the global grad norm
  double aux_loss = -1;               // the routers' load-balancing loss, part of loss (MoE; < 0: none)
  double z_loss = -1;                 // the routers' z-loss, part of loss (MoE; < 0: none)
  double sec = 0;                     // the step's wall time
  double tokens = 0;                  // tokens per step (every rank's)
  double flops = 0;                   // model FLOPs per step (every rank's)
  int world_size = 1;
  double peak_flops = 0;                     // one device's peak (0: not known, no MFU)
  int64_t comm_bytes = 0, across_hosts = 0;  // this rank's bytes sent, and of them to other hosts
  bool spans_hosts = false;                  // the job runs on several hosts
  MemoryStats mem;                           // this rank's device memory
  double eta_sec = 0;                        // the rest of the run at the average step time
};

std::string step_line(const StepLog& s);
nlohmann::json step_json(const StepLog& s);
// step_json's line read back (a resumed run's report starts with the steps before it):
// tokens and FLOPs from the rates and the time, the peak from the MFU where there is one;
// world_size, steps and spans_hosts are the run's own. Throws nlohmann::json::exception
// where a field is missing or of another type.
StepLog step_from_json(const nlohmann::json& j, int world_size, int64_t steps, bool spans_hosts);
// The same numbers as TensorBoard scalars: loss/train, lr, grad_norm, throughput/*, memory/*,
// comm/* (several ranks), time/step_ms.
io::Scalars step_scalars(const StepLog& s);

// A step line's speed: "MFU n%" of peak_flops when it is known, else "n GFLOP/s" per rank.
std::string speed_text(double gflops_per_rank, double peak_flops);
// What MFU is measured against, said once at the start of a GPU run: the device and its
// peak, or that MFU cannot be computed for it and which key to set.
std::string mfu_peak_line(const std::string& gpu_name, double peak_flops, const std::string& dtype);

// This process's peak resident set (VmHWM in /proc/self/status), 0 where unknown. It counts
// the pages of memory-mapped files that were touched, so it shows what loading really read.
int64_t peak_resident_bytes();

}  // namespace ndt::train
