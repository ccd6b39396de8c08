// ndtrain: generating tokens from a GPT with a key/value cache (models/kv_cache.h): the
// prompt runs through the model once, then one token per step.
//
//   models::SampleOptions o;
//   o.max_new_tokens = 200, o.temperature = 0.8, o.top_k = 40, o.top_p = 0.95, o.seed = 1;
//   o.stop_ids = {eos};                                  // ends after emitting one of these
//   o.vocab_limit = tokenizer_ids;                      // ids the tokenizer lacks never drawn
//   std::vector<int32_t> ids = models::generate(gpt, prompt_ids, o, device,
//                                              [&](int32_t id) { std::cout << piece(id); return true; });
//
// Each token is drawn from softmax(logits / temperature) restricted to the top_k most likely
// tokens, then to the smallest set of them whose probability reaches top_p (nucleus), with
// the counter-based RNG keyed by (seed, the token's position): a sample is reproducible, and
// the same on every rank. temperature 0 takes the most likely token (greedy).
//
// The cache holds model.block_size positions. A sequence that reaches it keeps its last
// block_size / 2 tokens and runs them through the model again as a new prompt (positions
// from 0), then goes on: the context slides by half a block at a time, one prefill each.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "models/gpt.h"
#include "models/kv_cache.h"

namespace ndt::models {

struct SampleOptions {
  int64_t max_new_tokens = 200;  // at most this many new tokens
  double temperature = 1.0;      // > 0; 0: greedy
  int64_t top_k = 0;             // 0: the whole vocabulary
  double top_p = 1.0;            // in (0, 1]; 1: no nucleus cut
  uint64_t seed = 1;
  std::vector<int32_t> stop_ids;  // end after emitting one of these (end-of-text ids)
  // ids at or past this are never drawn (0: every id of model.vocab_size): a tokenizer with
  // fewer ids than the model's vocabulary (Hub configs pad it) has no text for the rest
  int64_t vocab_limit = 0;
  // if set, each drawn token passes through it and the token it returns is the one taken: the
  // ranks of a parallel model agree on every token (dist::ParallelModel::generate takes rank
  // 0's under expert parallelism), so that no rank's forward passes leave the others' (a logit
  // one bit apart on one rank could draw another token, end the sample sooner and leave the
  // others waiting in a collective)
  std::function<int32_t(int32_t)> agree;
};

// The next token from one row of logits (V live entries; padded columns excluded), drawn
// as SampleOptions says with the RNG at (seed, position).
int32_t sample_token(const std::vector<float>& logits, const SampleOptions& o, uint64_t position);

// prompt -> prompt followed by the new tokens (an empty prompt starts from token 0).
// on_token, if given, sees each new token as it is drawn and may return false to stop.
// logits_fn: where the logits come from (models/kv_cache.h; default: the model's own).
std::vector<int32_t> generate(const models::GPT& gpt, std::vector<int32_t> prompt, const SampleOptions& o,
                              Device device, const std::function<bool(int32_t)>& on_token = {},
                              const LogitsFn& logits_fn = {});

}  // namespace ndt::models
