#include "dist/data_parallel.h"

#include "autograd/hooks.h"
#include "tensor/kernels.h"

#include <tuple>

namespace ndt::dist {

DataParallel::DataParallel(const nn::FlatParams& params, Communicator& replicas, Communicator* tp,
                           Communicator* ep_data)
    : Strategy(params, /*shard_group=*/nullptr, tp),
      comm_(replicas),
      ep_data_(ep_data) {  // replicas hold the same gradients
  for (size_t i = 1; i < params.units.size(); ++i) {
    const nn::FlatUnit& u = params.units[i];
    std::vector<Tensor> ps;
    for (const nn::FlatParam& p : u.params) ps.push_back(p.value);
    // in backward, right after the last gradient of this unit: average it over the replicas
    autograd::GradGroup::create(ps, [this, &u] {
      nn::fold_grad(u);  // mixed precision: into the master's dtype first, reduced there
      if (!sync_) return;
      if (ep_data_ && !expert_grads(u).empty()) return start_expert_sum(u);
      comm_.note_unit(u.name);
      pending_.push_back(comm_.all_reduce(u.grad, ReduceOp::kAvg));
    });
  }
}

namespace {

// parts (views into one gradient buffer) copied one after another into one buffer
Tensor pack(const std::vector<Tensor>& parts, const Tensor& like) {
  int64_t n = 0;
  for (const Tensor& t : parts) n += t.numel();
  Tensor packed = Tensor::empty({n}, like.dtype(), like.device());
  int64_t at = 0;
  for (const Tensor& t : parts) {
    packed.narrow(0, at, t.numel()).copy_(t);
    at += t.numel();
  }
  return packed;
}

}  // namespace

// A unit with expert slices: its other parameters averaged over the replicas, its experts
// summed over those that hold the same ones, each in a packed copy (unpacked by end_accumulation)
void DataParallel::start_expert_sum(const nn::FlatUnit& u) {
  UnitSums e;
  for (const nn::FlatParam& p : u.params) {
    const nn::ShardPart s = nn::shard_part(u, p);
    if (s.size() > 0)
      (p.spec.tp.experts ? e.experts : e.dense).push_back(u.grad.narrow(0, s.begin, s.size()));
  }
  e.packed_dense = pack(e.dense, u.grad);
  e.packed_experts = pack(e.experts, u.grad);
  comm_.note_unit(u.name);
  pending_.push_back(comm_.all_reduce(e.packed_dense, ReduceOp::kAvg));
  ep_data_->note_unit(u.name + " experts");
  pending_.push_back(ep_data_->all_reduce(e.packed_experts, ReduceOp::kSum));
  sums_.push_back(std::move(e));
}

void DataParallel::end_micro() { nn::fold_grad(params_.units[0]); }

void DataParallel::end_accumulation() {
  comm_.note_unit(params_.units[0].name);
  pending_.push_back(comm_.all_reduce(params_.units[0].grad, ReduceOp::kAvg));  // the embeddings, last
  for (const WorkPtr& w : pending_) w->wait();
  pending_.clear();
  // back into the units: the other parameters' mean, and each expert's gradient (its owner's,
  // every ep member's tokens) summed over the replicas that hold it, over all the replicas
  const double experts_scale = 1.0 / static_cast<double>(comm_.size());
  for (const UnitSums& e : sums_)
    for (const auto& [parts, packed, by] : {std::tuple{&e.dense, &e.packed_dense, 1.0},
                                            std::tuple{&e.experts, &e.packed_experts, experts_scale}}) {
      int64_t at = 0;
      for (const Tensor& t : *parts) {
        kernels::scale(packed->narrow(0, at, t.numel()), by, t);
        at += t.numel();
      }
    }
  sums_.clear();
  sum_partial_grads_over_tp();
}

}  // namespace ndt::dist
