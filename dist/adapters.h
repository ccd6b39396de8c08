// ndtrain: data parallelism for a LoRA run (nn/lora.h): trained adapters on a frozen base.
//
// Where each lives, and why:
//   the adapters  their own flat buffers (models::GPT::adapter_units), whole on every rank and
//                 averaged over every data-parallel rank as DP does (dist/data_parallel.h).
//                 They are r (in + out) numbers per targeted linear, well under 1% of the
//                 model: sharding them would save next to nothing and cost a gather per block.
//   the base      the model's usual buffers, materialized frozen (no gradients, no AdamW
//                 moments) and, under FSDP/HSDP, sharded as ever: FSDP's wrapper gathers a
//                 block's unit for its forward and its backward and releases it after, but
//                 reduces nothing (FullyShardedDataParallel's frozen).
//
//   auto s = std::make_unique<dist::AdapterParallel>(pm.params, &mesh.dp(), std::move(base_fsdp));
//
// So the optimizer, the gradient norm, clipping and the checkpoints see only the adapters.
#pragma once

#include <memory>
#include <string>

#include "dist/fsdp/fsdp.h"
#include "dist/mesh.h"
#include "dist/strategy.h"

namespace ndt::dist {

// Throws ndt::Error, one line naming the key, for a layout LoRA does not run in yet (tensor,
// context and pipeline parallelism).
void check_lora_layout(const ParallelDims& dims);

class AdapterParallel : public Strategy {
 public:
  // adapters: whole on this rank; dp: the data-parallel ranks (nullptr or a group of one: none);
  // base: FSDP's gatherer of the frozen base's shards (nullptr: the base is whole here).
  AdapterParallel(const nn::FlatParams& adapters, Communicator* dp,
                  std::unique_ptr<FullyShardedDataParallel> base);
  std::string name() const override;
  void begin_micro(bool sync) override;
  void end_micro() override;
  void end_accumulation() override;
  void end_step() override;
  void begin_forward_only() override;
  void end_forward_only() override;

 private:
  std::unique_ptr<Strategy> adapters_;  // DataParallel or NoParallelism
  std::unique_ptr<FullyShardedDataParallel> base_;
};

}  // namespace ndt::dist
