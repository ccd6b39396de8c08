// ndtrain: fully sharded data parallel (FSDP, ZeRO-3) and hybrid sharding (HSDP).
//
// Each unit's flat buffer is padded to a multiple of the n shard ranks and cut into n
// shards; a rank allocates only its shard of parameters, gradients and AdamW moments
// (nn::materialize with a ShardSpec). The whole buffer exists only while its unit runs:
//
//   forward of block i   all-gather its unit (prefetched during block i-1), start block
//                        i+1's all-gather, compute, release the unit (the last block stays:
//                        backward starts with it)
//   backward of block i  its unit is gathered again (prefetched during block i+1's
//                        backward), start block i-1's all-gather, compute; when the unit's
//                        GradGroup fires, release its parameters and reduce-scatter its
//                        gradients (mean) into this rank's gradient shard
//   the embeddings       (wte, wpe, ln_f: unit 0, used at both ends of the model) stay
//                        gathered for the whole step, their gradients accumulate locally
//                        and are reduce-scattered once, after the last micro-step
//
// So besides the embeddings at most two units are gathered at any time: the one computing
// and the one being prefetched. HSDP: the mesh's replicate dimension holds copies of the
// sharded model; after the last micro-step each gradient shard is averaged over the
// replicas with one all-reduce (it starts as soon as that unit's reduce-scatter is done).
//
//   dist::FullyShardedDataParallel fsdp(params, mesh.fsdp(), &mesh.replicate());
//   gpt.add_block_wrapper(fsdp.wrapper());   // after activation checkpointing (outermost)
//
// Communication per step, per rank, with n shards and padded unit bytes P: forward
// all-gathers (n-1)/n P of every unit; backward again of every block but the last;
// reduce-scatters (n-1)/n P of every block per micro-step, and of the embeddings once.
// HSDP adds one all-reduce of the shard (2 (r-1)/r P/n) per unit and step.
//
// Expert parallelism: the ep ranks of a group hold different experts (their slices), so a
// block's experts cannot share its unit. They have a unit of their own ("h.i.experts", after
// every block's: models::GPT::units(experts_apart)), sharded over the FSDP ranks that hold the
// same experts (n / ep of them) and gathered, released and reduced with its block's unit: a rank
// gathers only its experts, 1/ep of them. An expert's gradient on a rank sums every ep member's
// tokens (dist/expert_parallel/), so the mean over the n / ep shards (and over the replicas
// that hold the same experts) is divided by ep more: the mean over all n ranks' tokens. With ep
// = n (each rank's experts are its alone, an expert shard group of one rank) nothing is copied:
// the unit's whole buffer borrows the rank's shard (Storage::borrow) and its gradient is added
// to the shard's as it is, with no collective.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "dist/comm/communicator.h"
#include "dist/strategy.h"
#include "dist/trace.h"
#include "nn/block_wrapper.h"

namespace ndt::dist {

// Expert parallelism inside FSDP: the groups of the units of experts (nn::FlatUnit::experts).
struct ExpertGroups {
  Communicator* shards = nullptr;    // the FSDP ranks holding the same experts (DeviceMesh::ep_shard)
  Communicator* replicas = nullptr;  // the replicas holding them (DeviceMesh::ep_replicate), or nullptr
};

class FullyShardedDataParallel : public Strategy {
 public:
  // params: sharded over `shards` (materialized with ShardSpec{shard_group.rank(), shard_group.size()}).
  // replicas: HSDP's replicate group, or nullptr / a group of one for plain FSDP.
  // Mixed precision: gradients are reduce-scattered in reduce_dtype (the master dtype, or
  // the compute dtype to halve those bytes) and accumulated in the master dtype.
  // tp: the tensor-parallel group, for the global norm (nullptr: none).
  // frozen: params were materialized frozen (a LoRA run's base, nn::materialize): their units
  // are gathered for each block's forward and backward as above, and released once the
  // block's backward is over (when the backward of the block before it begins), but they
  // have no gradients: nothing is reduced.
  // experts: the groups of the units of experts, when params has any.
  FullyShardedDataParallel(const nn::FlatParams& params, Communicator& shard_group,
                           Communicator* replicas = nullptr, std::optional<DType> reduce_dtype = std::nullopt,
                           Communicator* tp = nullptr, bool frozen = false, ExpertGroups experts = {});
  std::string name() const override;

  // Install on the model (GPT::add_block_wrapper): the wrapper of block i gathers and
  // releases unit i + 1 (unit 0 is the embeddings) and the unit of its experts, if any.
  nn::BlockWrapper wrapper();

  void begin_micro(bool sync) override;
  void end_micro() override;
  void end_accumulation() override;
  void end_step() override;
  void begin_forward_only() override;
  void end_forward_only() override;

  // Releases every gathered unit (the end of a forward-only pass).
  void release_all();

  // Each rank's copy of a whole buffer (padded_numel) from the shards of every rank, and
  // back: for checkpoints of AdamW moments (collective over the shard group).
  Tensor gather_buffer(const nn::FlatUnit& u, const Tensor& shard);

  // Forward and backward of each block on the trace's compute track.
  void set_trace(Trace* t) { trace_ = t; }
  // false: a unit gathered stays gathered until the step ends (end_step), instead of being
  // released after its forward and its backward (PyTorch FSDP2's reshard_after_forward).
  // With several micro-batches (gradient accumulation, a pipeline's) each unit is then
  // all-gathered once a step rather than twice a micro-batch, at the cost of holding every
  // unit of the rank whole (ZeRO-2's memory for the parameters).
  void set_reshard_after_forward(bool on) { reshard_ = on; }

  // Most block units gathered at once (the embeddings not counted).
  int max_gathered() const { return max_gathered_; }

 private:
  struct UnitState {
    WorkPtr gather;  // all-gather in flight into full
    bool gathered = false;
    bool grad_live = false;  // full_grad holds memory
  };
  struct PendingReduce {
    size_t unit;
    Tensor in;   // (padded_numel) what is reduced: full_grad, or its copy in reduce_dtype
    Tensor out;  // (shard_numel) the reduce-scatter's result, added to the shard's grad
    WorkPtr work;
  };
  PendingReduce start_reduce(size_t unit);

  // unit u's groups: its shard group and its replicas (HSDP; nullptr: none)
  Communicator& shards_of(const nn::FlatUnit& u) const;
  Communicator* replicas_of(const nn::FlatUnit& u) const;
  // block unit b and, if it has one, the unit of its experts (these three take both)
  void start_gather(size_t b);
  void wait_gather(size_t b);
  void release(size_t b);
  void start_gather_unit(size_t u);
  void wait_gather_unit(size_t u);
  void release_unit(size_t u);
  void alloc_grad(size_t u);
  void reduce_unit(size_t u);      // start the reduce-scatter of unit u's full gradient
  void drain(size_t keep);         // finish all but the `keep` newest reduce-scatters
  void before_backward(size_t u);  // on_backward hook of block unit u

  Communicator& shard_group_;
  Communicator* replicas_;          // HSDP, or nullptr
  ExpertGroups experts_;            // the units of experts' (replicas: nullptr when one)
  double expert_scale_ = 1;         // their gradients' extra factor, 1 / ep
  size_t blocks_end_ = 0;           // units [1, blocks_end_) are the blocks', then the experts'
  std::vector<size_t> experts_of_;  // (units) block unit -> its experts' unit (0: none)
  std::vector<UnitState> state_;
  std::vector<PendingReduce> pending_;
  std::optional<DType> reduce_dtype_;
  std::vector<WorkPtr> replica_pending_;
  bool sync_ = true;
  Trace* trace_ = nullptr;
  std::vector<int64_t> backward_began_;  // per unit, for the trace
  int gathered_blocks_ = 0, max_gathered_ = 0;
  bool reshard_ = true;  // set_reshard_after_forward
  bool frozen_ = false;  // no gradients (the constructor's frozen)
};

}  // namespace ndt::dist
