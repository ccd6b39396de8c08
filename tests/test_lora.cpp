// LoRA adapters (nn/lora.h) on one process: the adapter path's float64 gradients against
// finite differences, the Llama's packed c_attn with q, k and v adapters each in its own
// columns of every kv group, step 0 equal to the base model bit for bit, a frozen base that no
// step changes (no gradient buffers, no moments), PEFT's initialization and scale, and the
// errors a bad [lora] gets. train_gpt with [lora]: a checkpoint that resumes to the same
// losses, holding only the adapters, and export_weights' PEFT folder and merged model.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "autograd/engine.h"
#include "autograd/gradcheck.h"
#include "autograd/node.h"
#include "dist/tensor_parallel/tensor_parallel.h"
#include "models/gpt.h"
#include "nn/lora.h"
#include "optim/adamw.h"
#include "support/corpus.h"
#include "support/launch.h"
#include "support/outputs.h"
#include "support/testing.h"
#include "tensor/kernels.h"
#include "train/checkpoint/checkpoint.h"
#include "train/checkpoint/hf.h"
#include "train/checkpoint/load.h"
#include "train/checkpoint/lora.h"
#include "train/checkpoint/sharded.h"
#include "train/io/hf_folder.h"
#include "train/io/safetensors.h"

using namespace ndt;
namespace fs = std::filesystem;

namespace {

Tensor random(const Shape& shape, uint64_t seed, double scale = 1.0) {
  Tensor t = Tensor::empty(shape, DType::f32);
  kernels::fill_normal(t, seed, 1, 0, 0.0f, static_cast<float>(scale));
  return t.to(DType::f64);
}

// The Llama's c_attn for C = 8, NH = 4, NKV = 2 (G = 2, HS = 2): NKV groups of {G HS, HS, HS}
struct PackedQkv {
  int64_t C = 8, NKV = 2, G = 2, HS = 2;
  int64_t out() const { return NKV * (G + 2) * HS; }
  nn::LinearSite site(int part) const { return {"", nullptr, part, NKV, {G * HS, HS, HS}}; }
};

// scale (x A^T) B^T by hand, f64 on the host: x (N, in), A (r, in), B (out, r) -> (N, out)
std::vector<double> lora_by_hand(const Tensor& x, const Tensor& A, const Tensor& B, double scale) {
  const int64_t N = x.size(0), in = x.size(1), r = A.size(0), out = B.size(0);
  const std::vector<double> xv = x.to_vector<double>(), av = A.to_vector<double>(),
                            bv = B.to_vector<double>();
  std::vector<double> y(static_cast<size_t>(N * out), 0.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < out; ++o)
      for (int64_t k = 0; k < r; ++k) {
        double h = 0;
        for (int64_t i = 0; i < in; ++i) h += xv[n * in + i] * av[k * in + i];
        y[n * out + o] += scale * h * bv[o * r + k];
      }
  return y;
}

}  // namespace

TEST(Lora, PackedQkvAdaptersAddToTheirOwnColumnsOfEveryKvGroup) {
  const PackedQkv p;
  const int64_t N = 3, r = 2;
  nn::Linear lin(p.C, p.out(), true, 0.02f);
  lin.weight = random({p.C, p.out()}, 1);
  lin.bias = random({p.out()}, 2);
  const Tensor x = random({N, p.C}, 3);
  const Tensor base = linear(x, lin.weight, lin.bias);
  // adapters on q (G HS = 4 columns a group) and v (HS = 2), none on k
  nn::LoraAdapter q(p.C, p.NKV * p.G * p.HS, r), v(p.C, p.NKV * p.HS, r);
  q.A = random({r, p.C}, 4), q.B = random({p.NKV * p.G * p.HS, r}, 5);
  v.A = random({r, p.C}, 6), v.B = random({p.NKV * p.HS, r}, 7);
  auto l = std::make_shared<nn::LoraLinear>(p.site(0), 0.5);
  l->add(0, &q);
  l->add(2, &v);
  lin.adapter = l;
  const std::vector<double> got = lin.forward(x).to_vector<double>(), b = base.to_vector<double>();
  const std::vector<double> dq = lora_by_hand(x, q.A, q.B, 0.5), dv = lora_by_hand(x, v.A, v.B, 0.5);
  const int64_t W = (p.G + 2) * p.HS, Q = p.G * p.HS;  // a group's columns: q (Q), k (HS), v (HS)
  for (int64_t n = 0; n < N; ++n)
    for (int64_t g = 0; g < p.NKV; ++g)
      for (int64_t j = 0; j < W; ++j) {
        const int64_t col = n * p.out() + g * W + j;
        double want = b[col];
        if (j < Q) want += dq[n * p.NKV * Q + g * Q + j];                             // q_g
        if (j >= Q + p.HS) want += dv[n * p.NKV * p.HS + g * p.HS + (j - Q - p.HS)];  // v_g
        EXPECT_NEAR(got[col], want, 1e-12) << "row " << n << " group " << g << " column " << j;
      }
}

TEST(Lora, AdapterPathGradientsEqualFiniteDifferencesInFloat64) {
  const PackedQkv p;
  const int64_t N = 3, r = 2;
  nn::Linear lin(p.C, p.out(), true, 0.02f);
  lin.weight = random({p.C, p.out()}, 11);  // frozen: held fixed
  lin.bias = random({p.out()}, 12);
  nn::LoraAdapter k(p.C, p.NKV * p.HS, r), v(p.C, p.NKV * p.HS, r);
  auto l = std::make_shared<nn::LoraLinear>(p.site(1), 2.0);
  l->add(1, &k);
  l->add(2, &v);
  lin.adapter = l;
  nn::Linear whole(p.C, 5, false, 0.02f);  // an adapter on a whole linear (o_proj, down_proj, c_fc)
  whole.weight = random({p.C, 5}, 13);
  nn::LoraAdapter o(p.C, 5, r);
  auto lo = std::make_shared<nn::LoraLinear>(nn::LinearSite{"", nullptr}, 0.75);
  lo->add(-1, &o);
  whole.adapter = lo;
  std::vector<Tensor> in = {
      random({N, p.C}, 14), random({r, p.C}, 15),          random({p.NKV * p.HS, r}, 16),
      random({r, p.C}, 17), random({p.NKV * p.HS, r}, 18), random({r, p.C}, 19),
      random({5, r}, 20)};
  for (Tensor& t : in) t.set_requires_grad(true);
  const autograd::GradcheckResult res = autograd::gradcheck(
      [&](const std::vector<Tensor>& t) {
        k.A = t[1], k.B = t[2], v.A = t[3], v.B = t[4], o.A = t[5], o.B = t[6];
        return std::vector<Tensor>{lin.forward(t[0]), whole.forward_gelu(t[0])};
      },
      in);
  EXPECT_TRUE(res.ok) << res.message;
  EXPECT_EQ(res.checked, N * p.C + 3 * r * p.C + 2 * p.NKV * p.HS * r + 5 * r);
}

// lora.dropout: the adapter path with dropout on its input, with the mask held fixed (the key
// does not change between the finite differences), against float64 finite differences; the
// dropped elements get no gradient through the adapter.
TEST(LoraDropout, AdapterPathGradientsWithAFixedMaskEqualFiniteDifferencesInFloat64) {
  const int64_t N = 4, in = 6, out = 5, r = 2;
  nn::LoraAdapter a(in, out, r);
  nn::LoraDropout d{.p = 0.4, .seed = 7, .training = true, .step = 3, .micro = 1, .row_start = 8};
  std::vector<Tensor> t = {random({N, in}, 31), random({r, in}, 32), random({out, r}, 33)};
  for (Tensor& x : t) x.set_requires_grad(true);
  const autograd::GradcheckResult res = autograd::gradcheck(
      [&](const std::vector<Tensor>& x) {
        a.A = x[1], a.B = x[2];
        return std::vector<Tensor>{a.forward(x[0], 1.5, &d)};
      },
      t);
  EXPECT_TRUE(res.ok) << res.message;
  EXPECT_EQ(res.checked, N * in + r * in + out * r);
  // the op alone: dx = mask * dy / (1 - p), nothing where the forward dropped
  const kernels::DropoutKey key{.p = 0.4, .seed = 7, .stream = 9, .row_start = 2, .row_stride = in};
  Tensor x = random({N, in}, 34).set_requires_grad(true);
  const autograd::GradcheckResult op = autograd::gradcheck(
      [&](const std::vector<Tensor>& v) { return std::vector<Tensor>{dropout(v[0], key)}; }, {x});
  EXPECT_TRUE(op.ok) << op.message;
  x = random({N, in}, 34).set_requires_grad(true);
  const Tensor y = dropout(x, key);
  backward(sum(y));
  const std::vector<double> yv = y.to_vector<double>(), xv = x.to_vector<double>(),
                            gv = x.grad().to_vector<double>();
  for (size_t i = 0; i < yv.size(); ++i) {
    const bool kept = yv[i] != 0;
    EXPECT_NEAR(yv[i], kept ? xv[i] / 0.6 : 0.0, 1e-12) << i;
    EXPECT_EQ(gv[i], kept ? 1 / 0.6 : 0.0) << i;
  }
}

// The kept fraction over 2^20 elements is 1 - p: the count is Binomial(n, 1 - p) for an ideal
// generator, sd = sqrt(n p (1 - p)) ~ 470 for p = 0.3; the mask is a fixed function of the key,
// so the bound of 10 sd (0.45% of n) cannot flake, and a biased or constant mask fails it.
// A rank's rows and columns of x draw exactly those rows and columns of the whole x's mask.
TEST(LoraDropout, KeepsOneMinusPAndARanksSliceDrawsTheWholeMasksSlice) {
  const int64_t N = 1024, C = 1024;
  const Tensor ones = Tensor::full({N, C}, 1.0, DType::f32);
  for (const double p : {0.05, 0.3, 0.9}) {
    const kernels::DropoutKey key{.p = p, .seed = 1337, .stream = 5, .row_stride = C};
    const Tensor y = dropout(ones, key);
    const std::vector<float> v = y.to_vector<float>();
    const double kept =
        static_cast<double>(std::count_if(v.begin(), v.end(), [](float e) { return e != 0; }));
    const double n = static_cast<double>(N * C), sd = std::sqrt(n * p * (1 - p));
    EXPECT_NEAR(kept, n * (1 - p), 10 * sd) << "p = " << p;
    EXPECT_NEAR(sum(y).item() / n, 1.0, 10 * sd / n / (1 - p)) << "E[dropout(x)] = x";
  }
  const kernels::DropoutKey whole{.p = 0.5, .seed = 1, .stream = 2, .row_stride = 8};
  const Tensor x = random({6, 8}, 40);
  const std::vector<double> all = dropout(x, whole).to_vector<double>();
  // rows 2..5, columns 4..7 (a data-parallel rank's tokens of a row-parallel rank's input)
  kernels::DropoutKey part = whole;
  part.row_start = 2, part.col_start = 4;
  const Tensor slice = x.narrow(0, 2, 4).narrow(1, 4, 4).contiguous();
  const std::vector<double> got = dropout(slice, part).to_vector<double>();
  for (int64_t n = 0; n < 4; ++n)
    for (int64_t c = 0; c < 4; ++c) EXPECT_EQ(got[n * 4 + c], all[(n + 2) * 8 + c + 4]) << n << "," << c;
  // another stream (step, micro-batch, adapter): another mask
  kernels::DropoutKey other = whole;
  other.stream = 3;
  EXPECT_NE(dropout(x, other).to_vector<double>(), all);
}

// Context parallelism and Ulysses: a rank holds pieces of every row, and the key takes their
// positions in the row (nn::LoraDropout::positions). Two data ranks of 2 rows of T = 16 tokens;
// data rank 1's pieces under CP over 2 ranks (chunks of 4: rank r holds chunks r and 3 - r),
// Ulysses over 2 (contiguous halves) and both (USP: each cp rank's 8 tokens halved again) draw
// exactly their rows of the whole input's mask. Packed documents do not enter the key.
TEST(LoraDropout, ARanksPiecesOfTheRowsDrawTheirRowsOfTheWholeMask) {
  const int64_t T = 16, rows = 4, C = 3, row_start = 2 * T;  // data rank 1: rows 2, 3
  const nn::LoraDropout whole{.p = 0.5, .seed = 11, .training = true, .step = 2, .micro = 1};
  const Tensor x = random({rows * T, C}, 41);  // (4 T, C): the micro-step's whole input
  const std::vector<double> all = whole.drop(x, C, 0, 7).to_vector<double>();
  const std::vector<std::vector<int32_t>> layouts = {{0, 1, 2, 3, 12, 13, 14, 15},
                                                     {4, 5, 6, 7, 8, 9, 10, 11},  // cp 2: ranks 0, 1
                                                     {0, 1, 2, 3, 4, 5, 6, 7},
                                                     {8, 9, 10, 11, 12, 13, 14, 15},  // sp 2
                                                     {0, 1, 2, 3},
                                                     {12, 13, 14, 15},  // cp 2 x sp 2: cp rank 0's sp ranks
                                                     {4, 5, 6, 7},
                                                     {8, 9, 10, 11}};  // cp rank 1's
  for (const std::vector<int32_t>& pos : layouts) {
    const int64_t L = static_cast<int64_t>(pos.size());
    nn::LoraDropout d = whole;
    d.place(11, row_start);
    d.positions = Tensor::from_vector(pos, {L}), d.seq_len = T;
    std::vector<Tensor> pieces;  // (2 L, C): the rank's tokens of data rank 1's rows, in its order
    for (int64_t s = 0; s < 2; ++s)
      for (int64_t t = 0; t < L; ++t) pieces.push_back(x.narrow(0, row_start + s * T + pos[t], 1));
    const Tensor local = concat(pieces, 0).contiguous();
    const std::vector<double> got = d.drop(local, C, 0, 7).to_vector<double>();
    for (int64_t s = 0; s < 2; ++s)
      for (int64_t t = 0; t < L; ++t)
        for (int64_t c = 0; c < C; ++c)
          EXPECT_EQ(got[(s * L + t) * C + c], all[(row_start + s * T + pos[t]) * C + c])
              << "positions from " << pos[0] << ", row " << s << ", token " << t << ", channel " << c;
  }
  nn::LoraDropout bad = whole;  // more positions than the sequence's tokens: one clear line
  bad.positions = Tensor::from_vector(std::vector<int32_t>{0, 1, 2}, {3}), bad.seq_len = 2;
  EXPECT_THROW(bad.drop(x, C, 0, 7), Error);
}

TEST(Lora, InitializesAsPeftAndScalesByAlphaOverRankOrItsRoot) {
  nn::LoraAdapter a(64, 10, 4);
  const nn::FlatParams ps = nn::materialize({{"u", a.parameters("x")}}, Device::cpu(), DType::f32, 5);
  const std::vector<float> A = a.A.to_vector<float>(), B = a.B.to_vector<float>();
  float lo = 1, hi = -1;
  for (float v : A) lo = std::min(lo, v), hi = std::max(hi, v);
  EXPECT_GE(lo, -1.0f / 8) << "A ~ U(-1/sqrt(in), 1/sqrt(in)), in = 64";
  EXPECT_LE(hi, 1.0f / 8);
  EXPECT_LT(lo, -0.1f);  // and fills the range
  EXPECT_GT(hi, 0.1f);
  for (float v : B) EXPECT_EQ(v, 0.0f);
  EXPECT_EQ((nn::LoraConfig{.rank = 4, .alpha = 16}.scale()), 4.0);
  EXPECT_EQ((nn::LoraConfig{.rank = 4, .alpha = 16, .rslora = true}.scale()), 8.0);
}

namespace {

models::GPTConfig tiny(const std::string& arch) {
  models::GPTConfig c{
      .arch = arch, .n_layer = 2, .n_head = 4, .n_embd = 16, .vocab_size = 40, .block_size = 16};
  if (arch == "llama") {
    c.n_kv_head = 2;
    c.intermediate_size = 24;
  }
  return c;
}

Tensor tokens(int64_t B, int64_t T, uint64_t seed) {
  std::vector<int32_t> v(static_cast<size_t>(B * T));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int32_t>((i * 7 + seed * 13 + i * i) % 40);
  return Tensor::from_vector(v, {B, T});
}

}  // namespace

// Tensor parallelism splits each adapter with its linear (as rank 1 of 2 holds it):
// column-parallel, lora_B by rows as the linear's columns (GPT-2's c_attn in its q, k and v
// blocks; a Llama's q/k/v parts by kv groups) and lora_A whole with a partial gradient;
// row-parallel, lora_A by columns as the linear's rows and lora_B whole with a partial gradient.
TEST(Lora, TensorParallelSplitsEachAdapterWithItsLinear) {
  struct Want {
    int dim;
    int64_t groups, rows, cols;  // the local shape
    bool partial;
  };
  const std::map<std::string, std::map<std::string, Want>> want{
      {"gpt2",
       {{"attn.c_attn.lora_A", {-1, 1, 2, 16, true}},
        {"attn.c_attn.lora_B", {0, 3, 24, 2, false}},
        {"attn.c_proj.lora_A", {1, 1, 2, 8, false}},
        {"attn.c_proj.lora_B", {-1, 1, 16, 2, true}},
        {"mlp.c_fc.lora_B", {0, 1, 32, 2, false}},
        {"mlp.c_proj.lora_A", {1, 1, 2, 32, false}}}},
      {"llama",
       {{"self_attn.q_proj.lora_A", {-1, 1, 2, 16, true}},
        {"self_attn.q_proj.lora_B", {0, 1, 8, 2, false}},  // NKV G HS = 16 rows: this rank's kv group's
        {"self_attn.k_proj.lora_B", {0, 1, 4, 2, false}},
        {"self_attn.v_proj.lora_B", {0, 1, 4, 2, false}},
        {"self_attn.o_proj.lora_A", {1, 1, 2, 8, false}},
        {"mlp.up_proj.lora_B", {0, 1, 12, 2, false}},
        {"mlp.down_proj.lora_A", {1, 1, 2, 12, false}},
        {"mlp.down_proj.lora_B", {-1, 1, 16, 2, true}}}}};
  for (const auto& [arch, adapters] : want) {
    models::GPT g(tiny(arch));
    g.add_lora({.rank = 2, .targets = {"all-linear"}});
    dist::split_tensor_parallel(g, 2, 1);
    int checked = 0;
    const std::vector<nn::UnitSpec> units = g.adapter_units();
    for (const nn::ParamSpec& p : units[1].params) {
      const auto w = adapters.find(p.name.substr(std::string("h.0.").size()));
      if (w == adapters.end()) continue;
      SCOPED_TRACE(arch + " " + p.name);
      EXPECT_EQ(p.tp.dim, w->second.dim);
      if (w->second.dim >= 0) EXPECT_EQ(p.tp.groups, w->second.groups);
      EXPECT_EQ(p.shape, (Shape{w->second.rows, w->second.cols}));
      EXPECT_EQ(p.tp.partial_grad, w->second.partial);
      ++checked;
    }
    EXPECT_EQ(checked, static_cast<int>(adapters.size())) << arch;
  }
}

// The base alone and the base with fresh adapters (B = 0) give the same loss, bit for bit;
// training steps the adapters only: the base has no gradient buffers and keeps every bit.
// Dropout only while training: with training off (evaluation, generation) a model with
// lora.dropout 0.5 computes what one without dropout does; on, it differs.
TEST(LoraDropout, EvaluationRunsWithoutIt) {
  const Tensor x = tokens(2, 8, 1), y = tokens(2, 8, 2);
  models::GPT plain(tiny("llama")), drop(tiny("llama"));
  plain.add_lora({.rank = 2, .targets = {"all-linear"}});
  drop.add_lora({.rank = 2, .dropout = 0.5, .targets = {"all-linear"}});
  const nn::FlatParams b1 = nn::materialize(plain.units(), Device::cpu(), DType::f32, 9, {}, {}, true),
                       b2 = nn::materialize(drop.units(), Device::cpu(), DType::f32, 9, {}, {}, true);
  const nn::FlatParams a1 = nn::materialize(plain.adapter_units(), Device::cpu(), DType::f32, 9),
                       a2 = nn::materialize(drop.adapter_units(), Device::cpu(), DType::f32, 9);
  for (const nn::FlatParams* a : {&a1, &a2})  // B = 0 would hide the adapters' input
    for (const nn::FlatUnit& u : a->units)
      if (u.data.defined()) kernels::fill_normal(u.data, 3, 4, 0, 0.0f, 0.1f);
  ASSERT_FALSE(drop.lora_dropout->training);  // until a trainer turns it on
  EXPECT_EQ(drop.forward(x, y).loss.item(), plain.forward(x, y).loss.item());
  drop.lora_dropout->training = true;
  EXPECT_NE(drop.forward(x, y).loss.item(), plain.forward(x, y).loss.item());
  drop.lora_dropout->training = false;
  EXPECT_EQ(drop.forward(x, y).loss.item(), plain.forward(x, y).loss.item());
}

TEST(Lora, StartsAsTheBaseAndTrainsOnlyTheAdapters) {
  for (const std::string arch : {"llama", "gpt2"}) {
    SCOPED_TRACE(arch);
    const Tensor x = tokens(2, 8, 1), y = tokens(2, 8, 2);
    models::GPT plain(tiny(arch));
    const nn::FlatParams pp = nn::materialize(plain.units(), Device::cpu(), DType::f32, 9);
    models::GPT gpt(tiny(arch));
    gpt.add_lora({.rank = 2, .alpha = 4, .targets = {"all-linear"}});
    const nn::FlatParams base = nn::materialize(gpt.units(), Device::cpu(), DType::f32, 9, {}, {}, true);
    nn::FlatParams adapters = nn::materialize(gpt.adapter_units(), Device::cpu(), DType::f32, 9);
    EXPECT_EQ(adapters.units.size(), 3u);  // an empty embeddings unit, then one per block
    EXPECT_EQ(adapters.units[0].param_count(), 0);
    EXPECT_EQ(gpt.forward(x, y).loss.item(), plain.forward(x, y).loss.item());
    const std::vector<float> before = ndt::testing::all_values(base),
                             adapters_before = ndt::testing::all_values(adapters);
    optim::AdamW opt(adapters, {});
    double first = 0, last = 0;
    for (int step = 0; step < 5; ++step) {
      adapters.zero_grad();
      const Tensor loss = gpt.forward(x, y).loss;
      (step == 0 ? first : last) = loss.item();
      backward(loss);
      opt.step(0.01);
    }
    for (const nn::FlatUnit& u : base.units) {
      EXPECT_FALSE(u.grad.defined()) << u.name;
      for (const nn::FlatParam& p : u.params) EXPECT_FALSE(p.value.requires_grad()) << p.spec.name;
    }
    EXPECT_EQ(ndt::testing::all_values(base), before) << "the base changed";
    EXPECT_NE(ndt::testing::all_values(adapters), adapters_before);
    EXPECT_LT(last, first);
  }
}

TEST(Lora, BadSettingsAreOneLineNamingTheKey) {
  models::GPT llama(tiny("llama"));
  EXPECT_NE(ndt::testing::error_of([&] {
              llama.add_lora({.rank = 2, .targets = {"c_attn"}});
            }).find("lora.targets: 'c_attn' names none of this model's linears (self_attn.q_proj"),
            std::string::npos);
  models::GPT l2(tiny("llama"));
  EXPECT_NE(ndt::testing::error_of([&] {
              l2.add_lora({.rank = 9, .targets = {"k_proj"}});
            }).find("lora.rank = 9 is above the width 8 of self_attn.k_proj (16 -> 8)"),
            std::string::npos);
  models::GPT l3(tiny("llama"));
  EXPECT_NE(ndt::testing::error_of([&] {
              l3.add_lora({.rank = 2, .dropout = 1});
            }).find("lora.dropout = 1 must be in [0, 1)"),
            std::string::npos);
  // PEFT's default targets: q_proj and v_proj (llama), c_attn (gpt2)
  models::GPT l4(tiny("llama")), g(tiny("gpt2"));
  l4.add_lora({.rank = 2});
  g.add_lora({.rank = 2});
  EXPECT_EQ(l4.lora[0]->names, (std::vector<std::string>{"self_attn.q_proj", "self_attn.v_proj"}));
  EXPECT_EQ(g.lora[0]->names, (std::vector<std::string>{"attn.c_attn"}));
  models::GPT g2(tiny("gpt2"));
  g2.add_lora({.rank = 2, .targets = {"c_proj"}});  // PEFT matches the name's end: both c_proj
  EXPECT_EQ(g2.lora[1]->names, (std::vector<std::string>{"attn.c_proj", "mlp.c_proj"}));
}

namespace {

std::vector<double> metric(const fs::path& metrics, const char* key) {
  std::vector<double> l;
  std::ifstream f(metrics);
  std::string line;
  while (std::getline(f, line)) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains(key)) l.push_back(j[key].get<double>());
  }
  return l;
}

}  // namespace

// train_gpt with [lora] on the weights a full run trained: a stopped and resumed run trains the
// same losses bit for bit from a checkpoint that holds only the adapters; export_weights
// writes it as a PEFT folder, and merged into its base as a model whose validation loss is
// the LoRA run's.
TEST(Lora, TrainGptResumesFromAdapterCheckpointsAndExportsPeftAndMerged) {
  const fs::path d = ndt::testing::fresh_dir("lora_run");
  ndt::testing::write_small_run(d);
  const std::string ini = (d / "gpt.ini").string();
  ndt::testing::RunResult r =
      ndt::testing::run_train_gpt({"--config", ini, "--checkpoint.dir", (d / "base").string()});
  ASSERT_EQ(r.rc, 0) << r.err;
  const std::vector<std::string> lora = {
      "--config",          ini,
      "--model.init_from", (d / "base" / "step_00000008" / "model.safetensors").string(),
      "--lora.rank",       "4",
      "--lora.alpha",      "8",
      "--lora.targets",    "c_attn, c_fc"};
  auto run = [&](std::vector<std::string> more) {
    std::vector<std::string> a = lora;
    a.insert(a.end(), more.begin(), more.end());
    return ndt::testing::run_train_gpt(a);
  };
  r = run({"--log.metrics", (d / "full.jsonl").string(), "--log.grads", (d / "grads.safetensors").string()});
  ASSERT_EQ(r.rc, 0) << r.err;
  {  // log.grads: the adapters' first gradients (B's: A's are zero while B is)
    io::SafeTensorsReader g((d / "grads.safetensors").string());
    EXPECT_EQ(g.entries().size(), 8u);
    const std::vector<float> gb = g.get("grad.h.0.attn.c_attn.lora_B").to_vector<float>();
    EXPECT_TRUE(std::any_of(gb.begin(), gb.end(), [](float v) { return v != 0; }));
  }
  EXPECT_NE(r.out.find("frozen base: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("LoRA adapters (rank 4, scale 2), trained: 2304 in 3 flat buffers"), std::string::npos)
      << r.out;
  r = run({"--log.metrics", (d / "b.jsonl").string(), "--checkpoint.dir", (d / "b").string(),
           "--train.stop_after", "3"});
  ASSERT_EQ(r.rc, 0) << r.err;
  r = run({"--log.metrics", (d / "b.jsonl").string(), "--checkpoint.dir", (d / "b").string(),
           "--checkpoint.resume", "true"});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("resumed from"), std::string::npos) << r.out;
  const std::vector<double> a = metric(d / "full.jsonl", "loss"), b = metric(d / "b.jsonl", "loss");
  ASSERT_EQ(a.size(), 8u);
  ASSERT_EQ(b.size(), 8u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], b[i]) << "step " << i + 1;

  // the checkpoint: the adapters of c_attn and c_fc in both blocks, nothing of the base
  const fs::path step = d / "b" / "step_00000008";
  {
    io::SafeTensorsReader m((step / "model.safetensors").string());
    EXPECT_EQ(m.entries().size(), 8u);
    EXPECT_TRUE(m.has("h.1.mlp.c_fc.lora_B"));
    EXPECT_EQ(m.entries().at("h.0.attn.c_attn.lora_A").shape, (Shape{4, 32}));
    EXPECT_EQ(m.entries().at("h.0.attn.c_attn.lora_B").shape, (Shape{96, 4}));
  }
  // a run without [lora] refuses it, naming why
  r = ndt::testing::run_train_gpt({"--config", ini, "--checkpoint.dir", (d / "b").string(),
                                   "--checkpoint.resume", "true", "--train.steps", "9"});
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("holds LoRA adapters; resume it with its [lora] settings"), std::string::npos)
      << r.err;

  // generate and model.init_from take a model, not adapters: one line saying how
  EXPECT_NE(ndt::testing::error_of([&] {
              ckpt::find_weights((d / "b").string());
            }).find("is a LoRA run's checkpoint: it holds adapters, not a model"),
            std::string::npos);

  // PEFT's folder
  ckpt::export_weights((d / "b").string(), (d / "adapter").string());
  std::ifstream cf(d / "adapter" / "adapter_config.json");
  const nlohmann::json c = nlohmann::json::parse(cf);
  EXPECT_EQ(c["r"], 4);
  EXPECT_EQ(c["lora_alpha"], 8.0);
  EXPECT_EQ(c["target_modules"], (nlohmann::json{"c_attn", "c_fc"}));
  EXPECT_EQ(c["peft_type"], "LORA");
  EXPECT_EQ(c["task_type"], "CAUSAL_LM");
  EXPECT_EQ(c["use_rslora"], false);
  EXPECT_EQ(c["base_model_name_or_path"], (d / "base" / "step_00000008" / "model.safetensors").string());
  io::SafeTensorsReader peft((d / "adapter" / "adapter_model.safetensors").string());
  EXPECT_EQ(peft.entries().size(), 8u);
  EXPECT_TRUE(peft.has("base_model.model.transformer.h.0.attn.c_attn.lora_A.weight"));
  EXPECT_TRUE(peft.has("base_model.model.transformer.h.1.mlp.c_fc.lora_B.weight"));

  // merged: its validation loss (train.steps 0 evaluates) is the LoRA run's at its last step
  ckpt::export_weights((d / "b").string(), (d / "merged").string(), DType::f32, std::cerr, /*merge=*/true);
  r = ndt::testing::run_train_gpt({"--config", ini, "--model.init_from", (d / "merged").string(),
                                   "--train.steps", "0", "--log.metrics", (d / "merged.jsonl").string()});
  ASSERT_EQ(r.rc, 0) << r.err;
  const std::vector<double> lora_val = metric(d / "full.jsonl", "val_loss"),
                            merged_val = metric(d / "merged.jsonl", "val_loss");
  ASSERT_FALSE(lora_val.empty());
  ASSERT_EQ(merged_val.size(), 1u);
  EXPECT_NEAR(merged_val[0], lora_val.back(), 1e-5 * lora_val.back());
  EXPECT_NE(ndt::testing::error_of([&] {
              ckpt::export_weights((d / "base").string(), (d / "x").string(), DType::f32, std::cerr, true);
            }).find("--merge is for a LoRA run's checkpoint"),
            std::string::npos);
}

namespace {

using ndt::testing::max_rel;

// A random base folder (export_hf), ndtrain's float64 logits with random adapters on every
// linear, the adapters as a LoRA checkpoint, exported as a PEFT folder and merged; PEFT's
// logits of the folder on the base (float64) and transformers' of the merged model.
// The reference script's command line (the reference venv's python) and its output.
ndt::testing::ShellResult reference(const std::string& args) {
  return ndt::testing::run_shell(ndt::testing::reference_python() + " " + NDT_SOURCE_DIR +
                                 "/tests/scripts/hf_reference.py " + args + " 2>&1");
}

// d/base: a random tiny model of `arch` as a Hugging Face folder; qwen2: transformers' own
// Qwen2ForCausalLM (biases on q, k and v) made by the reference script, in float64.
void make_base(const fs::path& d, const std::string& arch) {
  if (arch == "qwen2") {
    const ndt::testing::ShellResult r = reference("make " + (d / "made").string() + " --arch qwen2");
    ASSERT_EQ(r.rc, 0) << r.out;
    fs::rename(d / "made" / "model", d / "base");
    return;
  }
  models::GPTConfig c = tiny(arch);
  c.n_embd = 32, c.vocab_size = 64, c.block_size = 32;
  if (arch == "llama") c.intermediate_size = 48;
  models::GPT g(c);
  const nn::FlatParams p = nn::materialize(g.units(), Device::cpu(), DType::f32, 7);
  ckpt::export_hf((d / "base").string(), g, p, DType::f32);
}

// The model's float64 logits (B, T, V) on x (B, T)
Tensor logits64(const models::GPT& gpt, const Tensor& x) {
  autograd::NoGradGuard no_grad;
  const int64_t V = gpt.cfg.vocab_size;
  return gpt.forward(x, Tensor()).logits.narrow(1, 0, V).contiguous().view({x.size(0), x.size(1), V});
}

void check_against_peft(const std::string& arch, bool rslora) {
  if (!fs::exists(ndt::testing::reference_python()))
    GTEST_SKIP() << "peft not available: no venv at " << ndt::testing::reference_python()
                 << " (scripts/setup.sh --reference)";
  const fs::path d = ndt::testing::fresh_dir("lora_peft_" + arch);
  make_base(d, arch);
  if (::testing::Test::HasFatalFailure()) return;
  const io::HfFolder folder((d / "base").string());
  models::GPT gpt(ckpt::model_config(folder.config()));
  gpt.add_lora({.rank = 4, .alpha = 6, .targets = {"all-linear"}, .rslora = rslora});
  const nn::FlatParams base = nn::materialize(gpt.units(), Device::cpu(), DType::f64, 1, {}, {}, true);
  ckpt::load_hf_local(folder, gpt, base);
  const nn::FlatParams a32 = nn::materialize(gpt.adapter_units(), Device::cpu(), DType::f32, 1);
  const nn::FlatParams a64 =
      nn::materialize(gpt.adapter_units(), Device::cpu(), DType::f64, 1);  // the model's
  ckpt::Moments moments;
  for (size_t i = 0; i < a32.units.size(); ++i) {  // B != 0: the adapters matter
    kernels::fill_normal(a32.units[i].data, 3, i, 0, 0.0f, 0.2f);
    a64.units[i].data.copy_(a32.units[i].data.to(DType::f64));
    moments.m.push_back(Tensor::zeros({a32.units[i].numel}));
    moments.v.push_back(Tensor::zeros({a32.units[i].numel}));
  }
  const Tensor x = tokens(2, 8, 5);
  const Tensor ours = logits64(gpt, x);
  ckpt::TrainState st;
  st.step = 1;
  st.extra = ckpt::lora_metadata(gpt, (d / "base").string());
  ckpt::save_checkpoint((d / "ckpt").string(), gpt, a32, moments, st, 0);
  ckpt::export_weights((d / "ckpt").string(), (d / "adapter").string());
  ckpt::export_weights((d / "ckpt").string(), (d / "merged").string(), DType::f32, std::cerr, true);
  io::SafeTensorsWriter in;
  in.add("inputs", x);
  in.write((d / "inputs.safetensors").string());
  const ndt::testing::ShellResult r = reference(
      "peft " + (d / "base").string() + " " + (d / "adapter").string() + " " + (d / "merged").string() +
      " --inputs " + (d / "inputs.safetensors").string() + " --out " + (d / "out.safetensors").string());
  if (r.rc == 3) GTEST_SKIP() << r.out;
  ASSERT_EQ(r.rc, 0) << r.out;
  io::SafeTensorsReader ref((d / "out.safetensors").string());
  const double peft = max_rel(ours, ref.get("peft", DType::f64)),
               merged = max_rel(ours, ref.get("merged", DType::f64));
  std::cout << arch << ": logits within " << peft << " of PEFT's, " << merged << " of the merged model's\n";
  EXPECT_LT(peft, 1e-10);
  EXPECT_LT(merged, 1e-5);                                             // merged in float32
  for (const nn::FlatUnit& u : a64.units) kernels::fill(u.data, 0.0);  // without the adapters: other logits
  EXPECT_GT(max_rel(logits64(gpt, x), ours), 1e-3);
}

}  // namespace

TEST(Lora, LlamaAdapterExportsEqualPeftInFloat64) { check_against_peft("llama", false); }
TEST(Lora, Gpt2RsloraAdapterExportsEqualPeftInFloat64) { check_against_peft("gpt2", true); }
TEST(Lora, Qwen2AdapterWithQkvBiasesExportsEqualPeftInFloat64) { check_against_peft("qwen2", false); }

// An adapter PEFT made (get_peft_model, random A and B, lora_dropout 0.05, which eval ignores)
// on transformers' Qwen2 (q, k, v biases), read with read_peft_config and load_peft_adapters:
// PEFT's float64 logits.
TEST(Lora, PeftMadeAdapterReadInGivesPeftsLogitsInFloat64) {
  if (!fs::exists(ndt::testing::reference_python()))
    GTEST_SKIP() << "peft not available: no venv at " << ndt::testing::reference_python();
  const fs::path d = ndt::testing::fresh_dir("lora_peft_made");
  make_base(d, "qwen2");
  if (HasFatalFailure()) return;
  const Tensor x = tokens(2, 8, 3);
  io::SafeTensorsWriter in;
  in.add("inputs", x);
  in.write((d / "inputs.safetensors").string());
  const ndt::testing::ShellResult r = reference(
      "peft-make " + (d / "base").string() + " " + (d / "adapter").string() +
      " --targets down_proj,q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj --r 4 --alpha 6 --dropout 0.05"
      " --inputs " +
      (d / "inputs.safetensors").string() + " --out " + (d / "out.safetensors").string());
  if (r.rc == 3) GTEST_SKIP() << r.out;
  ASSERT_EQ(r.rc, 0) << r.out;
  nn::LoraConfig c = ckpt::read_peft_config((d / "adapter").string());
  EXPECT_EQ(c.rank, 4);
  EXPECT_EQ(c.alpha, 6.0);
  EXPECT_EQ(c.dropout, 0.05);
  EXPECT_EQ(c.targets.size(), 7u);
  c.dropout = 0;  // eval: PEFT applies none
  const io::HfFolder folder((d / "base").string());
  models::GPT gpt(ckpt::model_config(folder.config()));
  ASSERT_TRUE(gpt.cfg.attention_bias);
  gpt.add_lora(c);
  const nn::FlatParams base = nn::materialize(gpt.units(), Device::cpu(), DType::f64, 1, {}, {}, true);
  ckpt::load_hf_local(folder, gpt, base);
  const nn::FlatParams a = nn::materialize(gpt.adapter_units(), Device::cpu(), DType::f64, 1);
  ckpt::load_peft_adapters((d / "adapter").string(), gpt.cfg.arch, a);
  io::SafeTensorsReader ref((d / "out.safetensors").string());
  const double err = max_rel(logits64(gpt, x), ref.get("peft", DType::f64));
  std::cout << "PEFT-made adapter: logits within " << err << " of PEFT's\n";
  EXPECT_LT(err, 1e-10);
  // a folder for another base: its shapes, one line
  models::GPTConfig other = gpt.cfg;
  other.intermediate_size += 8;
  models::GPT g2(other);
  g2.add_lora(c);
  const nn::FlatParams a2 = nn::materialize(g2.adapter_units(), Device::cpu(), DType::f32, 1);
  EXPECT_NE(ndt::testing::error_of([&] {
              ckpt::load_peft_adapters((d / "adapter").string(), "llama", a2);
            }).find("the adapter was made for another base model"),
            std::string::npos);
}

TEST(Lora, TrainGptRefusesABadLoraConfigAtStartWithCode2) {
  const fs::path d = ndt::testing::fresh_dir("lora_bad");
  ndt::testing::write_small_run(d);
  const std::string ini = (d / "gpt.ini").string();
  ndt::testing::RunResult r = ndt::testing::run_train_gpt({"--config", ini, "--lora.rank", "4"});
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.err.find("lora.rank = 4 trains adapters on a frozen base, which comes from model.init_from"),
            std::string::npos)
      << r.err;
  r = ndt::testing::run_train_gpt(
      {"--config", ini, "--checkpoint.dir", (d / "base").string(), "--train.steps", "1"});
  ASSERT_EQ(r.rc, 0) << r.err;
  const std::string base = (d / "base" / "step_00000001" / "model.safetensors").string();
  r = ndt::testing::run_train_gpt(
      {"--config", ini, "--model.init_from", base, "--lora.rank", "4", "--lora.targets", "q_proj"});
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.err.find("lora.targets: 'q_proj' names none of this model's linears (attn.c_attn"),
            std::string::npos)
      << r.err;
  r = ndt::testing::run_train_gpt({"--config", ini, "--lora.targets", "c_attn", "--train.steps", "0"});
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_NE((r.out + r.err).find("lora.targets and lora.rslora have no effect: lora.rank is 0"),
            std::string::npos)
      << r.out << r.err;
}

namespace {

// generate's text (its stdout) for these arguments, greedy (or with `sampling`); its exit code in *rc
std::string greedy(const std::string& args, int* rc, const std::string& sampling = "--temperature 0") {
  const ndt::testing::ShellResult r = ndt::testing::run_shell("{ " + std::string(NDT_GENERATE_BIN) +
                                                              " --max_new_tokens 48 --prompt 'the cat ' " +
                                                              sampling + " " + args + " 2>/dev/null; }");
  *rc = r.rc;
  return r.out;
}

}  // namespace

// lora.init_from: an adapter exported from a run, read back, starts where that run ended (its
// validation loss bit for bit), filling the [lora] keys not given and saying so; generate
// --adapter (the PEFT folder, or the run's checkpoint) writes the merged export's greedy text;
// bad folders and disagreeing keys are one line each, exit code 2.
TEST(Lora, InitFromAnExportedAdapterAndGenerateWithAnAdapter) {
  const fs::path d = ndt::testing::fresh_dir("lora_init_from");
  ndt::testing::write_small_run(d);
  const std::string ini = (d / "gpt.ini").string();
  ndt::testing::RunResult r =
      ndt::testing::run_train_gpt({"--config", ini, "--checkpoint.dir", (d / "base").string(),
                                   "--checkpoint.format", "sharded"});  // a model generate reads
  ASSERT_EQ(r.rc, 0) << r.err;
  const std::string base = (d / "base").string();
  r = ndt::testing::run_train_gpt({"--config", ini, "--model.init_from", base, "--lora.rank", "4",
                                   "--lora.alpha", "8", "--lora.targets", "c_attn,c_fc", "--checkpoint.dir",
                                   (d / "a").string(), "--log.metrics", (d / "a.jsonl").string()});
  ASSERT_EQ(r.rc, 0) << r.err;
  const std::string adapter = (d / "adapter").string();
  ckpt::export_weights((d / "a").string(), adapter);
  r = ndt::testing::run_train_gpt({"--config", ini, "--model.init_from", base, "--lora.init_from", adapter,
                                   "--train.steps", "0", "--log.metrics", (d / "c.jsonl").string()});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(
      r.out.find("lora.init_from " + adapter +
                 ": lora.rank = 4, lora.alpha = 8, lora.targets = c_attn,c_fc, lora.rslora = false from its "
                 "adapter_config.json"),
      std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("LoRA adapters (rank 4, scale 2), trained: 2304"), std::string::npos) << r.out;
  const std::vector<double> a = metric(d / "a.jsonl", "val_loss"), c = metric(d / "c.jsonl", "val_loss");
  ASSERT_FALSE(a.empty());
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0], a.back()) << "the adapters read back give the run's last validation loss";
  // without lora.init_from, the same keys start from fresh adapters: the base's loss, not the run's
  r = ndt::testing::run_train_gpt({"--config", ini, "--model.init_from", base, "--lora.rank", "4",
                                   "--lora.targets", "c_attn,c_fc", "--train.steps", "0", "--log.metrics",
                                   (d / "f.jsonl").string()});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(metric(d / "f.jsonl", "val_loss").at(0), a.back());
  // it trains on from there: keys given that agree, a checkpoint, exported again
  r = ndt::testing::run_train_gpt({"--config", ini, "--model.init_from", base, "--lora.init_from", adapter,
                                   "--lora.rank", "4", "--train.steps", "2", "--checkpoint.dir",
                                   (d / "e").string()});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("lora.alpha = 8, lora.targets = c_attn,c_fc, lora.rslora = false from"),
            std::string::npos)
      << r.out;

  // bad: a key that disagrees, folders PEFT options ndtrain does not apply, targets of another model
  auto refused = [&](const std::vector<std::string>& more, const std::string& want) {
    std::vector<std::string> args = {"--config", ini, "--model.init_from", base, "--train.steps", "0"};
    args.insert(args.end(), more.begin(), more.end());
    const ndt::testing::RunResult b = ndt::testing::run_train_gpt(args);
    EXPECT_EQ(b.rc, 2) << b.out;
    EXPECT_NE(b.err.find(want), std::string::npos) << b.err;
  };
  refused({"--lora.init_from", adapter, "--lora.rank", "8"},
          "lora.rank = 8 (given) but r = 4 in " + adapter + "/adapter_config.json (lora.init_from); give 4");
  refused({"--lora.init_from", adapter, "--lora.targets", "c_attn"}, "lora.targets = c_attn (given) but");
  refused({"--lora.init_from", (d / "nothing").string()},
          "is not a PEFT adapter folder (no adapter_config.json)");
  auto edited = [&](const std::string& name, const std::string& key, const nlohmann::json& value) {
    const fs::path to = d / name;
    fs::copy(adapter, to);
    std::ifstream in(to / "adapter_config.json");
    nlohmann::json j = nlohmann::json::parse(in);
    j[key] = value;
    std::ofstream(to / "adapter_config.json") << j.dump(2);
    return to.string();
  };
  refused({"--lora.init_from", edited("dora", "use_dora", true)}, "use_dora = true is not supported");
  refused({"--lora.init_from", edited("save", "modules_to_save", {"lm_head"})},
          "modules_to_save = [\"lm_head\"] is not supported");
  refused({"--lora.init_from", edited("regex", "target_modules", ".*attn.*")},
          "is a regular expression, which ndtrain does not match");
  refused({"--lora.init_from", edited("q", "target_modules", {"q_proj"})},
          "lora.targets: 'q_proj' names none of this model's linears");
  {  // another model's adapters: shapes
    const std::string other = edited("wide", "r", 4);
    io::SafeTensorsWriter w;
    const io::SafeTensorsReader from((fs::path(adapter) / "adapter_model.safetensors").string());
    for (const auto& [name, e] : from.entries())
      w.add(name, name.find("c_fc.lora_A") != std::string::npos ? Tensor::zeros({4, 64}) : from.get(name));
    w.write((fs::path(other) / "adapter_model.safetensors").string());
    r = ndt::testing::run_train_gpt(
        {"--config", ini, "--model.init_from", base, "--lora.init_from", other, "--train.steps", "0"});
    EXPECT_NE(r.rc, 0);
    EXPECT_NE(r.err.find("h.0.mlp.c_fc.lora_A.weight is "), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("; the adapter was made for another base model"), std::string::npos) << r.err;
  }

  // generate --adapter on the base's folder: the merged export's greedy text, from the PEFT folder
  // or the run's checkpoint
  ckpt::export_weights((d / "a").string(), (d / "merged").string(), DType::f32, std::cerr, /*merge=*/true);
  const std::string base_hf = base;
  const std::string tok = " --tokenizer " + (d / "data" / "vocab.json").string();
  int rc = 0;
  const std::string merged = greedy("--model " + (d / "merged").string() + tok, &rc);
  ASSERT_EQ(rc, 0);
  EXPECT_GT(merged.size(), 16u) << merged;
  EXPECT_EQ(greedy("--model " + base_hf + " --adapter " + adapter + tok, &rc), merged);
  EXPECT_EQ(rc, 0);
  EXPECT_EQ(greedy("--model " + base_hf + " --adapter " + (d / "a").string() + tok, &rc), merged);
  EXPECT_EQ(rc, 0);
  // drawn at temperature 1 (every logit matters): the same text, and the base's differs
  const std::string drawn = "--temperature 1 --top_k 0 --top_p 1 --seed 5";
  const std::string merged_drawn = greedy("--model " + (d / "merged").string() + tok, &rc, drawn);
  EXPECT_EQ(greedy("--model " + base_hf + " --adapter " + adapter + tok, &rc, drawn), merged_drawn);
  EXPECT_NE(greedy("--model " + base_hf + tok, &rc, drawn), merged_drawn)
      << "the base alone draws other text";
  greedy("--model " + base_hf + " --adapter " + (d / "nothing").string() + tok, &rc);
  EXPECT_EQ(rc, 2);
}
