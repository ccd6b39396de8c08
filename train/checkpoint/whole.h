// ndtrain: the model as one process holds it, gathered from every rank's shards and slices.
//
// Full checkpoints, weight files and log.grads use the single-process layout, whatever the
// layout that trained: FSDP's shards are all-gathered over the shard group into whole unit
// buffers, TP's slices over the tp group into whole parameters. Collective: every rank of
// the job calls it; only the ranks that `keep` hold the result (on the CPU). Loading goes
// the other way without it: each rank reads only its own elements.
//
//   std::unique_ptr<ckpt::WholeModel> w = ckpt::gather_whole(mc, pm, &opt, /*keep=*/rank == 0, false);
//   if (w) ckpt::save_checkpoint(dir, *w->gpt, w->params, w->moments, state, keep);
#pragma once

#include <memory>
#include <string>

#include "dist/parallelize.h"
#include "models/gpt.h"
#include "nn/flat.h"
#include "optim/adamw.h"
#include "train/checkpoint/checkpoint.h"

namespace ndt::ckpt {

struct WholeModel {
  std::unique_ptr<models::GPT> gpt;
  nn::FlatParams params;  // on the CPU; gathered with grads = true, they hold the gradients
  Moments moments;        // AdamW's m and v in the same layout (not with grads)
};

// The model of `mc` whole, from this rank's part of it in `pm` (parameters, or their
// gradients with grads = true) and of AdamW's moments in `opt` (nullptr or grads: none).
// Returns nullptr where keep is false.
std::unique_ptr<WholeModel> gather_whole(const models::GPTConfig& mc, const dist::ParallelModel& pm,
                                         const optim::AdamW* opt, bool keep, bool grads);

// A run's checkpoint of `st` into dir, in either format: sharded (every rank writes its own
// shards, nobody gathers) or full (the single-process layout gathered onto the world's rank
// 0, which writes it; a failed write throws on every rank). Collective. Returns where it went.
// A LoRA run's (train/checkpoint/lora.h): its adapters, gathered whole (tensor parallelism's
// slices, every stage's) onto rank 0, which writes them as a full checkpoint in either format.
std::string save_run(const std::string& dir, bool sharded, int keep, const TrainState& st,
                     const models::GPTConfig& mc, const dist::ParallelModel& pm, const optim::AdamW& opt,
                     PruneLog* prune_log);
// Whether this rank writes save_run's files: sharded, every rank of the first replica (the
// replicas hold the same shards); full, the world's rank 0.
bool writes_checkpoints(bool sharded, const dist::DeviceMesh& mesh);
// The other way: a checkpoint of either format, written in any layout, into this rank's
// shards of the parameters and the AdamW moments; its state. Warnings go to `warn`.
TrainState resume_run(const std::string& path, const models::GPTConfig& mc, const models::GPT& gpt,
                      dist::ParallelModel& pm, optim::AdamW& opt, std::ostream* warn);

// log.grads: every parameter's whole gradient, by name ("grad." + name), into one
// safetensors file that rank 0 (`lead`) writes, comparable between any two layouts.
// Collective over `world`; `layout` goes into the file's metadata.
void write_whole_grads(const std::string& path, const models::GPTConfig& mc, const dist::ParallelModel& pm,
                       const std::string& layout, dist::Communicator& world);

}  // namespace ndt::ckpt
