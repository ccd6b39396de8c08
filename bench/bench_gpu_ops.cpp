// GPU op benchmarks (Google Benchmark): GEMM, attention forward+backward, LayerNorm.
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

void register_all() {
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
    std::printf("%-44s %12s %14s\n", "benchmark", "time/iter", "throughput");
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
      std::printf("%-44s %9.3f ms %14s\n", r.benchmark_name().c_str(), ms, tp.c_str());
    }
  }

 private:
  std::vector<Run> runs_;
};

}  // namespace

int main(int argc, char** argv) {
  if (!cuda::available()) {
    std::printf("bench_gpu_ops: no CUDA device visible (%s); nothing to measure, skipping\n",
                cuda::compiled() ? "built with CUDA" : "built without CUDA");
    return 0;
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  register_all();
  SummaryReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  reporter.PrintSummary();
  benchmark::Shutdown();
  return 0;
}
