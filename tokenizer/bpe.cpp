#include "tokenizer/bpe.h"

#include <climits>
#include <cstring>
#include <queue>
#include <tuple>

namespace ndt::tok {

uint64_t hash_bytes(std::string_view s) {
  // 8 bytes at a time, each word mixed by a multiply (wyhash's folding)
  uint64_t h = 0x243F6A8885A308D3ull ^ s.size();
  const auto mix = [](uint64_t a, uint64_t b) {
    const __uint128_t r = static_cast<__uint128_t>(a ^ 0xA0761D6478BD642Full) * (b ^ 0xE7037ED1A0B428DBull);
    return static_cast<uint64_t>(r) ^ static_cast<uint64_t>(r >> 64);
  };
  size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    uint64_t w;
    std::memcpy(&w, s.data() + i, 8);
    h = mix(h, w);
  }
  uint64_t tail = 0;
  std::memcpy(&tail, s.data() + i, s.size() - i);
  return mix(h, tail ^ (static_cast<uint64_t>(s.size() - i) << 56));
}

Bpe::Bpe(const std::vector<std::pair<std::string, int32_t>>& vocab,
         const std::vector<std::array<int32_t, 3>>& merges, BpeOptions opt)
    : opt_(opt) {
  std::fill(std::begin(byte_id_), std::end(byte_id_), -1);
  vocab_.reserve(vocab.size());
  for (const auto& [bytes, id] : vocab) {
    vocab_[bytes] = id;
    if (bytes.size() == 1) byte_id_[static_cast<unsigned char>(bytes[0])] = id;
  }
  size_t cap = 16;
  while (cap < 2 * merges.size() + 16) cap *= 2;
  merges_.assign(cap, MergeSlot{});
  mask_ = cap - 1;
  shift_ = 64 - __builtin_ctzll(cap);
  int32_t rank = 0;
  for (const auto& [a, b, id] : merges) {
    const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
    for (size_t i = (key * 0x9E3779B97F4A7C15ull) >> shift_;; i = (i + 1) & mask_) {
      MergeSlot& s = merges_[i];
      if (s.key == kEmpty || s.key == key) {
        s.key = key;
        s.rank = rank;
        s.id = id;
        break;
      }
    }
    ++rank;
  }
}

const int32_t* Bpe::Cache::find(std::string_view key, uint64_t hash, size_t& n) const {
  const size_t mask = slots_.size() - 1;
  for (size_t i = hash & mask;; i = (i + 1) & mask) {
    const Slot& s = slots_[i];
    if (s.key_len == 0) return nullptr;
    if (s.hash == hash && s.key_len == key.size() &&
        std::memcmp(keys_.data() + s.key_at, key.data(), key.size()) == 0) {
      n = s.ids_len;
      return ids_.data() + s.ids_at;
    }
  }
}

void Bpe::Cache::insert(std::string_view key, uint64_t hash, const int32_t* ids, size_t n) {
  if (key.empty() || key.size() > 256) return;
  if (2 * (used_ + 1) > slots_.size()) {
    if (slots_.size() < (1u << 20)) {  // grow, keeping what it holds
      std::vector<Slot> old(slots_.size() * 2);
      old.swap(slots_);
      const size_t mask = slots_.size() - 1;
      for (const Slot& s : old)
        if (s.key_len != 0) {
          size_t i = s.hash & mask;
          while (slots_[i].key_len != 0) i = (i + 1) & mask;
          slots_[i] = s;
        }
    } else {  // full: start again (a text's common words come back at once)
      std::fill(slots_.begin(), slots_.end(), Slot{});
      keys_.clear();
      ids_.clear();
      used_ = 0;
    }
  }
  const size_t mask = slots_.size() - 1;
  size_t i = hash & mask;
  while (slots_[i].key_len != 0) i = (i + 1) & mask;
  slots_[i] = {hash, static_cast<uint32_t>(keys_.size()), static_cast<uint32_t>(key.size()),
               static_cast<uint32_t>(ids_.size()), static_cast<uint32_t>(n)};
  keys_.append(key);
  ids_.insert(ids_.end(), ids, ids + n);
  ++used_;
}

void Bpe::encode(std::string_view bytes, Cache& cache, std::vector<int32_t>& out) const {
  if (bytes.empty()) return;
  if (bytes.size() == 1 && byte_id_[static_cast<unsigned char>(bytes[0])] >= 0) {
    out.push_back(byte_id_[static_cast<unsigned char>(bytes[0])]);
    return;
  }
  const uint64_t h = hash_bytes(bytes);
  size_t n = 0;
  if (const int32_t* hit = cache.find(bytes, h, n)) {
    out.insert(out.end(), hit, hit + n);
    return;
  }
  const size_t at = out.size();
  if (opt_.ignore_merges) {
    // a pre-token that is a token is that token
    if (auto it = vocab_.find(bytes); it != vocab_.end()) out.push_back(it->second);
  }
  if (out.size() == at) {
    // one symbol per byte; bytes without a token: unk_token (fused) or dropped
    thread_local std::vector<int32_t> syms;
    syms.clear();
    bool unk_open = false;
    for (unsigned char b : bytes) {
      if (byte_id_[b] >= 0) {
        syms.push_back(byte_id_[b]);
        unk_open = false;
      } else if (opt_.unk_id >= 0) {
        if (!(unk_open && opt_.fuse_unk)) syms.push_back(opt_.unk_id);
        unk_open = true;
      }
    }
    merge(syms);
    out.insert(out.end(), syms.begin(), syms.end());
  }
  cache.insert(bytes, h, out.data() + at, out.size() - at);
}

void Bpe::merge(std::vector<int32_t>& syms) const {
  const size_t n0 = syms.size();
  if (n0 < 2) return;
  if (n0 > 64) return merge_long(syms);
  // few symbols: find the lowest-ranked pair, merge it, update its two neighbours' pairs
  int32_t rank[64], made[64];
  for (size_t i = 0; i + 1 < n0; ++i) std::tie(rank[i], made[i]) = find_merge(syms[i], syms[i + 1]);
  size_t n = n0;
  for (;;) {
    size_t best = n;
    int32_t best_rank = INT32_MAX;
    for (size_t i = 0; i + 1 < n; ++i)
      if (rank[i] >= 0 && rank[i] < best_rank) {
        best_rank = rank[i];
        best = i;
      }
    if (best == n) break;
    syms[best] = made[best];
    for (size_t i = best + 1; i + 1 < n; ++i) syms[i] = syms[i + 1];
    for (size_t i = best + 1; i + 2 < n; ++i) {
      rank[i] = rank[i + 1];
      made[i] = made[i + 1];
    }
    --n;
    if (best > 0) std::tie(rank[best - 1], made[best - 1]) = find_merge(syms[best - 1], syms[best]);
    if (best + 1 < n) std::tie(rank[best], made[best]) = find_merge(syms[best], syms[best + 1]);
  }
  syms.resize(n);
}

void Bpe::merge_long(std::vector<int32_t>& syms) const {
  // many symbols (a long run of spaces or digits): tokenizers' own algorithm, a linked list of
  // symbols and a heap of candidate merges ordered by (rank, position); an entry whose pair
  // has changed since it was pushed is skipped
  const int n = static_cast<int>(syms.size());
  std::vector<int> prev(n), next(n);
  std::vector<bool> gone(n, false);
  for (int i = 0; i < n; ++i) {
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  struct Cand {
    int32_t rank, pos, made;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
  const auto push = [&](int pos) {
    if (pos < 0 || next[pos] < 0) return;
    const auto [r, m] = find_merge(syms[pos], syms[next[pos]]);
    if (r >= 0) heap.push({r, pos, m});
  };
  for (int i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    const Cand c = heap.top();
    heap.pop();
    if (gone[c.pos] || next[c.pos] < 0) continue;
    const int right = next[c.pos];
    if (find_merge(syms[c.pos], syms[right]).second != c.made) continue;  // stale
    syms[c.pos] = c.made;
    gone[right] = true;
    next[c.pos] = next[right];
    if (next[right] >= 0) prev[next[right]] = c.pos;
    push(prev[c.pos]);
    push(c.pos);
  }
  size_t k = 0;
  for (int i = 0; i >= 0 && i < n; i = next[i]) syms[k++] = syms[i];
  syms.resize(k);
}

}  // namespace ndt::tok
