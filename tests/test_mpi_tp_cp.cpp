// Tensor and context parallelism at the layer level, under mpirun (2, 3 and 4 ranks), in
// float64, each against the unsharded computation on the same inputs: a transformer block
// split over tp (outputs, input gradients, every parameter's gradient), the vocabulary-
// parallel embedding and cross-entropy (with ignored targets and padded vocabulary rows),
// and ring attention over cp head-tail chunks (outputs and dq, dk, dv); the bytes each
// sends against the analytic volume; ring attention's memory against the whole attention.
#include <gtest/gtest.h>

#include <cmath>

#include "autograd/engine.h"
#include "autograd/ops.h"
#include "dist/context_parallel/ring_attention.h"
#include "dist/tensor_parallel/comm.h"
#include "dist/tensor_parallel/tensor_parallel.h"
#include "dist_testing.h"
#include "nn/flat.h"
#include "nn/layers.h"
#include "tensor/kernels.h"

using namespace ndt;

namespace {

Tensor randn(const Shape& s, uint64_t stream, bool grad = false) {
  Tensor t = Tensor::empty(s, DType::f64);
  kernels::fill_normal(t, 17, stream, 0, 0.0f, 1.0f);
  if (grad) t.set_requires_grad(true);
  return t;
}

// The largest difference, relative to the largest magnitude of the reference a.
double max_diff(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  std::vector<double> x = a.contiguous().to_vector<double>(), y = b.contiguous().to_vector<double>();
  double m = 0, scale = 1e-300;
  for (size_t i = 0; i < std::min(x.size(), y.size()); ++i) {
    m = std::max(m, std::abs(x[i] - y[i]));
    scale = std::max(scale, std::abs(x[i]));
  }
  return m / scale;
}

TEST(TensorParallel, BlockEqualsTheWholeBlock) {
  auto& tp = *ndt::testing::world();
  const int64_t C = 24, NH = 12, B = 2, T = 5;  // 12 heads and 96 hidden units divide by 2, 3, 4
  nn::Block whole(C, NH, 0.3f, 0.2f), part(C, NH, 0.3f, 0.2f);
  dist::apply_tensor_parallel(part, tp);
  nn::FlatParams wp = nn::materialize({{"b", whole.parameters("b")}}, Device::cpu(), DType::f64, 5);
  nn::FlatParams pp = nn::materialize({{"b", part.parameters("b")}}, Device::cpu(), DType::f64, 5);
  // each rank holds 1/tp of the split matrices and biases, all of the LayerNorms
  int64_t split_whole = 0, split_part = 0;
  for (const nn::FlatParam& f : pp.units[0].params)
    if (f.spec.tp.split()) {
      split_part += numel_of(f.spec.shape);
      split_whole += numel_of(f.spec.global_shape());
    } else {
      const bool norm = f.spec.name.find(".ln_") != std::string::npos;
      const bool row_bias = f.spec.name.size() > 11 && f.spec.name.substr(f.spec.name.size() - 11) == "c_proj.bias";
      EXPECT_TRUE(norm || row_bias) << f.spec.name << ": only LayerNorms and row-parallel biases stay whole";
    }
  EXPECT_EQ(split_part * tp.size(), split_whole);
  // random values everywhere (biases and LayerNorms start at 0 and 1), the part's its slice
  for (const nn::FlatParam& f : pp.units[0].params) {
    const Tensor v = randn(f.spec.global_shape(), nn::name_hash(f.spec.name) % 100000);
    wp.find(f.spec.name)->value.copy_(v);
    f.value.copy_(dist::slice_param(f.spec, v));
  }
  Tensor x = randn({B, T, C}, 1, true), xp = randn({B, T, C}, 1, true), w = randn({B, T, C}, 2);
  Tensor y = whole.forward(x);
  backward(sum(mul(y, w)));
  tp.reset_stats();
  Tensor yp = part.forward(xp);
  EXPECT_LT(max_diff(y, yp), 1e-12) << "outputs";
  backward(sum(mul(yp, w)));
  // g after attention and after the MLP in forward, f before each in backward
  const int64_t n = tp.size(), bytes = B * T * C * 8;
  EXPECT_EQ(tp.stats()[dist::CommKind::kAllReduce], 4 * (2 * (n - 1) * bytes / n));
  EXPECT_LT(max_diff(x.grad(), xp.grad()), 1e-12) << "input gradients";
  for (const nn::FlatParam& f : pp.units[0].params) {
    const Tensor g = dist::gather_param(f.spec, f.value.grad(), tp);
    EXPECT_LT(max_diff(wp.find(f.spec.name)->value.grad(), g), 1e-12) << f.spec.name;
  }
}

}  // namespace

namespace {

TEST(TensorParallel, VocabParallelEmbeddingAndCrossEntropy) {
  auto& tp = *ndt::testing::world();
  const int64_t n = tp.size(), Vp = 12 * 4, V = 41, C = 6, N = 14;  // Vp rows, the last 7 padding
  const int64_t Vl = Vp / n, v_start = tp.rank() * Vl, v_live = std::clamp<int64_t>(V - v_start, 0, Vl);
  // embedding: the whole table against this rank's rows
  Tensor table = randn({Vp, C}, 3, true), part = randn({Vp, C}, 3).narrow(0, v_start, Vl).contiguous();
  part.set_requires_grad(true);
  std::vector<int32_t> idv;
  for (int64_t i = 0; i < N; ++i) idv.push_back(static_cast<int32_t>((i * 7 + 3) % V));
  Tensor ids = Tensor::from_vector(idv, {N}), w = randn({N, C}, 4);
  Tensor e = embedding(ids, table), ep = dist::vocab_parallel_embedding(ids, part, v_start, tp);
  EXPECT_LT(max_diff(e, ep), 1e-12);
  backward(sum(mul(e, w)));
  backward(sum(mul(ep, w)));
  EXPECT_LT(max_diff(table.grad().narrow(0, v_start, Vl), part.grad()), 1e-12);
  // cross-entropy: whole logits (padded columns excluded, -1 ignored) against the slices
  Tensor logits = randn({N, Vp}, 5, true), lp = randn({N, Vp}, 5).narrow(1, v_start, Vl).contiguous();
  lp.set_requires_grad(true);
  std::vector<int32_t> tv;
  for (int64_t i = 0; i < N; ++i) tv.push_back(i % 5 == 2 ? -1 : static_cast<int32_t>((i * 11 + 1) % V));
  Tensor targets = Tensor::from_vector(tv, {N});
  Tensor l = cross_entropy(logits, targets, -1, V);
  tp.reset_stats();
  Tensor lpar = dist::vocab_parallel_cross_entropy(lp, targets, v_start, v_live, -1, tp);
  EXPECT_NEAR(l.item(), lpar.item(), 1e-12);
  EXPECT_EQ(tp.stats()[dist::CommKind::kAllReduce], 3 * (2 * (n - 1) * (N * 8) / n))
      << "max, sum of exp, target";
  backward(l);
  backward(lpar);
  EXPECT_LT(max_diff(logits.grad().narrow(1, v_start, Vl), lp.grad()), 1e-12);
}

TEST(ContextParallel, RingAttentionEqualsAttention) {
  auto& cp = *ndt::testing::world();
  const int64_t n = cp.size(), r = cp.rank(), B = 2, NH = 3, HS = 4, Tc = 3, T = 2 * n * Tc;
  Tensor q = randn({B, NH, T, HS}, 6, true), k = randn({B, NH, T, HS}, 7, true),
         v = randn({B, NH, T, HS}, 8, true);
  Tensor w = randn({B, NH, T, HS}, 9);
  Tensor out = attention(q, k, v).out;
  backward(sum(mul(out, w)));
  // this rank's head and tail chunks of (B, NH, T, HS)
  auto mine = [&](const Tensor& t) {
    Tensor m = Tensor::empty({B, NH, 2 * Tc, HS}, DType::f64);
    m.narrow(2, 0, Tc).copy_(t.narrow(2, r * Tc, Tc));
    m.narrow(2, Tc, Tc).copy_(t.narrow(2, (2 * n - 1 - r) * Tc, Tc));
    return m;
  };
  Tensor ql = mine(q.detach()), kl = mine(k.detach()), vl = mine(v.detach());
  for (Tensor* t : {&ql, &kl, &vl}) t->set_requires_grad(true);
  cp.reset_stats();
  Tensor ol = dist::ring_attention(ql, kl, vl, cp);
  EXPECT_LT(max_diff(ol, mine(out.detach())), 1e-12) << "outputs";
  backward(sum(mul(ol, mine(w))));
  EXPECT_LT(max_diff(ql.grad(), mine(q.grad())), 1e-12) << "dq";
  EXPECT_LT(max_diff(kl.grad(), mine(k.grad())), 1e-12) << "dk (came back around the ring)";
  EXPECT_LT(max_diff(vl.grad(), mine(v.grad())), 1e-12) << "dv";
  // forward: n-1 K/V blocks sent; backward: n-1 gradient blocks of the same size
  const int64_t block = B * NH * 2 * Tc * 2 * HS * 8;
  EXPECT_EQ(cp.stats()[dist::CommKind::kSend], 2 * (n - 1) * block);
}

TEST(ContextParallel, RingAttentionHoldsOneScoreBlockAtATime) {
  auto& cp = *ndt::testing::world();
  const int64_t n = cp.size(), B = 1, NH = 2, HS = 4, T = 2 * n * 128;  // scores dominate
  auto peak_of = [](const std::function<void()>& f) {
    const int64_t base = memory_stats(Device::cpu()).in_use;
    reset_peak_memory(Device::cpu());
    f();
    return memory_stats(Device::cpu()).peak - base;
  };
  const int64_t whole = peak_of([&] {
    Tensor q = randn({B, NH, T, HS}, 1, true), k = randn({B, NH, T, HS}, 2, true),
           v = randn({B, NH, T, HS}, 3, true);
    backward(sum(attention(q, k, v).out));
  });
  const int64_t ring = peak_of([&] {
    const int64_t L = T / n;
    Tensor q = randn({B, NH, L, HS}, 1, true), k = randn({B, NH, L, HS}, 2, true),
           v = randn({B, NH, L, HS}, 3, true);
    backward(sum(dist::ring_attention(q, k, v, cp)));
  });
  // the whole attention keeps its (T x T) probabilities for backward; the ring one block of
  // (T/2n x T/2n) at a time, besides activations of size T/n: well under 1/n^2 of the whole
  std::printf(
      "rank %d: attention peak %lld bytes, ring attention over %lld ranks %lld bytes (%.3f; 1/cp^2 = %.3f)\n",
      cp.rank(), static_cast<long long>(whole), static_cast<long long>(n), static_cast<long long>(ring),
      static_cast<double>(ring) / static_cast<double>(whole), 1.0 / static_cast<double>(n * n));
  EXPECT_LT(ring, whole / (n * n));
}

}  // namespace
