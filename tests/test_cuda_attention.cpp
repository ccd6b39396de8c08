// The fused attention (cuDNN SDPA, tensor/cuda/sdpa.h) against the composed path
// (attention_composed) on the same GPU inputs (label gpu): out and lse of the forward, and
// dq, dk, dv through autograd, causal and unmasked, at small shapes and at GPT-2's
// (B 2, NH 12, T 1024, HS 64), from strided views of one qkv tensor, and with a dlse (two
// key blocks merged as ring attention does); and grouped-query attention (k, v with NKV < NH
// heads) on the GPU, fused and composed, against the CPU's attention on the same values.
// Legend: B batch, NH heads, NKV key/value heads, T time, HS head size.
//
// Tolerances (bf16 keeps 8 significant bits, relative rounding 2^-9 ~ 2e-3): both paths take
// the same bf16 inputs and round out and the gradients to bf16; cuDNN also rounds the
// probabilities and dS to bf16 before its second GEMMs, where the composed path stays in f32.
//   out, dq, dk, dv: ||fused - composed|| / ||composed|| <= 2e-2
//   lse (f32, computed from the same bf16 inputs in f32): max |fused - composed| <= 2e-3
// An error in masking, scaling, the lse's definition or a layout gives errors of order 1.
//
// sdpa_supported() is also checked where no GPU is (CPU tensors, f32). Without a CUDA device
// (or without the frontend headers) the GPU tests are skipped.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "autograd/ops.h"
#include "support/op_cases.h"
#include "tensor/cuda/runtime.h"
#include "tensor/cuda/sdpa.h"

using namespace ndt;
using namespace ndt::testing;

namespace {

constexpr double kTolOut = 2e-2, kTolGrad = 2e-2, kTolLse = 2e-3;
const Device kGpu = Device::cuda(0);

// ||a - ref|| / ||ref|| in f64 on the host (NaN anywhere gives NaN, so the check fails).
double rel_err(const Tensor& a, const Tensor& ref) {
  EXPECT_EQ(a.shape(), ref.shape());
  if (a.shape() != ref.shape()) return std::numeric_limits<double>::infinity();
  const std::vector<double> va = a.to_vector<double>(), vr = ref.to_vector<double>();
  double num = 0, den = 0;
  for (size_t i = 0; i < va.size(); ++i) num += (va[i] - vr[i]) * (va[i] - vr[i]), den += vr[i] * vr[i];
  return den == 0 ? std::numeric_limits<double>::infinity() : std::sqrt(num / den);
}

double max_abs_diff(const Tensor& a, const Tensor& ref) {
  EXPECT_EQ(a.shape(), ref.shape());
  const std::vector<double> va = a.to_vector<double>(), vr = ref.to_vector<double>();
  double m = 0;
  for (size_t i = 0; i < va.size(); ++i) {
    const double d = std::abs(va[i] - vr[i]);
    if (std::isnan(d)) return std::numeric_limits<double>::quiet_NaN();
    m = std::max(m, d);
  }
  return m;
}

// A leaf with the values of t (any strides kept) that collects its gradient.
Tensor leaf(const Tensor& t) {
  Tensor l = t.detach();
  l.set_requires_grad(true);
  return l;
}

class CudaAttention : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda::available())
      GTEST_SKIP() << (cuda::compiled() ? "no CUDA device visible" : "ndtrain was built without CUDA");
    if (!cuda::sdpa_compiled())
      GTEST_SKIP() << "built without the cuDNN frontend headers (no fused attention)";
  }
};

struct Result {
  Tensor out, lse, dq, dk, dv;
};

// How strictly a case asks for the fused path. GPT-2's shapes (head size 64, causal, the
// model's strided q/k/v) must run fused. For other shapes (head sizes 32 and 128, Tq != Tk)
// a cuDNN that cannot build the graph is the designed fallback, not a bug: the case then
// says so on stdout and compares the composed path with itself.
enum class Fused { kRequired, kIfCudnnBuildsIt };

// attention (fused) or attention_composed on leaves made from q, k, v, then backward of
// L = sum(out * dout) [+ sum(lse * dlse)] -> out, lse and the leaves' gradients.
Result run(bool fused, const Tensor& q, const Tensor& k, const Tensor& v, int64_t q_off, int64_t k_off,
           const Tensor& dout, const Tensor& dlse, Fused need = Fused::kRequired) {
  Tensor lq = leaf(q), lk = leaf(k), lv = leaf(v);
  if (fused) {
    std::string why;
    EXPECT_TRUE(cuda::sdpa_supported(lq, lk, lv, q_off, k_off, &why))
        << "the fused path is not taken: " << why;
    // attention() falls back to the composed path when cuDNN cannot build the graphs: make
    // sure it did not (the comparison would then pass trivially)
    const bool causal = k_off + k.size(2) - 1 > q_off;
    const bool built = cuda::sdpa_prepare(lq, lk, lv, causal, 1.0 / std::sqrt(double(q.size(3))), true, &why);
    if (need == Fused::kRequired)
      EXPECT_TRUE(built) << "cuDNN cannot build the graphs: " << why;
    else if (!built)
      std::printf("note: %s (the composed path is compared with itself)\n", why.c_str());
  }
  AttentionOut r = fused ? attention(lq, lk, lv, q_off, k_off) : attention_composed(lq, lk, lv, q_off, k_off);
  Tensor loss = sum(mul(r.out, dout));
  if (dlse.defined()) loss = add(loss, sum(mul(r.lse, dlse)));
  backward(loss);
  return {r.out.detach(), r.lse.detach(), lq.grad(), lk.grad(), lv.grad()};
}

void expect_match(const Result& got, const Result& ref, const std::string& what) {
  EXPECT_LE(rel_err(got.out, ref.out), kTolOut) << what << ": out";
  EXPECT_LE(max_abs_diff(got.lse, ref.lse), kTolLse) << what << ": lse";
  EXPECT_LE(rel_err(got.dq, ref.dq), kTolGrad) << what << ": dq";
  EXPECT_LE(rel_err(got.dk, ref.dk), kTolGrad) << what << ": dk";
  EXPECT_LE(rel_err(got.dv, ref.dv), kTolGrad) << what << ": dv";
}

// q (B,NH,Tq,HS), k and v (B,NH,Tk,HS) random bf16 (never zeros), fused vs composed.
void compare(int64_t B, int64_t NH, int64_t Tq, int64_t Tk, int64_t HS, int64_t q_off, int64_t k_off,
             bool with_dlse = false, Fused need = Fused::kRequired) {
  const std::string what = "B" + std::to_string(B) + " NH" + std::to_string(NH) + " Tq" + std::to_string(Tq) +
                           " Tk" + std::to_string(Tk) + " HS" + std::to_string(HS) + " q_off" +
                           std::to_string(q_off) + " k_off" + std::to_string(k_off) +
                           (with_dlse ? " dlse" : "");
  Tensor q = randn({B, NH, Tq, HS}, DType::bf16, kGpu, 1), k = randn({B, NH, Tk, HS}, DType::bf16, kGpu, 2),
         v = randn({B, NH, Tk, HS}, DType::bf16, kGpu, 3),
         dout = randn({B, NH, Tq, HS}, DType::bf16, kGpu, 4);
  Tensor dlse = with_dlse ? randn({B, NH, Tq}, DType::f32, kGpu, 5) : Tensor();
  expect_match(run(true, q, k, v, q_off, k_off, dout, dlse, need),
               run(false, q, k, v, q_off, k_off, dout, dlse), what);
}

}  // namespace

// ---- where the fused path applies (runs anywhere) -------------------------------------------
TEST(SdpaSupported, FalseWithAReasonForCpuTensorsAndF32) {
  const bool env_off = std::getenv("NDT_SDPA") && std::string(std::getenv("NDT_SDPA")) == "0";
  for (DType dt : {DType::bf16, DType::f32}) {
    Tensor q = randn({2, 3, 16, 64}, dt, Device::cpu(), 1);
    std::string why;
    EXPECT_FALSE(cuda::sdpa_supported(q, q, q, 0, 0, &why)) << dtype_name(dt) << " on cpu";
    EXPECT_FALSE(why.empty()) << dtype_name(dt) << " on cpu: no reason given";
    if (cuda::sdpa_compiled() && !env_off) EXPECT_NE(why.find("cpu"), std::string::npos) << why;
    // and on CPU attention() is the composed path, bit for bit, when both multiply on
    // OpenBLAS (the fused kernel calls it itself; the composed one's GEMMs follow NDT_F32_GEMM)
    Tensor k = randn({2, 3, 16, 64}, dt, Device::cpu(), 2), v = randn({2, 3, 16, 64}, dt, Device::cpu(), 3);
    setenv("NDT_F32_GEMM", "openblas", 1);
    AttentionOut a = attention(q, k, v), b = attention_composed(q, k, v);
    unsetenv("NDT_F32_GEMM");
    EXPECT_EQ(a.out.to_vector<float>(), b.out.to_vector<float>());
    EXPECT_EQ(a.lse.to_vector<float>(), b.lse.to_vector<float>());
  }
  if (cuda::available()) {
    Tensor q = randn({2, 3, 16, 64}, DType::f32, kGpu, 1);
    std::string why;
    EXPECT_FALSE(cuda::sdpa_supported(q, q, q, 0, 0, &why)) << "f32 on cuda";
    EXPECT_FALSE(why.empty());
    if (cuda::sdpa_compiled() && !env_off) EXPECT_NE(why.find("bf16"), std::string::npos) << why;
  }
}

TEST_F(CudaAttention, SupportedForCausalAndUnmaskedOnly) {
  Tensor q = randn({2, 3, 64, 64}, DType::bf16, kGpu, 1), k = randn({2, 3, 64, 64}, DType::bf16, kGpu, 2);
  std::string why;
  EXPECT_TRUE(cuda::sdpa_supported(q, k, k, 0, 0, &why)) << why;    // causal from the top-left
  EXPECT_TRUE(cuda::sdpa_supported(q, k, k, 64, 0, &why)) << why;   // every key before every query
  EXPECT_TRUE(cuda::sdpa_supported(q, k, k, 500, 7, &why)) << why;  // the same, further apart
  EXPECT_FALSE(cuda::sdpa_supported(q, k, k, 32, 0, &why));         // partial diagonal
  EXPECT_NE(why.find("mask"), std::string::npos) << why;
  EXPECT_FALSE(cuda::sdpa_supported(q, k, k, 0, 2, &why));  // rows that see no key
  Tensor k100 = randn({2, 3, 100, 64}, DType::bf16, kGpu, 3);
  EXPECT_FALSE(cuda::sdpa_supported(q, k100, k100, 0, 0, &why));  // Tq != Tk with a diagonal
  EXPECT_TRUE(cuda::sdpa_supported(q, k100, k100, 100, 0, &why)) << why;
  Tensor k1 = randn({2, 1, 64, 64}, DType::bf16, kGpu, 6);  // grouped-query: 3 query heads over 1
  EXPECT_TRUE(cuda::sdpa_supported(q, k1, k1, 0, 0, &why)) << why;
  Tensor k2 = randn({2, 2, 64, 64}, DType::bf16, kGpu, 7);  // 2 does not divide 3
  EXPECT_FALSE(cuda::sdpa_supported(q, k2, k2, 0, 0, &why));
  Tensor q12 = randn({2, 3, 64, 12}, DType::bf16, kGpu, 4);  // head size not a multiple of 8
  EXPECT_FALSE(cuda::sdpa_supported(q12, q12, q12, 0, 0, &why));
  EXPECT_NE(why.find("head size"), std::string::npos) << why;
  Tensor q256 = randn({1, 1, 16, 256}, DType::bf16, kGpu, 5);  // above 128
  EXPECT_FALSE(cuda::sdpa_supported(q256, q256, q256, 0, 0, &why));
}

// ---- fused vs composed -----------------------------------------------------------------------
TEST_F(CudaAttention, CausalSmall) {
  compare(2, 3, 64, 64, 64, 0, 0);
  compare(2, 3, 100, 100, 64, 0, 0);
  compare(2, 3, 100, 100, 64, 37, 37);  // same offsets: still the top-left diagonal
}

TEST_F(CudaAttention, CausalGpt2Shape) { compare(2, 12, 1024, 1024, 64, 0, 0); }

TEST_F(CudaAttention, UnmaskedWhenEveryKeyIsVisible) {
  compare(2, 3, 64, 64, 64, 64, 0);                                     // ring attention's past block
  compare(2, 3, 64, 100, 64, 200, 50, false, Fused::kIfCudnnBuildsIt);  // keys 50..149, queries 200..263
  compare(2, 3, 100, 64, 64, 64, 0, false, Fused::kIfCudnnBuildsIt);    // keys 0..63, queries 64..163
}

TEST_F(CudaAttention, HeadSizes) {
  compare(1, 2, 64, 64, 32, 0, 0, false, Fused::kIfCudnnBuildsIt);
  compare(1, 2, 64, 64, 128, 0, 0, false, Fused::kIfCudnnBuildsIt);
}

// The gradient of lse as well (cuDNN's backward has none: the node recomputes through the
// composed kernels), alone and as ring attention produces it, merging two key blocks.
TEST_F(CudaAttention, WithDlse) {
  compare(2, 3, 64, 64, 64, 0, 0, /*with_dlse=*/true);
  compare(2, 3, 64, 100, 64, 200, 50, /*with_dlse=*/true, Fused::kIfCudnnBuildsIt);
}

TEST_F(CudaAttention, MergedBlocks) {
  const int64_t B = 2, NH = 3, T = 64, HS = 64;
  // queries 64..127 against keys 0..63 (all visible) and keys 64..127 (causal), merged
  Tensor q = randn({B, NH, T, HS}, DType::bf16, kGpu, 1), ka = randn({B, NH, T, HS}, DType::bf16, kGpu, 2),
         va = randn({B, NH, T, HS}, DType::bf16, kGpu, 3), kb = randn({B, NH, T, HS}, DType::bf16, kGpu, 4),
         vb = randn({B, NH, T, HS}, DType::bf16, kGpu, 5), dout = randn({B, NH, T, HS}, DType::bf16, kGpu, 6);
  std::vector<Tensor> grads[2];
  Tensor outs[2], lses[2];
  for (int fused : {1, 0}) {
    std::vector<Tensor> in = {leaf(q), leaf(ka), leaf(va), leaf(kb), leaf(vb)};
    auto att = fused ? attention : attention_composed;
    if (fused) {  // and cuDNN builds both graphs (else the comparison would be composed to composed)
      const double scale = 1.0 / std::sqrt(static_cast<double>(HS));
      std::string why;
      EXPECT_TRUE(cuda::sdpa_supported(in[0], in[1], in[2], 64, 0));
      EXPECT_TRUE(cuda::sdpa_supported(in[0], in[3], in[4], 64, 64));
      EXPECT_TRUE(cuda::sdpa_prepare(in[0], in[1], in[2], /*causal=*/false, scale, true, &why)) << why;
      EXPECT_TRUE(cuda::sdpa_prepare(in[0], in[3], in[4], /*causal=*/true, scale, true, &why)) << why;
    }
    AttentionOut a = att(in[0], in[1], in[2], 64, 0, 0.0, Tensor()),
                 b = att(in[0], in[3], in[4], 64, 64, 0.0, Tensor());
    AttentionOut m = merge_attention(a.out, a.lse, b.out, b.lse);
    backward(sum(mul(m.out, dout)));
    outs[fused] = m.out.detach();
    lses[fused] = m.lse.detach();
    for (const Tensor& t : in) grads[fused].push_back(t.grad());
  }
  EXPECT_LE(rel_err(outs[1], outs[0]), kTolOut) << "merged out";
  EXPECT_LE(max_abs_diff(lses[1], lses[0]), kTolLse) << "merged lse";
  const char* names[] = {"dq", "dka", "dva", "dkb", "dvb"};
  for (int i = 0; i < 5; ++i) EXPECT_LE(rel_err(grads[1][i], grads[0][i]), kTolGrad) << names[i];
}

// q, k, v as the model hands them over: permuted views of one (B,T,3,NH,HS) tensor, strided,
// passed to cuDNN without copies.
TEST_F(CudaAttention, StridedViewsOfQkv) {
  const int64_t B = 2, T = 100, NH = 3, HS = 64;
  Tensor qkv = randn({B, T, 3, NH, HS}, DType::bf16, kGpu, 1),
         dout = randn({B, NH, T, HS}, DType::bf16, kGpu, 2);
  auto part = [&](int64_t i) { return qkv.select(2, i).permute({0, 2, 1, 3}); };  // (B,NH,T,HS)
  Tensor q = part(0), k = part(1), v = part(2);
  ASSERT_FALSE(q.is_contiguous());
  expect_match(run(true, q, k, v, 0, 0, dout, Tensor()),
               run(false, q.contiguous(), k.contiguous(), v.contiguous(), 0, 0, dout, Tensor()),
               "strided qkv");
}

// Grouped-query attention, q (B,NH,Tq,HS) over k, v (B,NKV,Tk,HS): the GPU's fused path
// (cuDNN with K, V and dK, dV of NKV heads) and its composed path (each group's query heads
// as one matrix) against the CPU's attention (its fused kernel, in f32) on the same bf16
// values: out, lse, dq, dk, dv, causal and unmasked, with and without a dlse (the composed
// backward the fused node takes for one), G = 4 (Llama 3 8B's 32 over 8) and MQA.
TEST_F(CudaAttention, GroupedQueryMatchesTheCpu) {
  struct Shape_ {
    int64_t NH, NKV, Tq, Tk, q_off, k_off;
    bool dlse;
  };
  const Shape_ shapes[] = {
      {8, 2, 128, 128, 0, 0, false},    // causal, G = 4
      {8, 1, 128, 128, 0, 0, false},    // causal, multi-query
      {8, 2, 64, 64, 64, 0, false},     // ring attention's past block: unmasked
      {8, 2, 128, 128, 0, 0, true},     // causal with a dlse
      {8, 1, 64, 64, 64, 0, true},      // unmasked, multi-query, with a dlse
      {6, 3, 100, 100, 37, 37, false},  // G = 2, odd lengths
  };
  const int64_t B = 2, HS = 64;
  for (const Shape_& c : shapes) {
    const std::string what = "NH" + std::to_string(c.NH) + " NKV" + std::to_string(c.NKV) + " Tq" +
                             std::to_string(c.Tq) + " Tk" + std::to_string(c.Tk) + " q_off" +
                             std::to_string(c.q_off) + " k_off" + std::to_string(c.k_off) +
                             (c.dlse ? " dlse" : "");
    SCOPED_TRACE(what);
    Tensor q = randn({B, c.NH, c.Tq, HS}, DType::bf16, kGpu, 11),
           k = randn({B, c.NKV, c.Tk, HS}, DType::bf16, kGpu, 12),
           v = randn({B, c.NKV, c.Tk, HS}, DType::bf16, kGpu, 13),
           dout = randn({B, c.NH, c.Tq, HS}, DType::bf16, kGpu, 14);
    Tensor dlse = c.dlse ? randn({B, c.NH, c.Tq}, DType::f32, kGpu, 15) : Tensor();
    // the CPU's reference on the same values in f32 (bf16 -> f32 is exact)
    auto on_cpu = [](const Tensor& t) { return t.defined() ? t.to(Device::cpu()).to(DType::f32) : t; };
    Tensor cq = leaf(on_cpu(q)), ck = leaf(on_cpu(k)), cv = leaf(on_cpu(v));
    AttentionOut cr = attention(cq, ck, cv, c.q_off, c.k_off);
    Tensor loss = sum(mul(cr.out, on_cpu(dout)));
    if (c.dlse) loss = add(loss, sum(mul(cr.lse, on_cpu(dlse))));
    backward(loss);
    const Result cpu{cr.out.detach(), cr.lse.detach(), cq.grad(), ck.grad(), cv.grad()};
    ASSERT_EQ(cpu.dk.shape(), Shape({B, c.NKV, c.Tk, HS}));

    const Result fused = run(true, q, k, v, c.q_off, c.k_off, dout, dlse);
    ASSERT_EQ(fused.dk.shape(), Shape({B, c.NKV, c.Tk, HS}));
    ASSERT_EQ(fused.dv.shape(), Shape({B, c.NKV, c.Tk, HS}));
    expect_match(fused, cpu, what + ": fused (cuDNN) vs cpu");
    expect_match(run(false, q, k, v, c.q_off, c.k_off, dout, dlse), cpu, what + ": composed vs cpu");
  }
}

// NDT_SDPA=0 turns the fused path off.
TEST_F(CudaAttention, EnvironmentSwitch) {
  Tensor q = randn({1, 2, 16, 64}, DType::bf16, kGpu, 1);
  ASSERT_TRUE(cuda::sdpa_supported(q, q, q, 0, 0));
  setenv("NDT_SDPA", "0", 1);
  std::string why;
  EXPECT_FALSE(cuda::sdpa_supported(q, q, q, 0, 0, &why));
  EXPECT_NE(why.find("NDT_SDPA"), std::string::npos) << why;
  unsetenv("NDT_SDPA");
  EXPECT_TRUE(cuda::sdpa_supported(q, q, q, 0, 0));
}
