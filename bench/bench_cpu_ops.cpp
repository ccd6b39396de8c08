// CPU op benchmarks (Google Benchmark): GEMM through the kernel, through the op and
// straight through cblas_sgemm; a linear's bias and weight gradient; causal attention (and on
// rows packed with several documents); LayerNorm; the MoE grouped GEMM against a dense one.
// Results: docs/PERFORMANCE.md (grouped_matmul: docs/moe-performance.md).
//
//   build/bench_cpu_ops --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
//
// BLAS: ndt::use_cpu_defaults first (re-executes with OPENBLAS_CORETYPE set where
// Debian's OpenBLAS misdetects the CPU; NDT_NO_BLAS_REEXEC=1 keeps what it detected).
// Threads: ndt::set_num_threads(NDT_BENCH_THREADS) (default 2, the reference machine's
// cores) sets both OpenMP and OpenBLAS.
// Under noise from other processes, compare the min_time / max_FLOPS rows of repetitions.
// FLOP counters count the arithmetic the kernels do (attention: full, unmasked score
// GEMMs, which is what the CPU path computes).
//
// Legend: N square matrix size; B batch, NH heads, T time, HS head size; R rows, C channels.
//
// And the bookkeeping every collective pays for its deadline message and the flight
// recorder (dist/flight.h): the context string, queued, started and finished.
#include <benchmark/benchmark.h>
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "autograd/node.h"
#include "autograd/ops.h"
#include "dist/flight.h"
#include "tensor/kernels.h"
#include "tensor/threads.h"

using namespace ndt;

namespace {

Tensor randn(const Shape& shape, uint64_t stream, DType dt = DType::f32) {
  Tensor t = Tensor::empty(shape, DType::f32);
  kernels::fill_normal(t, /*seed=*/7, stream, 0, 0.0f, 1.0f);
  return dt == DType::f32 ? t : t.to(dt);
}

// Extra statistics over repetitions: the fastest run (min time) and its rate (max).
double min_of(const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); }
double max_of(const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); }
void setup(benchmark::internal::Benchmark* b) {
  b->UseRealTime()->ComputeStatistics("min", min_of)->ComputeStatistics("max", max_of);
}

void flops(benchmark::State& state, double per_iteration) {
  state.counters["FLOPS"] = benchmark::Counter(per_iteration, benchmark::Counter::kIsIterationInvariantRate);
}

// ---- (a) matmul: a (N,N) @ b (N,N) -> c (N,N), f32 ---------------------------------------

// The kernel with a preallocated output: ndt::kernels::gemm -> cpu::gemm -> cblas_sgemm.
void BM_gemm_kernel(benchmark::State& state) {
  const int64_t N = state.range(0);
  Tensor a = randn({N, N}, 0), b = randn({N, N}, 1), c = Tensor::empty({N, N});
  for (auto _ : state) {
    kernels::gemm(a, false, b, false, c);
    benchmark::DoNotOptimize(c.data_ptr());
    benchmark::ClobberMemory();
  }
  flops(state, 2.0 * N * N * N);
}

// The differentiable op, no grad: checks, allocates the output (from the CPU cache), GEMM.
void BM_matmul_op(benchmark::State& state) {
  const int64_t N = state.range(0);
  Tensor a = randn({N, N}, 0), b = randn({N, N}, 1);
  for (auto _ : state) {
    Tensor c = ndt::matmul(a, b);
    benchmark::DoNotOptimize(c.data_ptr());
    benchmark::ClobberMemory();
  }
  flops(state, 2.0 * N * N * N);
}

// The baseline: cblas_sgemm on the same buffers.
void BM_cblas_sgemm(benchmark::State& state) {
  const int64_t N = state.range(0);
  Tensor a = randn({N, N}, 0), b = randn({N, N}, 1), c = Tensor::empty({N, N});
  const int n = static_cast<int>(N);
  for (auto _ : state) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data<float>(), n, b.data<float>(),
                n, 0.0f, c.data<float>(), n);
    benchmark::DoNotOptimize(c.data_ptr());
    benchmark::ClobberMemory();
  }
  flops(state, 2.0 * N * N * N);
}

BENCHMARK(BM_cblas_sgemm)
    ->Arg(32)
    ->Arg(256)
    ->Arg(512)
    ->Arg(1024)
    ->Unit(benchmark::kMicrosecond)
    ->Apply(setup);
BENCHMARK(BM_gemm_kernel)
    ->Arg(32)
    ->Arg(256)
    ->Arg(512)
    ->Arg(1024)
    ->Unit(benchmark::kMicrosecond)
    ->Apply(setup);
BENCHMARK(BM_matmul_op)->Arg(32)->Arg(256)->Arg(512)->Arg(1024)->Unit(benchmark::kMicrosecond)->Apply(setup);

// The three paths back to back in every iteration (order rotating), each call timed on
// its own: the median over iterations of (path time / cblas time - 1) is the framework's
// overhead, robust to the slow drifts a shared machine adds to separate benchmarks.
void BM_matmul_overhead_paired(benchmark::State& state) {
  const int64_t N = state.range(0);
  const int n = static_cast<int>(N);
  Tensor a = randn({N, N}, 0), b = randn({N, N}, 1), c = Tensor::empty({N, N});
  using clock = std::chrono::steady_clock;
  std::vector<double> kernel_ratio, op_ratio;
  int64_t it = 0;
  for (auto _ : state) {
    double t[3] = {};
    for (int j = 0; j < 3; ++j) {
      const int path = static_cast<int>((it + j) % 3);
      const auto t0 = clock::now();
      if (path == 0) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data<float>(), n,
                    b.data<float>(), n, 0.0f, c.data<float>(), n);
      } else if (path == 1) {
        kernels::gemm(a, false, b, false, c);
      } else {
        Tensor o = ndt::matmul(a, b);
        benchmark::DoNotOptimize(o.data_ptr());
      }
      benchmark::ClobberMemory();
      t[path] = std::chrono::duration<double>(clock::now() - t0).count();
    }
    kernel_ratio.push_back(t[1] / t[0] - 1);
    op_ratio.push_back(t[2] / t[0] - 1);
    ++it;
  }
  auto median = [](std::vector<double> v) {
    std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
    return v[v.size() / 2];
  };
  state.counters["kernel_overhead_pct"] = 100 * median(kernel_ratio);
  state.counters["op_overhead_pct"] = 100 * median(op_ratio);
  flops(state, 3 * 2.0 * N * N * N);
}
BENCHMARK(BM_matmul_overhead_paired)->Arg(32)->Arg(512)->Unit(benchmark::kMicrosecond)->UseRealTime();

// A linear with bias at config M's c_fc shape, x (2048,384) @ w (384,1536) + b: arg 0 the
// GEMM into a zeroed output and then the bias added (two passes over y), arg 1
// kernels::linear_forward (the bias copied into y, the GEMM adds onto it: one pass).
void BM_linear_bias(benchmark::State& state) {
  Tensor x = randn({2048, 384}, 6), w = randn({384, 1536}, 7), b = randn({1536}, 8);
  Tensor y = Tensor::empty({2048, 1536});
  for (auto _ : state) {
    if (state.range(0) == 1) {
      kernels::linear_forward(x, w, b, false, y, Tensor());
    } else {
      kernels::gemm(x, false, w, false, y, 1.0, 0.0);
      kernels::add(y, b, y, 1.0, 1.0);
    }
    benchmark::DoNotOptimize(y.data_ptr());
  }
  flops(state, 2.0 * 2048 * 384 * 1536);
}
BENCHMARK(BM_linear_bias)->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond)->Apply(setup);

// The same linear's weight gradient, dw (384,1536) = x^T @ dpre onto a gradient buffer that
// already holds values: arg 0 as a returned gradient (the GEMM into a fresh dw, which
// OpenBLAS zeroes first, then AccumulateGrad's grad += dw), arg 1 as the linear does it for a
// leaf weight (the GEMM adds onto the buffer, beta 1).
void BM_weight_grad(benchmark::State& state) {
  Tensor x = randn({2048, 384}, 6), dpre = randn({2048, 1536}, 9), grad = randn({384, 1536}, 10);
  for (auto _ : state) {
    if (state.range(0) == 1) {
      kernels::gemm(x, true, dpre, false, grad, 1.0, 1.0);
    } else {
      Tensor dw = Tensor::empty({384, 1536});
      kernels::gemm(x, true, dpre, false, dw);
      kernels::add_(grad, dw);
    }
    benchmark::DoNotOptimize(grad.data_ptr());
  }
  flops(state, 2.0 * 2048 * 384 * 1536);
}
BENCHMARK(BM_weight_grad)->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond)->Apply(setup);

// One GEMM of a GPT step at config M (2048 tokens, C 384), as f32 sgemm (path 0) and in bf16
// converted to f32 for sgemm (1) or on oneDNN's bf16 kernels (2; tensor/cpu/onednn_gemm.cpp).
// Shapes (m, k, n, trans_a, trans_b): 0 c_attn forward, 1 c_fc forward, 2 c_proj (MLP)
// forward, 3 lm_head forward, 4 c_fc's dW (x^T @ dy), 5 c_fc's dX (dy @ w^T); config S's
// micro-step of 256 rows (a rank of the planner's bench): 6 c_attn, 7 c_attn under TP 4,
// 8 attn c_proj under TP 4 (K = C/4), 9 c_fc under TP 4.
void BM_gemm_bf16(benchmark::State& state) {
  struct G {
    int64_t m, k, n;
    bool ta, tb;
  };
  const G shapes[] = {{2048, 384, 1152, false, false}, {2048, 384, 1536, false, false},
                      {2048, 1536, 384, false, false}, {2048, 384, 4096, false, false},
                      {384, 2048, 1536, true, false},  {2048, 1536, 384, false, true},
                      {256, 256, 768, false, false},   {256, 256, 192, false, false},
                      {256, 64, 256, false, false},    {256, 256, 256, false, false}};
  const G g = shapes[state.range(1)];
  const int path = static_cast<int>(state.range(0));
  const DType dt = path == 0 ? DType::f32 : DType::bf16;
  Tensor a = randn(g.ta ? Shape{g.k, g.m} : Shape{g.m, g.k}, 9, dt);
  Tensor b = randn(g.tb ? Shape{g.n, g.k} : Shape{g.k, g.n}, 10, dt);
  Tensor c = Tensor::empty({g.m, g.n}, dt);
  if (path == 1) setenv("NDT_BF16_GEMM", "f32", 1);
  if (path == 2) setenv("NDT_BF16_GEMM", "onednn", 1);
  for (auto _ : state) {
    kernels::gemm(a, g.ta, b, g.tb, c);
    benchmark::DoNotOptimize(c.data_ptr());
  }
  unsetenv("NDT_BF16_GEMM");
  flops(state, 2.0 * g.m * g.k * g.n);
}
BENCHMARK(BM_gemm_bf16)
    ->ArgsProduct({{0, 1, 2}, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9}})
    ->ArgNames({"path", "shape"})
    ->Unit(benchmark::kMicrosecond)
    ->Apply(setup);

// ---- (b) causal attention: q, k, v (B,NH,T,HS) -> out (B,NH,T,HS), f32 ---------------------
// Arg 0: composed (GEMMs over every (T,T) pair and the masked softmax); arg 1: the CPU's
// fused kernel (blocks of 64 queries against the keys they see), as ndt::attention runs it.
constexpr int64_t kB = 4, kNH = 4, kT = 256, kHS = 64;
// forward: q k^T and p v, 2*T*T*HS each per head; backward: four more GEMMs of that size
// (the composed path's count, for both arguments: a rate to compare)
constexpr double kAttnGemmFlops = 2.0 * kB * kNH * kT * kT * kHS;

AttentionOut attention_of(bool fused, const Tensor& q, const Tensor& k, const Tensor& v) {
  return fused ? ndt::attention(q, k, v) : ndt::attention_composed(q, k, v);
}

void BM_attention_forward(benchmark::State& state) {
  Tensor q = randn({kB, kNH, kT, kHS}, 0), k = randn({kB, kNH, kT, kHS}, 1), v = randn({kB, kNH, kT, kHS}, 2);
  autograd::NoGradGuard no_grad;
  for (auto _ : state) {
    AttentionOut r = attention_of(state.range(0) == 1, q, k, v);
    benchmark::DoNotOptimize(r.out.data_ptr());
  }
  flops(state, 2 * kAttnGemmFlops);
  state.counters["tokens"] = benchmark::Counter(kB * kT, benchmark::Counter::kIsIterationInvariantRate);
}

void BM_attention_forward_backward(benchmark::State& state) {
  Tensor q = randn({kB, kNH, kT, kHS}, 0), k = randn({kB, kNH, kT, kHS}, 1), v = randn({kB, kNH, kT, kHS}, 2);
  Tensor dout = randn({kB, kNH, kT, kHS}, 3);
  for (Tensor* t : {&q, &k, &v}) t->set_requires_grad(true);
  for (auto _ : state) {
    AttentionOut r = attention_of(state.range(0) == 1, q, k, v);
    ndt::backward({r.out}, {dout});
    benchmark::DoNotOptimize(q.grad().data_ptr());
    for (Tensor* t : {&q, &k, &v}) t->set_grad(Tensor());  // fresh gradients each iteration
  }
  flops(state, 6 * kAttnGemmFlops);
  state.counters["tokens"] = benchmark::Counter(kB * kT, benchmark::Counter::kIsIterationInvariantRate);
}

BENCHMARK(BM_attention_forward)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->Apply(setup);
BENCHMARK(BM_attention_forward_backward)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->Apply(setup);

// The whole attention core of a GPT block from c_attn's packed output, as the model runs it:
// qkv (B,T,3C) -> y (B,T,C), forward + backward, at config M's sizes. Arg 1: the CPU's fused
// kernel (ndt::self_attention); arg 0: composed (split, permute, attention, permute back).
constexpr int64_t kSB = 8, kST = 256, kSC = 384, kSNH = 6;

void BM_self_attention_forward_backward(benchmark::State& state) {
  const bool fused = state.range(0) == 1;
  Tensor qkv = randn({kSB, kST, 3 * kSC}, 4), dy = randn({kSB, kST, kSC}, 5);
  qkv.set_requires_grad(true);
  for (auto _ : state) {
    Tensor y = fused ? ndt::self_attention(qkv, kSNH) : ndt::self_attention_composed(qkv, kSNH);
    ndt::backward({y}, {dy});
    benchmark::DoNotOptimize(qkv.grad().data_ptr());
    qkv.set_grad(Tensor());
  }
  // the composed path's six full (T,T,HS) GEMMs per head, for both arguments (a rate to compare)
  flops(state, 6 * 2.0 * kSB * kST * kST * kSC);
  state.counters["tokens"] = benchmark::Counter(kSB * kST, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_self_attention_forward_backward)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->Apply(setup);

// Packed rows: the fused self-attention core, forward + backward, on rows of T 1024 tokens
// cut into n equal documents (docs: each attends only to itself). Arg n: 0 no docs (one
// causal row), 1 docs of one document (the same mask through the document path), 4 and 16
// documents: the fused kernel skips the keys of earlier documents, so n equal documents
// should cost about 1/n of the causal row.
constexpr int64_t kDB = 2, kDT = 1024;

void BM_self_attention_documents(benchmark::State& state) {
  const int64_t n = state.range(0);
  Tensor qkv = randn({kDB, kDT, 3 * kSC}, 4), dy = randn({kDB, kDT, kSC}, 5);
  qkv.set_requires_grad(true);
  std::vector<int32_t> d(static_cast<size_t>(kDB * kDT));
  for (size_t i = 0; i < d.size(); ++i) d[i] = n ? static_cast<int32_t>(int64_t(i) % kDT / (kDT / n)) : 0;
  const Tensor docs = n ? Tensor::from_vector(d, {kDB, kDT}) : Tensor();
  for (auto _ : state) {
    Tensor y = ndt::self_attention(qkv, kSNH, docs);
    ndt::backward({y}, {dy});
    benchmark::DoNotOptimize(qkv.grad().data_ptr());
    qkv.set_grad(Tensor());
  }
  state.counters["tokens"] = benchmark::Counter(kDB * kDT, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_self_attention_documents)
    ->Arg(0)
    ->Arg(1)
    ->Arg(4)
    ->Arg(16)
    ->Unit(benchmark::kMillisecond)
    ->Apply(setup);

// ---- (c) layernorm: x (R,C), w (C), b (C) -> out (R,C), f32 --------------------------------
constexpr int64_t kR = 8192, kC = 768;

void BM_layernorm_forward(benchmark::State& state) {
  Tensor x = randn({kR, kC}, 0), w = randn({kC}, 1), b = randn({kC}, 2);
  Tensor out = Tensor::empty({kR, kC}), mean = Tensor::empty({kR}), rstd = Tensor::empty({kR});
  for (auto _ : state) {
    kernels::layernorm_forward(x, w, b, 1e-5, out, mean, rstd);
    benchmark::DoNotOptimize(out.data_ptr());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * 2 * kR * kC * 4);  // read x, write out
}

void BM_layernorm_backward(benchmark::State& state) {
  Tensor x = randn({kR, kC}, 0), w = randn({kC}, 1), b = randn({kC}, 2), dout = randn({kR, kC}, 3);
  Tensor out = Tensor::empty({kR, kC}), mean = Tensor::empty({kR}), rstd = Tensor::empty({kR});
  kernels::layernorm_forward(x, w, b, 1e-5, out, mean, rstd);
  Tensor dx = Tensor::empty({kR, kC}), dw = Tensor::empty({kC}), db = Tensor::empty({kC});
  for (auto _ : state) {
    kernels::layernorm_backward(dout, x, w, mean, rstd, dx, dw, db);
    benchmark::DoNotOptimize(dx.data_ptr());
    benchmark::ClobberMemory();
  }
  // reads dout and x (each twice: the dx pass, then the dw/db pass), writes dx
  state.SetBytesProcessed(state.iterations() * 5 * kR * kC * 4);
}

// The op, forward and backward (allocation, the graph, both kernels).
void BM_layernorm_op_forward_backward(benchmark::State& state) {
  Tensor x = randn({kR, kC}, 0), w = randn({kC}, 1), b = randn({kC}, 2), dout = randn({kR, kC}, 3);
  for (Tensor* t : {&x, &w, &b}) t->set_requires_grad(true);
  for (auto _ : state) {
    Tensor y = ndt::layernorm(x, w, b);
    ndt::backward({y}, {dout});
    benchmark::DoNotOptimize(x.grad().data_ptr());
    for (Tensor* t : {&x, &w, &b}) t->set_grad(Tensor());
  }
  state.SetBytesProcessed(state.iterations() * 7 * kR * kC * 4);  // the two kernels above
}

BENCHMARK(BM_layernorm_forward)->Unit(benchmark::kMillisecond)->Apply(setup);
BENCHMARK(BM_layernorm_backward)->Unit(benchmark::kMillisecond)->Apply(setup);
BENCHMARK(BM_layernorm_op_forward_backward)->Unit(benchmark::kMillisecond)->Apply(setup);

// ---- (f) mixture of experts: grouped_matmul against one dense GEMM of the same FLOPs ------

// Shapes of one expert projection: N tokens, each through k of E experts, C -> I. Rows per
// expert come from a real top k of random router logits (uneven, as at initialization).
struct MoeShape {
  int64_t N, C, I, E, k;
};
constexpr MoeShape kMoe[] = {{1024, 256, 128, 16, 4},    // bench_gpt_train's MS: gate/up proj
                             {1024, 128, 256, 16, 4},    // and its down proj
                             {2048, 512, 256, 64, 8},    // many small experts (Qwen3-MoE's ratios)
                             {2048, 1024, 512, 32, 4}};  // fewer, larger experts

std::vector<int64_t> routed_counts(const MoeShape& s) {
  Tensor logits = randn({s.N, s.E}, 11);  // (N,E)
  TopK t = moe_topk(ndt::softmax(logits), s.k, /*normalize=*/true);
  return moe_sort(t.experts, s.E).counts;  // (E) summing to N k
}

// Forward + backward of x (M,C) -> (M,I), M = N k: Arg(1) grouped_matmul over E experts'
// routed rows, w (E,C,I); Arg(0) one matmul with w (C,I), the same FLOPs (6 M C I).
// Counters: FLOPS, and the fewest and most rows an expert got.
void BM_grouped_matmul_forward_backward(benchmark::State& state) {
  const MoeShape& s = kMoe[state.range(0)];
  const bool grouped = state.range(1) == 1;
  const int64_t M = s.N * s.k;
  const std::vector<int64_t> counts = routed_counts(s);
  Tensor x = randn({M, s.C}, 12), dy = randn({M, s.I}, 13);
  Tensor w = grouped ? randn({s.E, s.C, s.I}, 14) : randn({s.C, s.I}, 14);
  for (Tensor* t : {&x, &w}) t->set_requires_grad(true);
  for (auto _ : state) {
    Tensor y = grouped ? ndt::grouped_matmul(x, w, counts) : ndt::matmul(x, w);  // (M,I)
    ndt::backward({y}, {dy});
    benchmark::DoNotOptimize(w.grad().data_ptr());
    for (Tensor* t : {&x, &w}) t->set_grad(Tensor());
  }
  flops(state, 6.0 * static_cast<double>(M * s.C * s.I));
  state.counters["rows_min"] = static_cast<double>(*std::min_element(counts.begin(), counts.end()));
  state.counters["rows_max"] = static_cast<double>(*std::max_element(counts.begin(), counts.end()));
}

BENCHMARK(BM_grouped_matmul_forward_backward)
    ->ArgsProduct({{0, 1, 2, 3}, {0, 1}})
    ->ArgNames({"shape", "grouped"})
    ->Unit(benchmark::kMillisecond)
    ->Apply(setup);

// ---- (d) element-wise passes in f32 (arg 0) and bf16 (arg 1): what one value costs -------
// x, y (R,C): add (read 2, write 1), GELU forward (read 1, write 1), LayerNorm forward (read
// 1, write 1), the conversion to the other dtype (Tensor::to). Bytes: in the dtype.
template <typename Fn>
void elementwise(benchmark::State& state, int values_moved, Fn fn) {
  const DType dt = state.range(0) ? DType::bf16 : DType::f32;
  Tensor x = randn({kR, kC}, 0, dt), y = randn({kR, kC}, 1, dt), out = Tensor::empty({kR, kC}, dt);
  for (auto _ : state) {
    fn(x, y, out);
    benchmark::DoNotOptimize(out.data_ptr());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * values_moved * kR * kC * int64_t(dtype_size(dt)));
}
void BM_add(benchmark::State& s) {
  elementwise(s, 3, [](const Tensor& x, const Tensor& y, const Tensor& o) { kernels::add(x, y, o); });
}
void BM_gelu(benchmark::State& s) {
  elementwise(s, 2, [](const Tensor& x, const Tensor&, const Tensor& o) { kernels::gelu_forward(x, o); });
}
void BM_layernorm_dtype(benchmark::State& s) {
  const DType dt = s.range(0) ? DType::bf16 : DType::f32;
  Tensor w = randn({kC}, 2, dt), b = randn({kC}, 3, dt), mean = Tensor::empty({kR}),
         rstd = Tensor::empty({kR});
  elementwise(s, 2, [&](const Tensor& x, const Tensor&, const Tensor& o) {
    kernels::layernorm_forward(x, w, b, 1e-5, o, mean, rstd);
  });
}
void BM_convert(benchmark::State& s) {
  const DType to = s.range(0) ? DType::f32 : DType::bf16;
  elementwise(s, 1, [&](const Tensor& x, const Tensor&, const Tensor&) {
    benchmark::DoNotOptimize(x.to(to).data_ptr());
  });
}
// A (B, T, C) buffer's heads laid out as (B, NH, T, HS) (attention's q, k, v split and
// permuted) and back: the strided copy kernel, f32 (arg 0) and bf16 (arg 1). Bytes: read + write.
void BM_permute_copy(benchmark::State& s) {
  const DType dt = s.range(0) ? DType::bf16 : DType::f32;
  constexpr int64_t B = 8, T = 256, NH = 12, HS = 64;
  Tensor x = randn({B, T, NH * HS}, 0, dt);
  for (auto _ : s) {
    Tensor heads = x.view({B, T, NH, HS}).permute({0, 2, 1, 3}).contiguous();
    Tensor back = heads.permute({0, 2, 1, 3}).contiguous();
    benchmark::DoNotOptimize(back.data_ptr());
  }
  s.SetBytesProcessed(s.iterations() * 4 * B * T * NH * HS * int64_t(dtype_size(dt)));
}
BENCHMARK(BM_permute_copy)->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond)->Apply(setup);
BENCHMARK(BM_add)->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond)->Apply(setup);
BENCHMARK(BM_gelu)->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond)->Apply(setup);
BENCHMARK(BM_layernorm_dtype)->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond)->Apply(setup);
BENCHMARK(BM_convert)->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond)->Apply(setup);

void usage() {
  std::printf(
      "usage: bench_cpu_ops [--benchmark_filter=REGEX] [--benchmark_repetitions=N] [Google Benchmark flags]\n"
      "  CPU op benchmarks (GEMM, attention, LayerNorm); threads from NDT_BENCH_THREADS (default 2)\n\n");
  benchmark::PrintDefaultHelp();
}

}  // namespace

// ---- per-collective bookkeeping -------------------------------------------------------

// What a collective adds on the issuing thread and the communication thread: its timeout
// message's context ("the shard group of replica 1; step 37, micro-step 2 of 4, unit h.3")
// and its three flight-record updates. Compare with a step's collectives (the flight record
// of a run lists them) to bound the cost per step.
void BM_collective_bookkeeping(benchmark::State& state) {
  dist::FlightRecorder flight;
  flight.set_step(37);
  flight.set_micro(1, 4);
  const std::string description = "the shard group of replica 1";
  int64_t seq = 0;
  for (auto _ : state) {
    flight.set_unit("h.3");
    std::string context = description + "; " + flight.where();
    benchmark::DoNotOptimize(context);
    const int64_t id = flight.queued("dp_shard@1", ++seq, "dp_shard.all_gather", 396544);
    flight.started(id);
    flight.finished(id, true);
  }
}
BENCHMARK(BM_collective_bookkeeping)->Unit(benchmark::kNanosecond);

int main(int argc, char** argv) {
  ndt::use_cpu_defaults(argv);
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]) == "-h") {  // Google Benchmark knows only --help
      usage();
      return 0;
    }
  try {
    const char* env = std::getenv("NDT_BENCH_THREADS");
    const int threads = env ? std::atoi(env) : 2;
    ndt::set_num_threads(threads);  // OpenMP and OpenBLAS
    benchmark::AddCustomContext("openblas_threads", std::to_string(openblas_get_num_threads()));
    benchmark::AddCustomContext("openblas_config", openblas_get_config());
    benchmark::AddCustomContext("openblas_core", ndt::blas_core());
    benchmark::AddCustomContext("omp_max_threads", std::to_string(omp_get_max_threads()));
    benchmark::Initialize(&argc, argv, usage);  // takes its flags out of argv; --help: usage, exit 0
    if (argc > 1) {
      std::fprintf(stderr, "bench_cpu_ops: error: unknown argument %s (see --help)\n", argv[1]);
      return 2;
    }
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_cpu_ops: error: %s\n", e.what());
    return 1;
  }
}
