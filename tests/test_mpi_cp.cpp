// Context parallelism (CP) at the layer level, under mpirun (2, 3 and 4 ranks), in
// float64: ring attention over cp head-tail chunks against the whole causal attention on
// the same inputs (outputs, and dq, dk, dv after the backward), multi-head and grouped-query
// (k, v with fewer heads than q, passed around the ring as they are), the bytes it sends against
// the analytic volume, and its peak memory against the whole attention's (one score block
// at a time, or none where the pairs run fused); on packed rows (documents across the chunks)
// as well, and their positions.
#include <gtest/gtest.h>

#include <cstdio>
#include <functional>

#include "autograd/engine.h"
#include "autograd/ops.h"
#include "dist/context_parallel/ring_attention.h"
#include "dist_testing.h"

using namespace ndt;
using namespace ndt::testing;  // world, randn, max_diff (tests/dist/dist_testing.h)

namespace {

// Both ways a pair can run: the CPU's fused kernel, and (NDT_SDPA=0, as on a GPU in f32)
// composed and recomputed in backward.
class RingAttention : public ::testing::TestWithParam<bool> {};

// Packed rows of T = 2 n Tc positions cut into the ring's 2 n chunks of Tc: documents that
// cross chunk boundaries, one of a single token, one over three chunks (2 Tc + 2 tokens from
// the middle of a chunk); row 1 the same lengths in another order -> docs (2, T) i32.
Tensor packed_docs(int64_t T, int64_t Tc) {
  const std::vector<int64_t> lengths[2] = {{1, Tc + 1, 2 * Tc + 2, 1, Tc - 1, 3},
                                           {Tc / 2 + 1, 2 * Tc + 2, 1, 1, Tc + 1, 2}};
  return ndt::testing::packed_docs(lengths, T);
}

// Ring attention of q (B,NH,T,HS) over k, v (B,NKV,T,HS) on the cp ranks against the whole
// attention on one process (the same inputs on every rank); packed: on packed rows
// (packed_docs), whose documents every rank holds whole.
void expect_ring_equals_attention(dist::Communicator& cp, int64_t NH, int64_t NKV, bool packed = false) {
  // chunks of 3 positions, and of 70 (the fused kernel's blocks of 64 queries, the last partial)
  for (const int64_t Tc : {3, 70}) {
    SCOPED_TRACE("NH " + std::to_string(NH) + " NKV " + std::to_string(NKV) + " Tc " + std::to_string(Tc) +
                 (packed ? " packed" : ""));
    const int64_t n = cp.size(), r = cp.rank(), B = 2, HS = 4, T = 2 * n * Tc;
    Tensor q = randn({B, NH, T, HS}, 6, true), k = randn({B, NKV, T, HS}, 7, true),
           v = randn({B, NKV, T, HS}, 8, true);
    Tensor w = randn({B, NH, T, HS}, 9);
    const Tensor docs = packed ? packed_docs(T, Tc) : Tensor();
    // the reference: every pair, from GEMMs (packed: the block-diagonal causal mask)
    Tensor out = attention_composed(q, k, v, 0, 0, 0.0, docs).out;
    backward(sum(mul(out, w)));
    // this rank's head and tail chunks of (B, H, T, HS)
    auto mine = [&](const Tensor& t) {
      Tensor m = Tensor::empty({B, t.size(1), 2 * Tc, HS}, DType::f64);
      m.narrow(2, 0, Tc).copy_(t.narrow(2, r * Tc, Tc));
      m.narrow(2, Tc, Tc).copy_(t.narrow(2, (2 * n - 1 - r) * Tc, Tc));
      return m;
    };
    Tensor ql = mine(q.detach()), kl = mine(k.detach()), vl = mine(v.detach());
    for (Tensor* t : {&ql, &kl, &vl}) t->set_requires_grad(true);
    cp.reset_stats();
    Tensor ol = dist::ring_attention(ql, kl, vl, cp, docs);
    EXPECT_LT(max_diff(ol, mine(out.detach())), 1e-12) << "outputs";
    if (packed)  // the documents' mask is not lost on the way
      EXPECT_GT(max_diff(ol, mine(attention_composed(q, k, v).out.detach())), 1e-3);
    backward(sum(mul(ol, mine(w))));
    EXPECT_LT(max_diff(ql.grad(), mine(q.grad())), 1e-12) << "dq";
    EXPECT_LT(max_diff(kl.grad(), mine(k.grad())), 1e-12) << "dk (came back around the ring)";
    EXPECT_LT(max_diff(vl.grad(), mine(v.grad())), 1e-12) << "dv";
    // forward: n-1 K/V blocks sent; backward: n-1 gradient blocks of the same size; with
    // GQA the blocks hold the NKV kv heads only; packed rows send nothing more
    const int64_t block = B * NKV * 2 * Tc * 2 * HS * 8;
    EXPECT_EQ(cp.stats()[dist::CommKind::kSend], 2 * (n - 1) * block);
  }
}

TEST_P(RingAttention, EqualsAttention) {
  if (GetParam()) setenv("NDT_SDPA", "0", 1);
  expect_ring_equals_attention(*ndt::testing::world(), 3, 3);
  unsetenv("NDT_SDPA");
}

// Grouped-query attention: 4 query heads over 2 kv heads, and over 1 (multi-query).
TEST_P(RingAttention, GqaEqualsAttention) {
  if (GetParam()) setenv("NDT_SDPA", "0", 1);
  expect_ring_equals_attention(*ndt::testing::world(), 4, 2);
  expect_ring_equals_attention(*ndt::testing::world(), 4, 1);
  unsetenv("NDT_SDPA");
}

// Packed rows: each pair takes its part of the block-diagonal causal mask, pairs and rows that
// see no key add nothing (no NaN in the gradients), multi-head and grouped-query.
TEST_P(RingAttention, PackedRowsEqualAttention) {
  if (GetParam()) setenv("NDT_SDPA", "0", 1);
  expect_ring_equals_attention(*ndt::testing::world(), 3, 3, true);
  expect_ring_equals_attention(*ndt::testing::world(), 4, 2, true);
  unsetenv("NDT_SDPA");
}

// The positions of packed rows under context parallelism: each rank's head and tail chunks
// get the positions one process gives the whole rows (restarting at each document's start,
// which may lie in another rank's chunk).
TEST(ContextParallel, PackedPositionsAreTheWholeRowsPieces) {
  auto& cp = *ndt::testing::world();
  const int64_t n = cp.size(), r = cp.rank(), Tc = 3, T = 2 * n * Tc;
  models::GPTConfig c{.n_layer = 1, .n_head = 2, .n_embd = 8, .vocab_size = 11, .block_size = T};
  models::GPT gpt(c);
  dist::ContextParallel ctx(gpt, cp, T);
  const Tensor docs = packed_docs(T, Tc), idx = Tensor::zeros({2, 2 * Tc}, DType::i32);
  const std::vector<int32_t> got = gpt.positions(idx, 0, docs).to_vector<int32_t>(),
                             whole = document_positions(docs).to_vector<int32_t>();
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t t = 0; t < 2 * Tc; ++t) {
      const int64_t g = t < Tc ? r * Tc + t : (2 * n - 1 - r) * Tc + t - Tc;  // its global position
      EXPECT_EQ(got[static_cast<size_t>(b * 2 * Tc + t)], whole[static_cast<size_t>(b * T + g)])
          << "row " << b << " token " << t;
    }
  // and docs that are not the whole rows are refused
  EXPECT_THROW(gpt.positions(idx, 0, Tensor::zeros({2, 2 * Tc}, DType::i32)), Error);
}

INSTANTIATE_TEST_SUITE_P(Pairs, RingAttention, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& i) {
                           return i.param ? "composed" : "fused";
                         });

// A kv head count that does not divide the query heads is refused before anything is sent
// (every rank throws the same error; no rank waits in the ring).
TEST(ContextParallel, RingAttentionRefusesKvHeadsThatDoNotDivide) {
  auto& cp = *ndt::testing::world();
  const Tensor q = randn({1, 4, 6, 4}, 1), k = randn({1, 3, 6, 4}, 2);
  try {
    dist::ring_attention(q, k, k, cp);
    ADD_FAILURE() << "4 query heads over 3 kv heads accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("q has 4 heads and k, v 3"), std::string::npos) << e.what();
  }
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
    backward(sum(attention_composed(q, k, v).out));
  });
  auto ring_peak = [&] {
    return peak_of([&] {
      const int64_t L = T / n;
      Tensor q = randn({B, NH, L, HS}, 1, true), k = randn({B, NH, L, HS}, 2, true),
             v = randn({B, NH, L, HS}, 3, true);
      backward(sum(dist::ring_attention(q, k, v, cp)));
    });
  };
  // on the CPU the pairs run fused (no score block kept at all); composed (NDT_SDPA=0, as
  // on a GPU in f32) each pair is recomputed in backward
  const int64_t fused = ring_peak();
  setenv("NDT_SDPA", "0", 1);
  const int64_t composed = ring_peak();
  unsetenv("NDT_SDPA");
  // the whole attention keeps its (T x T) probabilities for backward; the composed ring one
  // block of (T/2n x T/2n) at a time, besides activations of size T/n: well under 1/n^2 of
  // the whole; the fused ring only the activations
  std::printf(
      "rank %d: attention peak %lld bytes; ring attention over %lld ranks, composed %lld bytes (%.3f; 1/cp^2 "
      "= "
      "%.3f), fused %lld\n",
      cp.rank(), static_cast<long long>(whole), static_cast<long long>(n), static_cast<long long>(composed),
      static_cast<double>(composed) / static_cast<double>(whole), 1.0 / static_cast<double>(n * n),
      static_cast<long long>(fused));
  EXPECT_LT(composed, whole / (n * n));
  EXPECT_LT(fused, composed);
}

}  // namespace
