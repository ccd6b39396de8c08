#include "dist/data_parallel.h"

#include <cmath>

#include "autograd/hooks.h"
#include "optim/adamw.h"

namespace ndt::dist {

double Strategy::global_norm(const nn::FlatParams& params, Communicator* shards) {
  const int64_t tp = tp_ ? tp_->size() : 1;
  double s = optim::grad_sum_squares(params, tp);
  if (shards) s = shards->all_reduce_scalar(s, ReduceOp::kSum);
  if (tp > 1) s = tp_->all_reduce_scalar(s, ReduceOp::kSum);
  return std::sqrt(s);
}

void NoParallelism::end_micro() {
  for (const nn::FlatUnit& u : params_.units) nn::fold_grad(u);
}

double NoParallelism::grad_norm() { return global_norm(params_, nullptr); }

DataParallel::DataParallel(const nn::FlatParams& params, Communicator& replicas)
    : params_(params), comm_(replicas) {
  for (size_t i = 1; i < params.units.size(); ++i) {
    const nn::FlatUnit& u = params.units[i];
    std::vector<Tensor> ps;
    for (const nn::FlatParam& p : u.params) ps.push_back(p.value);
    // in backward, right after the last gradient of this unit: average it over the replicas
    autograd::GradGroup::create(ps, [this, &u] {
      nn::fold_grad(u);  // mixed precision: into the master's dtype first, reduced there
      if (sync_) pending_.push_back(comm_.all_reduce(u.grad, ReduceOp::kAvg));
    });
  }
}

void DataParallel::end_micro() {
  nn::fold_grad(params_.units[0]);
  if (!sync_) return;
  pending_.push_back(comm_.all_reduce(params_.units[0].grad, ReduceOp::kAvg));  // the embeddings, last
  for (const WorkPtr& w : pending_) w->wait();
  pending_.clear();
}

double DataParallel::grad_norm() {
  return global_norm(params_, nullptr);
}  // replicas hold the same gradients

}  // namespace ndt::dist
