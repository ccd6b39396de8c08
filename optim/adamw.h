// ndtrain: AdamW over flat buffers, global gradient-norm clipping, LR schedules.
//
//   optim::AdamW opt(params, {.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1});
//   double norm = optim::grad_norm(params);              // over every gradient buffer
//   double lr = optim::lr_at(step, sched);               // warmup, then cosine/linear/constant
//   opt.step(lr, optim::clip_scale(norm, /*max=*/1.0));  // one fused pass per buffer
//
// Weight decay touches 2-D weights only: nn::materialize puts them first in each buffer,
// so a unit's decay_end is all the kernel needs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "nn/flat.h"

namespace ndt::optim {

struct AdamWConfig {
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
};

class AdamW {
 public:
  AdamW(const nn::FlatParams& params, AdamWConfig cfg);
  // Applies one step with learning rate lr; gradients are multiplied by grad_scale first.
  void step(double lr, double grad_scale = 1.0);
  int64_t steps_taken() const { return t_; }
  void set_steps_taken(int64_t t) { t_ = t; }
  // First and second moments, one buffer per unit (same order as params.units).
  const std::vector<Tensor>& m() const { return m_; }
  const std::vector<Tensor>& v() const { return v_; }
  const AdamWConfig& config() const { return cfg_; }

 private:
  const nn::FlatParams& params_;
  AdamWConfig cfg_;
  std::vector<Tensor> m_, v_;
  int64_t t_ = 0;
};

// sqrt of the sum of squares of every gradient buffer (padding is zero).
double grad_norm(const nn::FlatParams& params);
// The sum of squares of this rank's gradient shards; summed over the ranks that shard the
// buffers (each element counted once), its square root is the global norm.
double grad_sum_squares(const nn::FlatParams& params);
// The same with tensor parallelism over `tp` ranks: a replicated parameter (whole on every
// tp rank) counts 1/tp here, so that the sum over the tp ranks counts it once. unit0_weight:
// the weight of units[0]'s squares (pipeline parallelism: 1/2 where two stages hold the same
// tied embeddings).
double grad_sum_squares(const nn::FlatParams& params, int64_t tp, double unit0_weight = 1.0);
// PyTorch clip_grad_norm_: scale = max_norm / (norm + 1e-6) when that is < 1, else 1.
// max_norm <= 0 disables clipping.
double clip_scale(double norm, double max_norm);

struct Schedule {
  enum Kind { kCosine, kLinear, kConstant } kind = kCosine;
  double lr = 3e-4;
  double min_lr_frac = 0.1;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
  static Kind parse(const std::string& name);  // "cosine", "linear", "constant"
};
// The learning rate for a batch of `batch` sequences: lr as given (scaling "none"), or
// scaled from base_batch "linear"ly or by "sqrt" of the ratio (the guide's LR scaling).
double scaled_lr(double lr, const std::string& scaling, int64_t batch, int64_t base_batch);

// step < warmup: lr * (step + 1) / warmup; then from lr down to lr * min_lr_frac at the
// last step (total_steps - 1) following the schedule's shape.
double lr_at(int64_t step, const Schedule& s);

}  // namespace ndt::optim
