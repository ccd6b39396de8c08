#include "dist/strategy.h"

#include <cmath>

#include "optim/adamw.h"

namespace ndt::dist {

double Strategy::grad_norm() const {
  const int64_t tp = tp_ ? tp_->size() : 1;
  double s = optim::grad_sum_squares(params_, tp);
  if (norm_group_) s = norm_group_->all_reduce_scalar(s, ReduceOp::kSum);
  if (tp > 1) s = tp_->all_reduce_scalar(s, ReduceOp::kSum);
  return std::sqrt(s);
}

void NoParallelism::end_micro() {
  for (const nn::FlatUnit& u : params_.units) nn::fold_grad(u);
}

}  // namespace ndt::dist
