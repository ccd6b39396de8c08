// Training speed of a GPT: forward + backward + clipping + AdamW on random tokens, 10 timed
// steps after 2 warm-up steps. Configs: S and M (the CPU configs of docs/PERFORMANCE.md) and GPT2 (124M,
// B 16, T 1024, vocab padded to 50304; for a GPU); the llamas LS, LM, L1B and MS, a Qwen3-MoE
// shape for a CPU (docs/moe-performance.md).
//
//   build/bench_gpt_train                 # S and M on CPU, all cores
//   build/bench_gpt_train S 2             # one config, 2 threads
//   build/bench_gpt_train GPT2 0 cuda     # GPT-2 124M on the first GPU, f32
//   build/bench_gpt_train GPT2 0 cuda none --dtype bf16 --batch 8   # bf16 mixed precision, B 8
//   build/bench_gpt_train S,M 2 cpu none,full,selective   # activation checkpointing modes
//
// Positional arguments: configs, threads, device, checkpointing modes (--help lists them; a
// bad argument is one line on stderr and exit code 2). Options (anywhere):
//   --dtype f32|bf16   f32 (default), or bf16 mixed precision as train_gpt's train.dtype =
//                      bfloat16 does it: an f32 master copy with f32 AdamW moments, bf16 copies
//                      that the model computes with (nn::materialize's compute dtype), each
//                      step's bf16 gradients folded into the f32 master (nn::fold_grad), the
//                      bf16 copies refreshed after the optimizer (refresh_compute)
//   --tf32             f32 runs on a GPU: GEMMs on TF32 tensor cores (train.tf32; MFU then
//                      against the TF32 peak, 495 TFLOP/s)
//   --batch B          sequences per step (default: the config's)
//   --steps N --warmup N   timed and warm-up steps (default 10 and 2)
//   --lora R           LoRA fine-tuning instead of full: rank-R adapters (alpha 2R) on every
//                      linear of every block (lora.targets = all-linear), the base frozen (no
//                      gradients, no AdamW moments); the optimizer, clipping and the params
//                      column see only the adapters (bench/bench_lora.py compares it to PEFT)
//   --lora-targets T   the adapters' lora.targets instead (comma-separated: q_proj,v_proj)
//
// Prints a table: ms/step, tokens/s and achieved GFLOP/s (model FLOPs, 6N + attention; a
// recompute is not counted), and on a GPU the MFU against the H100/H200 SXM dense peak of
// the arithmetic used: 989 TFLOP/s for bf16, 495 for TF32, 67 for f32 (the vendor's datasheet
// figures, without sparsity; f32 GEMMs are strict f32 unless --tf32).
// The 4th argument lists activation checkpointing modes (nn::ACMode; "full/2" or
// "selective/2": only every 2nd block); their steps are interleaved, one of each in turn, so
// that a busy machine slows them alike. For each mode the table also gives the activation
// memory from the allocator: "saved" is what the forward leaves allocated for backward (in use
// after forward minus before), "peak" the allocator's peak during forward + backward minus
// what was in use before the step (parameters, gradients, AdamW moments), "total peak" the
// allocator's peak over the whole step (everything held, optimizer included), and whether the
// losses equal those of the first mode bit for bit. After the table, one line per run for
// scripts:
//   RESULT config=GPT2 dtype=bf16 B=8 T=1024 mode=none ... ms=... tokens_per_s=... mfu_pct=...
//          total_peak_mib=... final_loss=...
// and one PHASES line per run from one more step, synchronized between phases: the
// time the host took to queue forward, backward and the optimizer, and when the device had
// finished each (queue times near the finish times: the host sets the pace, not the GPU).
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "bench/bench_args.h"
#include "models/gpt.h"
#include "nn/flat.h"
#include "optim/adamw.h"
#include "tensor/cpu/onednn_gemm.h"
#include "tensor/cuda/runtime.h"
#include "tensor/kernels.h"
#include "tensor/storage.h"
#include "tensor/threads.h"

using namespace ndt;

namespace {

using bench::integer;

// A benchmark shape: GPT-2's architecture, or the llama family's when n_kv_head > 0
// (grouped-query attention, SwiGLU of `inter` hidden units, RMSNorm, RoPE; an untied lm_head
// unless `tied`); with experts > 0 a Qwen3-MoE: q/k norms and every layer's MLP a mixture of
// `experts` SwiGLU experts of moe_inter hidden units, each token through its top k (weights
// divided by their sum; no load-balancing loss, as transformers without output_router_logits).
struct Case {
  const char* name;
  int64_t n_layer, n_head, n_embd, vocab, B, T;
  int64_t n_kv_head = 0, inter = 0;
  bool tied = true;
  int64_t experts = 0, k = 0, moe_inter = 0;
};

models::GPTConfig config_of(const Case& c) {
  models::GPTConfig cfg;
  cfg.n_layer = c.n_layer, cfg.n_head = c.n_head, cfg.n_embd = c.n_embd, cfg.vocab_size = c.vocab,
  cfg.block_size = c.T;
  cfg.vocab_multiple = c.vocab > 4096 ? 128 : 1;
  if (c.n_kv_head > 0) {
    cfg.arch = "llama", cfg.n_kv_head = c.n_kv_head, cfg.intermediate_size = c.inter;
    cfg.tie_embeddings = c.tied, cfg.norm_eps = 1e-5, cfg.rope.theta = 500000;
  }
  if (c.experts > 0) {
    cfg.qk_norm = true, cfg.n_experts = c.experts, cfg.n_experts_per_tok = c.k;
    cfg.moe_intermediate_size = c.moe_inter, cfg.norm_topk_prob = true;
  }
  cfg.validate();
  return cfg;
}

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
  if (slash != std::string::npos) m.every = integer("checkpointing mode " + s, s.substr(slash + 1));
  if (name == "full")
    m.ac = nn::ACMode::full;
  else if (name == "selective")
    m.ac = nn::ACMode::selective;
  else
    NDT_CHECK(name == "none", "checkpointing mode must be none, full or selective[/k], got '", s, "'");
  NDT_CHECK(m.every >= 1, "checkpointing mode: every must be >= 1 in '", s, "'");
  return m;
}

// One model (with its parameters and optimizer) per checkpointing mode.
struct Run {
  Mode mode;
  std::unique_ptr<models::GPT> gpt;
  nn::FlatParams base;    // --lora: the frozen base (empty otherwise)
  nn::FlatParams params;  // what the optimizer steps: every weight, or --lora's adapters
  std::unique_ptr<optim::AdamW> opt;
  double total_s = 0;
  int64_t saved = 0, peak = 0;
  std::vector<double> losses;
  int64_t total_peak = 0;
};

// --name value options, taken out of argv; what is left are the positional arguments
struct Options {
  bool help = false;
  std::string dtype = "f32";
  bool tf32 = false;
  int64_t batch = 0, steps = 10, warmup = 2;
  int64_t lora = 0;  // --lora R: rank of the all-linear adapters (0: full fine-tuning)
  std::vector<std::string> lora_targets{"all-linear"};  // --lora-targets
  std::vector<std::string> positional;
};

Options parse_options(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      NDT_CHECK(i + 1 < argc, a, " needs a value (see --help)");
      return argv[++i];
    };
    if (a == "--help" || a == "-h")
      o.help = true;
    else if (a == "--dtype")
      o.dtype = value();
    else if (a == "--tf32")
      o.tf32 = true;
    else if (a == "--batch")
      o.batch = integer(a, value());
    else if (a == "--steps")
      o.steps = integer(a, value());
    else if (a == "--warmup")
      o.warmup = integer(a, value());
    else if (a == "--lora")
      o.lora = integer(a, value());
    else if (a == "--lora-targets")
      o.lora_targets = split(value());
    else if (a.rfind("-", 0) == 0 && a.size() > 1)
      NDT_FAIL("unknown option ", a, " (see --help)");
    else
      o.positional.push_back(a);
  }
  NDT_CHECK(o.dtype == "f32" || o.dtype == "bf16", "--dtype must be f32 or bf16, got ", o.dtype);
  NDT_CHECK(o.lora >= 0, "--lora must be >= 0 (0: full fine-tuning), got ", o.lora);
  NDT_CHECK(o.batch >= 0 && o.steps >= 1 && o.warmup >= 0,
            "--batch must be >= 0, --steps >= 1 and --warmup >= 0, got ", o.batch, ", ", o.steps, ", ",
            o.warmup);
  NDT_CHECK(o.positional.size() <= 4,
            "at most 4 arguments (configs, threads, device, checkpointing modes), got ", o.positional.size(),
            " (see --help)");
  return o;
}

constexpr const char* kUsage =
    "usage: bench_gpt_train [CONFIGS [THREADS [DEVICE [MODES]]]] [--dtype f32|bf16] [--tf32] [--batch B]\n"
    "                       [--steps N] [--warmup N] [--lora R] [--lora-targets T]\n"
    "  CONFIGS  comma-separated S, M, GPT2, LS, LM, L1B, MS (default S,M)  THREADS  0: every core (default)\n"
    "  DEVICE   cpu (default), cuda or cuda:N               MODES    none,full,selective[/k] (default none)\n"
    "  --dtype  f32 (default) or bf16 mixed precision       --tf32   f32 GEMMs on TF32 tensor cores (GPU)\n"
    "  --batch  sequences per step (default: the config's)  --steps, --warmup  timed, warm-up steps (10, 2)\n"
    "  --lora   R: rank-R adapters on every linear, the base frozen (default 0: full fine-tuning)\n"
    "  --lora-targets  the adapters' linears, comma-separated (default all-linear)\n"
    "prints ms/step, tokens/s, GFLOP/s (MFU on a GPU) per config and mode, then RESULT and PHASES lines\n";

// The benchmark itself, on arguments parse_options has checked.
int run(const std::vector<Case>& cases, const Options& opt, const std::vector<std::string>& only, int threads,
        const Device& device, const std::vector<Mode>& modes) {
  if (device.is_cuda() && !cuda::available()) {
    std::printf("no CUDA device visible; skipping\n");
    return 0;
  }
  const bool bf16 = opt.dtype == "bf16", tf32 = !bf16 && opt.tf32 && device.is_cuda();
  if (tf32) cuda::set_allow_tf32(device.index, true);
  // H100/H200 SXM dense peaks (no sparsity): bf16 989.4, TF32 494.7, plain f32 66.9 TFLOP/s
  const double peak_tflops = bf16 ? 989.0 : tf32 ? 495.0 : 67.0;
  const char* arith = bf16 ? "bf16" : tf32 ? "tf32" : "f32";
  set_num_threads(threads);
  std::printf("threads: %d, OpenBLAS kernel: %s, f32 GEMMs: %s, dtype: %s\n\n", num_threads(),
              blas_core().c_str(), cpu::f32_gemm_library().c_str(),
              bf16 ? "bf16 mixed precision (f32 master and AdamW)" : "f32");
  std::printf(
      "| config | params | tokens/step | checkpointing | ms/step | tokens/s | GFLOP/s | saved MB | peak MB | "
      "total peak MB | same loss | device |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  std::vector<std::string> results;
  for (const Case& c : cases) {
    bool wanted = only.empty() ? std::string(c.name) == "S" || std::string(c.name) == "M" : false;
    for (const std::string& o : only) wanted = wanted || o == c.name;
    if (!wanted) continue;
    const int64_t B = opt.batch > 0 ? opt.batch : c.B, T = c.T;
    const models::GPTConfig cfg = config_of(c);
    std::vector<Run> runs(modes.size());
    for (size_t m = 0; m < modes.size(); ++m) {
      runs[m].mode = modes[m];
      runs[m].gpt = std::make_unique<models::GPT>(cfg);
      if (modes[m].ac != nn::ACMode::none)
        runs[m].gpt->add_block_wrapper(nn::activation_checkpointing(modes[m].ac, modes[m].every));
      const std::optional<DType> compute = bf16 ? std::optional<DType>(DType::bf16) : std::nullopt;
      if (opt.lora > 0) {  // the base frozen, the adapters trained (train_gpt's [lora])
        runs[m].gpt->add_lora({.rank = opt.lora, .alpha = 2.0 * opt.lora, .targets = opt.lora_targets});
        runs[m].base = nn::materialize(runs[m].gpt->units(), device, DType::f32, 1, {}, compute, true);
        runs[m].params = nn::materialize(runs[m].gpt->adapter_units(), device, DType::f32, 1, {}, compute);
      } else {
        runs[m].params = nn::materialize(runs[m].gpt->units(), device, DType::f32, 1, {}, compute);
      }
      runs[m].opt = std::make_unique<optim::AdamW>(runs[m].params, optim::AdamWConfig{});
    }
    const int64_t warmup = opt.warmup, steps = opt.steps;
    for (int64_t s = 0; s < warmup + steps; ++s) {
      Tensor x = random_ids(B, T, c.vocab, 2 * s).to(device),
             y = random_ids(B, T, c.vocab, 2 * s + 1).to(device);
      for (Run& r : runs) {  // one step of each mode in turn
        if (device.is_cuda()) cuda::synchronize(device.index);
        const auto t0 = std::chrono::steady_clock::now();
        reset_peak_memory(device);
        r.params.zero_grad();
        const int64_t before = memory_stats(device).in_use;
        Tensor loss = r.gpt->forward(x, y).loss;
        const int64_t saved = memory_stats(device).in_use - before;
        backward(loss);
        const int64_t peak = memory_stats(device).peak - before;
        // mixed precision: the bf16 gradients into the f32 master's (no-op in f32), as
        // dist::NoParallelism::end_micro does for train_gpt
        for (const nn::FlatUnit& u : r.params.units) nn::fold_grad(u);
        r.opt->step(1e-4, optim::clip_scale(optim::grad_norm(r.params), 1.0));
        r.params.refresh_compute();  // mixed precision: the bf16 copies of the new parameters
        if (device.is_cuda()) cuda::synchronize(device.index);
        r.total_peak = std::max(r.total_peak, memory_stats(device).peak);
        const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        r.losses.push_back(loss.item());
        if (s >= warmup) r.total_s += sec;
        r.saved = saved, r.peak = peak;
      }
    }
    // One more step of each run timed phase by phase: how long the host takes to queue each
    // phase (autograd, launches) against when the device has finished it. On a GPU, queue
    // times close to the finish times mean the host, not the GPU, sets the pace (on the CPU
    // the two are the same).
    auto sync = [&] {
      if (device.is_cuda()) cuda::synchronize(device.index);
    };
    for (Run& r : runs) {
      Tensor x = random_ids(B, T, c.vocab, 7777).to(device), y = random_ids(B, T, c.vocab, 7778).to(device);
      sync();
      using Clock = std::chrono::steady_clock;
      auto ms_since = [](Clock::time_point t) {
        return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
      };
      double queued[3], done[3];
      auto t = Clock::now();
      r.params.zero_grad();
      Tensor loss = r.gpt->forward(x, y).loss;
      queued[0] = ms_since(t);
      sync();
      done[0] = ms_since(t);
      t = Clock::now();
      backward(loss);
      for (const nn::FlatUnit& u : r.params.units) nn::fold_grad(u);
      queued[1] = ms_since(t);
      sync();
      done[1] = ms_since(t);
      t = Clock::now();
      r.opt->step(1e-4, optim::clip_scale(optim::grad_norm(r.params), 1.0));  // reads the norm: waits
      r.params.refresh_compute();
      queued[2] = ms_since(t);
      sync();
      done[2] = ms_since(t);
      char line[400];
      std::snprintf(line, sizeof line,
                    "PHASES config=%s dtype=%s B=%lld mode=%s forward_queued_ms=%.2f forward_done_ms=%.2f "
                    "backward_queued_ms=%.2f backward_done_ms=%.2f optimizer_queued_ms=%.2f "
                    "optimizer_done_ms=%.2f",
                    c.name, arith, (long long)B, r.mode.label.c_str(), queued[0], done[0], queued[1], done[1],
                    queued[2], done[2]);
      results.push_back(line);
    }
    for (const Run& r : runs) {
      const double ms = r.total_s / static_cast<double>(steps) * 1e3, tok = static_cast<double>(B * T);
      const double gflops = r.gpt->flops_per_token(T) * tok / (ms / 1e3) / 1e9;
      const double mfu = gflops / (peak_tflops * 1e3) * 100;
      const bool same =
          std::memcmp(r.losses.data(), runs[0].losses.data(), r.losses.size() * sizeof(double)) == 0;
      char mfu_text[64] = "";
      if (device.is_cuda())
        std::snprintf(mfu_text, sizeof mfu_text, " MFU %.1f%% of %.0f (%s)", mfu, peak_tflops, arith);
      std::printf(
          "| %s (L%lld H%lld C%lld V%lld B%lld T%lld) %s | %.2fM | %.0f | %s | %.1f | %.0f | %.1f | %.1f | "
          "%.1f "
          "| %.1f | %s | %s%s |\n",
          c.name, (long long)c.n_layer, (long long)c.n_head, (long long)c.n_embd, (long long)c.vocab,
          (long long)B, (long long)T, opt.dtype.c_str(), r.params.param_count() / 1e6, tok,
          r.mode.label.c_str(), ms, tok / (ms / 1e3), gflops, r.saved / 1048576.0, r.peak / 1048576.0,
          r.total_peak / 1048576.0, same ? "yes" : "NO", device.str().c_str(), mfu_text);
      char line[512];
      std::snprintf(
          line, sizeof line,
          "RESULT config=%s dtype=%s B=%lld T=%lld mode=%s lora=%lld device=%s ms=%.2f tokens_per_s=%.0f "
          "gflops=%.1f mfu_pct=%.2f peak_tflops=%.0f total_peak_mib=%.1f final_loss=%.4f",
          c.name, arith, (long long)B, (long long)T, r.mode.label.c_str(), (long long)opt.lora,
          device.str().c_str(), ms, tok / (ms / 1e3), gflops, device.is_cuda() ? mfu : 0.0, peak_tflops,
          r.total_peak / 1048576.0, r.losses.empty() ? 0.0 : r.losses.back());
      results.push_back(line);
    }
  }
  std::printf("\n");
  for (const std::string& l : results) std::printf("%s\n", l.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  use_cpu_defaults(argv);
  // GPT-2: S and M for a CPU, GPT2 the 124M model. Llama: LS and LM are S and M's sizes with
  // 2 kv heads and SwiGLU (hidden ~8/3 C), untied like Llama 3.1; L1B has Llama-3.2-1B's
  // layer and vocabulary shapes (32 heads, 8 kv heads, C 2048, hidden 8192, 128256 tokens,
  // tied) but 2 of its 16 layers, so that a CPU's memory holds it beside PyTorch's twin. MS: a
  // Qwen3-MoE for a CPU: 16 experts of 128 hidden units, top 4, in every layer.
  const std::vector<Case> cases = {{"S", 4, 4, 256, 512, 8, 128},
                                   {"M", 6, 6, 384, 4096, 8, 256},
                                   {"GPT2", 12, 12, 768, 50257, 16, 1024},
                                   {"LS", 4, 4, 256, 512, 8, 128, 2, 688, false},
                                   {"LM", 6, 6, 384, 4096, 8, 256, 2, 1024, false},
                                   {"L1B", 2, 32, 2048, 128256, 1, 512, 8, 8192, true},
                                   {"MS", 4, 8, 256, 2048, 4, 256, 4, 512, false, 16, 4, 128}};
  Options opt;
  std::vector<std::string> only;
  int threads = 0;
  Device device = Device::cpu();
  std::vector<Mode> modes;
  try {  // a bad argument: one line and exit code 2
    opt = parse_options(argc, argv);
    if (opt.help) {
      std::printf("%s", kUsage);
      return 0;
    }
    const std::vector<std::string>& pos = opt.positional;
    only = split(pos.size() > 0 ? pos[0] : "");
    for (const std::string& o : only)
      NDT_CHECK(std::any_of(cases.begin(), cases.end(), [&](const Case& c) { return o == c.name; }),
                "unknown config '", o, "': S, M, GPT2, LS, LM, L1B or MS (see --help)");
    threads = static_cast<int>(pos.size() > 1 ? integer("THREADS", pos[1]) : 0);
    NDT_CHECK(threads >= 0, "THREADS must be >= 0 (0: every core), got ", threads);
    device = Device::parse(pos.size() > 2 ? pos[2] : "cpu");
    for (const std::string& m : split(pos.size() > 3 ? pos[3] : "none")) modes.push_back(parse_mode(m));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_gpt_train: error: %s\n", e.what());
    return 2;
  }
  try {
    return run(cases, opt, only, threads, device, modes);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_gpt_train: error: %s\n", e.what());
    return 1;
  }
}
