// ndtrain tokenizer: what a loaded tokenizer.json holds (load.cpp builds it, tokenizer.cpp
// encodes and decodes with it). Not part of the API.
#pragma once

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "tokenizer/bpe.h"
#include "tokenizer/regex.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace ndt::tok {

// The added tokens' contents, for leftmost-longest matching (as tokenizers' Aho-Corasick
// with MatchKind::LeftmostLongest): at the first position where any content starts, the
// longest one.
class Trie {
 public:
  void add(std::string_view s, int32_t value);
  bool empty() const { return nodes_.size() == 1; }
  // The first match at or after `from`: its start, length and value; false when none.
  bool find(std::string_view text, size_t from, size_t& start, size_t& len, int32_t& value) const;

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int32_t>> next;
    int32_t value = -1;
  };
  std::vector<Node> nodes_ = std::vector<Node>(1);
  bool first_[256] = {};
};

enum class Behavior { removed, isolated, merged_with_previous, merged_with_next, contiguous };

struct SplitStep {
  std::unique_ptr<Regex> re;
  Behavior behavior = Behavior::isolated;
  bool invert = false;
};

// What one thread needs to encode: matchers for the regexes, the BPE cache, buffers.
struct Scratch {
  std::vector<std::unique_ptr<Regex::Matcher>> matchers;  // one per split step
  Bpe::Cache cache;
  std::vector<std::vector<std::pair<size_t, size_t>>> pieces;  // per split step
  std::string prefixed;                                        // a piece with ByteLevel's prefix space
  std::unique_ptr<Regex::Matcher> word_char;                   // single_word's test, made when needed
};

struct Tokenizer::Impl {
  std::string source;
  Bpe bpe;
  std::vector<std::string> bytes;                // id -> what decoding it gives
  std::vector<uint8_t> known;                    // id -> 1 when it is a token
  std::vector<uint8_t> special;                  // id -> 1 for a special added token
  std::vector<AddedToken> added;                 // as tokenizers reads them (ids it gives them)
  Trie raw_tokens, normalized_tokens;            // values index `added`
  std::unordered_map<std::string, int32_t> ids;  // tokens as the file spells them, added ones too
  std::vector<NormalForm> normalizers;
  std::vector<SplitStep> splits;      // the pre-tokenizer's splits in order (ByteLevel's regex last)
  size_t prefix_space_at = SIZE_MAX;  // ByteLevel's add_prefix_space: before this split step
  bool template_set = false;
  std::vector<int32_t> before, after;  // the single template's tokens around the text
  std::optional<int32_t> bos, eos;
  int64_t vocab_size = 0;

  std::unique_ptr<Regex> word_char;  // single_word's \w (Rust's regex crate)

  std::unique_ptr<Scratch> take_scratch() const;
  void give_back(std::unique_ptr<Scratch> s) const;
  mutable std::mutex pool_mutex;
  mutable std::vector<std::unique_ptr<Scratch>> pool;
};

}  // namespace ndt::tok
