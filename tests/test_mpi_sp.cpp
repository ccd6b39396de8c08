// Ulysses sequence parallelism (SP) at the layer level, under mpirun (2, 3 and 4 ranks), in
// float64: the all-to-all op forward and backward against the pieces of whole tensors; Ulysses
// attention over each rank's contiguous part of the sequence against the whole causal attention
// on the same inputs (outputs, and dq, dk, dv after the backward), multi-head, grouped-query
// (kv heads split over the ranks, and fewer kv heads than ranks: replicated) and on packed rows;
// the bytes it sends against the analytic volume; the positions; bad layouts refused. On 4
// ranks, Ulysses inside the ring (USP: cp 2 x sp 2): attention, its gradients and the positions
// against one process's, with and without packed rows.
#include <gtest/gtest.h>

#include <functional>

#include "autograd/engine.h"
#include "autograd/ops.h"
#include "dist/context_parallel/ring_attention.h"
#include "dist/parallelize.h"
#include "dist/ulysses/ulysses.h"
#include "dist_testing.h"

using namespace ndt;
using namespace ndt::testing;  // world, randn, max_diff (tests/dist/dist_testing.h)

namespace {

// all_to_all (B, H, T/n, HS) -> (B, H/n, T, HS): rank r's output is heads r of the whole
// tensor; the gradient of sum(out_r * W_r) over every rank, with respect to rank r's input, is
// W's part r along time (the inverse all-to-all of the output's gradient).
TEST(Ulysses, AllToAllAndItsGradient) {
  auto& sp = *world();
  const int64_t n = sp.size(), r = sp.rank(), B = 2, H = 2 * n, L = 3, HS = 5, T = n * L;
  const Tensor X = randn({B, H, T, HS}, 1), W = randn({B, H, T, HS}, 2);
  Tensor x = X.narrow(2, r * L, L).contiguous();
  x.set_requires_grad(true);
  sp.reset_stats();
  const Tensor out = dist::all_to_all(x, 1, 2, sp);
  EXPECT_EQ(out.shape(), (Shape{B, H / n, T, HS}));
  EXPECT_EQ(max_diff(out, X.narrow(1, r * (H / n), H / n).contiguous()), 0.0) << "forward";
  backward(sum(mul(out, W.narrow(1, r * (H / n), H / n).contiguous())));
  EXPECT_EQ(max_diff(x.grad(), W.narrow(2, r * L, L).contiguous()), 0.0) << "backward";
  // each way, (n - 1) / n of the input leaves the rank
  EXPECT_EQ(sp.stats()[dist::CommKind::kSend], 2 * (n - 1) * (B * H * L * HS / n) * 8);
  // a dimension that does not split into n pieces is refused before anything is sent
  if (n > 1) EXPECT_THROW(dist::all_to_all(randn({1, n + 1, 2, 2}, 3), 1, 2, sp), Error);
}

// Packed rows of T positions: documents of lengths crossing the ranks' parts -> (2, T) i32.
Tensor packed_docs(int64_t T) {
  const std::vector<int64_t> lengths[2] = {{1, 4, 7, 1, 2, 3}, {3, 7, 1, 1, 4, 2}};
  return ndt::testing::packed_docs(lengths, T);
}

// The whole causal attention of random q (B,NH,T,HS) over k, v (B,NKV,T,HS) on one process (the
// same inputs on every rank), against `part`: this rank's L positions from `first` of q, k, v ->
// its part of the output, computed across ranks. Outputs and dq, dk, dv within 1e-12.
void expect_part_equals_attention(
    int64_t NH, int64_t NKV, int64_t T, bool packed, int64_t first, int64_t L,
    const std::function<Tensor(const Tensor&, const Tensor&, const Tensor&, const Tensor& docs)>& part) {
  const int64_t B = 2, HS = 4;
  Tensor q = randn({B, NH, T, HS}, 6, true), k = randn({B, NKV, T, HS}, 7, true),
         v = randn({B, NKV, T, HS}, 8, true);
  const Tensor w = randn({B, NH, T, HS}, 9);
  const Tensor docs = packed ? packed_docs(T) : Tensor();
  Tensor out = attention_composed(q, k, v, 0, 0, 0.0, docs).out;
  backward(sum(mul(out, w)));
  auto mine = [&](const Tensor& t) { return t.narrow(2, first, L).contiguous(); };
  Tensor ql = mine(q.detach()), kl = mine(k.detach()), vl = mine(v.detach());
  for (Tensor* t : {&ql, &kl, &vl}) t->set_requires_grad(true);
  Tensor ol = part(ql, kl, vl, docs);
  EXPECT_LT(max_diff(ol, mine(out.detach())), 1e-12) << "outputs";
  if (packed)  // the documents' mask is not lost on the way
    EXPECT_GT(max_diff(ol, mine(attention_composed(q, k, v).out.detach())), 1e-3);
  backward(sum(mul(ol, mine(w))));
  EXPECT_LT(max_diff(ql.grad(), mine(q.grad())), 1e-12) << "dq";
  EXPECT_LT(max_diff(kl.grad(), mine(k.grad())), 1e-12) << "dk";
  EXPECT_LT(max_diff(vl.grad(), mine(v.grad())), 1e-12) << "dv";
}

// Ulysses attention, each rank holding its part of T/n positions, against the whole attention.
void expect_ulysses_equals_attention(dist::Communicator& sp, int64_t NH, int64_t NKV, bool packed) {
  SCOPED_TRACE("NH " + std::to_string(NH) + " NKV " + std::to_string(NKV) + (packed ? " packed" : ""));
  const int64_t n = sp.size(), r = sp.rank(), B = 2, HS = 4, L = 5;
  expect_part_equals_attention(NH, NKV, n * L, packed, r * L, L,
                               [&](const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& docs) {
                                 sp.reset_stats();
                                 return dist::ulysses_attention(q, k, v, sp, docs);
                               });
  // forward: (n-1)/n of q, k, v (kv heads replicated up to n) and the output; backward the same
  const int64_t kv_sent = std::max(NKV, n);
  const int64_t values = (2 * NH + 2 * kv_sent) * B * L * HS * (n - 1) / n;
  EXPECT_EQ(sp.stats()[dist::CommKind::kSend], 2 * values * 8);
}

TEST(Ulysses, EqualsAttention) {
  auto& sp = *world();
  const int64_t n = sp.size();
  for (const bool packed : {false, true}) {
    expect_ulysses_equals_attention(sp, 3 * n, 3 * n, packed);      // multi-head
    expect_ulysses_equals_attention(sp, 2 * n, n, packed);          // grouped-query, kv heads split
    expect_ulysses_equals_attention(sp, 2 * n, 1, packed);          // multi-query: replicated n times
    if (n == 4) expect_ulysses_equals_attention(sp, 8, 2, packed);  // each kv head twice
  }
}

// Each rank's positions are its part of the whole rows' (restarting per document when packed).
// The positions gpt's hook gives this rank's L tokens of rows of T that start at `first`: plain,
// first.. ; packed, the whole rows' document positions there.
void expect_part_positions(const models::GPT& gpt, int64_t T, int64_t L, int64_t first) {
  const Tensor idx = Tensor::zeros({2, L}, DType::i32), docs = packed_docs(T);
  const std::vector<int32_t> plain = gpt.positions(idx, 0, Tensor()).to_vector<int32_t>(),
                             got = gpt.positions(idx, 0, docs).to_vector<int32_t>(),
                             whole = document_positions(docs).to_vector<int32_t>();
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t t = 0; t < L; ++t) {
      EXPECT_EQ(plain[static_cast<size_t>(b * L + t)], first + t);
      EXPECT_EQ(got[static_cast<size_t>(b * L + t)], whole[static_cast<size_t>(b * T + first + t)]);
    }
}

TEST(Ulysses, PositionsAreTheWholeRowsParts) {
  auto& sp = *world();
  const int64_t n = sp.size(), r = sp.rank(), L = 5, T = n * L;
  models::GPTConfig c{.n_layer = 1, .n_head = 2 * n, .n_embd = 8 * n, .vocab_size = 11, .block_size = T};
  models::GPT gpt(c);
  dist::Ulysses u(gpt, sp, T);
  expect_part_positions(gpt, T, L, r * L);
  const Tensor tokens = randn({2, T}, 4);
  EXPECT_EQ(max_diff(u.local(tokens), tokens.narrow(1, r * L, L).contiguous()), 0.0);
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(accepted)";
}

// USP on 4 ranks, cp 2 x sp 2 (mesh order: sp inside cp): the cp rank holds chunks c and
// 3 - c of the 4 chunks of a sequence (T = 4 Tc), its sp rank the first or the second of them;
// attention (all-to-all over sp, ring over cp, all-to-all back) and its gradients against the
// whole causal attention, and the positions against the whole rows'.
void expect_usp_equals_attention(dist::Communicator& cp, dist::Communicator& sp, int64_t NH, int64_t NKV,
                                 bool packed) {
  SCOPED_TRACE("NH " + std::to_string(NH) + " NKV " + std::to_string(NKV) + (packed ? " packed" : ""));
  const int64_t B = 2, HS = 4, Tc = 5;
  const int64_t chunk = sp.rank() == 0 ? cp.rank() : 3 - cp.rank();  // this rank's positions
  const nn::AttendFn ring = [&cp](const Tensor& q, const Tensor& k, const Tensor& v, int64_t,
                                  const Tensor& docs) { return dist::ring_attention(q, k, v, cp, docs); };
  expect_part_equals_attention(NH, NKV, 4 * Tc, packed, chunk * Tc, Tc,
                               [&](const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& docs) {
                                 sp.reset_stats();
                                 cp.reset_stats();
                                 return dist::ulysses_attention(q, k, v, sp, docs, ring);
                               });
  // sp: half of q, k, v (kv heads replicated up to 2) and the output of this rank's Tc positions,
  // forward and backward; cp: one K/V block of this rank's kv heads (NKV / 2, at least 1) on the
  // cp rank's 2 Tc positions, forward, and its gradient, backward
  const int64_t kv_sent = std::max<int64_t>(NKV, 2), kv_here = kv_sent / 2;
  EXPECT_EQ(sp.stats()[dist::CommKind::kSend], 2 * (2 * NH + 2 * kv_sent) * B * Tc * HS / 2 * 8);
  EXPECT_EQ(cp.stats()[dist::CommKind::kSend], 2 * B * kv_here * 2 * Tc * 2 * HS * 8);
}

TEST(Ulysses, InsideTheRingEqualsAttention) {
  auto& w = *world();
  if (w.size() != 4) GTEST_SKIP() << "cp 2 x sp 2 runs on 4 ranks";
  // rank = cp x 2 + sp, as the mesh orders them
  const auto cp = w.split(static_cast<int>(w.rank() % 2), w.rank(), "cp");
  const auto sp = w.split(static_cast<int>(w.rank() / 2), w.rank(), "sp");
  for (const bool packed : {false, true}) {
    expect_usp_equals_attention(*cp, *sp, 4, 4, packed);  // multi-head
    expect_usp_equals_attention(*cp, *sp, 4, 2, packed);  // grouped-query, kv heads split over sp
    expect_usp_equals_attention(*cp, *sp, 2, 1, packed);  // one kv head, replicated over sp
  }
  // the model's positions: ContextParallel's chunks, then this rank's half of them
  const int64_t Tc = 5, T = 4 * Tc, chunk = sp->rank() == 0 ? cp->rank() : 3 - cp->rank();
  models::GPTConfig c{.n_layer = 1, .n_head = 4, .n_embd = 16, .vocab_size = 11, .block_size = T};
  models::GPT gpt(c);
  dist::ContextParallel ring(gpt, *cp, T);
  dist::Ulysses u(gpt, *sp, T, nullptr, 1, cp->size());
  expect_part_positions(gpt, T, Tc, chunk * Tc);
  const Tensor tokens = randn({2, T}, 4);
  EXPECT_EQ(max_diff(u.local(ring.local(tokens)), tokens.narrow(1, chunk * Tc, Tc).contiguous()), 0.0);
}

// Bad layouts: one line each, before any collective.
TEST(Ulysses, BadLayoutsAreRefused) {
  models::GPTConfig c{.n_layer = 1, .n_head = 6, .n_embd = 24, .vocab_size = 12, .block_size = 24};
  auto dims = [](int64_t cp, int64_t sp, int64_t tp, int64_t pp) {
    return dist::ParallelDims::resolve_sp(pp, 1, 1, cp, sp, tp, pp * cp * sp * tp);
  };
  auto check = [&](const dist::ParallelDims& d, int64_t seq_len, bool sequence_parallel = false) {
    return error_of([&] { dist::check_parallel_model(c, d, seq_len, sequence_parallel); });
  };
  EXPECT_NE(check(dims(1, 4, 1, 1), 16).find("model.n_head = 6 must be divisible by parallel.sp_size = 4"),
            std::string::npos);
  EXPECT_NE(check(dims(1, 3, 1, 1), 16).find("train.seq_len = 16"), std::string::npos);
  // sp x tp: the heads of a tp rank over sp
  EXPECT_NE(check(dims(1, 2, 2, 1), 24)
                .find("model.n_head = 6 must be divisible by parallel.tp_size x sp_size "
                      "= 2 x 2"),
            std::string::npos);
  // USP: the cp rank's tokens over sp (seq_len 20 splits into 2 cp x 2 chunks, not 2 x 3 parts)
  EXPECT_NE(check(dims(2, 3, 1, 1), 20)
                .find("train.seq_len = 20 must be divisible by parallel.cp_size x "
                      "sp_size = 2 x 3"),
            std::string::npos);
  c.n_kv_head = 3;  // 3 kv heads over 2 ranks: neither divides the other
  EXPECT_NE(check(dims(1, 2, 1, 1), 16).find("n_kv_head = 3"), std::string::npos);
  EXPECT_EQ(check(dims(1, 3, 1, 1), 18), "(accepted)");
  c.n_head = 12, c.n_kv_head = 6;  // 3 kv heads per tp rank over sp 2
  EXPECT_NE(check(dims(1, 2, 2, 1), 16).find("n_kv_head = 6 (3 per tp rank) and parallel.sp_size = 2"),
            std::string::npos);
  c.n_kv_head = 2;  // 1 per tp rank, replicated over sp
  // TP's sequence parallelism: the sp rank's tokens over tp
  EXPECT_NE(check(dims(1, 2, 2, 1), 18, true)
                .find("train.seq_len / (cp_size x sp_size) = 18 / (1 x 2) tokens of a sequence must be "
                      "divisible by tp_size = 2"),
            std::string::npos);
  // every combination accepted
  EXPECT_EQ(check(dims(1, 3, 2, 1), 24, true), "(accepted)");
  EXPECT_EQ(check(dims(2, 2, 1, 2), 24), "(accepted)");
}

}  // namespace
