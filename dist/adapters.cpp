#include "dist/adapters.h"

#include "dist/data_parallel.h"

namespace ndt::dist {

void check_lora_layout(const ParallelDims& dims) {
  NDT_CHECK(dims.tp == 1, "parallel.tp_size = ", dims.tp,
            ": LoRA (lora.rank > 0) does not run with tensor parallelism yet; set parallel.tp_size = 1");
  NDT_CHECK(dims.cp == 1, "parallel.cp_size = ", dims.cp,
            ": LoRA (lora.rank > 0) does not run with context parallelism yet; set parallel.cp_size = 1");
  NDT_CHECK(dims.pp == 1, "parallel.pp_size = ", dims.pp,
            ": LoRA (lora.rank > 0) does not run with pipeline parallelism yet; set parallel.pp_size = 1");
}

AdapterParallel::AdapterParallel(const nn::FlatParams& adapters, Communicator* dp,
                                 std::unique_ptr<FullyShardedDataParallel> base)
    : Strategy(adapters, /*shard_group=*/nullptr, /*tp=*/nullptr), base_(std::move(base)) {
  if (dp && dp->size() > 1)
    adapters_ = std::make_unique<DataParallel>(adapters, *dp);
  else
    adapters_ = std::make_unique<NoParallelism>(adapters);
}

std::string AdapterParallel::name() const {
  return "LoRA adapters (" + adapters_->name() + ")" +
         (base_ ? " on an " + base_->name() + "-sharded base" : "");
}

void AdapterParallel::begin_micro(bool sync) {
  if (base_) base_->begin_micro(sync);
  adapters_->begin_micro(sync);
}

void AdapterParallel::end_micro() {
  adapters_->end_micro();
  if (base_) base_->end_micro();
}

void AdapterParallel::end_accumulation() {
  adapters_->end_accumulation();
  if (base_) base_->end_accumulation();
}

void AdapterParallel::end_step() {
  adapters_->end_step();
  if (base_) base_->end_step();
}

void AdapterParallel::begin_forward_only() {
  if (base_) base_->begin_forward_only();
  adapters_->begin_forward_only();
}

void AdapterParallel::end_forward_only() {
  adapters_->end_forward_only();
  if (base_) base_->end_forward_only();
}

}  // namespace ndt::dist
