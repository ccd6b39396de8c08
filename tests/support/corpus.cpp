#include "support/corpus.h"

#include <cmath>
#include <string>
#include <vector>

#include <sstream>

#include "train/data.h"
#include "train/trainer.h"
#include "train/vocab.h"

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

RunResult run_train_gpt(std::vector<std::string> args) {
  args.insert(args.begin(), "train_gpt");
  std::vector<const char*> argv;
  for (auto& a : args) argv.push_back(a.c_str());
  std::ostringstream out, err;
  const int rc = train::train_main(static_cast<int>(argv.size()), argv.data(), out, err);
  return {rc, out.str(), err.str()};
}

}  // namespace ndt::testing
