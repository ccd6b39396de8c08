// ndtrain: the predicted time of one optimizer step of a plan on a cluster.
//
//   const Plan p = plan(config, world);
//   const StepTime t = predict_time(config, p, resolve_cluster(...));
//   t.step_s, t.compute_s, t.exposed_s, t.tokens_per_s, t.mfu, t.bottleneck
//
// The model replays the step as the trainer runs it (StepReplay, train/planner/replay.h):
// one compute thread that runs each block's forward and backward (matrix products at the
// cluster's rate, element-wise passes at its memory bandwidth), a queue of collectives per
// communicator inside a host, and a host's links to the others, which the collectives in
// flight between hosts share (SharedLink); each collective's time from the ring formulas
// (latency + bytes / the bandwidth of the slowest link its ring crosses). The compute
// thread waits only where the trainer waits: TP's all-reduces at once, FSDP's prefetched
// all-gather when the block starts, a reduce-scatter one block later, DP's all-reduces and
// ring attention's K/V at the end of the step or of the ring step they run under. What it
// waits is the exposed communication, and on CPU ranks also what the transfers behind it
// took of its cores (the link's cpu_share of each transfer's time, Cluster).
//
// With pipeline stages every stage is replayed alone (its chunks timed per micro-batch), and
// the step is the schedule (dist/pipeline_parallel/schedule.h's simulate) run with those
// costs and the messages' times, each stage then finishing its step (the tied embeddings'
// sum between the ends, the last reductions, AdamW), plus the stages' scalar sums.
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
  double step_s = 0;                             // one optimizer step
  double compute_s = 0;                          // forward, backward and the optimizer, without recomputation
  double recompute_s = 0;                        // activation checkpointing's forward again
  double exposed_s = 0;                          // the compute thread waiting on communication
  double gemm_s = 0;                             // of compute + recompute, the matrix products
  std::map<std::string, double> exposed_by_dim;  // "fsdp", "replicate", "tp", "cp", "scalars"
  double tokens_per_s = 0;
  double mfu = 0;  // model FLOPs / step / device peak
  // sent per step by a rank, on average over a host's ranks: to its own host, to others
  int64_t bytes_intra = 0, bytes_inter = 0;
  std::vector<std::string> across_hosts;  // the dimensions whose rings cross hosts
  std::string bottleneck;                 // in words
  // pipeline parallelism: the schedule simulated with each stage's F, B (and W) as its replay
  // times them (its blocks, the first stage's embeddings, the last one's head; the stage's
  // own collectives inside) and each message's time on the link its boundary crosses.
  // exposed_by_dim["pp"] is what the planned stage waits for the others: the bubble, the
  // messages, and the stages' sums of the loss and the norm
  double pipeline_s = 0;        // the schedule's makespan (0 without a pipeline)
  double bubble = 0;            // of the stages' time in it, the share idle
  double message_s = 0;         // one activation (or its gradient) on the slowest boundary
  bool messages_cross = false;  // some boundary between stages crosses hosts
};

StepTime predict_time(const Config& c, const Plan& p, const Cluster& k);
void print_time(const Plan& p, const StepTime& t, const Cluster& k, std::ostream& out);
void print_cluster(const Cluster& k, std::ostream& out);
nlohmann::json time_to_json(const StepTime& t);
nlohmann::json cluster_to_json(const Cluster& k);

}  // namespace ndt::train
