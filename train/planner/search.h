// ndtrain: the layout search (train_gpt --plan --plan.search with a cluster).
//
// Every (pp, dp_replicate, dp_shard, cp, tp) whose product is the cluster's devices -- a
// pipeline of at most model.n_layer stages, each with the schedules 1f1b, zb-h1 and (when
// every rank can hold two chunks) interleaved over 2 --, every micro-batch that divides a
// data-parallel rank's sequences per step (the batch per step is fixed: plan.batch, or the
// config's; under a pipeline the rest are its micro-batches), and every activation
// checkpointing mode is planned with plan() -- whose checks are the trainer's own: tp
// divides the heads, 4 n_embd and the padded vocabulary, 2 cp divides seq_len, the
// schedule's rules (interleaved: micro-batches a multiple of pp) -- and, when its
// highest stage fits in 90% of a device's memory, timed with predict_time(). The result is
// ranked by predicted tokens/s.
#pragma once

#include <cstdint>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "train/planner/cluster.h"
#include "train/planner/plan.h"
#include "train/planner/time.h"

namespace ndt::train {

struct Candidate {
  Plan plan;
  StepTime time;
};

struct SearchResult {
  int64_t world = 0, batch = 0;             // devices, sequences per step
  int64_t tried = 0;                        // layouts x micro-batches x checkpointing modes
  int64_t refused = 0, too_big = 0;         // by the trainer's constraints, by memory
  std::vector<Candidate> ranked;            // fastest first
  std::string why;                          // one line on why the first wins (or why none exists)
  std::map<std::string, int64_t> refusals;  // the trainer's rule that refused plans -> how many
  std::vector<int64_t> nearest_worlds;      // every plan refused: the nearest world sizes with plans
};

SearchResult search(const Config& c, const Cluster& k);
void print_search(const SearchResult& s, const Cluster& k, int64_t top, std::ostream& out);
void print_search_json(const SearchResult& s, const Cluster& k, int64_t top, std::ostream& out);

}  // namespace ndt::train
