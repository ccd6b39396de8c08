// ndtrain: the predicted time of one optimizer step of a plan on a cluster.
//
//   const Plan p = plan(config, world);
//   const StepTime t = predict_time(config, p, resolve_cluster(...));
//   t.step_s, t.compute_s, t.exposed_s, t.tokens_per_s, t.mfu, t.bottleneck
//
// The model replays the step as the trainer runs it (train/planner/time.cpp): one compute
// thread that runs each block's forward and backward (matrix products at the cluster's
// rate, element-wise passes at its memory bandwidth) and queues of collectives (one per
// communicator inside a host; one for a host's links to the others, shared by every
// dimension that crosses them), each collective's time from the ring formulas (latency + bytes / the
// bandwidth of the slowest link its ring crosses). The compute thread waits only where the
// trainer waits: TP's all-reduces at once, FSDP's prefetched all-gather when the block
// starts, a reduce-scatter one block later, DP's all-reduces and ring attention's K/V at
// the end of the step or of the ring step they run under. What it waits is the exposed
// communication.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <vector>

#include "train/config.h"
#include "train/planner/cluster.h"
#include "train/planner/plan.h"

namespace ndt::train {

struct StepTime {
  double step_s = 0;       // one optimizer step
  double compute_s = 0;    // forward, backward and the optimizer, without recomputation
  double recompute_s = 0;  // activation checkpointing's forward again
  double exposed_s = 0;    // the compute thread waiting on communication
  double gemm_s = 0;       // of compute + recompute, the matrix products
  std::map<std::string, double> exposed_by_dim;  // "fsdp", "replicate", "tp", "cp", "scalars"
  double tokens_per_s = 0;
  double mfu = 0;                                // model FLOPs / step / device peak
  // sent per step by a rank, on average over a host's ranks: to its own host, to others
  int64_t bytes_intra = 0, bytes_inter = 0;
  std::vector<std::string> across_hosts;         // the dimensions whose rings cross hosts
  std::string bottleneck;                        // in words
};

StepTime predict_time(const Config& c, const Plan& p, const Cluster& k);
void print_time(const Plan& p, const StepTime& t, const Cluster& k, std::ostream& out);
void print_cluster(const Cluster& k, std::ostream& out);
nlohmann::json time_to_json(const StepTime& t);
nlohmann::json cluster_to_json(const Cluster& k);

}  // namespace ndt::train
