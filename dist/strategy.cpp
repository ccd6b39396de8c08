#include "dist/strategy.h"

#include <cmath>
#include <vector>

#include "optim/adamw.h"
#include "tensor/kernels.h"

namespace ndt::dist {

double Strategy::grad_norm() const {
  const int64_t tp = tp_ ? tp_->size() : 1;
  double s = optim::grad_sum_squares(params_, tp, unit0_weight_);
  // each ep member's experts are its own: the other members' squares added, at 1/tp as every
  // parameter tp ranks hold alike (grad_sum_squares), since the sum over tp below counts them again
  if (ep_ && ep_->size() > 1) {
    double mine = 0;
    for (const nn::FlatUnit& u : params_.units)
      for (const Tensor& g : expert_grads(u)) {
        Tensor sq = Tensor::empty({1}, g.dtype() == DType::f64 ? DType::f64 : DType::f32, g.device());
        kernels::sum_squares(g, sq);
        mine += sq.to(Device::cpu()).to(DType::f64).item();
      }
    s += (ep_->all_reduce_scalar(mine, ReduceOp::kSum) - mine) / static_cast<double>(tp);
  }
  if (norm_group_) s = norm_group_->all_reduce_scalar(s, ReduceOp::kSum);
  if (tp > 1) s = tp_->all_reduce_scalar(s, ReduceOp::kSum);
  if (pp_) s = pp_->all_reduce_scalar(s, ReduceOp::kSum);
  return std::sqrt(s);
}

std::vector<Tensor> Strategy::expert_grads(const nn::FlatUnit& u) {
  std::vector<Tensor> out;
  for (const nn::FlatParam& p : u.params) {
    const nn::ShardPart s = nn::shard_part(u, p);
    if (p.spec.tp.experts && s.size() > 0) out.push_back(u.grad.narrow(0, s.begin, s.size()));
  }
  return out;
}

void Strategy::sum_partial_grads_over_tp() const {
  if (!tp_ || tp_->size() == 1) return;
  const bool sequence_parallel = split_ && split_->sequence_parallel;
  // every unsplit parameter's part of this rank's gradient shards (sequence parallel) or
  // those whose gradient is partial whatever the layout (Qwen3's q_norm, k_norm: each rank's
  // heads): the same offsets on every tp rank (their buffers differ only in the split
  // parameters' contents). Experts split over the ep group are whole on every tp rank: under
  // sequence parallelism each tp rank's experts saw only its tokens.
  std::vector<Tensor> parts;
  int64_t n = 0;
  for (const nn::FlatUnit& u : params_.units) {
    for (const nn::FlatParam& p : u.params) {
      const nn::ShardPart s = nn::shard_part(u, p);
      const bool tp_split = p.spec.tp.split() && !p.spec.tp.experts;
      if (tp_split || s.size() == 0 || !(sequence_parallel || p.spec.tp.partial_grad)) continue;
      parts.push_back(u.grad.narrow(0, s.begin, s.size()));
      n += s.size();
    }
  }
  if (parts.empty()) return;
  Tensor packed = Tensor::empty({n}, parts.front().dtype(), parts.front().device());
  int64_t at = 0;
  for (const Tensor& t : parts) {
    packed.narrow(0, at, t.numel()).copy_(t);
    at += t.numel();
  }
  tp_->all_reduce(packed, ReduceOp::kSum)->wait();
  at = 0;
  for (const Tensor& t : parts) {
    t.copy_(packed.narrow(0, at, t.numel()));
    at += t.numel();
  }
}

void NoParallelism::end_micro() {
  for (const nn::FlatUnit& u : params_.units) nn::fold_grad(u);
}

}  // namespace ndt::dist
