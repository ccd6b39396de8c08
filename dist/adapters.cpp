#include "dist/adapters.h"

#include "dist/data_parallel.h"

namespace ndt::dist {

std::shared_ptr<Communicator> adapter_data_group(const DeviceMesh& mesh) {
  if (mesh.dims().cp * mesh.dims().sp == 1)  // the mesh's data group, not owned here
    return std::shared_ptr<Communicator>(&mesh.dp(), [](Communicator*) {});
  ParallelDims::Coords c = mesh.coords();
  c.replicate = c.shard = c.cp = c.sp = 0;  // the group's first rank names it
  const int color = static_cast<int>(mesh.dims().rank_of(c)), key = static_cast<int>(mesh.world().rank());
  std::shared_ptr<Communicator> g = mesh.world().split(color, key, "lora_data");
  g->set_description("the LoRA adapters' data group (dp x cp x sp)");
  return g;
}

AdapterParallel::AdapterParallel(const nn::FlatParams& adapters, std::shared_ptr<Communicator> data,
                                 Communicator* tp, std::unique_ptr<FullyShardedDataParallel> base)
    : Strategy(adapters, /*shard_group=*/nullptr, tp),
      data_(std::move(data)),
      tp_size_(tp ? tp->size() : 1),
      base_(std::move(base)) {
  if (data_ && data_->size() > 1)
    adapters_ = std::make_unique<DataParallel>(adapters, *data_);
  else
    adapters_ = std::make_unique<NoParallelism>(adapters);
}

std::string AdapterParallel::name() const {
  return "LoRA adapters (" + adapters_->name() +
         (tp_size_ > 1 ? ", split with their linears over tp " + std::to_string(tp_size_) : "") + ")" +
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
  adapters_->end_accumulation();  // the average over the data ranks, then the tp sums
  sum_partial_grads_over_tp();
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
