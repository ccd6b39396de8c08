// GPU op benchmarks (Google Benchmark): GEMM, attention forward+backward, LayerNorm, and the
// kernels of a GPT-2 124M step at B 16 x T 1024 (N = 16384 tokens, C 768, V 50304): the
// fused linear epilogues, add + LayerNorm, the fused classifier, the embedding backward,
// GELU's backward and AdamW over 124M parameters.
//
//   build-gpu/bench_gpu_ops --benchmark_min_time=0.2
//
// Every iteration ends with ndt::cuda::synchronize, so the measured (real) time is the
// device time of the op. Counters: TFLOP/s for GEMM and attention (the GEMM flops of
// attention: 4 B NH T^2 HS forward, twice that backward, causal mask ignored), GB/s for
// LayerNorm (bytes read and written once). After the benchmarks a short table repeats the
// figures. Without a CUDA device it prints a message and exits 0.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "autograd/node.h"
#include "autograd/ops.h"
#include "tensor/cuda/runtime.h"
#include "tensor/kernels.h"

using namespace ndt;

namespace {

const Device kGpu = Device::cuda(0);

Tensor randn(const Shape& shape, DType dt, uint64_t stream, float std = 1.0f) {
  Tensor t = Tensor::empty(shape, dt, kGpu);
  kernels::fill_normal(t, 42, stream, 0, 0.0f, std);
  return t;
}

// c (n,n) = a (n,n) @ b (n,n)
void BM_Matmul(benchmark::State& state, DType dt) {
  const int64_t n = state.range(0);
  Tensor a = randn({n, n}, dt, 1), b = randn({n, n}, dt, 2), c = Tensor::empty({n, n}, dt, kGpu);
  kernels::gemm(a, false, b, false, c);  // warm-up (cuBLAS heuristics, pool)
  cuda::synchronize(0);
  for (auto _ : state) {
    kernels::gemm(a, false, b, false, c);
    cuda::synchronize(0);
  }
  state.counters["TFLOP/s"] =
      benchmark::Counter(2.0 * n * n * n * 1e-12, benchmark::Counter::kIsIterationInvariantRate);
}

// causal attention forward + backward: q, k, v (B,NH,T,HS), gradients of q, k, v
void BM_Attention(benchmark::State& state, DType dt) {
  const int64_t B = 8, NH = 12, T = 1024, HS = 64;
  Tensor q = randn({B, NH, T, HS}, dt, 1), k = randn({B, NH, T, HS}, dt, 2), v = randn({B, NH, T, HS}, dt, 3);
  Tensor dout = randn({B, NH, T, HS}, dt, 4);
  q.set_requires_grad(true);
  k.set_requires_grad(true);
  v.set_requires_grad(true);
  auto step = [&] {
    AttentionOut r = attention(q, k, v);
    backward({r.out}, {dout});
  };
  step();
  cuda::synchronize(0);
  for (auto _ : state) {
    step();
    cuda::synchronize(0);
  }
  const double fwd = 4.0 * B * NH * T * T * HS;  // q k^T and p v
  state.counters["TFLOP/s"] =
      benchmark::Counter(3.0 * fwd * 1e-12, benchmark::Counter::kIsIterationInvariantRate);
}

// layernorm forward x (N,C) -> out, mean, rstd; or backward -> dx, dw, db
void BM_LayerNorm(benchmark::State& state, DType dt, bool backward_pass) {
  const int64_t N = 16384, C = 768;
  Tensor x = randn({N, C}, dt, 1), w = randn({C}, dt, 2), b = randn({C}, dt, 3), dy = randn({N, C}, dt, 4);
  Tensor out = Tensor::empty({N, C}, dt, kGpu), dx = Tensor::empty({N, C}, dt, kGpu);
  Tensor mean = Tensor::empty({N}, DType::f32, kGpu), rstd = Tensor::empty({N}, DType::f32, kGpu);
  Tensor dw = Tensor::empty({C}, dt, kGpu), db = Tensor::empty({C}, dt, kGpu);
  kernels::layernorm_forward(x, w, b, 1e-5, out, mean, rstd);
  cuda::synchronize(0);
  for (auto _ : state) {
    if (backward_pass)
      kernels::layernorm_backward(dy, x, w, mean, rstd, dx, dw, db);
    else
      kernels::layernorm_forward(x, w, b, 1e-5, out, mean, rstd);
    cuda::synchronize(0);
  }
  const double elem = static_cast<double>(dtype_size(dt));
  // forward reads x, writes out; backward reads dy and x (twice: dx and dw/db), writes dx
  const double bytes = backward_pass ? 4.0 * N * C * elem : 2.0 * N * C * elem;
  state.counters["GB/s"] = benchmark::Counter(bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

// One kernel call of a GPT-2 step, timed; its useful FLOPs and bytes (read + written once)
// give the TFLOP/s or GB/s counter.
void BM_Kernel(benchmark::State& state, std::function<void()> fn, double flops, double bytes) {
  fn();  // warm-up (heuristics, graph caches, pool)
  cuda::synchronize(0);
  for (auto _ : state) {
    fn();
    cuda::synchronize(0);
  }
  if (flops > 0)
    state.counters["TFLOP/s"] =
        benchmark::Counter(flops * 1e-12, benchmark::Counter::kIsIterationInvariantRate);
  else
    state.counters["GB/s"] = benchmark::Counter(bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

void register_gpt2_step_kernels() {
  const DType dt = DType::bf16;
  const int64_t N = 16384, C = 768, V = 50304, VL = 50257;
  const double e = 2.0;  // bytes per bf16
  auto reg = [](const std::string& name, std::function<void()> fn, double flops, double bytes) {
    benchmark::RegisterBenchmark(("gpt2_" + name).c_str(), BM_Kernel, std::move(fn), flops, bytes)
        ->UseRealTime()
        ->Unit(benchmark::kMicrosecond);
  };
  {  // qkv: bias epilogue
    Tensor x = randn({N, C}, dt, 1), w = randn({C, 3 * C}, dt, 2, 0.02f), b = randn({3 * C}, dt, 3);
    Tensor out = Tensor::empty({N, 3 * C}, dt, kGpu);
    reg(
        "linear_bias_16384x768x2304_bf16", [=] { kernels::linear_forward(x, w, b, false, out, Tensor()); },
        2.0 * N * C * 3 * C, 0);
  }
  {  // c_fc: bias + GELU epilogue, the pre-activation kept
    Tensor x = randn({N, C}, dt, 4), w = randn({C, 4 * C}, dt, 5, 0.02f), b = randn({4 * C}, dt, 6);
    Tensor out = Tensor::empty({N, 4 * C}, dt, kGpu), pre = Tensor::empty({N, 4 * C}, dt, kGpu);
    reg(
        "linear_gelu_16384x768x3072_bf16", [=] { kernels::linear_forward(x, w, b, true, out, pre); },
        2.0 * N * C * 4 * C, 0);
    Tensor dx = Tensor::empty({N, 4 * C}, dt, kGpu);
    reg(
        "gelu_backward_16384x3072_bf16", [=] { kernels::gelu_backward(pre, out, dx); }, 0,
        3.0 * N * 4 * C * e);
  }
  {  // residual add + ln_2
    Tensor a = randn({N, C}, dt, 7), r = randn({N, C}, dt, 8), w = randn({C}, dt, 9), b = randn({C}, dt, 10);
    Tensor sum = Tensor::empty({N, C}, dt, kGpu), out = Tensor::empty({N, C}, dt, kGpu);
    Tensor mean = Tensor::empty({N}, DType::f32, kGpu), rstd = Tensor::empty({N}, DType::f32, kGpu);
    reg(
        "add_layernorm_16384x768_bf16",
        [=] { kernels::add_layernorm_forward(a, r, w, b, 1e-5, sum, out, mean, rstd); }, 0, 4.0 * N * C * e);
    Tensor dx = Tensor::empty({N, C}, dt, kGpu), dw = Tensor::empty({C}, dt, kGpu),
           db = Tensor::empty({C}, dt, kGpu);
    reg(
        "layernorm_backward_residual_16384x768_bf16",
        [=] { kernels::layernorm_backward(out, sum, w, mean, rstd, dx, dw, db, r); }, 0, 4.0 * N * C * e);
  }
  {  // the fused classifier: loss, lse and the gradient over the logits (refilled by nothing:
     // after the first call the logits hold gradients, which is as fast to read)
    Tensor logits = randn({N, V}, dt, 11, 2.0f);
    Tensor targets = Tensor::empty({N}, DType::i32, kGpu);
    kernels::fill(targets, 17.0);
    Tensor kept = Tensor::empty({1}, DType::i32, kGpu);
    kernels::count_not_equal(targets, -1, kept);
    Tensor losses = Tensor::empty({N}, DType::f32, kGpu), lse = Tensor::empty({N}, DType::f32, kGpu);
    reg(
        "cross_entropy_fused_16384x50304_bf16",
        [=] { kernels::cross_entropy_forward(logits, targets, kept, VL, -1, losses, lse, logits); }, 0,
        3.0 * N * V * e);  // read twice (max/sum, gradient), written once
  }
  {  // wte's backward: 16384 ids, many repeats
    std::vector<int32_t> host(N);
    for (int64_t i = 0; i < N; ++i) host[i] = static_cast<int32_t>((i * 7919) % 5000);
    Tensor ids = Tensor::from_vector(host, {N}, kGpu);
    Tensor dout = randn({N, C}, dt, 13), dtable = Tensor::empty({V, C}, dt, kGpu);
    reg(
        "embedding_backward_16384ids_50304x768_bf16", [=] { kernels::embedding_backward(ids, dout, dtable); },
        0, (N * C + V * C) * e);
  }
  {  // AdamW over GPT-2 124M's parameters (f32 master, moments): reads p, g, m, v, writes p, m, v
    const int64_t P = 124439808;
    Tensor p = randn({P}, DType::f32, 14, 0.02f), g = randn({P}, DType::f32, 15, 1e-3f);
    Tensor m = Tensor::zeros({P}, DType::f32, kGpu), v = Tensor::zeros({P}, DType::f32, kGpu);
    kernels::AdamWArgs a;
    a.lr = 6e-4;
    a.weight_decay = 0.1;
    a.decay_end = P;
    reg(
        "adamw_124M_f32", [=] { kernels::adamw_step(p, g, m, v, a); }, 0, 7.0 * P * 4);
  }
}

void register_all() {
  register_gpt2_step_kernels();
  for (DType dt : {DType::f32, DType::bf16}) {
    const std::string s = dt == DType::f32 ? "f32" : "bf16";
    benchmark::RegisterBenchmark(("matmul_2048_" + s).c_str(), BM_Matmul, dt)
        ->Arg(2048)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("attention_fwd_bwd_B8_NH12_T1024_HS64_" + s).c_str(), BM_Attention, dt)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("layernorm_fwd_16384x768_" + s).c_str(), BM_LayerNorm, dt, false)
        ->UseRealTime()
        ->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark(("layernorm_bwd_16384x768_" + s).c_str(), BM_LayerNorm, dt, true)
        ->UseRealTime()
        ->Unit(benchmark::kMicrosecond);
  }
}

// The console table as usual, and the runs kept for the short summary at the end.
class SummaryReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& r : runs) runs_.push_back(r);
  }
  void PrintSummary() const {
    std::printf("\n== bench_gpu_ops summary (%s) ==\n", "cuda:0");
    std::printf("%-50s %12s %14s\n", "benchmark", "time/iter", "throughput");
    for (const Run& r : runs_) {
      const double ms = r.GetAdjustedRealTime() * benchmark::GetTimeUnitMultiplier(benchmark::kMillisecond) /
                        benchmark::GetTimeUnitMultiplier(r.time_unit);
      std::string tp = "-";
      char buf[64];
      if (auto it = r.counters.find("TFLOP/s"); it != r.counters.end()) {
        std::snprintf(buf, sizeof buf, "%.1f TFLOP/s", it->second.value);
        tp = buf;
      } else if (auto it2 = r.counters.find("GB/s"); it2 != r.counters.end()) {
        std::snprintf(buf, sizeof buf, "%.0f GB/s", it2->second.value);
        tp = buf;
      }
      std::printf("%-50s %9.3f ms %14s\n", r.benchmark_name().c_str(), ms, tp.c_str());
    }
  }

 private:
  std::vector<Run> runs_;
};

void usage() {
  std::printf(
      "usage: bench_gpu_ops [--benchmark_filter=REGEX] [--benchmark_min_time=S] [Google Benchmark flags]\n"
      "  GPU op benchmarks and the kernels of a GPT-2 124M step, then a summary table; without a\n"
      "  CUDA device it says so and exits 0\n\n");
  benchmark::PrintDefaultHelp();
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]) == "-h") {  // Google Benchmark knows only --help
      usage();
      return 0;
    }
  try {
    benchmark::Initialize(&argc, argv, usage);  // takes its flags out of argv; --help: usage, exit 0
    if (argc > 1) {
      std::fprintf(stderr, "bench_gpu_ops: error: unknown argument %s (see --help)\n", argv[1]);
      return 2;
    }
    if (!cuda::available()) {
      std::printf("bench_gpu_ops: no CUDA device visible (%s); nothing to measure, skipping\n",
                  cuda::compiled() ? "built with CUDA" : "built without CUDA");
      return 0;
    }
    register_all();
    SummaryReporter reporter;
    benchmark::RunSpecifiedBenchmarks(&reporter);
    reporter.PrintSummary();
    benchmark::Shutdown();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_gpu_ops: error: %s\n", e.what());
    return 1;
  }
}
