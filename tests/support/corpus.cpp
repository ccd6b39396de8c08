#include "support/corpus.h"

#include <cmath>
#include <string>
#include <vector>

#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "tensor/error.h"
#include "train/data/data.h"
#include "train/data/vocab.h"
#include "train/trainer.h"

namespace ndt::testing {

int64_t write_word_corpus(const std::filesystem::path& dir, int words, uint64_t seed, double val_fraction) {
  std::filesystem::create_directories(dir);
  const char* list[] = {"the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "to", "see", "it"};
  std::string text;
  uint64_t x = seed;
  for (int i = 0; i < words; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    text += list[(x >> 33) % 12];
    text += (i % 9 == 8) ? ".\n" : " ";
  }
  data::Vocab v = data::Vocab::build_char(text);
  std::vector<uint16_t> t = v.encode(text);
  // the first (1 - val_fraction) of the tokens train (in thousandths, so 0.1 is exactly 9/10)
  const size_t split = t.size() * static_cast<size_t>(std::lround((1 - val_fraction) * 1000)) / 1000;
  data::write_shard((dir / "train_000000.bin").string(), {t.begin(), t.begin() + split});
  if (split < t.size()) data::write_shard((dir / "val_000000.bin").string(), {t.begin() + split, t.end()});
  v.save((dir / "vocab.json").string());
  return v.size();
}

void write_small_run(const std::filesystem::path& d) {
  const int64_t V = write_word_corpus(d / "data", 6000, 42, 0.1);
  std::ofstream(d / "gpt.ini") << "[model]\nn_layer = 2\nn_head = 2\nn_embd = 32\nvocab_size = " << V
                               << "\nblock_size = 32\n[data]\ntrain = "
                               << (d / "data" / "train_*.bin").string()
                               << "\nval = " << (d / "data" / "val_*.bin").string()
                               << "\n[train]\nmicro_batch_size = 4\nseq_len = 32\nsteps = 8\neval_every = 4\n"
                                  "eval_steps = 2\nthreads = 1\n[optim]\nlr = 0.01\nwarmup_steps = 2\n"
                                  "[sample]\nevery = -1\n[log]\nevery = 1\n"
                                  "[checkpoint]\nformat = full  # these tests read model.safetensors\n";
}

ShellResult run_shell(const std::string& cmd) {
  const auto t0 = std::chrono::steady_clock::now();
  std::FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  NDT_CHECK(p != nullptr, "popen failed: ", cmd);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int st = ::pclose(p);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return {WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st), out, s};
}

std::string mpirun_prefix(const std::string& mpirun, int np) {
  return mpirun +
         " --allow-run-as-root --oversubscribe --bind-to none --mca btl_vader_single_copy_mechanism none "
         "-np " +
         std::to_string(np) + " ";
}

RunResult run_train_gpt(std::vector<std::string> args) {
  args.insert(args.begin(), "train_gpt");
  std::vector<const char*> argv;
  for (auto& a : args) argv.push_back(a.c_str());
  std::ostringstream out, err;
  const int rc = train::train_main(static_cast<int>(argv.size()), argv.data(), out, err);
  return {rc, out.str(), err.str()};
}

}  // namespace ndt::testing
