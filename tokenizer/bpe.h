// ndtrain tokenizer: byte-level BPE, as Hugging Face's BPE model merges.
//
// A pre-token's bytes start as one symbol each (the token of that byte); then, while any
// adjacent pair has a merge, the pair of lowest rank (leftmost on a tie) becomes the token the
// merge makes. With ignore_merges a pre-token that is itself a token is that token at once.
// A byte without a token becomes unk_token (fused runs with fuse_unk), or is dropped when the
// file has no unk_token, as tokenizers does.
//
//   Bpe bpe(vocab, merges, {.ignore_merges = true});   // tokens as bytes ("Ġa" is " a")
//   Bpe::Cache cache;                                  // one per thread
//   bpe.encode(" hello", cache, ids);                  // appends the ids
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace ndt::tok {

struct BpeOptions {
  bool ignore_merges = false;
  int32_t unk_id = -1;  // -1: none
  bool fuse_unk = false;
};

class Bpe {
 public:
  Bpe() = default;
  // vocab: (token bytes, id); merges: (left id, right id, merged id) in rank order (a pair given
  // twice keeps its last rank, as tokenizers does).
  Bpe(const std::vector<std::pair<std::string, int32_t>>& vocab,
      const std::vector<std::array<int32_t, 3>>& merges, BpeOptions opt);

  // Pre-tokens already seen, and their ids (per thread; cleared when full).
  class Cache {
   public:
    const int32_t* find(std::string_view key, uint64_t hash, size_t& n) const;
    void insert(std::string_view key, uint64_t hash, const int32_t* ids, size_t n);

   private:
    struct Slot {
      uint64_t hash = 0;
      uint32_t key_at = 0, key_len = 0, ids_at = 0, ids_len = 0;
    };
    std::vector<Slot> slots_ = std::vector<Slot>(1 << 16);
    std::string keys_;
    std::vector<int32_t> ids_;
    size_t used_ = 0;
  };

  void encode(std::string_view bytes, Cache& cache, std::vector<int32_t>& out) const;

 private:
  void merge(std::vector<int32_t>& syms) const;  // syms: ids, merged in place
  void merge_long(std::vector<int32_t>& syms) const;
  // the merge of a pair: (rank, new id), rank -1 when there is none
  std::pair<int32_t, int32_t> find_merge(int32_t a, int32_t b) const {
    const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
    for (size_t i = (key * 0x9E3779B97F4A7C15ull) >> shift_;; i = (i + 1) & mask_) {
      const MergeSlot& s = merges_[i];
      if (s.key == key) return {s.rank, s.id};
      if (s.key == kEmpty) return {-1, -1};
    }
  }

  static constexpr uint64_t kEmpty = ~0ull;
  struct MergeSlot {
    uint64_t key = kEmpty;
    int32_t rank = -1, id = -1;
  };
  std::vector<MergeSlot> merges_;  // open addressing, linear probing
  int shift_ = 64;
  size_t mask_ = 0;
  int32_t byte_id_[256];  // the token of each single byte, -1 when none
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> vocab_;  // looked up by string_view
  BpeOptions opt_;
};

uint64_t hash_bytes(std::string_view s);

}  // namespace ndt::tok
