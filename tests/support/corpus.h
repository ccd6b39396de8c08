// A small char-level corpus for the training tests: sentences from a fixed word list,
// picked by an LCG, so the text is the same on every machine.
#pragma once

#include <cstdint>
#include <filesystem>

namespace ndt::testing {

// Writes dir/train_000000.bin (and, with val_fraction > 0, dir/val_000000.bin holding the
// last val_fraction of the tokens) and dir/vocab.json; returns the vocabulary size.
int64_t write_word_corpus(const std::filesystem::path& dir, int words, uint64_t seed, double val_fraction);

}  // namespace ndt::testing
