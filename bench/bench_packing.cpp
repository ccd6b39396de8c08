// Packed rows against one document per row: the same documents (chat-like lengths, most of
// them far shorter than a row; the first 40% of each, its prompt, not trained) trained on by
// a GPT (forward + backward + clipping + AdamW on the CPU), once as the loader packs them
// (train/data/packing.h: first fit decreasing, padding last) and once padded one document
// per row, as without packing. The steps of the two alternate, so that a busy machine slows
// both alike. Prints a table: rows per epoch, efficiency (real tokens / row positions),
// ms/step, real and trained tokens per second, and the time an epoch takes.
//
//   build/bench_packing                               # T 512, B 8, 400 documents, 6 steps
//   build/bench_packing --threads 2 --steps 10 --seq_len 256
//
// The documents are drawn from a seed (no files needed) and written as one preparation with
// loss masks and document starts in a temporary folder, removed at the end.
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "bench/bench_args.h"
#include "models/gpt.h"
#include "nn/flat.h"
#include "optim/adamw.h"
#include "tensor/threads.h"
#include "train/data/data.h"
#include "train/data/preparation.h"

using namespace ndt;
namespace fs = std::filesystem;

namespace {

using bench::integer;

constexpr const char* kUsage =
    "usage: bench_packing [--seq_len T] [--batch B] [--docs N] [--steps S] [--threads K]\n"
    "  --seq_len  row length (default 512)       --batch    rows per step (default 8)\n"
    "  --docs     documents (default 400)        --steps    timed steps per mode (default 6)\n"
    "  --threads  0: every core (default 0)\n"
    "prints, for packed rows and one document per row: rows per epoch, efficiency, ms/step,\n"
    "real and trained tokens/s, and seconds per epoch\n";

uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

struct Docs {
  std::vector<uint32_t> tokens;  // ids 1 .. V-1 (0 is the loader's padding)
  std::string mask, first;       // one byte a token, as prepare_text writes them
  std::vector<int64_t> start, len;
};

// n documents of 16 .. T tokens, short ones most often (length 16 + (T - 16) u^2.5), as
// chat rows are; the first 40% of each not trained.
Docs draw_documents(int64_t n, int64_t T, int64_t V) {
  Docs d;
  uint64_t x = 12345;
  for (int64_t i = 0; i < n; ++i) {
    const double u = static_cast<double>(splitmix64(x) >> 11) / 9007199254740992.0;
    const int64_t len = 16 + static_cast<int64_t>(static_cast<double>(T - 16) * std::pow(u, 2.5));
    d.start.push_back(static_cast<int64_t>(d.tokens.size()));
    d.len.push_back(len);
    for (int64_t t = 0; t < len; ++t) {
      d.tokens.push_back(1 + static_cast<uint32_t>(splitmix64(x) % static_cast<uint64_t>(V - 1)));
      d.mask += t >= len * 2 / 5 ? '\1' : '\0';
      d.first += t == 0 ? '\1' : '\0';
    }
  }
  return d;
}

// One preparation in `dir`: train_000000.bin with its .mask and .docs.
void write_preparation(const fs::path& dir, const Docs& d) {
  data::write_shard((dir / "train_000000.bin").string(), d.tokens, data::ShardFormat::u16);
  std::ofstream(dir / "train_000000.mask", std::ios::binary) << d.mask;
  std::ofstream(dir / "train_000000.docs", std::ios::binary) << d.first;
  const int64_t n = static_cast<int64_t>(d.tokens.size());
  data::Preparation p{dir.string(), "0123456789abcdef", "", {{"train_000000.bin", n}}, {}};
  p.sidecars["train_000000.bin"] = {"train_000000.mask", "train_000000.docs", n};
  data::write_preparation(p);
}

// The documents one per row (in stream order), B rows a batch: the row's document, then
// padding (input 0, target -1, document id 1).
std::vector<data::Batch> one_per_row(const Docs& d, int64_t B, int64_t T) {
  std::vector<data::Batch> out;
  const int64_t n = static_cast<int64_t>(d.len.size());
  for (int64_t first = 0; first + B <= n; first += B) {
    std::vector<int32_t> x(B * T, 0), y(B * T, -1), doc(B * T, 1);
    for (int64_t b = 0; b < B; ++b) {
      const int64_t s = d.start[first + b], len = d.len[first + b];
      for (int64_t t = 0; t < len; ++t) {
        x[b * T + t] = static_cast<int32_t>(d.tokens[s + t]), doc[b * T + t] = 0;
        if (t + 1 < len && d.mask[s + t + 1]) y[b * T + t] = static_cast<int32_t>(d.tokens[s + t + 1]);
      }
    }
    out.push_back(
        {Tensor::from_vector(x, {B, T}), Tensor::from_vector(y, {B, T}), Tensor::from_vector(doc, {B, T})});
  }
  return out;
}

struct Mode {
  const char* name;
  std::vector<data::Batch> batches;  // one epoch
  std::unique_ptr<models::GPT> gpt;  // its own model and optimizer, from the same initial weights
  nn::FlatParams params;
  std::unique_ptr<optim::AdamW> opt;
  int64_t rows = 0;
  double seconds = 0;
  int64_t real = 0, trained = 0, steps = 0;  // over the timed steps
};

// Counts of a batch: real tokens (input != 0: the documents' ids start at 1) and trained targets.
void count(const data::Batch& b, int64_t& real, int64_t& trained) {
  for (int32_t v : b.inputs.to_vector<int32_t>()) real += v != 0;
  for (int32_t v : b.targets.to_vector<int32_t>()) trained += v >= 0;
}

void run(int64_t T, int64_t B, int64_t n_docs, int64_t steps) {
  const int64_t V = 4096;
  const Docs d = draw_documents(n_docs, T, V);
  char tmpl[] = "/tmp/bench_packing_XXXXXX";
  NDT_CHECK(::mkdtemp(tmpl) != nullptr, "cannot make a temporary folder under /tmp");
  const fs::path dir = tmpl;
  std::vector<Mode> modes(2);
  modes[0].name = "packed", modes[1].name = "one per row";
  try {  // the packed epoch, read by the loader; the folder goes whatever happens
    write_preparation(dir, d);
    data::DataLoader loader((dir / "train_*.bin").string(), B, T, 0, 1, true, 1, V);
    modes[0].rows = loader.packing().rows;
    for (int64_t k = 0; k < loader.windows_per_epoch(); ++k) modes[0].batches.push_back(loader.next());
  } catch (...) {
    fs::remove_all(dir);
    throw;
  }
  fs::remove_all(dir);
  modes[1].batches = one_per_row(d, B, T);
  modes[1].rows = n_docs;
  models::GPTConfig cfg;
  cfg.n_layer = 4, cfg.n_head = 4, cfg.n_embd = 256, cfg.vocab_size = V, cfg.block_size = T;
  cfg.validate();
  for (Mode& m : modes) {
    m.gpt = std::make_unique<models::GPT>(cfg);
    m.params = nn::materialize(m.gpt->units(), Device::cpu(), DType::f32, 1);
    m.opt = std::make_unique<optim::AdamW>(m.params, optim::AdamWConfig{});
  }
  for (int64_t s = 0; s < 1 + steps; ++s) {  // a warm-up step, then the timed ones, alternating
    for (Mode& m : modes) {
      const data::Batch& b = m.batches[static_cast<size_t>(s) % m.batches.size()];
      const auto t0 = std::chrono::steady_clock::now();
      m.params.zero_grad();
      backward(m.gpt->forward(b.inputs, b.targets, 0, b.docs).loss);
      m.opt->step(1e-4, optim::clip_scale(optim::grad_norm(m.params), 1.0));
      const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (s == 0) continue;
      m.seconds += sec, m.steps++;
      count(b, m.real, m.trained);
    }
  }
  std::printf("%-12s %10s %11s %9s %13s %16s %10s\n", "", "rows/epoch", "efficiency", "ms/step", "real tok/s",
              "trained tok/s", "s/epoch");
  for (const Mode& m : modes) {
    const double per_step = m.seconds / static_cast<double>(m.steps);
    const double eff = static_cast<double>(d.tokens.size()) / static_cast<double>(m.rows * T);
    std::printf("%-12s %10lld %10.1f%% %9.1f %13.0f %16.0f %10.2f\n", m.name, static_cast<long long>(m.rows),
                100.0 * eff, 1000.0 * per_step, static_cast<double>(m.real) / m.seconds,
                static_cast<double>(m.trained) / m.seconds, per_step * static_cast<double>(m.batches.size()));
  }
}

}  // namespace

int main(int argc, char** argv) {
  use_cpu_defaults(argv);
  int64_t T = 512, B = 8, n_docs = 400, steps = 6, threads = 0;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "--help" || a == "-h") {
        std::printf("%s", kUsage);
        return 0;
      }
      int64_t* v = a == "--seq_len"   ? &T
                   : a == "--batch"   ? &B
                   : a == "--docs"    ? &n_docs
                   : a == "--steps"   ? &steps
                   : a == "--threads" ? &threads
                                      : nullptr;
      NDT_CHECK(v != nullptr, "unknown argument ", a, " (see --help)");
      NDT_CHECK(i + 1 < argc, a, " needs a value (see --help)");
      *v = integer(a, argv[++i]);
    }
    NDT_CHECK(T >= 32 && B >= 1 && n_docs >= B && steps >= 1 && threads >= 0,
              "--seq_len must be >= 32, --batch and --steps >= 1, --docs >= --batch, --threads >= 0");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_packing: error: %s\n", e.what());
    return 2;
  }
  try {
    if (threads > 0) set_num_threads(static_cast<int>(threads));
    std::printf("bench_packing: %lld documents, rows of %lld, %lld rows a step, %d threads\n",
                static_cast<long long>(n_docs), static_cast<long long>(T), static_cast<long long>(B),
                num_threads());
    run(T, B, n_docs, steps);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_packing: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
