#include "dist/data_parallel.h"

#include "autograd/hooks.h"

namespace ndt::dist {

DataParallel::DataParallel(const nn::FlatParams& params, Communicator& replicas, Communicator* tp)
    : Strategy(params, /*shard_group=*/nullptr, tp), comm_(replicas) {  // replicas hold the same gradients
  for (size_t i = 1; i < params.units.size(); ++i) {
    const nn::FlatUnit& u = params.units[i];
    std::vector<Tensor> ps;
    for (const nn::FlatParam& p : u.params) ps.push_back(p.value);
    // in backward, right after the last gradient of this unit: average it over the replicas
    autograd::GradGroup::create(ps, [this, &u] {
      nn::fold_grad(u);  // mixed precision: into the master's dtype first, reduced there
      if (!sync_) return;
      comm_.note_unit(u.name);
      pending_.push_back(comm_.all_reduce(u.grad, ReduceOp::kAvg));
    });
  }
}

void DataParallel::end_micro() { nn::fold_grad(params_.units[0]); }

void DataParallel::end_accumulation() {
  comm_.note_unit(params_.units[0].name);
  pending_.push_back(comm_.all_reduce(params_.units[0].grad, ReduceOp::kAvg));  // the embeddings, last
  for (const WorkPtr& w : pending_) w->wait();
  pending_.clear();
  sum_partial_grads_over_tp();
}

}  // namespace ndt::dist
