// ndtrain: the memory and communication plan of a training config, without running it
// (train_gpt --plan): per rank, the bytes of parameters, gradients, AdamW moments, the
// units FSDP gathers, the activations of one micro-step under the chosen activation
// checkpointing, the logits and the loss's temporaries, a peak estimate; and the bytes each
// dimension of the mesh sends per step, by the formulas the communicators count.
//
//   train_gpt --config gpt.ini --plan                    # world = the [parallel] sizes' product
//   train_gpt --config gpt.ini --plan --plan.world 16    # needed when dp_shard_size = -1
//   train_gpt --config gpt.ini --plan --json             # the same as one JSON object
//
// Nothing is allocated and MPI never starts: the model is described, tensor parallelism
// splits the description (dist::apply_tensor_parallel against a communicator that has only
// a size and a rank), and nn::flat_layout lays out the FSDP shards. With pipeline stages
// (parallel.pp_size > 1) each stage is planned on its own part of the model, along its
// schedule (train/planner/pipeline.h), and the plan is the stage with the highest peak.
// docs/planner.md explains how to read the result; tests/test_dist_plan.cpp compares it
// with the allocator's measured peak and the communicators' byte counters under mpirun.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "train/config.h"
#include "train/planner/plan_types.h"

namespace ndt::train {

// The plan of config c on `world` ranks (the [parallel] sizes must multiply to it, or
// dp_shard_size = -1 takes the rest). Throws ConfigError on a layout the trainer refuses.
// With pipeline stages every stage is planned and the plan is the one with the highest
// peak, Plan::stages listing them all.
Plan plan(const Config& c, int64_t world);
// The plan of pipeline stage `stage` alone (Plan::stages empty); plan() of each stage, and
// the time model's picture of each.
Plan plan_stage(const Config& c, int64_t world, int64_t stage);
// The world size for --plan: plan_world when given, else the product of the [parallel]
// sizes; dp_shard_size = -1 without plan_world is a ConfigError.
int64_t plan_world(const Config& c);
void print_plan(const Plan& p, std::ostream& out);
void print_plan_json(const Plan& p, std::ostream& out);
nlohmann::json plan_to_json(const Plan& p);

}  // namespace ndt::train
