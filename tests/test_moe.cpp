// The mixture-of-experts ops (autograd/ops/moe.cpp) against naive references written here:
// the router's top k (ties as torch.topk), moe_sort's order and counts, grouped_matmul row by
// row, and a whole MoE block token by token and expert by expert; and their shape errors.
// Their gradients: tests/test_gradcheck_ops.cpp (the moe_* op cases); CUDA: tests/test_cuda_ops.cpp.
// Legend: N tokens, E experts, k choices per token, C channels, H an expert's hidden width.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "autograd/engine.h"
#include "autograd/ops.h"
#include "support/op_cases.h"
#include "support/testing.h"

using namespace ndt;
using namespace ndt::testing;

namespace {

const Device kCpu = Device::cpu();

// The experts of one row of probs, largest first, ties to the lower index: a stable sort.
std::vector<int32_t> ranked(const std::vector<double>& row) {
  std::vector<int32_t> idx(row.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return row[a] > row[b]; });
  return idx;
}

double silu(double g) { return g / (1.0 + std::exp(-g)); }

}  // namespace

// Ties go to the lower expert; normalize divides by the chosen ones' sum.
TEST(MoeTopK, ValuesExpertsAndTies) {
  Tensor probs = Tensor::from_vector<double>({0.1, 0.3, 0.3, 0.2, /**/ 0.4, 0.1, 0.2, 0.3}, {2, 4});
  TopK t = moe_topk(probs, 2, false);
  EXPECT_EQ(t.experts.dtype(), DType::i32);
  EXPECT_EQ(t.experts.to_vector<int32_t>(), (std::vector<int32_t>{1, 2, 0, 3}));
  EXPECT_EQ(t.values.to_vector<double>(), (std::vector<double>{0.3, 0.3, 0.4, 0.3}));
  TopK tn = moe_topk(probs, 2, true);
  EXPECT_EQ(tn.experts.to_vector<int32_t>(), (std::vector<int32_t>{1, 2, 0, 3}));
  const std::vector<double> v = tn.values.to_vector<double>();
  const std::vector<double> want = {0.5, 0.5, 0.4 / 0.7, 0.3 / 0.7};
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(v[i], want[i], 1e-15) << i;
}

// Random rows in f32 and bf16 (bf16 has many ties) against a stable sort of each row.
TEST(MoeTopK, MatchesAStableSortOfEachRow) {
  for (DType dt : {DType::f32, DType::bf16, DType::f64}) {
    const int64_t N = 40, E = 9, k = 4;
    Tensor probs = softmax(randn({N, E}, dt, kCpu, 1, 0.0f, 0.5f));
    TopK t = moe_topk(probs, k, false);
    const std::vector<double> p = probs.to_vector<double>(), v = t.values.to_vector<double>();
    const std::vector<int32_t> ex = t.experts.to_vector<int32_t>();
    for (int64_t n = 0; n < N; ++n) {
      const std::vector<int32_t> r = ranked(std::vector<double>(p.begin() + n * E, p.begin() + (n + 1) * E));
      for (int64_t j = 0; j < k; ++j) {
        EXPECT_EQ(ex[n * k + j], r[j]) << dtype_name(dt) << " row " << n << " choice " << j;
        EXPECT_EQ(v[n * k + j], p[n * E + r[j]]) << dtype_name(dt) << " row " << n << " choice " << j;
      }
    }
  }
}

// order lists the choices n*k + j expert by expert, in token order within an expert.
TEST(MoeSort, OrderAndCounts) {
  Tensor experts = Tensor::from_vector<int32_t>({2, 0, /**/ 0, 2, /**/ 1, 2}, {3, 2});
  MoeRouting r = moe_sort(experts, 4);
  EXPECT_EQ(r.tokens, 3);
  EXPECT_EQ(r.k, 2);
  EXPECT_EQ(r.counts, (std::vector<int64_t>{2, 1, 3, 0}));
  EXPECT_EQ(r.order.dtype(), DType::i32);
  EXPECT_EQ(r.order.to_vector<int32_t>(), (std::vector<int32_t>{1, 2, 4, 0, 3, 5}));
}

// Sorted rows are the tokens' copies, in order's order.
TEST(MoeDispatch, CopiesEachTokenOncePerChoice) {
  Tensor x = randn({3, 5}, DType::f32, kCpu, 2);
  MoeRouting r = moe_sort(Tensor::from_vector<int32_t>({2, 0, 0, 2, 1, 2}, {3, 2}), 4);
  Tensor xs = moe_dispatch(x, r);
  ASSERT_EQ(xs.shape(), Shape({6, 5}));
  const std::vector<float> vx = x.to_vector<float>(), vs = xs.to_vector<float>();
  const std::vector<int32_t> token = {0, 1, 2, 0, 1, 2};  // order / k = {1,2,4,0,3,5} / 2
  for (int64_t row = 0; row < 6; ++row)
    for (int64_t c = 0; c < 5; ++c) EXPECT_EQ(vs[row * 5 + c], vx[token[row] * 5 + c]) << row << "," << c;
}

// Each row times its group's matrix, summed here in f64 one row at a time.
TEST(GroupedMatmul, MatchesARowByRowProduct) {
  const std::vector<int64_t> counts = {3, 0, 5, 2};
  Tensor x = randn({10, 7}, DType::f64, kCpu, 3), w = randn({4, 7, 6}, DType::f64, kCpu, 4);
  const std::vector<double> out = grouped_matmul(x, w, counts).to_vector<double>();
  const std::vector<double> vx = x.to_vector<double>(), vw = w.to_vector<double>();
  int64_t row = 0;
  for (int64_t g = 0; g < 4; ++g)
    for (int64_t i = 0; i < counts[g]; ++i, ++row)
      for (int64_t o = 0; o < 6; ++o) {
        double s = 0;
        for (int64_t c = 0; c < 7; ++c) s += vx[row * 7 + c] * vw[(g * 7 + c) * 6 + o];
        EXPECT_NEAR(out[row * 6 + o], s, 1e-12) << "row " << row << " out " << o;
      }
}

// In f32 (on a CPU one sgemm per group, whatever the row counts), forward and both gradients
// equal the f64 op's on the same values: the three GEMMs (x w, dout w^T, x^T dout) in f32.
TEST(GroupedMatmul, F32MatchesF64ForwardAndBackward) {
  const std::vector<int64_t> counts = {3, 0, 5, 2};
  Tensor x = randn({10, 7}, DType::f64, kCpu, 3), w = randn({4, 7, 6}, DType::f64, kCpu, 4);
  Tensor dout = randn({10, 6}, DType::f64, kCpu, 5);
  std::vector<std::vector<double>> got[2];  // f64, f32: out, dx, dw
  for (int i = 0; i < 2; ++i) {
    const DType dt = i == 0 ? DType::f64 : DType::f32;
    Tensor xi = x.to(dt).set_requires_grad(true), wi = w.to(dt).set_requires_grad(true);
    Tensor out = grouped_matmul(xi, wi, counts);
    backward(sum(mul(out, dout.to(dt))));  // d sum(out * dout) / d out = dout
    for (const Tensor& t : {out, xi.grad(), wi.grad()}) got[i].push_back(t.to_vector<double>());
  }
  for (size_t t = 0; t < 3; ++t) {
    ASSERT_EQ(got[0][t].size(), got[1][t].size());
    for (size_t e = 0; e < got[0][t].size(); ++e)
      EXPECT_NEAR(got[1][t][e], got[0][t][e], 1e-4) << "result " << t << " element " << e;
  }
  // the empty group's weights took no part: their gradient is zero
  for (size_t e = 42; e < 84; ++e) EXPECT_EQ(got[1][2][e], 0.0) << e;
}

// A second backward adds onto the weight's .grad (the GEMM writes the first into it and adds
// the second, beta 1): twice the gradient, the empty group's still zero.
TEST(GroupedMatmul, WeightGradientsAccumulateOverBackwards) {
  const std::vector<int64_t> counts = {3, 0, 5, 2};
  for (DType dt : {DType::f64, DType::f32}) {
    Tensor x = randn({10, 7}, dt, kCpu, 3), w = randn({4, 7, 6}, dt, kCpu, 4).set_requires_grad(true);
    Tensor dout = randn({10, 6}, dt, kCpu, 5);
    backward(sum(mul(grouped_matmul(x, w, counts), dout)));
    const std::vector<double> once = w.grad().to_vector<double>();
    backward(sum(mul(grouped_matmul(x, w, counts), dout)));
    const std::vector<double> twice = w.grad().to_vector<double>();
    for (size_t e = 0; e < once.size(); ++e) {
      EXPECT_NEAR(twice[e], 2 * once[e], 1e-5 * (1 + std::abs(once[e]))) << e;
      if (e >= 42 && e < 84) EXPECT_EQ(twice[e], 0.0) << e;
    }
  }
}

// Dispatch then combine, forward and backward, in f32 and bf16 equal f64 on the same values:
// the CPU kernels' row loops (f32 at the vector width, bf16 through f32) on C = 37 channels,
// not a multiple of any vector width.
TEST(MoeCombine, F32AndBf16MatchF64ForwardAndBackward) {
  const int64_t N = 6, C = 37, E = 4, k = 3;
  MoeRouting r = moe_sort(
      Tensor::from_vector<int32_t>({2, 0, 1, 0, 3, 2, 1, 2, 3, 0, 1, 3, 3, 2, 0, 1, 0, 2}, {N, k}), E);
  Tensor x = randn({N, C}, DType::f64, kCpu, 20), w = randn({N, k}, DType::f64, kCpu, 21);
  Tensor dout = randn({N, C}, DType::f64, kCpu, 22);
  std::vector<std::vector<double>> got[3];  // f64, f32, bf16: out, dx, dw
  const DType dts[3] = {DType::f64, DType::f32, DType::bf16};
  for (int i = 0; i < 3; ++i) {
    Tensor xi = x.to(dts[i]).set_requires_grad(true), wi = w.to(dts[i]).set_requires_grad(true);
    Tensor out = moe_combine(moe_dispatch(xi, r), wi, r);  // out[n] = sum_j w[n,j] x[n]
    backward(sum(mul(out, dout.to(dts[i]))));
    for (const Tensor& t : {out, xi.grad(), wi.grad()}) got[i].push_back(t.to_vector<double>());
  }
  for (int i = 1; i < 3; ++i)
    for (size_t t = 0; t < 3; ++t)
      for (size_t e = 0; e < got[0][t].size(); ++e)
        EXPECT_NEAR(got[i][t][e], got[0][t][e], (i == 1 ? 1e-5 : 6e-2) * (1 + std::abs(got[0][t][e])))
            << "dtype " << i << " result " << t << " element " << e;
}

// The whole block, as transformers' Qwen3-MoE / Mixtral compute it, token by token:
// out[n] = sum over the top k experts e of w_e * down_e(silu(gate_e x) * up_e x).
TEST(MoeBlock, MatchesATokenByTokenReference) {
  const int64_t N = 11, C = 6, H = 5, E = 4, k = 2;
  for (bool normalize : {true, false}) {
    Tensor x = randn({N, C}, DType::f64, kCpu, 10), wr = randn({C, E}, DType::f64, kCpu, 11);
    Tensor wg = randn({E, C, H}, DType::f64, kCpu, 12), wu = randn({E, C, H}, DType::f64, kCpu, 13);
    Tensor wd = randn({E, H, C}, DType::f64, kCpu, 14);
    TopK t = moe_topk(softmax(matmul(x, wr)), k, normalize);
    MoeRouting r = moe_sort(t.experts, E);
    Tensor xs = moe_dispatch(x, r);
    Tensor h = silu_mul(grouped_matmul(xs, wg, r.counts), grouped_matmul(xs, wu, r.counts));
    const std::vector<double> out =
        moe_combine(grouped_matmul(h, wd, r.counts), t.values, r).to_vector<double>();

    const std::vector<double> vx = x.to_vector<double>(), vr = wr.to_vector<double>(),
                              vg = wg.to_vector<double>(), vu = wu.to_vector<double>(),
                              vd = wd.to_vector<double>();
    for (int64_t n = 0; n < N; ++n) {
      std::vector<double> probs(E), ref(C, 0.0);
      double zmax = -1e300, zsum = 0;
      for (int64_t e = 0; e < E; ++e) {
        for (int64_t c = 0; c < C; ++c) probs[e] += vx[n * C + c] * vr[c * E + e];
        zmax = std::max(zmax, probs[e]);
      }
      for (double& p : probs) zsum += (p = std::exp(p - zmax));
      for (double& p : probs) p /= zsum;
      const std::vector<int32_t> top = ranked(probs);
      double chosen = 0;
      for (int64_t j = 0; j < k; ++j) chosen += probs[top[j]];
      for (int64_t j = 0; j < k; ++j) {
        const int64_t e = top[j];
        const double weight = normalize ? probs[e] / chosen : probs[e];
        for (int64_t o = 0; o < C; ++o) {
          double y = 0;
          for (int64_t i = 0; i < H; ++i) {
            double g = 0, u = 0;
            for (int64_t c = 0; c < C; ++c) {
              g += vx[n * C + c] * vg[(e * C + c) * H + i];
              u += vx[n * C + c] * vu[(e * C + c) * H + i];
            }
            y += silu(g) * u * vd[(e * H + i) * C + o];
          }
          ref[o] += weight * y;
        }
      }
      for (int64_t o = 0; o < C; ++o)
        EXPECT_NEAR(out[n * C + o], ref[o], 1e-12) << "token " << n << " channel " << o;
    }
  }
}

// Shape errors name the op and what to fix.
TEST(MoeErrors, NameTheOpAndTheShapes) {
  Tensor x = randn({10, 4}, DType::f32, kCpu, 5), w = randn({3, 4, 2}, DType::f32, kCpu, 6);
  std::string e = error_of([&] { grouped_matmul(x, w, {3, 3, 3}); });
  EXPECT_NE(e.find("grouped_matmul: the group counts sum to 9"), std::string::npos) << e;
  e = error_of([&] { grouped_matmul(x, w, {5, 5}); });
  EXPECT_NE(e.find("grouped_matmul: 2 group counts for the 3 groups"), std::string::npos) << e;
  e = error_of([&] { grouped_matmul(x, randn({3, 5, 2}, DType::f32, kCpu, 6), {3, 3, 4}); });
  EXPECT_NE(e.find("grouped_matmul: expected x (M, in) and w (G, in, out)"), std::string::npos) << e;

  Tensor probs = softmax(randn({6, 4}, DType::f32, kCpu, 7));
  e = error_of([&] { moe_topk(probs, 5, true); });
  EXPECT_NE(e.find("moe_topk: k = 5 must be in [1, E] for the 4 experts"), std::string::npos) << e;

  e = error_of([&] { moe_sort(Tensor::from_vector<int32_t>({0, 4}, {1, 2}), 4); });
  EXPECT_NE(e.find("moe_sort: experts[0, 1] = 4 is outside [0, 4)"), std::string::npos) << e;
  e = error_of([&] { moe_sort(probs, 4); });
  EXPECT_NE(e.find("moe_sort: experts must be (N, k) int32"), std::string::npos) << e;

  MoeRouting r = moe_sort(moe_topk(probs, 2, true).experts, 4);  // 6 tokens
  e = error_of([&] { moe_dispatch(x, r); });
  EXPECT_NE(e.find("moe_dispatch: the routing is for 6 tokens but the input has 10 rows"), std::string::npos)
      << e;
  e = error_of([&] {
    moe_combine(randn({12, 3}, DType::f32, kCpu, 8), randn({6, 3}, DType::f32, kCpu, 9), r);
  });
  EXPECT_NE(e.find("moe_combine: weights must be (N, k) with k = 2"), std::string::npos) << e;
  e = error_of([&] {
    moe_combine(randn({11, 3}, DType::f32, kCpu, 8), randn({6, 2}, DType::f32, kCpu, 9), r);
  });
  EXPECT_NE(e.find("moe_combine: y must be (N*k, C) = (12, C)"), std::string::npos) << e;
  e = error_of([&] {
    moe_combine(randn({12, 3}, DType::f32, kCpu, 8), randn({6, 2}, DType::f64, kCpu, 9), r);
  });
  EXPECT_NE(e.find("moe_combine: dtype mismatch"), std::string::npos) << e;
}
