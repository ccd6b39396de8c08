// Rotary position embedding's angles (models/rope.h) with the rotary op (autograd/ops.h):
// the frequencies of rope_theta and of Llama 3's scaling, the property RoPE exists for
// (attention scores depend only on how far apart two tokens are), and bad settings.
#include <gtest/gtest.h>

#include <cmath>

#include "autograd/ops.h"
#include "models/rope.h"
#include "support/op_cases.h"
#include "support/testing.h"

using namespace ndt;

namespace {

// dot(rotary(q) at position pq, rotary(k) at position pk) for one head of size HS
double rotated_dot(const Tensor& q, const Tensor& k, int32_t pq, int32_t pk, const models::RopeConfig& rope) {
  const int64_t HS = q.numel();
  const Tensor x = concat({q.view({1, 1, 1, HS}), k.view({1, 1, 1, HS})}, 1);  // (1, 2, 1, HS)
  const models::RopeTables t =
      models::rope_tables(Tensor::from_vector<int32_t>({pq, pk}, {1, 2}), HS, rope, DType::f64);
  const std::vector<double> y = rotary(x, t.cos, t.sin).to_vector<double>();
  double d = 0;
  for (int64_t i = 0; i < HS; ++i) d += y[i] * y[HS + i];
  return d;
}

}  // namespace

// inv_freq_i = theta^(-2i/HS); Llama 3 (factor 8, low 1, high 4, 8192 positions): wavelengths
// under 2048 positions kept, over 8192 divided by 8, the band between blended monotonically.
TEST(Rope, FrequenciesFollowThetaAndLlama3Scaling) {
  const int64_t HS = 128;
  const models::RopeConfig plain{.theta = 500000};
  const models::RopeConfig llama3{.theta = 500000, .llama3 = models::Llama3Scaling{8, 1, 4, 8192}};
  const std::vector<float> f = models::rope_inv_freq(HS, plain), g = models::rope_inv_freq(HS, llama3);
  ASSERT_EQ(f.size(), 64u);
  int kept = 0, stretched = 0, blended = 0;
  for (size_t i = 0; i < f.size(); ++i) {
    const double want = std::pow(500000.0, -2.0 * double(i) / double(HS));
    EXPECT_NEAR(f[i], want, 1e-6 * want) << i;
    const double wavelen = 2 * M_PI / f[i];
    if (wavelen < 2048) {
      EXPECT_EQ(g[i], f[i]) << i;
      ++kept;
    } else if (wavelen > 8192) {
      EXPECT_NEAR(g[i], f[i] / 8, 1e-6 * f[i]) << i;
      ++stretched;
    } else {
      EXPECT_LT(g[i], f[i]) << i;
      EXPECT_GT(g[i], f[i] / 8) << i;
      ++blended;
    }
    if (i > 0) EXPECT_LT(g[i], g[i - 1]) << "frequencies fall with i";
  }
  EXPECT_GT(kept, 0);
  EXPECT_GT(stretched, 0);
  EXPECT_GT(blended, 0);
  EXPECT_EQ(f[0], 1.0f);
}

// The score of a query at m and a key at n depends on n - m only: shifting both by d changes
// nothing, while moving one of them does (with and without Llama 3's scaling).
TEST(Rope, ScoresDependOnlyOnTheDistanceBetweenTokens) {
  const Tensor q = ndt::testing::randn({16}, DType::f64, Device::cpu(), 1),
               k = ndt::testing::randn({16}, DType::f64, Device::cpu(), 2);
  for (const models::RopeConfig& rope :
       {models::RopeConfig{.theta = 10000},
        models::RopeConfig{.theta = 500000, .llama3 = models::Llama3Scaling{}}}) {
    const double base = rotated_dot(q, k, 3, 7, rope);
    for (int32_t d : {1, 5, 40})
      EXPECT_NEAR(rotated_dot(q, k, 3 + d, 7 + d, rope), base, 1e-5 * std::fabs(base)) << d;
    EXPECT_GT(std::fabs(rotated_dot(q, k, 3, 8, rope) - base), 1e-3 * std::fabs(base))
        << "the distance matters";
  }
  // position 0 turns nothing
  const Tensor x = q.view({1, 1, 1, 16});
  const models::RopeTables t =
      models::rope_tables(Tensor::from_vector<int32_t>({0}, {1, 1}), 16, {}, DType::f64);
  EXPECT_EQ(rotary(x, t.cos, t.sin).to_vector<double>(), q.to_vector<double>());
}

// Hugging Face's convention, written out for one head of 4 at position 5, theta 100: the pairs
// are (x0, x2) and (x1, x3) (rotate_half), not neighbours; angles 5 * 100^(-2i/4).
TEST(Rope, PairsAreTheHalvesOfAHeadAsHuggingFaceHasThem) {
  const std::vector<double> x = {0.3, -1.2, 0.7, 2.0};
  const models::RopeTables t =
      models::rope_tables(Tensor::from_vector<int32_t>({5}, {1, 1}), 4, {.theta = 100}, DType::f64);
  const std::vector<double> y =
      rotary(Tensor::from_vector(x, {1, 1, 1, 4}), t.cos, t.sin).to_vector<double>();
  const double a0 = static_cast<double>(5.0f * 1.0f), a1 = static_cast<double>(5.0f * (1.0f / 10.0f));
  const double c0 = std::cos(a0), s0 = std::sin(a0), c1 = std::cos(a1), s1 = std::sin(a1);
  const std::vector<double> want = {x[0] * c0 - x[2] * s0, x[1] * c1 - x[3] * s1, x[2] * c0 + x[0] * s0,
                                    x[3] * c1 + x[1] * s1};
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(y[i], want[i], 1e-6) << i;  // the tables' cos/sin are float32's
}

TEST(Rope, BadSettingsAreOneClearError) {
  const Tensor pos = Tensor::from_vector<int32_t>({0, 1}, {1, 2});
  EXPECT_NE(ndt::testing::error_of([&] { models::rope_tables(pos, 7, {}, DType::f32); }).find("must be even"),
            std::string::npos);
  EXPECT_NE(ndt::testing::error_of([&] {
              models::rope_tables(pos, 8, {.theta = 1}, DType::f32);
            }).find("rope_theta = 1"),
            std::string::npos);
  const models::RopeConfig bad{.theta = 500000, .llama3 = models::Llama3Scaling{8, 4, 4, 8192}};
  EXPECT_NE(ndt::testing::error_of([&] {
              models::rope_tables(pos, 8, bad, DType::f32);
            }).find("low_freq_factor < high_freq_factor"),
            std::string::npos);
}
