// Training speed of a GPT on CPU: the S and M configs of issue 3, 10 timed steps each
// (after 2 warm-up steps), forward + backward + AdamW, random tokens.
//
//   build/bench_gpt_train            # both configs, all cores
//   build/bench_gpt_train S 2        # one config, 2 threads
//
// Prints a table: ms/step, tokens/s and achieved GFLOP/s (model FLOPs, 6N + attention).
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "models/gpt.h"
#include "optim/adamw.h"
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
  const std::vector<Case> cases = {{"S", 4, 4, 256, 512, 8, 128}, {"M", 6, 6, 384, 4096, 8, 256}};
  const std::string only = argc > 1 ? argv[1] : "";
  const int threads = argc > 2 ? std::atoi(argv[2]) : 0;
  set_num_threads(threads);
  std::printf("threads: %d, OpenBLAS kernel: %s\n\n", num_threads(), blas_core().c_str());
  std::printf("| config | params | tokens/step | ms/step | tokens/s | GFLOP/s |\n|---|---|---|---|---|---|\n");
  for (const Case& c : cases) {
    if (!only.empty() && only != c.name) continue;
    models::GPTConfig cfg;
    cfg.n_layer = c.n_layer, cfg.n_head = c.n_head, cfg.n_embd = c.n_embd, cfg.vocab_size = c.vocab,
    cfg.block_size = c.T;
    models::GPT gpt(cfg);
    nn::FlatParams params = nn::materialize(gpt.units(), Device::cpu(), DType::f32, 1);
    optim::AdamW opt(params, {});
    double total = 0;
    const int warmup = 2, steps = 10;
    for (int s = 0; s < warmup + steps; ++s) {
      Tensor x = random_ids(c.B, c.T, c.vocab, 2 * s), y = random_ids(c.B, c.T, c.vocab, 2 * s + 1);
      const auto t0 = std::chrono::steady_clock::now();
      params.zero_grad();
      backward(gpt.forward(x, y).loss);
      opt.step(1e-4, optim::clip_scale(optim::grad_norm(params), 1.0));
      const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (s >= warmup) total += sec;
    }
    const double ms = total / steps * 1e3, tok = static_cast<double>(c.B * c.T);
    std::printf("| %s (L%lld H%lld C%lld V%lld B%lld T%lld) | %.2fM | %.0f | %.1f | %.0f | %.1f |\n", c.name,
                (long long)c.n_layer, (long long)c.n_head, (long long)c.n_embd, (long long)c.vocab, (long long)c.B,
                (long long)c.T, params.param_count() / 1e6, tok, ms, tok / (ms / 1e3),
                gpt.flops_per_token(c.T) * tok / (ms / 1e3) / 1e9);
  }
  return 0;
}
