// Training speed of a GPT: forward + backward + clipping + AdamW on random tokens, 10 timed
// steps after 2 warm-up steps. Configs: S and M (the CPU configs of docs/PERFORMANCE.md) and GPT2 (124M,
// B 16, T 1024, vocab padded to 50304; for a GPU).
//
//   build/bench_gpt_train                 # S and M on CPU, all cores
//   build/bench_gpt_train S 2             # one config, 2 threads
//   build/bench_gpt_train GPT2 0 cuda     # GPT-2 124M on the first GPU
//
// Prints a table: ms/step, tokens/s and achieved GFLOP/s (model FLOPs, 6N + attention),
// and on a GPU the MFU against 67 TFLOP/s (H100/H200 dense f32, no TF32).
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "models/gpt.h"
#include "optim/adamw.h"
#include "tensor/cuda/runtime.h"
#include "tensor/kernels.h"
#include "tensor/threads.h"

using namespace ndt;

namespace {

struct Case {
  const char* name;
  int64_t n_layer, n_head, n_embd, vocab, B, T;
};

Tensor random_ids(int64_t B, int64_t T, int64_t V, uint64_t stream) {
  Tensor u = Tensor::empty({B, T});
  kernels::fill_uniform(u, 1, stream, 0, 0.0f, static_cast<float>(V));
  std::vector<int32_t> v;
  for (float x : u.to_vector<float>()) v.push_back(static_cast<int32_t>(x));
  return Tensor::from_vector(v, {B, T});
}

}  // namespace

int main(int argc, char** argv) {
  use_optimized_blas(argv);
  const std::vector<Case> cases = {
      {"S", 4, 4, 256, 512, 8, 128}, {"M", 6, 6, 384, 4096, 8, 256}, {"GPT2", 12, 12, 768, 50257, 16, 1024}};
  const std::string only = argc > 1 ? argv[1] : "";
  const int threads = argc > 2 ? std::atoi(argv[2]) : 0;
  const Device device = Device::parse(argc > 3 ? argv[3] : "cpu");
  if (device.is_cuda() && !cuda::available()) {
    std::printf("no CUDA device visible; skipping\n");
    return 0;
  }
  set_num_threads(threads);
  std::printf("threads: %d, OpenBLAS kernel: %s\n\n", num_threads(), blas_core().c_str());
  std::printf(
      "| config | params | tokens/step | ms/step | tokens/s | GFLOP/s | device "
      "|\n|---|---|---|---|---|---|---|\n");
  for (const Case& c : cases) {
    if (only.empty() ? std::string(c.name) == "GPT2" : only != c.name) continue;
    models::GPTConfig cfg;
    cfg.n_layer = c.n_layer, cfg.n_head = c.n_head, cfg.n_embd = c.n_embd, cfg.vocab_size = c.vocab,
    cfg.block_size = c.T;
    cfg.vocab_multiple = c.vocab > 4096 ? 128 : 1;
    models::GPT gpt(cfg);
    nn::FlatParams params = nn::materialize(gpt.units(), device, DType::f32, 1);
    optim::AdamW opt(params, {});
    double total = 0;
    const int warmup = 2, steps = 10;
    for (int s = 0; s < warmup + steps; ++s) {
      Tensor x = random_ids(c.B, c.T, c.vocab, 2 * s).to(device),
             y = random_ids(c.B, c.T, c.vocab, 2 * s + 1).to(device);
      const auto t0 = std::chrono::steady_clock::now();
      params.zero_grad();
      backward(gpt.forward(x, y).loss);
      opt.step(1e-4, optim::clip_scale(optim::grad_norm(params), 1.0));
      if (device.is_cuda()) cuda::synchronize(device.index);
      const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (s >= warmup) total += sec;
    }
    const double ms = total / steps * 1e3, tok = static_cast<double>(c.B * c.T);
    const double gflops = gpt.flops_per_token(c.T) * tok / (ms / 1e3) / 1e9;
    std::printf(
        "| %s (L%lld H%lld C%lld V%lld B%lld T%lld) | %.2fM | %.0f | %.1f | %.0f | %.1f | %s%s |\n", c.name,
        (long long)c.n_layer, (long long)c.n_head, (long long)c.n_embd, (long long)c.vocab, (long long)c.B,
        (long long)c.T, params.param_count() / 1e6, tok, ms, tok / (ms / 1e3), gflops, device.str().c_str(),
        device.is_cuda() ? (" MFU " + std::to_string(gflops / 67e3 * 100).substr(0, 4) + "%").c_str() : "");
  }
  return 0;
}
