// ndtrain: which blocks each pipeline stage holds.
//
// Pipeline parallelism cuts the model's blocks into p x v consecutive pieces, the virtual
// stages (v = 1 but for interleaved schedules); rank r of the pipeline holds virtual stages
// r, r + p, r + 2p, ... (Megatron-LM's interleaved layout), one model chunk each. The first
// stage also embeds the tokens and the last computes the final norm, the head and the loss,
// so the balance is by cost, not by count: each block costs its forward FLOPs per token (its
// matrix products and attention; the caller's figure, as the planner's description of the
// block's kind gives it: train::block_cost) and the last stage the head's as well.
//
// A run's pipeline, from its config, is one PipelineLayout: the blocks of each stage and the
// schedule every rank runs, checked and built once (plan_pipeline). One stage is a pipeline
// too: its schedule F0 B0 F1 B1 ... is plain gradient accumulation, so every layout trains
// through the same executor (pipeline.h).
//
//   const double block = train::block_cost(cfg, seq_len);   // train/planner/block_kinds.h
//   dist::PipelineLayout l = dist::plan_pipeline(cfg, block, {.stages = p, .micro_batches = m});
//   models::GPT gpt(cfg, l.part(mesh.coords().pp));   // only this rank's blocks are described
//   ... dist::parallelize(gpt, mesh, {.layout = l, ...}) runs l.schedule
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dist/pipeline_parallel/schedule.h"
#include "models/gpt.h"

namespace ndt::dist {

// The config's words for a pipeline ([parallel] pp_size, pp_virtual, pp_schedule, pp_split;
// [train] grad_accum_steps).
struct PipelineOptions {
  int64_t stages = 1;             // parallel.pp_size: pipeline ranks
  int64_t chunks = 1;             // parallel.pp_virtual: model chunks per rank (interleaved)
  std::string schedule = "1f1b";  // parallel.pp_schedule (pp::parse_kind's names)
  std::string split;              // parallel.pp_split: blocks per virtual stage ("3,3,2"; "": by cost)
  int64_t micro_batches = 1;      // train.grad_accum_steps
};

struct PipelineLayout {
  std::vector<int64_t> blocks;  // the blocks of each virtual stage ({n_layer}: one stage)
  pp::Schedule schedule;        // what every pipeline rank runs in one step
  bool staged() const { return schedule.p > 1; }
  // What pipeline rank `rank` holds (one stage: the whole model).
  models::PipelinePart part(int64_t rank) const;
  // One line for the run's start, "" for one stage: "pipeline: 2 stages, blocks per stage 2 2,
  // schedule 1f1b over 4 micro-batches".
  std::string describe() const;
  // The schedule in a few words, for the report: "1f1b over 4 micro-batches, one stage".
  std::string summary() const;
};

// Every pipeline rule in one place: the stages' blocks (stage_blocks, with `block_cost` the
// relative forward cost per token of one block), the schedule (pp::make_schedule,
// pp::validate). Throws ndt::Error naming the config keys. One stage takes the options'
// schedule over one rank (the default 1f1b: F0 B0 F1 B1 ...).
PipelineLayout plan_pipeline(const models::GPTConfig& cfg, double block_cost, const PipelineOptions& o);

// The number of blocks of each of `stages` virtual stages: `split` ("3,3,2": parallel.pp_split)
// when given, else the split that makes the costliest stage cheapest, each block costing
// `block_cost` (its relative forward cost per token, > 0) and the last stage the head's too
// (ties: earlier stages take more). Throws ndt::Error, naming parallel.pp_split or
// parallel.pp_size, when there are fewer blocks than stages or `split` does not sum to
// model.n_layer.
std::vector<int64_t> stage_blocks(const models::GPTConfig& cfg, double block_cost, int64_t stages,
                                  const std::string& split);

// What pipeline rank `rank` of `pp` holds: chunk c is virtual stage c * pp + rank.
models::PipelinePart pipeline_part(const std::vector<int64_t>& blocks, int64_t pp, int64_t rank);

// The relative forward cost per token of the head, in block_cost's units (lm_head's product:
// 2 FLOPs per weight).
double head_cost(const models::GPTConfig& cfg);

}  // namespace ndt::dist
