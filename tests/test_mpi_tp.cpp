// Tensor parallelism (TP) at the layer level, under mpirun (2, 3 and 4 ranks), in float64,
// each against the unsharded computation on the same inputs: a transformer block split
// over tp (outputs, input gradients, every parameter's gradient; only LayerNorms and
// row-parallel biases stay whole), and the vocabulary-parallel embedding and cross-entropy
// (with ignored targets and padded vocabulary rows); the bytes each all-reduces against
// the analytic volume.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "autograd/ops.h"
#include "dist/tensor_parallel/comm.h"
#include "dist/tensor_parallel/tensor_parallel.h"
#include "dist_testing.h"
#include "nn/flat.h"
#include "nn/layers.h"

using namespace ndt;
using namespace ndt::testing;  // world, randn, max_diff (tests/dist/dist_testing.h)

namespace {

// Random values in every parameter of the whole model `wp` (biases and norms start at 0 and
// 1), and in the split model `pp` this rank's slice of the same values.
void set_random_values(const nn::FlatParams& wp, const nn::FlatParams& pp) {
  for (const nn::FlatParam& f : pp.units[0].params) {
    const Tensor v = randn(f.spec.global_shape(), nn::name_hash(f.spec.name) % 100000);
    wp.find(f.spec.name)->value.copy_(v);
    f.value.copy_(dist::slice_param(f.spec, v));
  }
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
      const bool row_bias =
          f.spec.name.size() > 11 && f.spec.name.substr(f.spec.name.size() - 11) == "c_proj.bias";
      EXPECT_TRUE(norm || row_bias) << f.spec.name << ": only LayerNorms and row-parallel biases stay whole";
    }
  EXPECT_EQ(split_part * tp.size(), split_whole);
  set_random_values(wp, pp);
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

// The Llama family's MLP (SwiGLU, no biases) through the same two layer kinds, one
// LinearComm each: gate and up column-parallel, down row-parallel. Outputs, input gradients
// and every weight's gradient equal the whole MLP's; one all-reduce forward (g) and one per
// column-parallel linear backward (f, under its weight gradient's GEMM).
TEST(TensorParallel, SwiGluMlpEqualsTheWholeMlp) {
  auto& tp = *ndt::testing::world();
  const int64_t C = 10, I = 24, B = 2, T = 3;  // 24 hidden units divide by 2, 3 and 4
  nn::SwiGLU whole(C, I, 0.3f, 0.2f), part(C, I, 0.3f, 0.2f);
  dist::apply_tensor_parallel(part, tp);
  nn::FlatParams wp = nn::materialize({{"mlp", whole.parameters("mlp")}}, Device::cpu(), DType::f64, 5);
  nn::FlatParams pp = nn::materialize({{"mlp", part.parameters("mlp")}}, Device::cpu(), DType::f64, 5);
  for (const nn::FlatParam& f : pp.units[0].params)
    EXPECT_TRUE(f.spec.tp.split()) << f.spec.name << ": every weight is split";
  set_random_values(wp, pp);
  Tensor x = randn({B, T, C}, 1, true), xp = randn({B, T, C}, 1, true), w = randn({B, T, C}, 2);
  Tensor y = whole.forward(x);
  backward(sum(mul(y, w)));
  tp.reset_stats();
  Tensor yp = part.forward(xp);
  EXPECT_LT(max_diff(y, yp), 1e-12) << "outputs";
  backward(sum(mul(yp, w)));
  const int64_t n = tp.size(), bytes = B * T * C * 8;
  EXPECT_EQ(tp.stats()[dist::CommKind::kAllReduce], 3 * (2 * (n - 1) * bytes / n));
  EXPECT_LT(max_diff(x.grad(), xp.grad()), 1e-12) << "input gradients";
  for (const nn::FlatParam& f : pp.units[0].params)
    EXPECT_LT(max_diff(wp.find(f.spec.name)->value.grad(), dist::gather_param(f.spec, f.value.grad(), tp)),
              1e-12)
        << f.spec.name;
}

// Sequence parallelism: the block's input and output in parts of the sequence (rank q holds
// positions [q T/n, (q+1) T/n)); the LayerNorms' and row-parallel biases' gradients are
// partial on each rank, their sum over the group the whole block's. The column-parallel
// layers gather their input again in backward (linear_shared_input).
TEST(TensorParallel, SequenceParallelBlockEqualsTheWholeBlock) {
  auto& tp = *ndt::testing::world();
  const int64_t C = 24, NH = 12, B = 2, T = 12;  // T divides by 2, 3 and 4
  const int64_t n = tp.size(), Ts = T / n, r = tp.rank();
  nn::Block whole(C, NH, 0.3f, 0.2f), part(C, NH, 0.3f, 0.2f);
  dist::SequenceSplit split;
  split.sequence_parallel = true;
  dist::apply_tensor_parallel(part, tp, &split);
  nn::FlatParams wp = nn::materialize({{"b", whole.parameters("b")}}, Device::cpu(), DType::f64, 5);
  nn::FlatParams pp = nn::materialize({{"b", part.parameters("b")}}, Device::cpu(), DType::f64, 5);
  set_random_values(wp, pp);
  Tensor x = randn({B, T, C}, 1, true), w = randn({B, T, C}, 2);
  Tensor xp = x.detach().narrow(1, r * Ts, Ts).contiguous().clone();
  xp.set_requires_grad(true);
  const Tensor wpart = w.narrow(1, r * Ts, Ts).contiguous();
  Tensor y = whole.forward(x);
  backward(sum(mul(y, w)));
  tp.reset_stats();
  Tensor yp = part.forward(xp);  // (B, T/n, C): this rank's positions
  ASSERT_EQ(yp.shape(), Shape({B, Ts, C}));
  EXPECT_LT(max_diff(y.narrow(1, r * Ts, Ts).contiguous(), yp), 1e-12) << "outputs";
  backward(sum(mul(yp, wpart)));
  // forward: an all-gather before each column-parallel layer and a reduce-scatter after
  // each row-parallel one; backward: the same again the other way round, and each
  // column-parallel layer's input gathered once more; the bytes of plain TP's all-reduces
  const int64_t bytes = B * T * C * 8, sent = (n - 1) * bytes / n;
  EXPECT_EQ(tp.stats()[dist::CommKind::kAllGather], 6 * sent);
  EXPECT_EQ(tp.stats()[dist::CommKind::kReduceScatter], 4 * sent);
  EXPECT_EQ(tp.stats()[dist::CommKind::kAllReduce], 0);
  EXPECT_LT(max_diff(x.grad().narrow(1, r * Ts, Ts).contiguous(), xp.grad()), 1e-12) << "input gradients";
  for (const nn::FlatParam& f : pp.units[0].params) {
    Tensor g = f.value.grad().clone();
    if (!f.spec.tp.split()) tp.all_reduce(g, dist::ReduceOp::kSum)->wait();  // partial: this rank's positions
    g = dist::gather_param(f.spec, g, tp);
    EXPECT_LT(max_diff(wp.find(f.spec.name)->value.grad(), g), 1e-12) << f.spec.name;
  }
}

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

}  // namespace
