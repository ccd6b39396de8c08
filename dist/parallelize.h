// ndtrain: every parallel dimension applied to a described GPT, in one place and in the
// order that matters:
//
//   1. tensor parallel    split the attention and MLP linears (local shapes, slices of the
//                         global init) and put f/g around them, while no memory exists
//                         (sequence parallel: the regions between them on this rank's part
//                         of each sequence)
//   2. context parallel   ring attention in every block; each rank keeps two chunks of
//                         every sequence
//   3. activation checkpointing   a wrapper around each block's forward
//   4. memory             this rank's shard of every flat buffer (nn::materialize): the
//                         same numbers as one process would draw, in any layout
//   5. data parallel      FSDP/HSDP (a wrapper outside checkpointing, so that a recompute
//                         finds its block gathered), DP's gradient hooks, or nothing
//   6. pipeline parallel  the schedule this rank runs its model chunks in (the model was
//                         described with only this rank's blocks: models::PipelinePart,
//                         dist/pipeline_parallel/stages.h)
//
//   dist::check_parallel_model(gpt.cfg, mesh.dims(), seq_len);  // sizes that do not divide
//   std::unique_ptr<dist::ParallelModel> pm = dist::parallelize(gpt, mesh, {device, seed, ...});
//   pm->strategy->begin_micro(sync); ... gpt.forward(pm->local(inputs), pm->local(targets)) ...
//
// What the training loop needs afterwards lives in ParallelModel: the buffers, the strategy
// (the hooks of dist/strategy.h) and the few questions whose answer depends on the layout
// (this rank's part of a batch, the mean loss over ranks, whole buffers for checkpoints),
// so the loop itself does not branch on tp, cp or fsdp.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include "dist/context_parallel/ring_attention.h"
#include "dist/fsdp/fsdp.h"
#include "dist/mesh.h"
#include "dist/pipeline_parallel/pipeline.h"
#include "dist/sequence_split.h"
#include "dist/strategy.h"
#include "dist/trace.h"
#include "models/gpt.h"
#include "nn/flat.h"
#include "nn/block_wrapper.h"

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
  // pipeline parallelism: the schedule (pp::parse_kind's names) and its micro-batches
  std::string pp_schedule = "1f1b";
  int64_t micro_batches = 1;
  std::vector<int64_t> pp_blocks;  // the blocks of each virtual stage (stages.h)
};

// Throws ndt::Error when the model or the sequence cannot be split as the mesh asks
// (heads, MLP or padded vocabulary that tp does not divide; seq_len that 2 cp does not;
// with sequence parallelism, seq_len / cp that tp does not; fewer blocks than pipeline stages).
void check_parallel_model(const models::GPTConfig& cfg, const ParallelDims& dims, int64_t seq_len,
                          bool sequence_parallel = false, int64_t pp_virtual = 1);

// Not copied or moved: the strategy and the model's hooks refer to its buffers.
class ParallelModel {
 public:
  ParallelModel() = default;
  ParallelModel(const ParallelModel&) = delete;
  ParallelModel& operator=(const ParallelModel&) = delete;

  nn::FlatParams params;               // this rank's shards (and TP slices)
  std::unique_ptr<Strategy> strategy;  // FSDP/HSDP, DP or NoParallelism
  std::unique_ptr<Pipeline> pipeline;  // pp > 1: runs the model's chunks (else none)

  std::vector<int64_t> pp_blocks;      // pp > 1: the blocks of each virtual stage
  const DeviceMesh& mesh() const { return *mesh_; }

  // After the step's last backward: the strategy's end_accumulation, then (pipeline with tied
  // embeddings) the sum of the embeddings' gradients of the first and the last stage.
  void end_accumulation();

  // (B, T) tokens of whole sequences -> this rank's part (CP: its two chunks of each).
  Tensor local(const Tensor& tokens) const;
  // A loss computed on this rank's sequences and chunks -> the mean over every token of the
  // step (each dp and cp rank holds as many tokens as any other; tp ranks hold the same loss).
  double mean_over_ranks(double loss) const;
  // True when a forward is collective (FSDP gathers, TP reduces): every rank must run it.
  bool forward_is_collective() const;
  // While false, every rank runs whole sequences (sampling): CP's chunks and sequence
  // parallelism's parts are off.
  void split_sequences(bool on);
  // Checkpoints and weight files in the single-process layout: a unit buffer whole (FSDP:
  // all-gathered over the shard group) and a parameter whole (TP: gathered over the tp group).
  Tensor whole_buffer(const nn::FlatUnit& u, const Tensor& shard) const;
  Tensor whole_param(const nn::ParamSpec& spec, const Tensor& local) const;
  // The communicators this model made beside the mesh's (pp > 1: the group of the first and
  // the last stage, which sums the tied embeddings' gradients), for the byte counters.
  std::vector<Communicator*> own_communicators() const;

 private:
  friend std::unique_ptr<ParallelModel> parallelize(models::GPT&, const DeviceMesh&,
                                                    const ParallelizeOptions&);
  const DeviceMesh* mesh_ = nullptr;
  FullyShardedDataParallel* fsdp_ = nullptr;  // the strategy, when sharded
  std::unique_ptr<ContextParallel> cp_;       // when cp > 1
  std::shared_ptr<Communicator> ends_;        // pp > 1: the first and the last stage
  bool tied_ends_ = false;                    // this rank is one of them and holds the tied embeddings
  SequenceSplit split_;                       // read by CP, TP and the strategy
};

std::unique_ptr<ParallelModel> parallelize(models::GPT& gpt, const DeviceMesh& mesh,
                                           const ParallelizeOptions& o);

}  // namespace ndt::dist
