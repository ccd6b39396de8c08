// The CUDA backend against the CPU reference (label gpu). Every op case of
// tests/support/op_cases runs forward and backward on CPU and on CUDA from the same random
// inputs, in f32 and bf16; larger shapes exercise the multi-block paths of the kernels; and
// the runtime (RNG, memory, copies, errors) is checked on its own.
//
// Without a CUDA device every test is skipped (GTEST_SKIP), so the suite passes anywhere.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "autograd/engine.h"
#include "autograd/ops.h"
#include "support/op_cases.h"
#include "tensor/cuda/runtime.h"
#include "tensor/kernels.h"
#include "tensor/storage.h"

using namespace ndt;
using namespace ndt::testing;

namespace {

constexpr double kTolF32 = 1e-5, kTolBf16 = 1e-2;  // relative error, CUDA vs CPU
double tol_for(DType dt) { return dt == DType::bf16 ? kTolBf16 : kTolF32; }

const Device kGpu = Device::cuda(0);

// ||a - ref|| / ||ref|| over all elements (a and ref on any device, any float dtype).
// Entries equal in both count as no error, so matching infinities (the lse = -inf of a
// query that sees no key) are fine; an unmatched infinity or a NaN gives NaN. 0 when both
// are zero, inf when only ref is.
double rel_err(const Tensor& a, const Tensor& ref) {
  EXPECT_EQ(a.shape(), ref.shape()) << "rel_err: shapes differ";
  if (a.shape() != ref.shape()) return std::numeric_limits<double>::infinity();
  const std::vector<double> va = a.to_vector<double>(), vr = ref.to_vector<double>();
  double num = 0, den = 0;
  for (size_t i = 0; i < va.size(); ++i) {
    if (va[i] == vr[i]) {
      if (std::isfinite(vr[i])) den += vr[i] * vr[i];
      continue;
    }
    num += (va[i] - vr[i]) * (va[i] - vr[i]);
    den += vr[i] * vr[i];
  }
  if (std::isnan(num) || std::isnan(den) || std::isinf(num)) return std::numeric_limits<double>::quiet_NaN();
  if (den == 0) return num == 0 ? 0.0 : std::numeric_limits<double>::infinity();
  return std::sqrt(num / den);
}

std::string skip_reason() {
  return cuda::compiled() ? "no CUDA device: built with CUDA but no device is visible"
                          : "no CUDA device: ndtrain was built without CUDA";
}

class Cuda : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda::available()) GTEST_SKIP() << skip_reason();
  }
};

// Outputs and input gradients of two runs of one case, output by output.
void expect_close(const std::string& what, const CaseRun& got, const CaseRun& ref, double tol) {
  ASSERT_EQ(got.outputs.size(), ref.outputs.size()) << what;
  for (size_t k = 0; k < ref.outputs.size(); ++k) {
    const double e = rel_err(got.outputs[k], ref.outputs[k]);
    EXPECT_LE(e, tol) << what << ": output " << k << " " << ref.outputs[k].shape_str() << " relative error "
                      << e;
  }
  ASSERT_EQ(got.grads.size(), ref.grads.size()) << what;
  for (size_t i = 0; i < ref.grads.size(); ++i) {
    ASSERT_EQ(got.grads[i].defined(), ref.grads[i].defined()) << what << ": gradient " << i;
    if (!ref.grads[i].defined()) continue;
    const double e = rel_err(got.grads[i], ref.grads[i]);
    EXPECT_LE(e, tol) << what << ": gradient of input " << i << " " << ref.grads[i].shape_str()
                      << " relative error " << e;
  }
}

// Runs case c forward and backward on CPU and on CUDA from the same inputs in dtype dt.
void compare_case(const OpCase& c, DType dt, double tol) {
  std::vector<Tensor> cpu_in = case_inputs(c, dt, Device::cpu());
  std::vector<Tensor> gpu_in = convert_inputs(c, cpu_in, dt, kGpu);
  for (const Tensor& t : gpu_in) ASSERT_TRUE(t.device().is_cuda());
  CaseRun ref = run_case(c, cpu_in);
  CaseRun got = run_case(c, gpu_in);
  expect_close(c.name + " " + dtype_name(dt) + " cuda vs cpu", got, ref, tol);
}

std::vector<bool> all_grad(size_t n) { return std::vector<bool>(n, true); }

// int32 targets in [0, hi) with every `every`-th one set to ignore_index
Tensor targets_with_ignored(int64_t n, int32_t hi, int64_t every, int32_t ignore_index, Device dev,
                            uint64_t stream) {
  std::vector<int32_t> v = random_ids({n}, hi, Device::cpu(), stream).to_vector<int32_t>();
  for (int64_t i = 0; i < n; i += every) v[i] = ignore_index;
  return Tensor::from_vector<int32_t>(v, {n}, dev);
}

// Larger shapes than the registry's: several blocks, several row chunks, long rows.
std::vector<OpCase> large_cases() {
  std::vector<OpCase> cs;
  auto normals = [](std::vector<std::tuple<Shape, float, float>> specs) {
    return [specs](DType dt, Device dev) {
      std::vector<Tensor> v;
      for (size_t i = 0; i < specs.size(); ++i)
        v.push_back(
            randn(std::get<0>(specs[i]), dt, dev, 500 + i, std::get<1>(specs[i]), std::get<2>(specs[i])));
      return v;
    };
  };
  using V = std::vector<Tensor>;
  cs.push_back({"matmul_tall_3d_2d", normals({{{3, 65, 130}, 0.f, 1.f}, {{130, 97}, 0.f, 1.f}}),
                [](const V& x) { return V{matmul(x[0], x[1])}; }, all_grad(2)});
  cs.push_back({"matmul_3d_2d_tb", normals({{{3, 65, 130}, 0.f, 1.f}, {{97, 130}, 0.f, 1.f}}),
                [](const V& x) { return V{matmul(x[0], x[1], false, true)}; }, all_grad(2)});
  cs.push_back({"matmul_batched_ta", normals({{{4, 130, 65}, 0.f, 1.f}, {{4, 130, 97}, 0.f, 1.f}}),
                [](const V& x) { return V{matmul(x[0], x[1], true, false)}; }, all_grad(2)});
  cs.push_back({"linear_gpt", normals({{{4, 64, 192}, 0.f, 1.f}, {{192, 576}, 0.f, 0.1f}, {{576}, 0.f, 1.f}}),
                [](const V& x) { return V{linear(x[0], x[1], x[2])}; }, all_grad(3)});
  // the MLP's c_fc: bias and GELU as cuBLASLt epilogues (aux leading dimension 768, a multiple of 8)
  cs.push_back({"linear_gelu_gpt",
                normals({{{4, 64, 192}, 0.f, 1.f}, {{192, 768}, 0.f, 0.1f}, {{768}, 0.f, 1.f}}),
                [](const V& x) { return V{linear_gelu(x[0], x[1], x[2])}; }, all_grad(3)});
  // no bias: the GELU_AUX epilogue
  cs.push_back({"linear_gelu_gpt_no_bias", normals({{{4, 64, 192}, 0.f, 1.f}, {{192, 768}, 0.f, 0.1f}}),
                [](const V& x) { return V{linear_gelu(x[0], x[1], Tensor())}; }, all_grad(2)});
  // an output width that is not a multiple of 8: the composed fallback
  cs.push_back({"linear_gelu_odd",
                normals({{{2, 33, 40}, 0.f, 1.f}, {{40, 37}, 0.f, 0.2f}, {{37}, 0.f, 1.f}}),
                [](const V& x) { return V{linear_gelu(x[0], x[1], x[2])}; }, all_grad(3)});
  cs.push_back({"mul_row_many_rows", normals({{{600, 257}, 0.f, 1.f}, {{257}, 0.f, 1.f}}),
                [](const V& x) { return V{mul(x[0], x[1])}; }, all_grad(2)});
  // a mixture-of-experts block at a size that spans many blocks and warps: 300 tokens, 8 experts,
  // top 2. The probabilities are an input (no softmax), so CPU and CUDA route alike in bf16 too.
  cs.push_back({"moe_block_big",
                normals({{{300, 64}, 0.f, 1.f},
                         {{300, 8}, 2.f, 0.5f},
                         {{8, 64, 96}, 0.f, 0.1f},
                         {{8, 64, 96}, 0.f, 0.1f},
                         {{8, 96, 64}, 0.f, 0.1f}}),
                [](const V& x) {
                  TopK t = moe_topk(x[1], 2, true);
                  MoeRouting r = moe_sort(t.experts, 8);
                  Tensor xs = moe_dispatch(x[0], r);  // (600, 64)
                  Tensor h = silu_mul(grouped_matmul(xs, x[2], r.counts), grouped_matmul(xs, x[3], r.counts));
                  return V{moe_combine(grouped_matmul(h, x[4], r.counts), t.values, r)};
                },
                all_grad(5)});
  cs.push_back({"gelu_big", normals({{{1000, 257}, 0.f, 2.f}}), [](const V& x) { return V{gelu(x[0])}; },
                all_grad(1)});
  cs.push_back(
      {"sum_big", normals({{{1000, 257}, 0.3f, 1.f}}), [](const V& x) { return V{sum(x[0])}; }, all_grad(1)});
  cs.push_back({"mean_big", normals({{{1000, 257}, 0.3f, 1.f}}), [](const V& x) { return V{mean(x[0])}; },
                all_grad(1)});
  cs.push_back({"sum_squares_big", normals({{{1000, 257}, 0.f, 1.f}}),
                [](const V& x) { return V{sum_squares(x[0])}; }, all_grad(1)});
  cs.push_back({"layernorm_768", normals({{{300, 768}, 0.5f, 2.f}, {{768}, 1.f, 0.5f}, {{768}, 0.f, 0.5f}}),
                [](const V& x) { return V{layernorm(x[0], x[1], x[2])}; }, all_grad(3)});
  cs.push_back({"layernorm_odd", normals({{{2, 77, 37}, 0.5f, 2.f}, {{37}, 1.f, 0.5f}, {{37}, 0.f, 0.5f}}),
                [](const V& x) { return V{layernorm(x[0], x[1], x[2])}; }, all_grad(3)});
  cs.push_back({"softmax_wide", normals({{{37, 5000}, 0.f, 2.f}}),
                [](const V& x) { return V{softmax(x[0])}; }, all_grad(1)});
  cs.push_back({"cross_entropy_wide",
                [normals](DType dt, Device dev) {
                  V v = normals({{{300, 2053}, 0.f, 2.f}})(dt, dev);
                  v.push_back(targets_with_ignored(300, 2040, 7, -100, dev, 600));
                  return v;
                },
                [](const V& x) { return V{cross_entropy(x[0], x[1], -100, 2040)}; },
                {true, false}});
  cs.push_back({"embedding_repeats",
                [normals](DType dt, Device dev) {
                  V v{random_ids({4, 250}, 37, dev, 601)};
                  v.push_back(normals({{{37, 96}, 0.f, 1.f}})(dt, dev)[0]);
                  return v;
                },
                [](const V& x) { return V{embedding(x[0], x[1])}; },
                {false, true}});
  // a vocabulary shard: rows [37, 74) of 148 (tensor parallelism's lookup)
  cs.push_back({"embedding_shard_repeats",
                [normals](DType dt, Device dev) {
                  V v{random_ids({4, 250}, 148, dev, 602)};
                  v.push_back(normals({{{37, 96}, 0.f, 1.f}})(dt, dev)[0]);
                  return v;
                },
                [](const V& x) { return V{embedding(x[0], x[1], 37, 148)}; },
                {false, true}});
  // attention: causal; a later query block (ring attention); leading queries fully masked
  struct Att {
    const char* name;
    int64_t tq, tk, q_off, k_off;
  };
  for (Att a : {Att{"attention_causal_128", 128, 128, 0, 0}, Att{"attention_ring_block", 64, 96, 64, 0},
                Att{"attention_fully_masked_rows", 64, 64, 0, 16}}) {
    cs.push_back(
        {a.name,
         normals({{{2, 4, a.tq, 32}, 0.f, 1.f}, {{2, 4, a.tk, 32}, 0.f, 1.f}, {{2, 4, a.tk, 32}, 0.f, 1.f}}),
         [a](const V& x) {
           AttentionOut r = attention(x[0], x[1], x[2], a.q_off, a.k_off);
           return V{r.out, r.lse};
         },
         all_grad(3)});
  }
  // ring attention: a query block against a past key block and its own, merged
  cs.push_back({"merge_attention_ring",
                normals({{{2, 4, 64, 40}, 0.f, 1.f},
                         {{2, 4, 64, 40}, 0.f, 1.f},
                         {{2, 4, 64, 40}, 0.f, 1.f},
                         {{2, 4, 96, 40}, 0.f, 1.f},
                         {{2, 4, 96, 40}, 0.f, 1.f}}),
                [](const V& x) {
                  AttentionOut a = attention(x[0], x[1], x[2], 64, 0);   // keys 0..63: all visible
                  AttentionOut b = attention(x[0], x[3], x[4], 64, 64);  // keys 64..159: causal, then masked
                  AttentionOut r = merge_attention(b.out, b.lse, a.out, a.lse);
                  return V{r.out, r.lse};
                },
                all_grad(5)});
  return cs;
}

const OpCase& large_case(const std::string& name) {
  static const std::vector<OpCase> cases = large_cases();
  for (const OpCase& c : cases)
    if (c.name == name) return c;
  NDT_FAIL("no large case named ", name);
}

std::vector<std::string> large_case_names() {
  std::vector<std::string> n;
  for (const OpCase& c : large_cases()) n.push_back(c.name);
  return n;
}

using CaseParam = std::tuple<std::string, DType>;
std::string case_param_name(const ::testing::TestParamInfo<CaseParam>& info) {
  return std::get<0>(info.param) + (std::get<1>(info.param) == DType::bf16 ? "_bf16" : "_f32");
}

class CudaOps : public ::testing::TestWithParam<CaseParam> {
 protected:
  void SetUp() override {
    if (!cuda::available()) GTEST_SKIP() << skip_reason();
  }
};

// Bit-level distance between two floats, in units in the last place.
int64_t ulp_distance(float a, float b) {
  int32_t ia, ib;
  std::memcpy(&ia, &a, 4);
  std::memcpy(&ib, &b, 4);
  auto ordered = [](int32_t i) { return i < 0 ? int64_t(INT32_MIN) - i : int64_t(i); };
  return std::llabs(ordered(ia) - ordered(ib));
}

}  // namespace

// ---- the libraries a process loads ---------------------------------------------------------

namespace {
// Whether a library whose file name starts with `name` is mapped into this process.
bool library_mapped(const std::string& name) {
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);)
    if (line.find("/" + name) != std::string::npos) return true;
  return false;
}
}  // namespace

// cuBLAS and cuBLASLt are opened by the first GEMM on a GPU (tensor/cuda/lazy_libraries.cpp), not
// when the program starts: linked, they alone made ~150 MiB of every process of a CUDA build
// resident, a run on CPU's too. In a fresh process (the death test runs this binary again for
// this test alone): a CPU GEMM leaves them out; a GPU GEMM, where there is a GPU, brings both.
TEST(CudaLibraries, CublasIsOpenedByTheFirstGpuGemm) {
  if (!cuda::compiled()) GTEST_SKIP() << skip_reason();
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        const Tensor a = randn({8, 8}, DType::f32, Device::cpu(), 1);
        kernels::gemm(a, false, a, false, Tensor::zeros({8, 8}));
        if (library_mapped("libcublas")) {
          std::fprintf(stderr, "cuBLAS is loaded, but no GEMM ran on a GPU\n");
          std::_Exit(1);
        }
        if (cuda::available()) {
          const Tensor g = a.to(kGpu);
          kernels::gemm(g, false, g, false, Tensor::zeros({8, 8}, DType::f32, kGpu));
          if (!library_mapped("libcublas.so") || !library_mapped("libcublasLt.so")) {
            std::fprintf(stderr,
                         "a GEMM ran on the GPU, but libcublas and libcublasLt are not both loaded\n");
            std::_Exit(2);
          }
        }
        std::_Exit(0);
      },
      ::testing::ExitedWithCode(0), "");
}

// ---- every op case: CUDA vs CPU ----------------------------------------------------------

class CudaVsCpu : public CudaOps {};

// bf16: the case's own bf16 tolerance (op_cases.h), at least kTolBf16. cuBLASLt's bias
// epilogue rounds x@w+b once where the CPU rounds x@w and then +b, so up to a quarter of a
// linear's bf16 outputs differ by one ulp; deep chains amplify that as they amplify bf16's
// rounding against f32 (gpt_tiny_loss: ~2e-2 emulated, its bf16_tol is 4e-2). A real bug
// (a wrong mask, layout or scale) errs by O(1).
TEST_P(CudaVsCpu, Registry) {
  const OpCase& c = op_case(std::get<0>(GetParam()));
  const DType dt = std::get<1>(GetParam());
  compare_case(c, dt, dt == DType::bf16 ? std::max(kTolBf16, c.bf16_tol) : kTolF32);
}

INSTANTIATE_TEST_SUITE_P(Ops, CudaVsCpu,
                         ::testing::Combine(::testing::ValuesIn(op_case_names()),
                                            ::testing::Values(DType::f32, DType::bf16)),
                         case_param_name);

class CudaVsCpuLarge : public CudaOps {};

TEST_P(CudaVsCpuLarge, Shapes) {
  compare_case(large_case(std::get<0>(GetParam())), std::get<1>(GetParam()),
               tol_for(std::get<1>(GetParam())));
}

INSTANTIATE_TEST_SUITE_P(Ops, CudaVsCpuLarge,
                         ::testing::Combine(::testing::ValuesIn(large_case_names()),
                                            ::testing::Values(DType::f32, DType::bf16)),
                         case_param_name);

// ---- kernels the ops do not reach with these arguments ------------------------------------

// moe_sort of experts on the GPU: the same order and counts as from the CPU, order on the GPU.
TEST_F(Cuda, MoeSortOfGpuExperts) {
  Tensor experts = random_ids({37, 3}, 6, Device::cpu(), 9);
  MoeRouting cpu = moe_sort(experts, 6), gpu = moe_sort(experts.to(kGpu), 6);
  EXPECT_EQ(gpu.order.device(), kGpu);
  EXPECT_EQ(gpu.counts, cpu.counts);
  EXPECT_EQ(gpu.order.to_vector<int32_t>(), cpu.order.to_vector<int32_t>());
}

// gemm honours alpha and beta (c = alpha op(a) op(b) + beta c), 2-D and batched.
TEST_F(Cuda, GemmAlphaBeta) {
  for (DType dt : {DType::f32, DType::bf16}) {
    for (bool batched : {false, true}) {
      Shape sa = batched ? Shape{3, 33, 17} : Shape{33, 17}, sc = batched ? Shape{3, 33, 21} : Shape{33, 21};
      Tensor a = randn(sa, dt, Device::cpu(), 1), b = randn({21, 17}, dt, Device::cpu(), 2);
      Tensor c = randn(sc, dt, Device::cpu(), 3);
      Tensor ga = a.to(kGpu), gb = b.to(kGpu), gc = c.to(kGpu);
      kernels::gemm(a, false, b, true, c, 0.5, 2.0);
      kernels::gemm(ga, false, gb, true, gc, 0.5, 2.0);
      EXPECT_LE(rel_err(gc, c), tol_for(dt)) << dtype_name(dt) << (batched ? " batched" : " 2-D");
    }
  }
}

// The queries that see no key: out = 0, lse = -inf, exactly as on the CPU.
// The linears of a GPT-2 block run as one cuBLASLt GEMM with their epilogue (the CudaVsCpu
// cases check the numbers; this, that the fused path is what they checked): bias, bias +
// GELU, GELU alone, in bf16 and in strict f32 (GELU then applied after).
TEST_F(Cuda, LinearEpiloguesRunFused) {
  for (DType dt : {DType::bf16, DType::f32}) {
    Tensor x = randn({4, 64, 192}, dt, kGpu, 1), w = randn({192, 768}, dt, kGpu, 2, 0.f, 0.1f),
           b = randn({768}, dt, kGpu, 3);
    const int64_t before = cuda::fused_linear_calls();
    linear(x, w, b);
    linear_gelu(x, w, b);
    linear_gelu(x, w, Tensor());
    EXPECT_EQ(cuda::fused_linear_calls() - before, 3) << dtype_name(dt) << ": a linear was composed";
  }
}

TEST_F(Cuda, AttentionFullyMaskedRows) {
  Tensor q = randn({1, 2, 6, 8}, DType::f32, Device::cpu(), 1),
         k = randn({1, 2, 5, 8}, DType::f32, Device::cpu(), 2);
  Tensor v = randn({1, 2, 5, 8}, DType::f32, Device::cpu(), 3);
  AttentionOut ref = attention(q, k, v, 0, 2);  // queries 0 and 1 see nothing
  AttentionOut got = attention(q.to(kGpu), k.to(kGpu), v.to(kGpu), 0, 2);
  std::vector<float> lse = got.lse.to_vector<float>(), out = got.out.to_vector<float>();
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t i = 0; i < 6; ++i) {
      const float l = lse[h * 6 + i];
      if (i < 2) {
        EXPECT_TRUE(std::isinf(l) && l < 0) << "head " << h << " query " << i << " lse " << l;
        for (int64_t d = 0; d < 8; ++d) EXPECT_EQ(out[(h * 6 + i) * 8 + d], 0.0f);
      } else {
        EXPECT_TRUE(std::isfinite(l)) << "head " << h << " query " << i;
      }
    }
  EXPECT_LE(rel_err(got.lse, ref.lse), kTolF32);
  EXPECT_LE(rel_err(got.out, ref.out), kTolF32);
}

// The backward with an undefined dlse (only out used) and with dlse.
TEST_F(Cuda, AttentionSoftmaxBackwardWithAndWithoutDlse) {
  const int64_t Bh = 3, Tq = 9, Tk = 11;
  Tensor p = randn({Bh, Tq, Tk}, DType::f32, Device::cpu(), 1);
  Tensor lse = Tensor::empty({Bh, Tq}, DType::f32);
  kernels::attention_softmax_forward(p, 0.7, 2, 0, lse);
  Tensor gp = p.to(kGpu);
  Tensor d = randn({Bh, Tq}, DType::f32, Device::cpu(), 2),
         dlse = randn({Bh, Tq}, DType::f32, Device::cpu(), 3);
  for (bool with_dlse : {false, true}) {
    Tensor dp = randn({Bh, Tq, Tk}, DType::f32, Device::cpu(), 4), gdp = dp.to(kGpu);
    kernels::attention_softmax_backward(p, dp, d, with_dlse ? dlse : Tensor(), 0.7);
    kernels::attention_softmax_backward(gp, gdp, d.to(kGpu), with_dlse ? dlse.to(kGpu) : Tensor(), 0.7);
    EXPECT_LE(rel_err(gdp, dp), kTolF32) << (with_dlse ? "with" : "without") << " dlse";
  }
}

// The merge kernels on rows that saw keys in both parts, in one, or in neither (lse -inf),
// with HS above a warp's width; the backward with and without dout and dlse.
TEST_F(Cuda, AttentionMergeKernels) {
  const int64_t Bh = 5, T = 37, HS = 70;
  for (DType dt : {DType::f32, DType::bf16}) {
    Tensor oa = randn({Bh, T, HS}, dt, Device::cpu(), 1), ob = randn({Bh, T, HS}, dt, Device::cpu(), 2);
    std::vector<float> la = randn({Bh, T}, DType::f32, Device::cpu(), 3, 0.0f, 3.0f).to_vector<float>();
    std::vector<float> lb = randn({Bh, T}, DType::f32, Device::cpu(), 4, 0.0f, 3.0f).to_vector<float>();
    for (int64_t r = 0; r < Bh * T; r += 3) la[r] = -INFINITY;  // every 3rd row: none in a
    for (int64_t r = 0; r < Bh * T; r += 4) lb[r] = -INFINITY;  // every 4th: none in b (12th: neither)
    Tensor lse_a = Tensor::from_vector<float>(la, {Bh, T}), lse_b = Tensor::from_vector<float>(lb, {Bh, T});
    Tensor out = Tensor::empty({Bh, T, HS}, dt), lse = Tensor::empty({Bh, T}, DType::f32);
    kernels::attention_merge_forward(oa, lse_a, ob, lse_b, out, lse);
    Tensor gout = Tensor::empty({Bh, T, HS}, dt, kGpu), glse = Tensor::empty({Bh, T}, DType::f32, kGpu);
    kernels::attention_merge_forward(oa.to(kGpu), lse_a.to(kGpu), ob.to(kGpu), lse_b.to(kGpu), gout, glse);
    EXPECT_LE(rel_err(gout, out), tol_for(dt)) << dtype_name(dt) << " out";
    EXPECT_LE(rel_err(glse, lse), kTolF32) << dtype_name(dt) << " lse";
    EXPECT_TRUE(std::isinf(glse.to_vector<float>()[0])) << "row 0 saw no key in either part";
    Tensor dout = randn({Bh, T, HS}, dt, Device::cpu(), 5),
           dlse = randn({Bh, T}, DType::f32, Device::cpu(), 6);
    for (int with : {0, 1, 2, 3}) {  // bit 0: dout defined, bit 1: dlse defined
      const Tensor d_o = with & 1 ? dout : Tensor(), d_l = with & 2 ? dlse : Tensor();
      std::vector<Tensor> ref = {Tensor::empty({Bh, T, HS}, dt), Tensor::empty({Bh, T}, DType::f32),
                                 Tensor::empty({Bh, T, HS}, dt), Tensor::empty({Bh, T}, DType::f32)};
      std::vector<Tensor> got;
      for (const Tensor& t : ref) got.push_back(Tensor::empty(t.shape(), t.dtype(), kGpu));
      kernels::attention_merge_backward(oa, lse_a, ob, lse_b, out, lse, d_o, d_l, ref[0], ref[1], ref[2],
                                        ref[3]);
      kernels::attention_merge_backward(oa.to(kGpu), lse_a.to(kGpu), ob.to(kGpu), lse_b.to(kGpu),
                                        out.to(kGpu), lse.to(kGpu), d_o.defined() ? d_o.to(kGpu) : Tensor(),
                                        d_l.defined() ? d_l.to(kGpu) : Tensor(), got[0], got[1], got[2],
                                        got[3]);
      const char* names[] = {"dout_a", "dlse_a", "dout_b", "dlse_b"};
      for (int i = 0; i < 4; ++i)
        EXPECT_LE(rel_err(got[i], ref[i]), tol_for(dt))
            << dtype_name(dt) << " " << names[i] << (with & 1 ? " with" : " without") << " dout,"
            << (with & 2 ? " with" : " without") << " dlse";
    }
  }
}

// The vocabulary-parallel cross-entropy kernels on a slice in the middle of the vocabulary,
// one at its end with padding, and one of padding only; long rows, some targets ignored.
TEST_F(Cuda, VocabParallelCrossEntropyKernels) {
  const int64_t N = 300, Vl = 517, ignore = -100;
  // targets over a 2000-column vocabulary: some fall into each slice below
  Tensor targets = targets_with_ignored(N, 2000, 7, ignore, Device::cpu(), 7), gtargets = targets.to(kGpu);
  struct Slice {
    int64_t v_start, v_live;
  };
  for (DType dt : {DType::f32, DType::bf16}) {
    Tensor logits = randn({N, Vl}, dt, Device::cpu(), 8, 0.0f, 2.0f), glogits = logits.to(kGpu);
    for (Slice s : {Slice{1000, Vl}, Slice{1700, 300}, Slice{2000, 0}}) {
      const std::string what = std::string(dtype_name(dt)) + " slice at " + std::to_string(s.v_start) +
                               " with " + std::to_string(s.v_live) + " live columns";
      Tensor m = Tensor::empty({N}, DType::f32), gm = Tensor::empty({N}, DType::f32, kGpu);
      kernels::rowmax(logits, s.v_live, m);
      kernels::rowmax(glogits, s.v_live, gm);
      EXPECT_LE(rel_err(gm, m), 0.0) << what << ": rowmax is exact";
      // a global max above this slice's own, as the all-reduce gives
      Tensor gmax = randu({N}, DType::f32, Device::cpu(), 9, 5.0f, 6.0f);
      Tensor se = Tensor::empty({N}, DType::f32), tl = Tensor::empty({N}, DType::f32);
      Tensor gse = Tensor::empty({N}, DType::f32, kGpu), gtl = Tensor::empty({N}, DType::f32, kGpu);
      kernels::cross_entropy_partials(logits, targets, gmax, s.v_start, s.v_live, ignore, se, tl);
      kernels::cross_entropy_partials(glogits, gtargets, gmax.to(kGpu), s.v_start, s.v_live, ignore, gse,
                                      gtl);
      EXPECT_LE(rel_err(gse, se), kTolF32) << what << ": sumexp";
      EXPECT_LE(rel_err(gtl, tl), 0.0) << what << ": target logit is exact";
      Tensor sumexp = randu({N}, DType::f32, Device::cpu(), 10, 50.0f, 60.0f);  // the global sum
      Tensor d = Tensor::empty({N, Vl}, dt), gd = Tensor::full({N, Vl}, 123.0, dt, kGpu);
      // dloss / kept = 0.5 / 50 = 0.01
      Tensor kept = Tensor::full({1}, 50, DType::i32), dloss = Tensor::full({1}, 0.5, DType::f32);
      kernels::cross_entropy_parallel_backward(logits, targets, gmax, sumexp, s.v_start, s.v_live, ignore,
                                               kept, dloss, d);
      kernels::cross_entropy_parallel_backward(glogits, gtargets, gmax.to(kGpu), sumexp.to(kGpu), s.v_start,
                                               s.v_live, ignore, kept.to(kGpu), dloss.to(kGpu), gd);
      // and the per-row losses from the global statistics
      Tensor losses = Tensor::empty({N}, DType::f32), glosses = Tensor::empty({N}, DType::f32, kGpu);
      kernels::cross_entropy_parallel_losses(gmax, sumexp, tl, targets, ignore, losses);
      kernels::cross_entropy_parallel_losses(gmax.to(kGpu), sumexp.to(kGpu), tl.to(kGpu), gtargets, ignore,
                                             glosses);
      EXPECT_LE(rel_err(glosses, losses), 1e-6) << what << ": losses";
      EXPECT_LE(rel_err(gd, d), tol_for(dt)) << what << ": dlogits";
    }
  }
}

// Gradients of leaves accumulate (+=) on the device as on the CPU.
TEST_F(Cuda, GradientsAccumulateAcrossBackwards) {
  Tensor x = randn({5, 7}, DType::f32, Device::cpu(), 1).set_requires_grad(true);
  Tensor gx = x.detach().to(kGpu).set_requires_grad(true);
  for (int i = 0; i < 2; ++i) {
    backward(sum_squares(gelu(x)));
    backward(sum_squares(gelu(gx)));
  }
  EXPECT_LE(rel_err(gx.grad(), x.grad()), kTolF32);
}

// ---- determinism: the same inputs give the same bits ------------------------------------

TEST_F(Cuda, DeterministicReductions) {
  for (DType dt : {DType::f32, DType::bf16}) {
    Tensor ids = random_ids({2000}, 13, kGpu, 1);  // many repeats per row of the table
    Tensor dout = randn({2000, 64}, dt, kGpu, 2), x = randn({3000, 96}, dt, kGpu, 3);
    Tensor w = randn({96}, dt, kGpu, 4), b = randn({96}, dt, kGpu, 5), dy = randn({3000, 96}, dt, kGpu, 6);
    auto run = [&] {
      std::vector<std::vector<double>> r;
      Tensor dtable = Tensor::empty({13, 64}, dt, kGpu);
      kernels::embedding_backward(ids, dout, dtable);
      r.push_back(dtable.to_vector<double>());
      Tensor out = Tensor::empty({3000, 96}, dt, kGpu), mean = Tensor::empty({3000}, DType::f32, kGpu);
      Tensor rstd = Tensor::empty({3000}, DType::f32, kGpu);
      kernels::layernorm_forward(x, w, b, 1e-5, out, mean, rstd);
      Tensor dx = Tensor::empty({3000, 96}, dt, kGpu), dw = Tensor::empty({96}, dt, kGpu),
             db = Tensor::empty({96}, dt, kGpu);
      kernels::layernorm_backward(dy, x, w, mean, rstd, dx, dw, db);
      r.push_back(dw.to_vector<double>());
      r.push_back(db.to_vector<double>());
      Tensor s = Tensor::empty({}, DType::f32, kGpu);
      kernels::sum(x, s);
      r.push_back(s.to_vector<double>());
      Tensor cols = Tensor::empty({96}, dt, kGpu);
      kernels::sum_rows(x, cols);
      r.push_back(cols.to_vector<double>());
      return r;
    };
    EXPECT_EQ(run(), run()) << dtype_name(dt);
  }
}

// ---- RNG: the same values on CPU and CUDA --------------------------------------------------

TEST_F(Cuda, RngMatchesCpu) {
  const int64_t n = 100003;
  const uint64_t seed = 1234, stream = 7, start = 98765;
  for (bool normal : {true, false}) {
    Tensor c = Tensor::empty({n}, DType::f32), g = Tensor::empty({n}, DType::f32, kGpu);
    if (normal) {
      kernels::fill_normal(c, seed, stream, start, 0.5f, 2.0f);
      kernels::fill_normal(g, seed, stream, start, 0.5f, 2.0f);
    } else {
      kernels::fill_uniform(c, seed, stream, start, -3.0f, 5.0f);
      kernels::fill_uniform(g, seed, stream, start, -3.0f, 5.0f);
    }
    std::vector<float> vc = c.to_vector<float>(), vg = g.to_vector<float>();
    int64_t differ = 0, max_ulp = 0;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t u = ulp_distance(vc[i], vg[i]);
      differ += u != 0;
      max_ulp = std::max(max_ulp, u);
    }
    std::cout << "[ rng      ] " << (normal ? "normal" : "uniform") << ": " << differ << " of " << n
              << " float32 values differ between CPU and CUDA (max " << max_ulp << " ulp)\n";
    RecordProperty(normal ? "normal_values_differing" : "uniform_values_differing", std::to_string(differ));
    EXPECT_LE(max_ulp, 1) << (normal ? "normal" : "uniform");
  }
  // bf16 fills round the same floats: equal bits (up to the f32 ulp above, which bf16 hides)
  Tensor c16 = Tensor::empty({n}, DType::bf16), g16 = Tensor::empty({n}, DType::bf16, kGpu);
  kernels::fill_normal(c16, seed, stream, 0, 0.0f, 1.0f);
  kernels::fill_normal(g16, seed, stream, 0, 0.0f, 1.0f);
  EXPECT_LE(rel_err(g16, c16), 1e-3);
  // a slice generated alone equals the same slice of the whole
  Tensor whole = Tensor::empty({1000}, DType::f32, kGpu), part = Tensor::empty({300}, DType::f32, kGpu);
  kernels::fill_normal(whole, seed, stream, 0, 0.0f, 1.0f);
  kernels::fill_normal(part, seed, stream, 401, 0.0f, 1.0f);
  EXPECT_EQ(part.to_vector<float>(), whole.narrow(0, 401, 300).contiguous().to_vector<float>());
}

// ---- runtime: memory, copies, dtypes ----------------------------------------------------------

TEST_F(Cuda, MemoryStatsFollowAllocations) {
  cuda::synchronize(0);
  const MemoryStats s0 = memory_stats(kGpu);
  reset_peak_memory(kGpu);
  const int64_t nbytes = int64_t(4) << 20;
  {
    Tensor t = Tensor::empty({nbytes / 4}, DType::f32, kGpu);
    const MemoryStats s1 = memory_stats(kGpu);
    EXPECT_GE(s1.in_use - s0.in_use, nbytes);
    EXPECT_GE(s1.peak, s1.in_use);
  }
  const MemoryStats s2 = memory_stats(kGpu);
  EXPECT_EQ(s2.in_use, s0.in_use);
  EXPECT_GE(s2.peak, s0.in_use + nbytes);
  reset_peak_memory(kGpu);
  EXPECT_EQ(memory_stats(kGpu).peak, s0.in_use);
  EXPECT_NO_THROW(empty_cache(kGpu));
}

TEST_F(Cuda, RawAllocAndMemcpy) {
  std::vector<float> host(1000), back(1000, -1.0f);
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<float>(i) * 0.5f;
  void* a = cuda::alloc(4000, 0);
  void* b = cuda::alloc(4000, 0);
  cuda::memcpy(a, host.data(), 4000, cuda::CopyKind::kHostToDevice, 0);
  cuda::memcpy(b, a, 4000, cuda::CopyKind::kDeviceToDevice, 0);
  cuda::memcpy(back.data(), b, 4000, cuda::CopyKind::kDeviceToHost, 0);
  EXPECT_EQ(back, host);
  cuda::free(a, 0);
  cuda::free(b, 0);
  cuda::synchronize(0);
  EXPECT_GE(cuda::device_count(), 1);
  EXPECT_TRUE(cuda::compiled());
}

// Uploads return without waiting for the device (through pinned staging buffers, used in
// turn): the host buffer is overwritten right after each upload, more uploads than buffers
// are queued behind a long kernel, and every device copy must still hold the values it was
// given; one upload above the staging size takes the synchronous path.
TEST_F(Cuda, UploadsReturnAtOnceAndKeepTheirValues) {
  Tensor busy = randn({4096, 4096}, DType::f32, kGpu, 3),
         busy_out = Tensor::empty({4096, 4096}, DType::f32, kGpu);
  kernels::gemm(busy, false, busy, false, busy_out);  // keeps the stream busy while we upload
  std::vector<int32_t> host(16384);
  std::vector<Tensor> up;
  for (int r = 0; r < 11; ++r) {
    for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<int32_t>(i * 31 + r);
    up.push_back(Tensor::from_vector(host, {16384}, kGpu));
  }
  std::vector<float> big(3 << 20);  // 12 MiB: above the staging size
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<float>(i % 1000);
  Tensor big_gpu = Tensor::from_vector(big, {static_cast<int64_t>(big.size())}, kGpu);
  big[5] = -1.0f;
  for (int r = 0; r < 11; ++r) {
    std::vector<int32_t> got = up[r].to_vector<int32_t>();
    for (size_t i = 0; i < got.size(); i += 997)
      ASSERT_EQ(got[i], static_cast<int32_t>(i * 31 + r)) << r << " " << i;
  }
  EXPECT_EQ(big_gpu.view({-1}).narrow(0, 5, 1).to_vector<float>()[0], 5.0f);
}

TEST_F(Cuda, ToRoundTrip) {
  Tensor f = randn({7, 13}, DType::f32, Device::cpu(), 1);
  EXPECT_EQ(f.to(kGpu).to(Device::cpu()).to_vector<float>(), f.to_vector<float>());
  Tensor h = f.to(DType::bf16);
  EXPECT_EQ(rel_err(h.to(kGpu).to(Device::cpu()), h), 0.0);
  Tensor d = f.to(DType::f64);
  EXPECT_EQ(d.to(kGpu).to(Device::cpu()).to_vector<double>(), d.to_vector<double>());
  Tensor i = Tensor::from_vector<int32_t>({-3, 0, 7, 1 << 20}, {2, 2});
  EXPECT_EQ(i.to(kGpu).to(Device::cpu()).to_vector<int32_t>(), i.to_vector<int32_t>());
  Tensor u = Tensor::from_vector<uint16_t>({0, 1, 65535}, {3});
  EXPECT_EQ(u.to(kGpu).to(Device::cpu()).to_vector<uint16_t>(), u.to_vector<uint16_t>());
  Tensor empty = Tensor::empty({0, 4}, DType::f32, kGpu);
  EXPECT_EQ(empty.to(Device::cpu()).numel(), 0);
}

// Strided copies and dtype conversions on the device equal the CPU's, bit for bit.
TEST_F(Cuda, StridedCopyAndConversions) {
  Tensor x = randn({3, 4, 5, 6}, DType::f32, Device::cpu(), 1), gx = x.to(kGpu);
  auto same = [](const Tensor& g, const Tensor& c, const char* what) {
    EXPECT_EQ(g.to(Device::cpu()).contiguous().to_vector<double>(), c.contiguous().to_vector<double>())
        << what;
  };
  same(gx.permute({3, 1, 0, 2}).contiguous(), x.permute({3, 1, 0, 2}).contiguous(), "permute");
  same(gx.transpose(1, 3).narrow(0, 1, 2).contiguous(), x.transpose(1, 3).narrow(0, 1, 2).contiguous(),
       "narrow");
  same(gx.select(2, 3).contiguous(), x.select(2, 3).contiguous(), "select");
  for (DType to : {DType::bf16, DType::f64, DType::i32, DType::u16}) {
    Tensor src = to == DType::u16 ? x.narrow(0, 0, 1).contiguous() : x;  // keep u16 in range below
    Tensor scaled = Tensor::empty(src.shape());
    kernels::scale(src, 100.0, scaled);
    if (to == DType::u16) kernels::add(scaled, Tensor::full({6}, 1000.0), scaled, 1.0, 1.0);
    same(scaled.to(kGpu).to(to), scaled.to(to), dtype_name(to));
    same(scaled.to(to).to(kGpu).to(DType::f32), scaled.to(to).to(DType::f32), dtype_name(to));
    same(scaled.to(kGpu).transpose(0, 2).to(to), scaled.transpose(0, 2).to(to), "strided conversion");
  }
  // fill on a strided view
  Tensor c = Tensor::zeros({4, 6}), g = Tensor::zeros({4, 6}, DType::f32, kGpu);
  kernels::fill(c.narrow(1, 2, 3), 2.5);
  kernels::fill(g.narrow(1, 2, 3), 2.5);
  same(g, c, "strided fill");
  // copy into a strided view (what concat_last does)
  Tensor part = randn({4, 3}, DType::bf16, Device::cpu(), 2);
  kernels::copy(c.narrow(1, 0, 3), part);
  kernels::copy(g.narrow(1, 0, 3), part.to(kGpu));
  same(g, c, "copy into a view with conversion");
}

// ---- errors -------------------------------------------------------------------------------

TEST_F(Cuda, BadEmbeddingIdThrows) {
  Tensor table = randn({5, 3}, DType::f32, kGpu, 1);
  for (int32_t bad : {5, -1}) {
    Tensor ids = Tensor::from_vector<int32_t>({0, 4, bad, 1}, {2, 2}, kGpu);
    try {
      embedding(ids, table);
      cuda::synchronize(0);  // a kernel's finding is reported where the host waits for the device
      ADD_FAILURE() << "embedding with id " << bad << " did not throw";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("id " + std::to_string(bad) + " at position 2"), std::string::npos)
          << e.what();
    }
  }
  // the device is fine afterwards
  Tensor ok = embedding(Tensor::from_vector<int32_t>({4, 0}, {2}, kGpu), table);
  EXPECT_EQ(ok.to_vector<float>(),
            embedding(Tensor::from_vector<int32_t>({4, 0}, {2}), table.to(Device::cpu())).to_vector<float>());
  cuda::synchronize(0);
}

TEST_F(Cuda, BadCrossEntropyTargetThrows) {
  Tensor logits = randn({3, 6}, DType::f32, kGpu, 1);
  auto targets = [](std::vector<int32_t> v) { return Tensor::from_vector<int32_t>(v, {3}, kGpu); };
  // reported at the next wait for the device: here the loss's copy to the host
  auto loss_of = [&](const Tensor& t, int64_t v_limit) {
    return cross_entropy(logits, t, -1, v_limit).item();
  };
  EXPECT_THROW(loss_of(targets({0, 6, 1}), -1), Error);   // beyond V
  EXPECT_THROW(loss_of(targets({0, -2, 1}), -1), Error);  // negative, not ignored
  EXPECT_THROW(loss_of(targets({0, 5, 1}), 5), Error);    // a padded column
  try {
    loss_of(targets({0, 1, 9}), -1);
    ADD_FAILURE() << "no throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("target 9 at row 2"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(loss_of(targets({0, -1, 5}), -1));  // -1 is ignored
  cuda::synchronize(0);
}

// No launcher waits for the device to check its input: a bad id is found by the kernel and
// reported at the next synchronization, once, after which the device is usable again; with
// NDT_CUDA_SYNC=1 it would be reported at the op itself.
TEST_F(Cuda, KernelErrorsAreReportedAtTheNextSynchronizationOnce) {
  Tensor table = randn({5, 3}, DType::f32, kGpu, 1);
  Tensor out = embedding(Tensor::from_vector<int32_t>({0, 7}, {2}, kGpu), table);  // no throw here
  try {
    cuda::synchronize(0);
    ADD_FAILURE() << "synchronize did not report the bad id";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("id 7 at position 1"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(cuda::synchronize(0));       // reported once
  EXPECT_EQ(out.to_vector<float>()[3], 0.0f);  // the bad row is zeros
}

TEST_F(Cuda, Float64IsCpuOnly) {
  Tensor x = Tensor::full({4}, 1.5, DType::f64, kGpu);  // storage, fill and copies work
  EXPECT_EQ(x.to_vector<double>(), std::vector<double>(4, 1.5));
  try {
    gelu(x);
    ADD_FAILURE() << "gelu on a float64 CUDA tensor did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("CPU only"), std::string::npos) << e.what();
  }
}

// ---- the shapes of GPT-2 124M training (B 16 x T 1024 tokens) ----------------------------
// Each against the CPU on the same inputs; where the full CPU run would be slow, on sampled
// rows. These need a few GiB of device memory and take seconds, not minutes.

namespace {
// rows `rows` of t (N, ...) as a CPU tensor
Tensor rows_to_cpu(const Tensor& t, const std::vector<int64_t>& rows) {
  Shape shape = t.shape();
  shape[0] = static_cast<int64_t>(rows.size());
  Tensor out = Tensor::empty(shape, t.dtype());
  for (size_t i = 0; i < rows.size(); ++i)
    out.narrow(0, static_cast<int64_t>(i), 1).copy_(t.narrow(0, rows[i], 1));
  return out;
}
std::vector<int64_t> sample_rows(int64_t n, int64_t count) {
  std::vector<int64_t> r;
  for (int64_t i = 0; i < count; ++i) r.push_back((i * 7919 + 13) % n);
  r.push_back(0);
  r.push_back(n - 1);
  return r;
}
}  // namespace

// The fused classifier at (16384, 50304) bf16 with the GPT-2 vocabulary limit 50257: loss,
// lse and the gradient written over the logits, on 258 sampled rows against the CPU with the
// same kept count; rows with ignore_index included.
TEST_F(Cuda, CrossEntropyAtGpt2ShapeBf16) {
  const int64_t N = 16384, V = 50304, v_limit = 50257;
  Tensor logits = randn({N, V}, DType::bf16, kGpu, 71, 0.0f, 2.0f);
  Tensor targets = targets_with_ignored(N, static_cast<int32_t>(v_limit), 97, -1, kGpu, 72);
  const std::vector<int64_t> rows = sample_rows(N, 256);
  Tensor logits_rows = rows_to_cpu(logits, rows);  // before the logits become the gradient
  Tensor kept = Tensor::empty({1}, DType::i32, kGpu);
  kernels::count_not_equal(targets, -1, kept);
  Tensor losses = Tensor::empty({N}, DType::f32, kGpu), lse = Tensor::empty({N}, DType::f32, kGpu);
  kernels::cross_entropy_forward(logits, targets, kept, v_limit, -1, losses, lse, logits);

  Tensor kept_cpu = kept.to(Device::cpu());
  EXPECT_EQ(kept_cpu.to_vector<int32_t>()[0], N - (N + 96) / 97);
  Tensor t_rows = rows_to_cpu(targets, rows);
  const int64_t R = static_cast<int64_t>(rows.size());
  Tensor ref_losses = Tensor::empty({R}, DType::f32), ref_lse = Tensor::empty({R}, DType::f32);
  Tensor ref_grad = Tensor::empty({R, V}, DType::bf16);
  kernels::cross_entropy_forward(logits_rows, t_rows, kept_cpu, v_limit, -1, ref_losses, ref_lse, ref_grad);
  EXPECT_LE(rel_err(rows_to_cpu(losses, rows), ref_losses), 1e-5);
  EXPECT_LE(rel_err(rows_to_cpu(lse, rows), ref_lse), 1e-5);
  EXPECT_LE(rel_err(rows_to_cpu(logits, rows), ref_grad), kTolBf16);
  std::vector<float> g = rows_to_cpu(logits, {1}).to_vector<float>();  // padded columns: zero gradient
  for (int64_t c = v_limit; c < V; ++c) ASSERT_EQ(g[c], 0.0f) << c;
}

// The embedding backward at V 50304 x C 768 from 16384 ids drawn from 300 values (every id
// repeats ~55 times): deterministic, against the CPU's in-order sums.
TEST_F(Cuda, EmbeddingBackwardAtGpt2ShapeWithRepeats) {
  const int64_t N = 16384, V = 50304, C = 768;
  std::vector<int32_t> ids = random_ids({N}, 300, Device::cpu(), 81).to_vector<int32_t>();
  for (int32_t& id : ids) id = id * 167 + (id % 3);  // spread over the table, < V
  Tensor ids_cpu = Tensor::from_vector<int32_t>(ids, {N});
  for (DType dt : {DType::f32, DType::bf16}) {
    Tensor dout = randn({N, C}, dt, kGpu, 82);
    Tensor d1 = Tensor::empty({V, C}, dt, kGpu), d2 = Tensor::empty({V, C}, dt, kGpu);
    Tensor ids_gpu = ids_cpu.to(kGpu);
    kernels::embedding_backward(ids_gpu, dout, d1);
    kernels::embedding_backward(ids_gpu, dout, d2);
    Tensor ref = Tensor::empty({V, C}, dt);
    kernels::embedding_backward(ids_cpu, dout.to(Device::cpu()), ref);
    EXPECT_LE(rel_err(d1, ref), dt == DType::bf16 ? 4e-3 : 1e-6) << dtype_name(dt);
    EXPECT_EQ(d1.to_vector<float>(), d2.to_vector<float>()) << "not deterministic, " << dtype_name(dt);
  }
}

// Attention at B 2 x NH 12 x T 1024 x HS 64, causal, forward and backward, bf16 and f32.
TEST_F(Cuda, AttentionAtGpt2Shape) {
  for (DType dt : {DType::f32, DType::bf16}) {
    std::vector<Tensor> in;
    for (uint64_t s = 0; s < 3; ++s) in.push_back(randn({2, 12, 1024, 64}, dt, Device::cpu(), 90 + s));
    auto run = [&](Device dev) {
      std::vector<Tensor> x;
      for (const Tensor& t : in) x.push_back(t.to(dev).set_requires_grad(true));
      AttentionOut r = attention(x[0], x[1], x[2]);
      Tensor dout = randn(r.out.shape(), dt, dev, 95);
      ndt::backward({r.out}, {dout});
      return std::vector<Tensor>{r.out, r.lse, x[0].grad(), x[1].grad(), x[2].grad()};
    };
    std::vector<Tensor> got = run(kGpu), ref = run(Device::cpu());
    const char* names[] = {"out", "lse", "dq", "dk", "dv"};
    for (size_t i = 0; i < ref.size(); ++i)
      EXPECT_LE(rel_err(got[i], ref[i]), dt == DType::bf16 ? 2e-2 : 1e-4)
          << names[i] << " " << dtype_name(dt);
  }
}

// A tensor of more than 2^31 elements: 64-bit indexing in the grid-stride loops of fill,
// scale, copies (contiguous and strided, with conversion) and AdamW, checked on both sides of
// element 2^31.
TEST_F(Cuda, TensorsAboveTwoToThe31Elements) {
  const int64_t n = (int64_t(1) << 31) + 4099;
  const std::vector<int64_t> probe = {0, (int64_t(1) << 31) - 1, int64_t(1) << 31, n - 1};
  auto at = [](const Tensor& t, int64_t i) { return t.view({-1}).narrow(0, i, 1).to_vector<double>()[0]; };
  Tensor x = Tensor::empty({n}, DType::bf16, kGpu);
  kernels::fill(x, 1.5);
  kernels::scale(x, 2.0, x);
  for (int64_t i : probe) EXPECT_EQ(at(x, i), 3.0) << i;
  {
    Tensor y = Tensor::empty({n}, DType::f32, kGpu);
    kernels::copy(y, x);  // contiguous with conversion
    for (int64_t i : probe) EXPECT_EQ(at(y, i), 3.0) << i;
  }
  {
    // strided: (2, n/2) viewed transposed; the element at [j, i] lands at j * rows + i
    const int64_t half = n / 2;  // n is odd: the last element is left out
    Tensor src = x.narrow(0, 0, 2 * half).view({2, half});
    kernels::fill(src.narrow(0, 1, 1), -1.0);
    Tensor dst = Tensor::empty({half, 2}, DType::bf16, kGpu);
    kernels::copy(dst, src.transpose(0, 1));
    EXPECT_EQ(at(dst, 0), 3.0);
    EXPECT_EQ(at(dst, 1), -1.0);
    EXPECT_EQ(at(dst, 2 * half - 2), 3.0);
    EXPECT_EQ(at(dst, 2 * half - 1), -1.0);
  }
  x = Tensor();
  Tensor p = Tensor::full({n}, 1.0, DType::f32, kGpu), g = Tensor::full({n}, 0.5, DType::f32, kGpu);
  Tensor m = Tensor::zeros({n}, DType::f32, kGpu), v = Tensor::zeros({n}, DType::f32, kGpu);
  kernels::AdamWArgs a;
  a.lr = 0.1;
  a.weight_decay = 0.0;
  kernels::adamw_step(p, g, m, v, a);
  for (int64_t i : probe) EXPECT_NEAR(at(p, i), 0.9, 1e-6) << i;  // the first step moves by lr
}
