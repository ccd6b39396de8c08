// The arithmetic that ring attention and vocabulary-parallel cross-entropy rest on, checked
// in one process (label unit): partial results computed the way each rank computes them and
// combined by hand equal the single-device ops, forward and backward.
//   - merge_attention over key blocks [0,a) and [a,T) (and three blocks, in either order)
//     equals the whole attention (attention_composed) over all keys, including blocks no
//     query can see;
//   - rowmax / cross_entropy_partials / cross_entropy_parallel_backward over 1 to 4
//     vocabulary slices equal cross_entropy() (padded vocabulary, ignored rows).
// Legend: B batch, NH heads, T time, HS head size, N rows, V vocab, Vl local vocab.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "autograd/ops.h"
#include "support/op_cases.h"
#include "tensor/kernels.h"

using namespace ndt;
using ndt::testing::randn;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
double tol_for(DType dt) { return dt == DType::f64 ? 1e-12 : 1e-5; }
DType stat_dtype_of(DType dt) { return dt == DType::f64 ? DType::f64 : DType::f32; }  // lse, sumexp, ...

// |got - want| <= tol * max(1, |want|) element by element; equal infinities match.
void expect_close(const Tensor& got, const Tensor& want, double tol, const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  const std::vector<double> g = got.to_vector<double>(), w = want.to_vector<double>();
  int bad = 0;
  for (size_t i = 0; i < w.size() && bad < 5; ++i) {
    const bool ok = g[i] == w[i] || std::fabs(g[i] - w[i]) <= tol * std::max(1.0, std::fabs(w[i]));
    if (!ok) ++bad;
    EXPECT_TRUE(ok) << what << ": element " << i << " is " << g[i] << ", expected " << w[i];
  }
}

bool all_neg_inf(const Tensor& t) {
  const std::vector<double> v = t.to_vector<double>();
  return std::all_of(v.begin(), v.end(), [](double x) { return x == -kInf; });
}

// Keys [start, start+len) of k (B,NH,T,HS) as a fresh tensor (no graph).
Tensor key_block(const Tensor& k, int64_t start, int64_t len) { return k.narrow(2, start, len).contiguous(); }

// Attention of q (global positions q_off..) against the key blocks cut at `cuts`
// (0 = c_0 < c_1 < ... < c_m = T), each block computed alone, merged in block order or in
// reverse order.
AttentionOut ring_attention(const Tensor& q, const std::vector<Tensor>& k_blocks,
                            const std::vector<Tensor>& v_blocks, const std::vector<int64_t>& cuts,
                            int64_t q_off, bool reverse) {
  AttentionOut acc;
  for (size_t s = 0; s < k_blocks.size(); ++s) {
    const size_t b = reverse ? k_blocks.size() - 1 - s : s;
    AttentionOut part = attention(q, k_blocks[b], v_blocks[b], q_off, cuts[b]);
    acc = s == 0 ? part : merge_attention(acc.out, acc.lse, part.out, part.lse);
  }
  return acc;
}

// The blocks of x (B,NH,T,HS) between the cuts, through differentiable ops so that
// gradients reach x: (B,NH,T,HS) -> (B,NH,HS,T) -> split -> back.
std::vector<Tensor> split_time(const Tensor& x, const std::vector<int64_t>& cuts) {
  std::vector<int64_t> sizes;
  for (size_t i = 1; i < cuts.size(); ++i) sizes.push_back(cuts[i] - cuts[i - 1]);
  std::vector<Tensor> parts = split_last(transpose(x, 2, 3), sizes);
  for (Tensor& p : parts) p = transpose(p, 2, 3);
  return parts;
}

}  // namespace

// ---- ring attention: merging over key blocks ----------------------------------------------

// Every split of the keys into two blocks (and one into three), merged in both orders, gives
// attention()'s out and lse. Query blocks at several offsets make some key blocks fully
// masked for every query (their lse is -inf throughout) and others masked for some rows.
TEST(RingMath, MergeOverKeyBlocksEqualsAttention) {
  const int64_t B = 2, NH = 3, T = 9, HS = 5;
  for (DType dt : {DType::f64, DType::f32}) {
    const double tol = tol_for(dt);
    Tensor q = randn({B, NH, T, HS}, dt, Device::cpu(), 1), k = randn({B, NH, T, HS}, dt, Device::cpu(), 2),
           v = randn({B, NH, T, HS}, dt, Device::cpu(), 3);
    int fully_masked_blocks = 0, partly_masked_blocks = 0;
    struct QBlock {
      int64_t q_off, tq;
    };
    for (QBlock qb : {QBlock{0, T}, QBlock{0, 4}, QBlock{6, 3}, QBlock{2, 3}}) {
      Tensor qc = q.narrow(2, qb.q_off, qb.tq).contiguous();
      AttentionOut ref = attention_composed(qc, k, v, qb.q_off, 0);
      std::vector<std::vector<int64_t>> splits = {{0, 1, T}, {0, 4, T}, {0, 6, T}, {0, 8, T}, {0, 3, 6, T}};
      for (const std::vector<int64_t>& cuts : splits) {
        std::vector<Tensor> kb, vb;
        for (size_t i = 1; i < cuts.size(); ++i) {
          kb.push_back(key_block(k, cuts[i - 1], cuts[i] - cuts[i - 1]));
          vb.push_back(key_block(v, cuts[i - 1], cuts[i] - cuts[i - 1]));
          const Tensor lse = attention(qc, kb.back(), vb.back(), qb.q_off, cuts[i - 1]).lse;
          if (all_neg_inf(lse)) {
            ++fully_masked_blocks;
          } else if (std::isinf(lse.to_vector<double>()[0])) {
            ++partly_masked_blocks;
          }
        }
        for (bool reverse : {false, true}) {
          std::string what = std::string(dtype_name(dt)) + " queries " + std::to_string(qb.q_off) + "+" +
                             std::to_string(qb.tq) + ", " + std::to_string(cuts.size() - 1) +
                             " blocks cut at " + std::to_string(cuts[1]) + (reverse ? ", reversed" : "");
          AttentionOut got = ring_attention(qc, kb, vb, cuts, qb.q_off, reverse);
          expect_close(got.out, ref.out, tol, what + ": out");
          expect_close(got.lse, ref.lse, tol, what + ": lse");
        }
      }
    }
    EXPECT_GT(fully_masked_blocks, 0) << "some key block is masked for every query";
    EXPECT_GT(partly_masked_blocks, 0) << "some key block is masked for some queries";
  }
}

// The gradients of q, k and v through the merge equal attention()'s, for a loss on both
// outputs, with and without a key block that no query sees.
TEST(RingMath, MergeGradientsEqualAttentionGradients) {
  const int64_t B = 2, NH = 2, T = 8, HS = 4;
  for (DType dt : {DType::f64, DType::f32}) {
    struct Setup {
      int64_t q_off, tq;
      std::vector<int64_t> cuts;
    };
    for (const Setup& s : {Setup{0, T, {0, 3, T}}, Setup{0, 4, {0, 5, T}}, Setup{4, 4, {0, 2, 4, 6, T}}}) {
      const std::string what = std::string(dtype_name(dt)) + " queries " + std::to_string(s.q_off) + "+" +
                               std::to_string(s.tq) + ", " + std::to_string(s.cuts.size() - 1) + " blocks";
      Tensor r_out = randn({B, NH, s.tq, HS}, dt, Device::cpu(), 10);
      Tensor r_lse = randn({B, NH, s.tq}, stat_dtype_of(dt), Device::cpu(), 11);
      auto leaves = [&] {
        std::vector<Tensor> l = {randn({B, NH, s.tq, HS}, dt, Device::cpu(), 1),
                                 randn({B, NH, T, HS}, dt, Device::cpu(), 2),
                                 randn({B, NH, T, HS}, dt, Device::cpu(), 3)};
        for (Tensor& t : l) t.set_requires_grad(true);
        return l;
      };
      // L = <out, r_out> + <lse, r_lse>
      auto loss = [&](const AttentionOut& a) {
        return add(sum(mul(a.out, r_out)), cast(sum(mul(a.lse, r_lse)), dt));
      };
      std::vector<Tensor> ref = leaves(), got = leaves();
      backward(loss(attention_composed(ref[0], ref[1], ref[2], s.q_off, 0)));
      std::vector<Tensor> kb = split_time(got[1], s.cuts), vb = split_time(got[2], s.cuts);
      backward(loss(ring_attention(got[0], kb, vb, s.cuts, s.q_off, /*reverse=*/true)));
      const char* names[] = {"dq", "dk", "dv"};
      for (int i = 0; i < 3; ++i)
        expect_close(got[i].grad(), ref[i].grad(), tol_for(dt), what + ": " + names[i]);
    }
  }
}

// Rows that saw no key in one part take the other part exactly; rows that saw none in
// either get out = 0, lse = -inf; no gradient is NaN.
TEST(RingMath, MergeOfRowsThatSawNoKey) {
  const double inf = kInf;
  // (B,NH,T,HS) = (1,1,3,2): row 0 saw keys only in a, row 1 only in b, row 2 in neither
  Tensor oa = Tensor::from_vector<double>({0.5, -1.0, 0.0, 0.0, 0.0, 0.0}, {1, 1, 3, 2});
  Tensor ob = Tensor::from_vector<double>({0.0, 0.0, 2.0, 0.25, 0.0, 0.0}, {1, 1, 3, 2});
  Tensor la = Tensor::from_vector<double>({0.3, -inf, -inf}, {1, 1, 3});
  Tensor lb = Tensor::from_vector<double>({-inf, 1.7, -inf}, {1, 1, 3});
  for (Tensor* t : {&oa, &ob, &la, &lb}) t->set_requires_grad(true);
  AttentionOut m = merge_attention(oa, la, ob, lb);
  EXPECT_EQ(m.out.to_vector<double>(), (std::vector<double>{0.5, -1.0, 2.0, 0.25, 0.0, 0.0}));
  EXPECT_EQ(m.lse.to_vector<double>(), (std::vector<double>{0.3, 1.7, -inf}));
  Tensor dout = Tensor::from_vector<double>({1.0, 2.0, 3.0, 4.0, 5.0, 6.0}, {1, 1, 3, 2});
  Tensor dlse = Tensor::from_vector<double>({0.5, -0.5, 7.0}, {1, 1, 3});
  backward({m.out, m.lse}, {dout, dlse});
  // the part that holds the row passes dout and dlse through; the other gets nothing
  EXPECT_EQ(oa.grad().to_vector<double>(), (std::vector<double>{1.0, 2.0, 0.0, 0.0, 0.0, 0.0}));
  EXPECT_EQ(ob.grad().to_vector<double>(), (std::vector<double>{0.0, 0.0, 3.0, 4.0, 0.0, 0.0}));
  EXPECT_EQ(la.grad().to_vector<double>(), (std::vector<double>{0.5, 0.0, 0.0}));
  EXPECT_EQ(lb.grad().to_vector<double>(), (std::vector<double>{0.0, -0.5, 0.0}));
}

// ---- vocabulary-parallel cross-entropy ------------------------------------------------------

// Logits (N, V) with the last V - v_limit columns padded, cut into contiguous slices as tensor
// parallelism holds them. Per slice: rowmax; gmax = max of the rowmaxes (the all-reduce);
// per slice: sumexp against gmax and the target logit; sums over slices (the all-reduce);
// loss = mean over kept rows of log(sumexp) + gmax - target_logit. Then each slice's dlogits.
// Loss and the concatenated dlogits equal cross_entropy()'s.
TEST(RingMath, VocabParallelCrossEntropyMatchesCrossEntropy) {
  const int64_t N = 13, V = 29, v_limit = 26, ignore = -100;
  std::vector<int32_t> tg = ndt::testing::random_ids({N}, v_limit, Device::cpu(), 7).to_vector<int32_t>();
  // targets on the edges of the slices below: the first and last live columns, the last
  // and first columns of neighbouring slices
  for (auto [n, t] : {std::pair{0, v_limit - 1}, {1, 0}, {3, 9}, {4, 10}, {5, 14}, {6, 15}, {8, 20}})
    tg[n] = static_cast<int32_t>(t);
  for (int64_t n : {2, 7, 11}) tg[n] = ignore;
  const int64_t kept = N - 3;
  Tensor targets = Tensor::from_vector<int32_t>(tg, {N});
  // slice sizes; the last cut of 4 holds only padding (v_live = 0)
  const std::vector<std::vector<int64_t>> slicings = {{29}, {15, 14}, {10, 10, 9}, {10, 10, 6, 3}};
  for (DType dt : {DType::f64, DType::f32}) {
    const double tol = tol_for(dt);
    const DType sd = stat_dtype_of(dt);
    Tensor logits = randn({N, V}, dt, Device::cpu(), 5, 0.0f, 2.0f).set_requires_grad(true);
    Tensor ref_loss = cross_entropy(logits, targets, ignore, v_limit);
    backward(ref_loss);
    const Tensor ref_grad = logits.grad();
    for (const std::vector<int64_t>& sizes : slicings) {
      const std::string what = std::string(dtype_name(dt)) + ", " + std::to_string(sizes.size()) + " slices";
      struct Slice {
        int64_t start, len, live;
        Tensor logits;
      };
      std::vector<Slice> slices;
      int64_t start = 0;
      for (int64_t len : sizes) {
        const int64_t live = std::clamp<int64_t>(v_limit - start, 0, len);
        slices.push_back({start, len, live, logits.detach().narrow(1, start, len).contiguous()});
        start += len;
      }
      ASSERT_EQ(start, V);
      // gmax: max over the slices' rowmax
      std::vector<double> gmax(N, -kInf);
      for (const Slice& s : slices) {
        Tensor m = Tensor::empty({N}, sd);
        kernels::rowmax(s.logits, s.live, m);
        const std::vector<double> mv = m.to_vector<double>();
        if (s.live == 0) EXPECT_TRUE(all_neg_inf(m)) << what << ": a slice of padding has no max";
        for (int64_t n = 0; n < N; ++n) gmax[n] = std::max(gmax[n], mv[n]);
      }
      Tensor gmax_t = Tensor::from_vector<double>(gmax, {N}).to(sd);
      // sumexp and the target logit, summed over slices
      std::vector<double> sumexp(N, 0.0), target_logit(N, 0.0);
      for (const Slice& s : slices) {
        Tensor se = Tensor::empty({N}, sd), tl = Tensor::empty({N}, sd);
        kernels::cross_entropy_partials(s.logits, targets, gmax_t, s.start, s.live, ignore, se, tl);
        const std::vector<double> sev = se.to_vector<double>(), tlv = tl.to_vector<double>();
        for (int64_t n = 0; n < N; ++n) {
          sumexp[n] += sev[n];
          target_logit[n] += tlv[n];
        }
      }
      double loss = 0;
      for (int64_t n = 0; n < N; ++n)
        if (tg[n] != ignore) loss += std::log(sumexp[n]) + gmax[n] - target_logit[n];
      loss /= kept;
      EXPECT_NEAR(loss, ref_loss.item(), tol * std::max(1.0, std::fabs(ref_loss.item()))) << what << ": loss";
      // the same loss from the kernels that keep it on the device
      Tensor sumexp_t = Tensor::from_vector<double>(sumexp, {N}).to(sd);
      Tensor target_t = Tensor::from_vector<double>(target_logit, {N}).to(sd);
      Tensor losses = Tensor::empty({N}, sd), kept_t = Tensor::empty({1}, DType::i32),
             mean = Tensor::empty({}, sd);
      kernels::cross_entropy_parallel_losses(gmax_t, sumexp_t, target_t, targets, ignore, losses);
      kernels::count_not_equal(targets, ignore, kept_t);
      kernels::mean_of_kept(losses, kept_t, mean);
      EXPECT_EQ(kept_t.to_vector<int32_t>()[0], kept);
      EXPECT_NEAR(mean.item(), ref_loss.item(), tol * std::max(1.0, std::fabs(ref_loss.item()))) << what;
      // dlogits, slice by slice into one (N, V) tensor, for dloss = 1
      Tensor dloss_t = Tensor::full({1}, 1.0, sd);
      Tensor grad = Tensor::full({N, V}, 123.0, dt);  // every entry must be written
      for (const Slice& s : slices) {
        Tensor d = Tensor::empty({N, s.len}, dt);
        kernels::cross_entropy_parallel_backward(s.logits, targets, gmax_t, sumexp_t, s.start, s.live, ignore,
                                                 kept_t, dloss_t, d);
        kernels::copy(grad.narrow(1, s.start, s.len), d);
      }
      expect_close(grad, ref_grad, tol, what + ": dlogits");
    }
  }
}

// v_live outside [0, Vl] is refused with a message naming the kernel.
TEST(RingMath, VocabParallelKernelsCheckLiveColumns) {
  Tensor logits = randn({3, 5}, DType::f32, Device::cpu(), 1), out = Tensor::empty({3}, DType::f32);
  EXPECT_THROW(kernels::rowmax(logits, 6, out), Error);
  EXPECT_THROW(kernels::rowmax(logits, -1, out), Error);
  EXPECT_NO_THROW(kernels::rowmax(logits, 0, out));
}
