#include "optim/adamw.h"

#include <algorithm>
#include <cmath>

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

double grad_sum_squares(const nn::FlatParams& params) {
  double total = 0;
  for (const nn::FlatUnit& u : params.units) {
    Tensor s = Tensor::empty({}, u.grad.dtype() == DType::f64 ? DType::f64 : DType::f32, u.grad.device());
    kernels::sum_squares(u.grad, s);
    total += s.item();
  }
  return total;
}

double grad_sum_squares(const nn::FlatParams& params, int64_t tp) {
  if (tp == 1) return grad_sum_squares(params);
  double total = 0;
  for (const nn::FlatUnit& u : params.units) {
    const int64_t s0 = u.shard_offset, s1 = s0 + u.shard_numel;
    for (const nn::FlatParam& p : u.params) {  // this shard's part of each parameter
      const int64_t a = std::max(p.offset, s0), b = std::min(p.offset + numel_of(p.spec.shape), s1);
      if (a >= b) continue;
      Tensor s = Tensor::empty({}, u.grad.dtype() == DType::f64 ? DType::f64 : DType::f32, u.grad.device());
      kernels::sum_squares(u.grad.narrow(0, a - s0, b - a), s);
      total += s.item() / (p.spec.tp.split() ? 1.0 : static_cast<double>(tp));
    }
  }
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

}  // namespace ndt::optim
