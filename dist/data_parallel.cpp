#include "dist/data_parallel.h"

#include "autograd/hooks.h"
#include "tensor/kernels.h"

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
      if (ep_data_) start_expert_sum(u);
      comm_.note_unit(u.name);
      pending_.push_back(comm_.all_reduce(u.grad, ReduceOp::kAvg));
    });
  }
}

void DataParallel::start_expert_sum(const nn::FlatUnit& u) {
  ExpertSum e{expert_grads(u), Tensor()};
  if (e.parts.empty()) return;
  int64_t n = 0;
  for (const Tensor& t : e.parts) n += t.numel();
  e.packed = Tensor::empty({n}, u.grad.dtype(), u.grad.device());
  int64_t at = 0;
  for (const Tensor& t : e.parts) {
    e.packed.narrow(0, at, t.numel()).copy_(t);
    at += t.numel();
  }
  ep_data_->note_unit(u.name + " experts");
  pending_.push_back(ep_data_->all_reduce(e.packed, ReduceOp::kSum));
  experts_.push_back(std::move(e));
}

void DataParallel::end_micro() { nn::fold_grad(params_.units[0]); }

void DataParallel::end_accumulation() {
  comm_.note_unit(params_.units[0].name);
  pending_.push_back(comm_.all_reduce(params_.units[0].grad, ReduceOp::kAvg));  // the embeddings, last
  for (const WorkPtr& w : pending_) w->wait();
  pending_.clear();
  // each expert's gradient: its owner's (every ep member's tokens) summed over the replicas
  // that hold it, over all the replicas as the mean of the others
  for (const ExpertSum& e : experts_) {
    int64_t at = 0;
    for (const Tensor& t : e.parts) {
      kernels::scale(e.packed.narrow(0, at, t.numel()), 1.0 / static_cast<double>(comm_.size()), t);
      at += t.numel();
    }
  }
  experts_.clear();
  sum_partial_grads_over_tp();
}

}  // namespace ndt::dist
