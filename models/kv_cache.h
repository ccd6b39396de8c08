// ndtrain: a key/value cache for generation. A prompt's keys and values are computed once
// (the prefill); each new token then runs alone through the model and attends to all the
// keys and values kept so far, instead of the whole prefix being computed again per token.
//
//   models::KVCache cache(gpt, /*capacity=*/gpt.cfg.block_size);
//   Tensor logits = cache.next_token_logits(prompt);   // prompt (B, Tp) i32 -> (B, Vp)
//   logits = cache.next_token_logits(tokens);          // tokens (B, 1): one step -> (B, Vp)
//   cache.length();                                    // Tp + 1 positions kept
//
// While a KVCache lives it is how the model's blocks attend (it takes their attend hooks
// and gives back the ones it found when destroyed), so one cache per model at a time. It
// holds, per block, K and V of shape (B, NKV, capacity, HS) in the model's compute dtype,
// allocated at the first call from the shapes the block hands it: under tensor parallelism
// a rank keeps its own heads (NKV / tp). The forward runs without gradients.
//
// Legend: B rows (sequences), T new tokens per call, NH query heads, NKV key/value heads,
// HS head size, Vp padded vocabulary.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "models/gpt.h"

namespace ndt::models {

// How a cache gets the next token's logits of (B, T) tokens at pos_offset..: the model's own
// GPT::next_token_logits by default; under pipeline parallelism, the pipeline's (every
// stage runs its blocks through its own cache, the last stage's logits come back).
using LogitsFn = std::function<Tensor(const Tensor& idx, int64_t pos_offset)>;

class KVCache {
 public:
  // capacity: positions kept (<= block_size). Throws ndt::Error for a capacity out of range.
  KVCache(const GPT& gpt, int64_t capacity, LogitsFn logits_fn = {});
  ~KVCache();
  KVCache(const KVCache&) = delete;
  KVCache& operator=(const KVCache&) = delete;

  // The tokens idx (B, T) i32 come next in their sequences (positions length() ..
  // length() + T - 1): their keys and values are kept, and the logits of the token after
  // each row's last are returned, (B, Vp). Throws ndt::Error when they would not fit
  // (length() + T > capacity) or B differs from the first call's.
  Tensor next_token_logits(const Tensor& idx);
  // The same, with the logits of every new position: (B*T, Vp), as GPT::forward gives them
  // (for tests that compare against the uncached model).
  Tensor logits(const Tensor& idx);

  int64_t length() const { return length_; }
  int64_t capacity() const { return capacity_; }
  // Forgets every position (the buffers are kept): the next call starts a new sequence.
  void clear() { length_ = 0; }

 private:
  // The hook every block attends through: q (B,NH,T,HS), k, v (B,NKV,T,HS) at pos_offset ->
  // (B,NH,T,HS). Writes k, v at [pos_offset, pos_offset + T) of block `layer`'s buffers and
  // attends to [0, pos_offset + T) of them.
  Tensor attend(size_t layer, const Tensor& q, const Tensor& k, const Tensor& v, int64_t pos_offset);
  void check_room(const Tensor& idx) const;

  const GPT& gpt_;
  LogitsFn logits_fn_;
  int64_t capacity_ = 0, length_ = 0, batch_ = -1;
  std::vector<Tensor> k_, v_;        // per block: (B, NKV, capacity, HS)
  std::vector<nn::AttendFn> saved_;  // the blocks' hooks before this cache
};

}  // namespace ndt::models
