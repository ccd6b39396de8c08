// AdamW against a hand-written reference (PyTorch's formulas), the weight-decay mask,
// global-norm clipping and the LR schedules.
#include <gtest/gtest.h>

#include <cmath>

#include "nn/flat.h"
#include "optim/adamw.h"
#include "tensor/kernels.h"

using namespace ndt;

namespace {

struct Two : nn::Module {
  Tensor w, b;
  Two() {
    param("weight", &w, {3, 4}, nn::Init::normal(0.5f), true);
    param("bias", &b, {5}, nn::Init::normal(0.5f), false);
  }
};

// PyTorch torch.optim.AdamW, written out per element.
struct RefAdamW {
  std::vector<double> m, v;
  void step(std::vector<double>& p, const std::vector<double>& g, int t, double lr, double b1, double b2,
            double eps, double wd, const std::vector<bool>& decay, double clip) {
    if (m.empty()) m.assign(p.size(), 0), v.assign(p.size(), 0);
    for (size_t i = 0; i < p.size(); ++i) {
      const double gi = g[i] * clip;
      if (decay[i]) p[i] *= 1 - lr * wd;
      m[i] = b1 * m[i] + (1 - b1) * gi;
      v[i] = b2 * v[i] + (1 - b2) * gi * gi;
      const double mhat = m[i] / (1 - std::pow(b1, t));
      const double denom = std::sqrt(v[i]) / std::sqrt(1 - std::pow(b2, t)) + eps;
      p[i] -= lr * mhat / denom;
      (void)mhat;
    }
  }
};

}  // namespace

TEST(AdamW, MatchesReferenceOverSeveralStepsWithDecayMaskAndClipping) {
  for (DType dt : {DType::f64, DType::f32}) {
    Two m;
    nn::FlatParams params = nn::materialize({{"u", m.parameters()}}, Device::cpu(), dt, 5);
    const nn::FlatUnit& u = params.units[0];
    ASSERT_EQ(u.decay_end, 32);  // weight (12 elements, padded to 32) first, then bias
    std::vector<bool> decay(u.numel);
    for (int64_t i = 0; i < u.numel; ++i) decay[i] = i < u.decay_end;
    optim::AdamW opt(params, {0.9, 0.95, 1e-8, 0.1});
    RefAdamW ref;
    std::vector<double> p = u.data.to_vector<double>();
    for (int t = 1; t <= 5; ++t) {
      kernels::fill_normal(u.grad, 11, t, 0, 0.0f, 2.0f);
      // padding stays zero in real use (no gradient reaches it)
      for (const nn::FlatParam& fp : u.params) (void)fp;
      std::vector<double> g = u.grad.to_vector<double>();
      const double norm = optim::grad_norm(params);
      double sq = 0;
      for (double x : g) sq += x * x;
      EXPECT_NEAR(norm, std::sqrt(sq), 1e-5 * std::sqrt(sq));
      const double clip = optim::clip_scale(norm, 1.0);
      EXPECT_LT(clip, 1.0);  // these gradients are large: clipping is active
      const double lr = 1e-2 * t;
      opt.step(lr, clip);
      ref.step(p, g, t, lr, 0.9, 0.95, 1e-8, 0.1, decay, std::min(1.0, 1.0 / (std::sqrt(sq) + 1e-6)));
      std::vector<double> got = u.data.to_vector<double>();
      const double tol = dt == DType::f64 ? 1e-12 : 2e-6;
      for (size_t i = 0; i < p.size(); ++i)
        ASSERT_NEAR(got[i], p[i], tol) << "step " << t << " element " << i;
    }
  }
}

TEST(AdamW, WeightDecayOnlyTouchesTwoDimensionalWeights) {
  Two m;
  nn::FlatParams params = nn::materialize({{"u", m.parameters()}}, Device::cpu(), DType::f64, 5);
  optim::AdamW opt(params, {0.9, 0.95, 1e-8, 0.5});
  std::vector<double> w0 = m.w.to_vector<double>(), b0 = m.b.to_vector<double>();
  opt.step(0.1, 1.0);  // zero gradients: only decay can move a parameter
  std::vector<double> w1 = m.w.to_vector<double>(), b1 = m.b.to_vector<double>();
  for (size_t i = 0; i < w0.size(); ++i) EXPECT_NEAR(w1[i], w0[i] * (1 - 0.1 * 0.5), 1e-15);
  for (size_t i = 0; i < b0.size(); ++i) EXPECT_EQ(b1[i], b0[i]);
}

TEST(Clip, ScaleFollowsPyTorch) {
  EXPECT_EQ(optim::clip_scale(0.5, 1.0), 1.0);
  EXPECT_NEAR(optim::clip_scale(4.0, 1.0), 1.0 / (4.0 + 1e-6), 1e-15);
  EXPECT_EQ(optim::clip_scale(100.0, 0.0), 1.0);  // disabled
}

TEST(Schedule, WarmupThenCosineLinearConstant) {
  optim::Schedule s{optim::Schedule::kCosine, 1.0, 0.1, 10, 110};
  EXPECT_DOUBLE_EQ(optim::lr_at(0, s), 0.1);
  EXPECT_DOUBLE_EQ(optim::lr_at(4, s), 0.5);
  EXPECT_DOUBLE_EQ(optim::lr_at(9, s), 1.0);
  EXPECT_DOUBLE_EQ(optim::lr_at(10, s), 1.0);
  EXPECT_NEAR(optim::lr_at(109, s), 0.1, 1e-12);            // last step: lr * min_lr_frac
  EXPECT_NEAR(optim::lr_at(10 + 99 / 2.0, s), 0.55, 1e-2);  // half way
  s.kind = optim::Schedule::kLinear;
  EXPECT_NEAR(optim::lr_at(109, s), 0.1, 1e-12);
  EXPECT_NEAR(optim::lr_at(10 + 33, s), 1.0 - 0.9 * 33.0 / 99.0, 1e-12);
  s.kind = optim::Schedule::kConstant;
  EXPECT_DOUBLE_EQ(optim::lr_at(50, s), 1.0);
  EXPECT_THROW(optim::Schedule::parse("exp"), Error);
}
