// Training speed of a GPT: forward + backward + clipping + AdamW on random tokens, 10 timed
// steps after 2 warm-up steps. Configs: S and M (the CPU configs of docs/PERFORMANCE.md) and GPT2 (124M,
// B 16, T 1024, vocab padded to 50304; for a GPU).
//
//   build/bench_gpt_train                 # S and M on CPU, all cores
//   build/bench_gpt_train S 2             # one config, 2 threads
//   build/bench_gpt_train GPT2 0 cuda     # GPT-2 124M on the first GPU
//   build/bench_gpt_train S,M 2 cpu none,full,selective   # activation checkpointing modes
//
// Prints a table: ms/step, tokens/s and achieved GFLOP/s (model FLOPs, 6N + attention; a
// recompute is not counted), and on a GPU the MFU against 67 TFLOP/s (H100/H200 dense f32,
// no TF32). The 4th argument lists activation checkpointing modes (nn::ACMode; "full/2" or
// "selective/2": only every 2nd block); their steps are interleaved, one of each in turn,
// so that a busy machine slows them alike. For each mode the table also gives the activation
// memory from the allocator: "saved" is what the forward leaves allocated for backward (in
// use after forward minus before), "peak" the allocator's peak during forward + backward
// minus what was in use before the step (parameters, gradients, AdamW moments), and whether
// the losses equal those of the first mode bit for bit.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "models/gpt.h"
#include "optim/adamw.h"
#include "tensor/cuda/runtime.h"
#include "tensor/kernels.h"
#include "tensor/storage.h"
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

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

// "none", "full", "selective", optionally "/k" for every k-th block
struct Mode {
  std::string label;
  nn::ACMode ac = nn::ACMode::none;
  int64_t every = 1;
};

Mode parse_mode(const std::string& s) {
  Mode m{s};
  const size_t slash = s.find('/');
  const std::string name = s.substr(0, slash);
  if (slash != std::string::npos) m.every = std::stoll(s.substr(slash + 1));
  if (name == "full")
    m.ac = nn::ACMode::full;
  else if (name == "selective")
    m.ac = nn::ACMode::selective;
  else
    NDT_CHECK(name == "none", "bench_gpt_train: mode must be none, full or selective[/k], got '", s, "'");
  NDT_CHECK(m.every >= 1, "bench_gpt_train: every must be >= 1 in '", s, "'");
  return m;
}

// One model (with its parameters and optimizer) per checkpointing mode.
struct Run {
  Mode mode;
  std::unique_ptr<models::GPT> gpt;
  nn::FlatParams params;
  std::unique_ptr<optim::AdamW> opt;
  double total_s = 0;
  int64_t saved = 0, peak = 0;
  std::vector<double> losses;
};

}  // namespace

int main(int argc, char** argv) {
  use_optimized_blas(argv);
  const std::vector<Case> cases = {
      {"S", 4, 4, 256, 512, 8, 128}, {"M", 6, 6, 384, 4096, 8, 256}, {"GPT2", 12, 12, 768, 50257, 16, 1024}};
  const std::vector<std::string> only = split(argc > 1 ? argv[1] : "");
  const int threads = argc > 2 ? std::atoi(argv[2]) : 0;
  const Device device = Device::parse(argc > 3 ? argv[3] : "cpu");
  std::vector<Mode> modes;
  for (const std::string& m : split(argc > 4 ? argv[4] : "none")) modes.push_back(parse_mode(m));
  if (device.is_cuda() && !cuda::available()) {
    std::printf("no CUDA device visible; skipping\n");
    return 0;
  }
  set_num_threads(threads);
  std::printf("threads: %d, OpenBLAS kernel: %s\n\n", num_threads(), blas_core().c_str());
  std::printf(
      "| config | params | tokens/step | checkpointing | ms/step | tokens/s | GFLOP/s | saved MB | peak MB | "
      "same loss | device |\n|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const Case& c : cases) {
    bool wanted = only.empty() ? std::string(c.name) != "GPT2" : false;
    for (const std::string& o : only) wanted = wanted || o == c.name;
    if (!wanted) continue;
    models::GPTConfig cfg;
    cfg.n_layer = c.n_layer, cfg.n_head = c.n_head, cfg.n_embd = c.n_embd, cfg.vocab_size = c.vocab,
    cfg.block_size = c.T;
    cfg.vocab_multiple = c.vocab > 4096 ? 128 : 1;
    std::vector<Run> runs(modes.size());
    for (size_t m = 0; m < modes.size(); ++m) {
      runs[m].mode = modes[m];
      runs[m].gpt = std::make_unique<models::GPT>(cfg);
      if (modes[m].ac != nn::ACMode::none)
        runs[m].gpt->add_unit_wrapper(nn::activation_checkpointing(modes[m].ac, modes[m].every));
      runs[m].params = nn::materialize(runs[m].gpt->units(), device, DType::f32, 1);
      runs[m].opt = std::make_unique<optim::AdamW>(runs[m].params, optim::AdamWConfig{});
    }
    const int warmup = 2, steps = 10;
    for (int s = 0; s < warmup + steps; ++s) {
      Tensor x = random_ids(c.B, c.T, c.vocab, 2 * s).to(device),
             y = random_ids(c.B, c.T, c.vocab, 2 * s + 1).to(device);
      for (Run& r : runs) {  // one step of each mode in turn
        if (device.is_cuda()) cuda::synchronize(device.index);
        const auto t0 = std::chrono::steady_clock::now();
        r.params.zero_grad();
        const int64_t before = memory_stats(device).in_use;
        reset_peak_memory(device);
        Tensor loss = r.gpt->forward(x, y).loss;
        const int64_t saved = memory_stats(device).in_use - before;
        backward(loss);
        const int64_t peak = memory_stats(device).peak - before;
        r.opt->step(1e-4, optim::clip_scale(optim::grad_norm(r.params), 1.0));
        if (device.is_cuda()) cuda::synchronize(device.index);
        const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        r.losses.push_back(loss.item());
        if (s >= warmup) r.total_s += sec;
        r.saved = saved, r.peak = peak;
      }
    }
    for (const Run& r : runs) {
      const double ms = r.total_s / steps * 1e3, tok = static_cast<double>(c.B * c.T);
      const double gflops = r.gpt->flops_per_token(c.T) * tok / (ms / 1e3) / 1e9;
      const bool same =
          std::memcmp(r.losses.data(), runs[0].losses.data(), r.losses.size() * sizeof(double)) == 0;
      std::printf(
          "| %s (L%lld H%lld C%lld V%lld B%lld T%lld) | %.2fM | %.0f | %s | %.1f | %.0f | %.1f | %.1f | %.1f "
          "| %s "
          "| %s%s |\n",
          c.name, (long long)c.n_layer, (long long)c.n_head, (long long)c.n_embd, (long long)c.vocab,
          (long long)c.B, (long long)c.T, r.params.param_count() / 1e6, tok, r.mode.label.c_str(), ms,
          tok / (ms / 1e3), gflops, r.saved / 1048576.0, r.peak / 1048576.0, same ? "yes" : "NO",
          device.str().c_str(),
          device.is_cuda() ? (" MFU " + std::to_string(gflops / 67e3 * 100).substr(0, 4) + "%").c_str() : "");
    }
  }
  return 0;
}
