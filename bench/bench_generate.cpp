// Generation speed: tokens/s with the key/value cache (train::generate) against the same
// sampling without it (every new token runs the whole sequence through the model again, as
// generation did before the cache), on random weights.
//
//   build/bench_generate                          # S, M, GPT2, LS, LM on the CPU, all cores
//   build/bench_generate S,LS 2 --prompt 64 --new 128
//   build/bench_generate GPT2 0 cuda              # on the first GPU
//
// Positional arguments: configs (bench_gpt_train's shapes: S, M, GPT2 and the llama family's
// LS, LM, L1B), threads (0: every core), device. Options: --prompt P (prompt tokens, default
// 64), --new N (new tokens, default 128; P + N <= the config's sequence length). A bad argument
// is one line on stderr and exit code 2.
//
// Prints a table of prefill ms, then tokens/s of the new tokens for both and the speed-up,
// and whether both drew the same tokens (greedy decoding, so they must, up to ties the
// rounding of a different summation order can break), then one RESULT line per config.
#include <charconv>
#include <chrono>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "autograd/node.h"
#include "bench/bench_args.h"
#include "models/generate.h"
#include "models/gpt.h"
#include "models/kv_cache.h"
#include "nn/flat.h"
#include "tensor/cuda/runtime.h"
#include "tensor/threads.h"

using namespace ndt;

namespace {

using bench::integer;

struct Case {
  const char* name;
  int64_t n_layer, n_head, n_embd, vocab, T, n_kv_head = 0, inter = 0;
  bool tied = true;
};

const std::vector<Case> kCases = {{"S", 4, 4, 256, 512, 128},
                                  {"M", 6, 6, 384, 4096, 256},
                                  {"GPT2", 12, 12, 768, 50257, 1024},
                                  {"LS", 4, 4, 256, 512, 128, 2, 688, false},
                                  {"LM", 6, 6, 384, 4096, 256, 2, 1024, false},
                                  {"L1B", 2, 32, 2048, 128256, 512, 8, 8192, true}};

models::GPTConfig config_of(const Case& c) {
  models::GPTConfig cfg;
  cfg.n_layer = c.n_layer, cfg.n_head = c.n_head, cfg.n_embd = c.n_embd, cfg.vocab_size = c.vocab;
  cfg.block_size = c.T, cfg.vocab_multiple = c.vocab > 4096 ? 128 : 1;
  if (c.n_kv_head > 0) {
    cfg.arch = "llama", cfg.n_kv_head = c.n_kv_head, cfg.intermediate_size = c.inter,
    cfg.tie_embeddings = c.tied;
    cfg.rope.theta = 500000;
  }
  cfg.validate();
  return cfg;
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// Greedy decoding without a cache: the whole sequence through the model for every token.
std::vector<int32_t> uncached(const models::GPT& gpt, std::vector<int32_t> ids, int64_t n, Device device) {
  autograd::NoGradGuard no_grad;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t T = static_cast<int64_t>(ids.size());
    std::vector<float> row =
        gpt.next_token_logits(Tensor::from_vector(ids, {1, T}, device)).to_vector<float>();
    row.resize(gpt.cfg.vocab_size);
    ids.push_back(models::sample_token(row, {.temperature = 0}, ids.size()));
  }
  return ids;
}

constexpr const char* kUsage =
    "usage: bench_generate [CONFIGS [THREADS [DEVICE]]] [--prompt P] [--new N]\n"
    "  CONFIGS  comma-separated S, M, GPT2, LS, LM, L1B (default S,M,GPT2,LS,LM)\n"
    "  THREADS  0: every core (default)     DEVICE  cpu (default), cuda or cuda:N\n"
    "  --prompt prompt tokens (default 64)  --new   new tokens (default 128)\n"
    "prints prefill ms and tokens/s with and without the key/value cache, then RESULT lines\n";

}  // namespace

int main(int argc, char** argv) {
  use_cpu_defaults(argv);
  std::vector<std::string> pos, only;
  int64_t prompt_len = 64, new_tokens = 128, threads = 0;
  Device device = Device::cpu();
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "--help" || a == "-h") {
        std::printf("%s", kUsage);
        return 0;
      }
      if (a == "--prompt" || a == "--new") {
        NDT_CHECK(i + 1 < argc, a, " needs a value (see --help)");
        (a == "--prompt" ? prompt_len : new_tokens) = integer(a, argv[++i]);
      } else {
        NDT_CHECK(a.empty() || a[0] != '-', "unknown option ", a, " (see --help)");
        pos.push_back(a);
      }
    }
    NDT_CHECK(pos.size() <= 3, "at most 3 arguments (configs, threads, device), got ", pos.size());
    std::stringstream ss(pos.size() > 0 ? pos[0] : "S,M,GPT2,LS,LM");
    for (std::string c; std::getline(ss, c, ',');) {
      bool known = false;
      for (const Case& k : kCases) known = known || c == k.name;
      NDT_CHECK(known, "unknown config '", c, "': S, M, GPT2, LS, LM or L1B (see --help)");
      only.push_back(c);
    }
    threads = pos.size() > 1 ? integer("THREADS", pos[1]) : 0;
    NDT_CHECK(threads >= 0, "THREADS must be >= 0, got ", threads);
    device = Device::parse(pos.size() > 2 ? pos[2] : "cpu");
    NDT_CHECK(prompt_len >= 1 && new_tokens >= 1, "--prompt and --new must be >= 1");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_generate: error: %s\n", e.what());
    return 2;
  }
  try {
    if (device.is_cuda() && !cuda::available()) {
      std::printf("no CUDA device visible; skipping\n");
      return 0;
    }
    set_num_threads(static_cast<int>(threads));
    std::printf("threads: %d, device %s, prompt %lld tokens, %lld new tokens (greedy), f32\n\n",
                num_threads(), device.str().c_str(), (long long)prompt_len, (long long)new_tokens);
    std::printf(
        "| config | params | prefill ms | cached tokens/s | uncached tokens/s | speed-up | same tokens |\n"
        "|---|---|---:|---:|---:|---:|---|\n");
    std::vector<std::string> results;
    for (const std::string& name : only) {
      const Case& c =
          *std::find_if(kCases.begin(), kCases.end(), [&](const Case& k) { return name == k.name; });
      NDT_CHECK(prompt_len + new_tokens <= c.T, "--prompt + --new = ", prompt_len + new_tokens, " exceeds ",
                c.name, "'s sequence length ", c.T);
      models::GPT gpt(config_of(c));
      nn::FlatParams params = nn::materialize(gpt.units(), device, DType::f32, 1);
      std::vector<int32_t> prompt(prompt_len);
      for (int64_t i = 0; i < prompt_len; ++i) prompt[i] = static_cast<int32_t>((i * 131 + 7) % c.vocab);
      uncached(gpt, prompt, 2, device);  // warm-up: caches, pages, kernels
      // prefill alone, then the whole generation with the cache
      auto t = std::chrono::steady_clock::now();
      {
        models::KVCache cache(gpt, c.T);
        cache.next_token_logits(Tensor::from_vector(prompt, {1, prompt_len}, device)).to_vector<float>();
      }
      const double prefill_s = seconds_since(t);
      t = std::chrono::steady_clock::now();
      const std::vector<int32_t> a =
          models::generate(gpt, prompt, {.max_new_tokens = new_tokens, .temperature = 0}, device);
      const double cached_s = seconds_since(t) - prefill_s;
      t = std::chrono::steady_clock::now();
      const std::vector<int32_t> b = uncached(gpt, prompt, new_tokens, device);
      const double plain_s = seconds_since(t);
      const double ca = new_tokens / cached_s, pl = new_tokens / plain_s;
      std::printf("| %s | %.1fM | %.1f | %.1f | %.1f | %.1fx | %s |\n", c.name, params.param_count() / 1e6,
                  prefill_s * 1e3, ca, pl, ca / pl, a == b ? "yes" : "no");
      char line[256];
      std::snprintf(line, sizeof line,
                    "RESULT config=%s prompt=%lld new=%lld prefill_ms=%.2f cached_tokens_per_s=%.2f "
                    "uncached_tokens_per_s=%.2f same=%d",
                    c.name, (long long)prompt_len, (long long)new_tokens, prefill_s * 1e3, ca, pl,
                    a == b ? 1 : 0);
      results.push_back(line);
    }
    std::printf("\n");
    for (const std::string& l : results) std::printf("%s\n", l.c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_generate: error: %s\n", e.what());
    return 1;
  }
}
