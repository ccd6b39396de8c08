// AdamW against a hand-written reference (PyTorch's formulas), the weight-decay mask,
// AdamW on shards of a flat buffer (index_offset), global-norm clipping and the LR schedules.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

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

namespace {

// A flat buffer of kN elements whose first kDecayEnd take weight decay (as nn::materialize
// lays out a unit), stepped as a whole or as shards [offset, offset + len).
constexpr int64_t kN = 1000, kDecayEnd = 437;

kernels::AdamWArgs shard_test_args(int t, int64_t index_offset) {
  kernels::AdamWArgs a;
  a.lr = 1e-2 * t;
  a.beta1 = 0.9;
  a.beta2 = 0.95;
  a.eps = 1e-8;
  a.weight_decay = 0.1;
  a.grad_scale = 0.5 + 0.25 * t;
  a.step = t;
  a.decay_end = kDecayEnd;
  a.index_offset = index_offset;
  return a;
}

// Success when a and b hold the same bits; otherwise names the first element that differs.
template <typename T>
::testing::AssertionResult same_bits(const Tensor& a, const Tensor& b) {
  const std::vector<T> x = a.to_vector<T>(), y = b.to_vector<T>();
  if (x.size() != y.size())
    return ::testing::AssertionFailure() << x.size() << " vs " << y.size() << " elements";
  for (size_t i = 0; i < x.size(); ++i)
    if (std::memcmp(&x[i], &y[i], sizeof(T)) != 0)
      return ::testing::AssertionFailure() << "element " << i << ": " << x[i] << " vs " << y[i];
  return ::testing::AssertionSuccess();
}

struct Moments {
  Tensor p, m, v;
};

// Steps the whole buffer and, beside it, every shard between consecutive `bounds` with
// index_offset = the shard's offset, 3 steps; after every step each shard must equal its
// slice of the whole, bit for bit. Each shard has its own storage, as a rank holds it, or
// (in_place) is a view into a second copy of the whole buffer.
template <typename T>
void expect_shards_match_whole(const std::vector<int64_t>& bounds, bool in_place) {
  const DType dt = dtype_of<T>();
  Moments whole{Tensor::empty({kN}, dt), Tensor::zeros({kN}, dt), Tensor::zeros({kN}, dt)};
  kernels::fill_normal(whole.p, 3, 0, 0, 0.0f, 1.0f);
  const Moments copy{whole.p.clone(), whole.m.clone(), whole.v.clone()};
  std::vector<Moments> shards;
  for (size_t s = 0; s + 1 < bounds.size(); ++s) {
    const int64_t lo = bounds[s], len = bounds[s + 1] - lo;
    Moments sh{copy.p.narrow(0, lo, len), copy.m.narrow(0, lo, len), copy.v.narrow(0, lo, len)};
    if (!in_place) sh = {sh.p.clone(), sh.m.clone(), sh.v.clone()};
    shards.push_back(sh);
  }
  for (int t = 1; t <= 3; ++t) {
    Tensor g = Tensor::empty({kN}, dt);
    kernels::fill_normal(g, 5, t, 0, 0.0f, 1.0f);
    kernels::adamw_step(whole.p, g, whole.m, whole.v, shard_test_args(t, 0));
    for (size_t s = 0; s < shards.size(); ++s) {
      const int64_t lo = bounds[s], len = bounds[s + 1] - lo;
      Moments& sh = shards[s];
      kernels::adamw_step(sh.p, g.narrow(0, lo, len).clone(), sh.m, sh.v, shard_test_args(t, lo));
      SCOPED_TRACE(::testing::Message()
                   << dtype_name(dt) << (in_place ? " in place" : " own storage") << " step " << t
                   << " shard [" << lo << ", " << lo + len << ") of " << kN << ", decay_end " << kDecayEnd);
      EXPECT_TRUE(same_bits<T>(sh.p, whole.p.narrow(0, lo, len))) << "parameters";
      EXPECT_TRUE(same_bits<T>(sh.m, whole.m.narrow(0, lo, len))) << "first moments";
      EXPECT_TRUE(same_bits<T>(sh.v, whole.v.narrow(0, lo, len))) << "second moments";
    }
  }
}

}  // namespace

// FSDP steps each rank's shard of a unit's buffer alone: index_offset tells the kernel
// where the shard starts, so decay stops at the same global element decay_end.
TEST(AdamW, ShardsWithIndexOffsetMatchOneStepOverTheWholeBufferBitForBit) {
  const std::vector<std::vector<int64_t>> layouts = {
      {0, 250, 500, 750, 1000},     // before decay_end, straddling it, after it (twice)
      {0, 300, 600, 900, 1000},     // 300 does not divide 1000: a short last shard
      {0, 437, 1000},               // a boundary exactly at decay_end
      {0, 1, 436, 438, 999, 1000},  // one-element shards at both ends, two around decay_end
  };
  for (const auto& bounds : layouts) {
    for (bool in_place : {false, true}) {
      expect_shards_match_whole<float>(bounds, in_place);
      expect_shards_match_whole<double>(bounds, in_place);
    }
  }
}

// The check above can fail: a shard past decay_end stepped as if it started at element 0
// takes weight decay it should not.
TEST(AdamW, ShardWithoutIndexOffsetIsDecayedWrongly) {
  const int64_t lo = 500, len = 250;
  Tensor p = Tensor::full({kN}, 1.0, DType::f64), g = Tensor::zeros({kN}, DType::f64);
  Tensor m = Tensor::zeros({kN}, DType::f64), v = Tensor::zeros({kN}, DType::f64);
  Tensor sp = p.narrow(0, lo, len).clone(), sg = g.narrow(0, lo, len).clone();
  Tensor sm = m.narrow(0, lo, len).clone(), sv = v.narrow(0, lo, len).clone();
  kernels::adamw_step(p, g, m, v, shard_test_args(1, 0));
  kernels::adamw_step(sp, sg, sm, sv, shard_test_args(1, /*index_offset=*/0));
  EXPECT_EQ(p.narrow(0, lo, len).to_vector<double>(), std::vector<double>(len, 1.0));  // not decayed
  EXPECT_FALSE(same_bits<double>(sp, p.narrow(0, lo, len)));
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
