#include "models/generate.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "models/kv_cache.h"
#include "tensor/error.h"
#include "tensor/rng.h"

namespace ndt::models {

int32_t sample_token(const std::vector<float>& logits, const SampleOptions& o, uint64_t position) {
  const int64_t V = static_cast<int64_t>(logits.size());
  NDT_CHECK(V > 0, "sample_token: no logits");
  auto before = [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  if (o.temperature <= 0)  // greedy: the most likely token (the lowest id among equals)
    return static_cast<int32_t>(
        std::min_element(logits.begin(), logits.end(), [&](float a, float b) { return a > b; }) -
        logits.begin());
  // the top k by logit, most likely first
  const int64_t k = o.top_k > 0 ? std::min(o.top_k, V) : V;
  std::vector<int32_t> order(V);
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + k, order.end(), before);
  // their softmax(logits / temperature), unnormalised
  std::vector<double> p(k);
  const double mx = logits[order[0]];
  double sum = 0;
  for (int64_t i = 0; i < k; ++i) sum += p[i] = std::exp((logits[order[i]] - mx) / o.temperature);
  // nucleus: the shortest prefix whose probability reaches top_p (at least one token)
  int64_t n = k;
  if (o.top_p < 1.0) {
    double acc = 0;
    for (n = 0; n < k && (n == 0 || acc < o.top_p * sum);) acc += p[n++];
    sum = acc;
  }
  const double u = Philox::uniform(o.seed, 0x5A3D1E, position, 0.0f, 1.0f) * sum;
  double acc = 0;
  for (int64_t i = 0; i < n; ++i) {
    acc += p[i];
    if (u < acc) return order[i];
  }
  return order[n - 1];
}

std::vector<int32_t> generate(const models::GPT& gpt, std::vector<int32_t> ids, const SampleOptions& o,
                              Device device, const std::function<bool(int32_t)>& on_token,
                              const LogitsFn& logits_fn) {
  NDT_CHECK(o.top_p > 0 && o.top_p <= 1, "sample: top_p must be in (0, 1], got ", o.top_p);
  if (ids.empty()) ids.push_back(0);
  NDT_CHECK(o.vocab_limit >= 0, "sample: vocab_limit must be >= 0, got ", o.vocab_limit);
  // the ids a token may take: padded columns are not tokens, nor ids past the tokenizer's
  const int64_t V = o.vocab_limit > 0 ? std::min(o.vocab_limit, gpt.cfg.vocab_size) : gpt.cfg.vocab_size;
  const int64_t cap = gpt.cfg.block_size;
  KVCache cache(gpt, cap, logits_fn);
  // the prompt (its last block_size tokens) in one forward; then each token alone
  const int64_t keep = std::min<int64_t>(static_cast<int64_t>(ids.size()), cap);
  Tensor logits = cache.next_token_logits(
      Tensor::from_vector(std::vector<int32_t>(ids.end() - keep, ids.end()), {1, keep}, device));  // (1, Vp)
  for (int64_t n = 0; n < o.max_new_tokens; ++n) {
    std::vector<float> row = logits.to_vector<float>();
    row.resize(V);
    int32_t next = sample_token(row, o, ids.size());
    if (o.agree) next = o.agree(next);
    ids.push_back(next);
    if (on_token && !on_token(next)) break;
    if (std::find(o.stop_ids.begin(), o.stop_ids.end(), next) != o.stop_ids.end()) break;
    if (n + 1 == o.max_new_tokens) break;
    if (cache.length() == cap) {  // full: slide to the last half block
      cache.clear();
      const int64_t keep = std::max<int64_t>(cap / 2, 1);
      std::vector<int32_t> ctx(ids.end() - keep, ids.end());
      logits = cache.next_token_logits(Tensor::from_vector(ctx, {1, keep}, device));
    } else {
      logits = cache.next_token_logits(Tensor::from_vector(std::vector<int32_t>{next}, {1, 1}, device));
    }
  }
  return ids;
}

}  // namespace ndt::models
