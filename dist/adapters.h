// ndtrain: the parallelism of a LoRA run (nn/lora.h): trained adapters on a frozen base.
//
// Where each lives, and why:
//   the adapters  their own flat buffers (models::GPT::adapter_units), averaged over every
//                 rank that trains other tokens with the same adapters, as DP does
//                 (dist/data_parallel.h). They are r (in + out) numbers per targeted linear,
//                 well under 1% of the model: sharding them would save next to nothing and
//                 cost a gather per block. By layout:
//                   DP, FSDP, HSDP   whole on every rank, averaged over the data ranks
//                   CP, Ulysses      whole, averaged over the data x cp x sp ranks (the
//                                    adapters are per-token linears: each rank's gradient is
//                                    its tokens' share, as for data-parallel ranks)
//                   TP               split as their linear (Megatron's LoRA): column-parallel,
//                                    B by output rows, A whole; row-parallel, A by input
//                                    columns, B whole. The whole one's gradient is a partial
//                                    sum, summed over the tp group (nn::LoraBlock)
//                   PP               each stage its blocks' adapters
//   the base      the model's usual buffers, materialized frozen (no gradients, no AdamW
//                 moments), split by TP and, under FSDP/HSDP/CP/SP, sharded as ever: FSDP's
//                 wrapper gathers a block's unit for its forward and its backward and
//                 releases it after, but reduces nothing (FullyShardedDataParallel's frozen).
//
//   auto s = std::make_unique<dist::AdapterParallel>(pm.params, data, tp, std::move(base_fsdp));
//
// So the optimizer, the gradient norm, clipping and the checkpoints see only the adapters.
#pragma once

#include <memory>
#include <string>

#include "dist/fsdp/fsdp.h"
#include "dist/mesh.h"
#include "dist/strategy.h"

namespace ndt::dist {

// The ranks over which a LoRA run averages its adapters' gradients: every rank of this one's
// pipeline stage and tp coordinate (data x cp x sp; the mesh's dp() when cp = sp = 1).
// Collective over mesh.world().
std::shared_ptr<Communicator> adapter_data_group(const DeviceMesh& mesh);

class AdapterParallel : public Strategy {
 public:
  // adapters: this rank's (TP: its slices); data: the ranks that average them (nullptr or a
  // group of one: none); tp: the tensor-parallel group (nullptr: none), over which the
  // partial gradients sum and the norm counts; base: FSDP's gatherer of the frozen base's
  // shards (nullptr: the base is whole here).
  AdapterParallel(const nn::FlatParams& adapters, std::shared_ptr<Communicator> data, Communicator* tp,
                  std::unique_ptr<FullyShardedDataParallel> base);
  std::string name() const override;
  void begin_micro(bool sync) override;
  void end_micro() override;
  void end_accumulation() override;
  void end_step() override;
  void begin_forward_only() override;
  void end_forward_only() override;

 private:
  std::shared_ptr<Communicator> data_;
  int64_t tp_size_;
  std::unique_ptr<Strategy> adapters_;  // DataParallel or NoParallelism
  std::unique_ptr<FullyShardedDataParallel> base_;
};

}  // namespace ndt::dist
