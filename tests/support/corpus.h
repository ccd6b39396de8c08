// What the training tests share: a small char-level corpus (sentences from a fixed word
// list, picked by an LCG, so the text is the same on every machine), and train_gpt run
// in-process (tests/support/launch.h runs it as a program).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace ndt::testing {

// Writes dir/train_000000.bin (and, with val_fraction > 0, dir/val_000000.bin holding the
// last val_fraction of the tokens) and dir/vocab.json; returns the vocabulary size.
int64_t write_word_corpus(const std::filesystem::path& dir, int words, uint64_t seed, double val_fraction);

// The tests' small run: the corpus in dir/data (6000 words, a tenth for validation) and
// dir/gpt.ini, a 2-layer GPT for 8 steps that writes full-format checkpoints (the tests read
// model.safetensors).
void write_small_run(const std::filesystem::path& dir);

struct RunResult {
  int rc;
  std::string out, err;
};
// train_gpt with these arguments (argv[0] added), in this process: its exit code and output.
RunResult run_train_gpt(std::vector<std::string> args);

}  // namespace ndt::testing
