#include "support/corpus.h"

#include <cmath>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

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

RunResult run_train_gpt(std::vector<std::string> args) {
  args.insert(args.begin(), "train_gpt");
  std::vector<const char*> argv;
  for (auto& a : args) argv.push_back(a.c_str());
  std::ostringstream out, err;
  const int rc = train::train_main(static_cast<int>(argv.size()), argv.data(), out, err);
  return {rc, out.str(), err.str()};
}

}  // namespace ndt::testing
