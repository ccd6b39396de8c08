// ndtrain: sharded checkpoints. Every rank writes only what it holds, in parallel, and any
// other layout (another pp, dp_shard, tp or cp, replicas, one process) resumes from them.
//
//   <dir>/step_00000100/
//     shard_tp0_fsdp0.safetensors   data.<unit>, m.<unit>, v.<unit>: one writer's shards
//     shard_tp0_fsdp1.safetensors   (a writer: the rank with replicate coordinate 0 for each
//     ...                            tensor-parallel rank and FSDP shard; replicas hold copies)
//     checkpoint.json                format "sharded", step, loader position, AdamW steps, the
//                                    model and layout that wrote it (pp, pp_blocks, dp_replicate,
//                                    dp_shard, cp, tp; ep under expert parallelism inside FSDP),
//                                    each file's size and checksum, and its own checksum
//                                    (manifest_xxh64) -- written last, by rank 0
//
// Expert parallelism inside FSDP: each writer's file also holds data.h.<i>.experts (and its
// moments), its ep rank's experts of block i sharded over the fsdp / ep writers that hold them
// (models::GPT::units(experts_apart)); every tp rank writes the same experts, tp rank 0's are read.
//
// Under pipeline parallelism (pp > 1) each stage's writers name their files
// shard_pp<s>_tp<t>_fsdp<f>.safetensors and hold that stage's units only: its blocks h.<i>,
// and "embeddings" with what the stage uses (tied: wte, wpe, ln_f on the first and on the
// last stage, identical; untied: wte on the first, ln_f and lm_head on the last; a middle
// stage's is empty, written as tensors of 0 elements). "pp_blocks" lists the blocks of
// each virtual stage (pp x pp_virtual entries), so a reader rebuilds every stage's layout;
// a manifest without "pp" is pp 1 with pp_blocks {n_layer}.
//
// No rank gathers anything. Atomic as a whole: the files go to .tmp_step_N, the directory is
// renamed into place and `latest` moves only after every writer's file is complete and
// fsynced, so a crash at any moment leaves the previous checkpoint intact.
//
// Loading into another layout: the writers' layouts follow from the model and their layout
// (nn::flat_layout of pipeline stage s's part of the model as tensor rank t of tp holds it,
// sharded over fsdp), so for each of its own parameters a rank finds, by name, the stage that
// holds it (the tied embeddings: the first stage's copy), and for each of its elements which
// file holds it and where, and reads only those bytes
// (memory-mapped, a piece at a time). Before any value is used, checkpoint.json is checked
// whole (its checksum; every field in range and consistent with the others and with the set
// of files), and each file the rank reads is verified (size, checksum, each tensor F32 at its
// layout's length) and refused if unlisted; a NaN or Inf read is an error naming the file and
// the parameter. The padded rows of wte (and of an untied lm_head) are never read, so another
// model.vocab_multiple loads.
//
//   ckpt::save_sharded(dir, state, params, opt, mesh, cfg, pm.pp_blocks, keep);  // every rank
//   ckpt::TrainState st = ckpt::load_sharded(path, cfg, params, opt); // every rank, any layout
//   ckpt::export_weights(path, "gpt2.safetensors");                  // one file, HF names
#pragma once

#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

#include "dist/mesh.h"
#include "models/gpt.h"
#include "nn/flat.h"
#include "optim/adamw.h"
#include "train/checkpoint/checkpoint.h"

namespace ndt::ckpt {

// Collective over the mesh's world. Throws (on every rank) if any rank failed to write;
// pruning old checkpoints (rank 0) warns through prune_log instead (checkpoint.h).
// pp_blocks: the blocks of each virtual pipeline stage (dist::ParallelModel::pp_blocks);
// empty without pipeline parallelism.
std::string save_sharded(const std::string& dir, const TrainState& state, const nn::FlatParams& params,
                         const optim::AdamW& opt, const dist::DeviceMesh& mesh, const models::GPTConfig& cfg,
                         const std::vector<int64_t>& pp_blocks, int keep, PruneLog* prune_log = nullptr);
// True when the checkpoint directory holds a sharded checkpoint.
bool is_sharded(const std::string& path);
// Reads this rank's shards of the parameters and AdamW moments (params and opt describe this
// rank's layout: its TP slices and FSDP shards) from a sharded checkpoint written in any layout.
// Warnings (a manifest written before manifests were sealed) go to `warn` (null: none, as on
// every rank but one).
TrainState load_sharded(const std::string& path, const models::GPTConfig& cfg, const nn::FlatParams& params,
                        optim::AdamW& opt, std::ostream* warn = &std::cerr);
// The model a sharded checkpoint holds, from its checkpoint.json (checked whole, as loading
// checks it): what to build before load_sharded_weights.
models::GPTConfig sharded_model_config(const std::string& path);
// Only the parameters of a sharded checkpoint, into this rank's shards (model.init_from of
// a checkpoint directory).
void load_sharded_weights(const std::string& path, const models::GPTConfig& cfg, const nn::FlatParams& params,
                          std::ostream* warn = &std::cerr);
// A sharded checkpoint as one safetensors file of whole parameters with GPT-2 names (one
// process; the model's bytes in memory once).
// OUT ending in .safetensors: one file of whole tensors with ndtrain's names (a GPT-2's are
// Hugging Face's GPT-2 names; a llama's those of a full checkpoint's model.safetensors); else a
// Hugging Face model folder (train/checkpoint/hf.h) in `dtype` (f32 or bf16), with the
// tokenizer the checkpoint carries (tokenizer_files.h; what the folder lacks, and why, is one
// line on `note`). `path` is a step folder, or a checkpoint.dir whose latest checkpoint is
// exported; returns the step folder exported. A LoRA run's checkpoint gives a PEFT adapter
// folder, or with merge the base with its adapters merged in (train/checkpoint/lora.h).
std::string export_weights(const std::string& path, const std::string& out, DType dtype = DType::f32,
                           std::ostream& note = std::cerr, bool merge = false);

}  // namespace ndt::ckpt
