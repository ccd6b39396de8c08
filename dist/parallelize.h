// ndtrain: every parallel dimension applied to a described GPT, in one place and in the
// order that matters:
//
//   1. tensor parallel    split the attention and MLP linears (local shapes, slices of the
//                         global init) and put f/g around them, while no memory exists
//                         (sequence parallel: the regions between them on this rank's part
//                         of each sequence)
//   2. context parallel   ring attention in every block; each rank keeps two chunks of
//                         every sequence (Ulysses sequence parallel: all-to-all attention,
//                         each rank keeps a contiguous part of every sequence, of the tp
//                         rank's heads; with cp, of the cp rank's chunks, around the ring)
//   3. activation checkpointing   a wrapper around each block's forward
//   4. memory             this rank's shard of every flat buffer (nn::materialize): the
//                         same numbers as one process would draw, in any layout
//   5. data parallel      FSDP/HSDP (a wrapper outside checkpointing, so that a recompute
//                         finds its block gathered), DP's gradient hooks, or nothing
//   6. the step           the schedule this rank runs its model chunks in: the pipeline's
//                         (the model was described with only this rank's blocks:
//                         dist/pipeline_parallel/stages.h), or with one stage F0 B0 F1 B1 ...,
//                         plain gradient accumulation, through the same executor
//
//   // the model against the layout, and the pipeline's stages and schedule (pp = 1: one stage)
//   dist::PipelineLayout l = dist::plan_layout(cfg, mesh.dims(), parallel, seq_len, m, block_cost);
//   models::GPT gpt(cfg, dist::model_part(l, mesh));  // only this rank's blocks are described
//   std::unique_ptr<dist::ParallelModel> pm = dist::parallelize(gpt, mesh, {device, seed, ..., l});
//   double loss = pm->train(micro_batches);   // forwards, backwards, reduced gradients
//   opt.step(lr, clip_scale(pm->strategy->grad_norm(), max)); pm->strategy->end_step();
//
// What the training loop needs afterwards lives in ParallelModel: the buffers, the strategy
// (the hooks of dist/strategy.h), a step's micro-batches, evaluation and sampling, and the
// few questions whose answer depends on the layout (the mean loss over ranks, whole buffers
// for checkpoints), so the loop itself never branches on pp, tp, cp or fsdp.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dist/context_parallel/ring_attention.h"
#include "dist/fsdp/fsdp.h"
#include "dist/mesh.h"
#include "dist/pipeline_parallel/pipeline.h"
#include "dist/pipeline_parallel/stages.h"
#include "dist/sequence_split.h"
#include "dist/strategy.h"
#include "dist/trace.h"
#include "dist/ulysses/ulysses.h"
#include "models/generate.h"
#include "models/gpt.h"
#include "nn/block_wrapper.h"
#include "nn/flat.h"

namespace ndt::dist {

struct ParallelizeOptions {
  Device device = Device::cpu();
  uint64_t seed = 0;                   // the counter-based init
  std::optional<DType> compute_dtype;  // bf16: an f32 master and bf16 copies the model computes with
  std::optional<DType> reduce_dtype;   // FSDP's gradient reductions (nullopt: the master's dtype)
  int64_t seq_len = 0;                 // CP: the sequences every rank takes two chunks of
  bool sequence_parallel = false;      // TP: LayerNorms, residuals, embeddings on T/tp positions
  bool reshard_after_forward = true;   // FSDP: release a unit after its forward and backward
  nn::ACMode ac = nn::ACMode::none;    // activation checkpointing ...
  int64_t ac_every = 1;                // ... of blocks 0, k, 2k, ...
  Trace* trace = nullptr;              // each block's forward on the compute track
  PipelineLayout layout;               // dist::plan_layout's: the stages' blocks and the step's schedule
};

// Throws ndt::Error when the model or the sequence cannot be split as the mesh asks
// (heads, MLP or padded vocabulary that tp does not divide; seq_len that 2 cp does not;
// with sequence parallelism, seq_len / (cp sp) that tp does not; Ulysses: heads per tp rank or
// seq_len / cp that sp does not divide). The pipeline's rules:
// plan_pipeline (stages.h); both at once: plan_layout.

void check_parallel_model(const models::GPTConfig& cfg, const ParallelDims& dims, int64_t seq_len,
                          bool sequence_parallel = false);

// The run's layout for this model, checked and planned once: the sizes against the model and
// the sequence (check_parallel_model) and the pipeline's stages and schedule (plan_pipeline,
// with the config's pp_* words over dims.pp stages and `micro_batches` = train.grad_accum_steps;
// block_cost: one block's relative forward cost per token, train::block_cost). Throws
// ndt::Error naming the config keys.
PipelineLayout plan_layout(const models::GPTConfig& cfg, const ParallelDims& dims,
                           const ParallelConfig& parallel, int64_t seq_len, int64_t micro_batches,
                           double block_cost);
// What of the model this rank describes: its pipeline stage's blocks (one stage: the whole model).
models::PipelinePart model_part(const PipelineLayout& layout, const DeviceMesh& mesh);

// Not copied or moved: the strategy and the model's hooks refer to its buffers.
class ParallelModel {
 public:
  ParallelModel() = default;
  ParallelModel(const ParallelModel&) = delete;
  ParallelModel& operator=(const ParallelModel&) = delete;

  nn::FlatParams params;  // this rank's shards (and TP slices): what is trained
  // LoRA (models::GPT::add_lora): the frozen base model, sharded as params would be, while
  // params holds the adapters (dist/adapters.h); empty without LoRA
  nn::FlatParams base;
  // The model's own weights (the base's buffers under LoRA, else params): what init_from loads.
  nn::FlatParams& model_params() { return base.units.empty() ? params : base; }
  std::unique_ptr<Strategy> strategy;  // FSDP/HSDP, DP or NoParallelism
  std::vector<int64_t> pp_blocks;      // the blocks of each virtual stage ({n_layer}: one stage)
  const DeviceMesh& mesh() const { return *mesh_; }
  const models::GPT& gpt() const { return *gpt_; }
  const pp::Schedule& schedule() const { return step_->schedule(); }

  // A batch of whole sequences: tokens and next tokens, (B, T) i32 on any device (targets
  // of -1 are not trained); docs (B, T) i32: packed rows' documents (GPT::forward), or
  // undefined (one per row).
  struct Batch {
    Tensor inputs, targets, docs;
  };
  // One optimizer step's forwards and backwards, whatever the layout: the gradients zeroed,
  // the micro-batches run in the schedule's order (each weighing 1/m), the gradients reduced
  // (the strategy's end_accumulation; a pipeline with tied embeddings then sums the
  // embeddings' gradients of its first and last stage). Returns the mean loss over every
  // token of the step, the same on every rank. on_action(j) is told before each forward or
  // backward which micro-batch it runs.
  double train(const std::vector<Batch>& micro, const std::function<void(int64_t)>& on_action = {});
  // The last train()'s mean load-balancing loss, part of its loss (MoE; -1: none).
  double aux_loss() const { return aux_loss_; }
  double z_loss() const { return z_loss_; }  // ... the router z-loss (router_z_loss_coef; -1: none)
  // The mean loss of these batches without gradients (a collective: every rank runs it).
  double evaluate(const std::vector<Batch>& batches);
  // prompt -> prompt and new tokens, every rank drawing the same (a collective where the
  // forward is one): whole sequences on every rank, through the stages of a pipeline.
  std::vector<int32_t> generate(const std::vector<int32_t>& prompt, const models::SampleOptions& o);

  // Checkpoints and weight files in the single-process layout: a unit buffer whole (FSDP:
  // all-gathered over the shard group) and a parameter whole (TP: gathered over the tp group).
  Tensor whole_buffer(const nn::FlatUnit& u, const Tensor& shard) const;
  Tensor whole_param(const nn::ParamSpec& spec, const Tensor& local) const;
  // This rank's bytes sent so far, and of them to other hosts (ring model, dist/comm): the
  // mesh's groups and this model's own (pp > 1: the group of the first and the last stage,
  // which sums the tied embeddings' gradients).
  int64_t bytes_sent() const;
  int64_t bytes_across_hosts() const;

 private:
  friend std::unique_ptr<ParallelModel> parallelize(models::GPT&, const DeviceMesh&,
                                                    const ParallelizeOptions&);
  // (B, T) tokens of whole sequences -> this rank's part on its device (CP: its two chunks of
  // each; the docs stay whole).
  std::vector<Pipeline::Batch> local(const std::vector<Batch>& batches) const;
  // Packed documents with loss masks: the step's loss is the mean over every trained token of
  // the global batch, as one process on the whole batch, not a mean of the micro-batches'
  // means. Each micro-batch weighs this rank's trained tokens of it (CP: in its chunks)
  // x m x dp x cp / the step's (the pipeline's 1/m and the average over data and cp ranks
  // cancel those); 1 without documents.
  void weigh_by_trained_tokens(const std::vector<Batch>& batches, std::vector<Pipeline::Batch>& local) const;
  // A loss computed on this rank's sequences and chunks -> the mean over every token of the
  // step (each dp and cp rank holds as many tokens as any other; tp ranks hold the same loss).
  double mean_over_ranks(double loss) const;
  // (B, T) tokens of whole sequences -> this rank's part of them (CP: its two chunks, SP: its
  // contiguous part of those), and the groups of ranks that share those sequences (cp, then
  // sp; none without either).
  Tensor sequence_part(const Tensor& tokens) const;
  std::vector<Communicator*> sequence_groups() const;
  // Mixture-of-experts layers: the load-balancing loss of the micro-step's whole batch
  void reduce_router_stats(models::GPT& gpt) const;
  // After the step's last backward: the strategy's end_accumulation, then (pipeline with tied
  // embeddings) the sum of the embeddings' gradients of the first and the last stage.
  void end_accumulation();
  // The stages' ends under pp > 1: who sums the tied embeddings' gradients (ends_).
  void join_pipeline_ends(const models::GPT& gpt, const DeviceMesh& mesh, Trace* trace);
  const models::GPT* gpt_ = nullptr;
  Device device_;
  const DeviceMesh* mesh_ = nullptr;
  std::unique_ptr<Pipeline> step_;            // the executor of every step's schedule
  FullyShardedDataParallel* fsdp_ = nullptr;  // the strategy, when sharded
  std::unique_ptr<ContextParallel> cp_;       // when cp > 1
  std::unique_ptr<Ulysses> sp_;               // when sp > 1
  std::shared_ptr<Communicator> ends_;        // pp > 1: the first and the last stage
  bool tied_ends_ = false;                    // this rank is one of them and holds the tied embeddings
  double aux_loss_ = -1;                      // aux_loss()
  double z_loss_ = -1;                        // z_loss()
  SequenceSplit split_;                       // read by CP, TP and the strategy
};

std::unique_ptr<ParallelModel> parallelize(models::GPT& gpt, const DeviceMesh& mesh,
                                           const ParallelizeOptions& o);

}  // namespace ndt::dist
