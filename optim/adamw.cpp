#include "optim/adamw.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "tensor/kernels.h"

namespace ndt::optim {

AdamW::AdamW(const nn::FlatParams& params, AdamWConfig cfg) : params_(params), cfg_(cfg) {
  for (const nn::FlatUnit& u : params.units) {
    m_.push_back(Tensor::zeros(u.data.shape(), u.data.dtype(), u.data.device()));
    v_.push_back(Tensor::zeros(u.data.shape(), u.data.dtype(), u.data.device()));
  }
}

void AdamW::step(double lr, double grad_scale) {
  ++t_;
  for (size_t i = 0; i < params_.units.size(); ++i) {
    const nn::FlatUnit& u = params_.units[i];
    kernels::AdamWArgs a;
    a.lr = lr;
    a.beta1 = cfg_.beta1;
    a.beta2 = cfg_.beta2;
    a.eps = cfg_.eps;
    a.weight_decay = cfg_.weight_decay;
    a.grad_scale = grad_scale;
    a.step = t_;
    a.decay_end = u.decay_end;
    a.index_offset = u.shard_offset;  // a shard's elements keep their global index (decay_end)
    kernels::adamw_step(u.data, u.grad, m_[i], v_[i], a);
  }
}

double grad_norm(const nn::FlatParams& params) { return std::sqrt(grad_sum_squares(params)); }

double grad_sum_squares(const nn::FlatParams& params) { return grad_sum_squares(params, 1); }

double grad_sum_squares(const nn::FlatParams& params, int64_t tp, double unit0_weight) {
  // The pieces to square and their weights: whole buffers without TP; with TP each parameter's
  // part of this shard, a replicated one at 1/tp (an expert-parallel slice too: every tp rank
  // holds the same experts).
  std::vector<std::pair<Tensor, double>> pieces;
  for (const nn::FlatUnit& u : params.units) {
    const double w = &u == &params.units.front() ? unit0_weight : 1.0;
    if (u.shard_numel == 0) continue;
    if (tp == 1) {
      pieces.emplace_back(u.grad, w);
      continue;
    }
    for (const nn::FlatParam& p : u.params) {
      const nn::ShardPart s = nn::shard_part(u, p);
      if (s.size() > 0)
        pieces.emplace_back(
            u.grad.narrow(0, s.begin, s.size()),
            w * (p.spec.tp.split() && !p.spec.tp.experts ? 1.0 : 1.0 / static_cast<double>(tp)));
    }
  }
  if (pieces.empty()) return 0.0;
  // one sum per piece into one buffer on the device, read back once: the host waits for the
  // device a single time here, not once per buffer
  const Tensor& g = pieces.front().first;
  Tensor sums = Tensor::empty({static_cast<int64_t>(pieces.size())},
                              g.dtype() == DType::f64 ? DType::f64 : DType::f32, g.device());
  for (size_t i = 0; i < pieces.size(); ++i)
    kernels::sum_squares(pieces[i].first, sums.narrow(0, static_cast<int64_t>(i), 1));
  const std::vector<double> v = sums.to_vector<double>();
  double total = 0;
  for (size_t i = 0; i < pieces.size(); ++i) total += v[i] * pieces[i].second;
  return total;
}

double clip_scale(double norm, double max_norm) {
  if (max_norm <= 0) return 1.0;
  const double c = max_norm / (norm + 1e-6);
  return c < 1.0 ? c : 1.0;
}

Schedule::Kind Schedule::parse(const std::string& name) {
  if (name == "cosine") return kCosine;
  if (name == "linear") return kLinear;
  if (name == "constant") return kConstant;
  NDT_FAIL("optim.schedule: unknown schedule '", name, "' (expected cosine, linear or constant)");
}

double lr_at(int64_t step, const Schedule& s) {
  if (step < s.warmup_steps)
    return s.lr * static_cast<double>(step + 1) / static_cast<double>(s.warmup_steps);
  const double min_lr = s.lr * s.min_lr_frac;
  const int64_t span = s.total_steps - 1 - s.warmup_steps;
  const double progress = span <= 0 ? 1.0 : std::min(1.0, static_cast<double>(step - s.warmup_steps) / span);
  switch (s.kind) {
    case Schedule::kCosine:
      return min_lr + (s.lr - min_lr) * 0.5 * (1.0 + std::cos(M_PI * progress));
    case Schedule::kLinear:
      return s.lr - (s.lr - min_lr) * progress;
    case Schedule::kConstant:
      return s.lr;
  }
  return s.lr;
}

double scaled_lr(double lr, const std::string& scaling, int64_t batch, int64_t base_batch) {
  if (scaling == "none") return lr;
  const double ratio = static_cast<double>(batch) / static_cast<double>(base_batch);
  return lr * (scaling == "linear" ? ratio : std::sqrt(ratio));
}

}  // namespace ndt::optim
