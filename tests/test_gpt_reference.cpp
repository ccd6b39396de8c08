// A golden check of the GPT forward (llm.c test_gpt2.c style): logits and loss of
// models::GPT against an independent, naive float64 implementation written here with
// plain loops from the paper's equations -- no ndtrain kernels or ops. Together with the
// finite-difference check of every parameter's gradient (test_gradcheck_gpt.cpp), this pins
// down the forward and the backward.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "autograd/node.h"
#include "models/gpt.h"
#include "tensor/kernels.h"

using namespace ndt;

namespace {

using Mat = std::vector<double>;  // row-major

struct Ref {
  const models::GPTConfig& c;
  const nn::FlatParams& p;
  Mat get(const std::string& name) const { return p.find(name)->value.to_vector<double>(); }

  // x (T,C) -> (T,C)
  Mat layernorm(const Mat& x, int64_t T, int64_t C, const std::string& pre) const {
    Mat w = get(pre + ".weight"), b = get(pre + ".bias"), y(T * C);
    for (int64_t t = 0; t < T; ++t) {
      double m = 0, v = 0;
      for (int64_t i = 0; i < C; ++i) m += x[t * C + i];
      m /= C;
      for (int64_t i = 0; i < C; ++i) v += (x[t * C + i] - m) * (x[t * C + i] - m);
      v /= C;
      for (int64_t i = 0; i < C; ++i) y[t * C + i] = (x[t * C + i] - m) / std::sqrt(v + 1e-5) * w[i] + b[i];
    }
    return y;
  }
  // x (T,IN) @ W (IN,OUT) + b -> (T,OUT)
  Mat linear(const Mat& x, int64_t T, int64_t IN, int64_t OUT, const std::string& pre) const {
    Mat w = get(pre + ".weight"), b = get(pre + ".bias"), y(T * OUT);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t o = 0; o < OUT; ++o) {
        double s = b[o];
        for (int64_t i = 0; i < IN; ++i) s += x[t * IN + i] * w[i * OUT + o];
        y[t * OUT + o] = s;
      }
    return y;
  }
  // one sequence: ids (T) -> logits (T, V)
  Mat forward(const std::vector<int32_t>& ids) const {
    const int64_t T = static_cast<int64_t>(ids.size()), C = c.n_embd, NH = c.n_head, HS = C / NH;
    Mat wte = get("wte.weight"), wpe = get("wpe.weight"), x(T * C);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < C; ++i) x[t * C + i] = wte[ids[t] * C + i] + wpe[t * C + i];
    for (int64_t l = 0; l < c.n_layer; ++l) {
      const std::string h = "h." + std::to_string(l);
      Mat qkv = linear(layernorm(x, T, C, h + ".ln_1"), T, C, 3 * C, h + ".attn.c_attn");
      Mat y(T * C, 0.0);
      for (int64_t hd = 0; hd < NH; ++hd)
        for (int64_t t = 0; t < T; ++t) {
          // softmax over s <= t of q_t . k_s / sqrt(HS)
          std::vector<double> a(t + 1);
          double mx = -1e300, z = 0;
          for (int64_t s = 0; s <= t; ++s) {
            double d = 0;
            for (int64_t i = 0; i < HS; ++i)
              d += qkv[t * 3 * C + hd * HS + i] * qkv[s * 3 * C + C + hd * HS + i];
            a[s] = d / std::sqrt(static_cast<double>(HS));
            mx = std::max(mx, a[s]);
          }
          for (int64_t s = 0; s <= t; ++s) z += a[s] = std::exp(a[s] - mx);
          for (int64_t s = 0; s <= t; ++s)
            for (int64_t i = 0; i < HS; ++i)
              y[t * C + hd * HS + i] += a[s] / z * qkv[s * 3 * C + 2 * C + hd * HS + i];
        }
      Mat proj = linear(y, T, C, C, h + ".attn.c_proj");
      for (int64_t i = 0; i < T * C; ++i) x[i] += proj[i];
      Mat f = linear(layernorm(x, T, C, h + ".ln_2"), T, C, 4 * C, h + ".mlp.c_fc");
      for (double& v : f) v = 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
      Mat m = linear(f, T, 4 * C, C, h + ".mlp.c_proj");
      for (int64_t i = 0; i < T * C; ++i) x[i] += m[i];
    }
    x = layernorm(x, T, C, "ln_f");
    Mat logits(T * c.vocab_size);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t v = 0; v < c.vocab_size; ++v) {
        double s = 0;
        for (int64_t i = 0; i < C; ++i) s += x[t * C + i] * wte[v * C + i];
        logits[t * c.vocab_size + v] = s;
      }
    return logits;
  }
};

}  // namespace

TEST(GPTReference, LogitsAndLossMatchANaiveImplementation) {
  models::GPTConfig c;
  c.n_layer = 2, c.n_head = 3, c.n_embd = 12, c.vocab_size = 11, c.block_size = 9, c.vocab_multiple = 8;
  models::GPT gpt(c);
  nn::FlatParams params = nn::materialize(gpt.units(), Device::cpu(), DType::f64, 3);
  for (size_t i = 0; i < params.units.size(); ++i) {  // move biases and norms off 0 and 1
    Tensor noise = Tensor::empty(params.units[i].data.shape(), DType::f64);
    kernels::fill_normal(noise, 9, i, 0, 0.0f, 0.2f);
    kernels::add_(params.units[i].data, noise);
  }
  kernels::fill(gpt.wte.weight.narrow(0, 11, 5), 0.0);  // padded rows as in training
  const int64_t B = 2, T = 9;
  std::vector<int32_t> ids(B * T), tg(B * T);
  for (int64_t i = 0; i < B * T; ++i)
    ids[i] = static_cast<int32_t>((7 * i + 3) % 11), tg[i] = static_cast<int32_t>((5 * i + 1) % 11);
  autograd::NoGradGuard no_grad;
  models::GPTOutput out = gpt.forward(Tensor::from_vector(ids, {B, T}), Tensor::from_vector(tg, {B, T}));
  ASSERT_EQ(out.logits.shape(), (Shape{B * T, 16}));  // padded vocab
  std::vector<double> got = out.logits.to_vector<double>();
  Ref ref{c, params};
  double loss = 0;
  for (int64_t b = 0; b < B; ++b) {
    Mat want = ref.forward({ids.begin() + b * T, ids.begin() + (b + 1) * T});
    for (int64_t t = 0; t < T; ++t) {
      double mx = -1e300, z = 0;
      for (int64_t v = 0; v < 11; ++v) {
        EXPECT_NEAR(got[(b * T + t) * 16 + v], want[t * 11 + v], 1e-12)
            << "b " << b << " t " << t << " v " << v;
        mx = std::max(mx, want[t * 11 + v]);
      }
      for (int64_t v = 0; v < 11; ++v) z += std::exp(want[t * 11 + v] - mx);
      loss += mx + std::log(z) - want[t * 11 + tg[b * T + t]];
    }
  }
  EXPECT_NEAR(out.loss.item(), loss / (B * T), 1e-12);
}
