// Generation: the key/value cache (models/kv_cache.h) against the uncached model, and the
// sampler (train/sample.h): top-k, top-p, temperature, greedy, stop tokens.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "autograd/node.h"
#include "models/generate.h"
#include "models/gpt.h"
#include "models/kv_cache.h"
#include "nn/flat.h"
#include "tensor/cuda/runtime.h"

using namespace ndt;

namespace {

models::GPTConfig gpt2_config() {
  return {.n_layer = 2, .n_head = 2, .n_embd = 16, .vocab_size = 29, .block_size = 24};
}

// grouped-query attention (4 query heads on 2 kv heads), rotary embeddings with Llama 3's
// scaling, q/k/v biases (Qwen2), an untied head and a padded vocabulary
models::GPTConfig llama_config() {
  models::GPTConfig c = gpt2_config();
  c.arch = "llama", c.n_head = 4, c.n_kv_head = 2, c.intermediate_size = 24, c.attention_bias = true;
  c.vocab_multiple = 8, c.rope.theta = 500000, c.rope.llama3 = models::Llama3Scaling{8, 1, 4, 8};
  return c;
}

std::vector<int32_t> tokens(int64_t n, int64_t V, int seed) {
  std::vector<int32_t> t(n);
  for (int64_t i = 0; i < n; ++i) t[i] = static_cast<int32_t>((i * 7 + seed * 13 + i * i) % V);
  return t;
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = a.to_vector<double>(), y = b.to_vector<double>();
  EXPECT_EQ(x.size(), y.size());
  double d = 0;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) d = std::max(d, std::fabs(x[i] - y[i]));
  return d;
}

// The cached logits of every position equal the full forward's over the whole sequence: a
// prompt prefilled in two pieces (the second attends to the first through the cache with
// a diagonal mask at an offset), then one token per step to the end of the block.
void expect_cache_equals_full(const models::GPTConfig& cfg, DType dtype, Device device, double tol) {
  models::GPT gpt(cfg);
  // f64 and f32 as they are; bf16 as mixed precision computes it (an f32 master, bf16 copies)
  const DType master = dtype == DType::bf16 ? DType::f32 : dtype;
  nn::FlatParams params = nn::materialize(gpt.units(), device, master, 5, nn::ShardSpec{},
                                          dtype == DType::bf16 ? std::optional<DType>(dtype) : std::nullopt);
  const int64_t T = cfg.block_size, V = cfg.padded_vocab();
  const std::vector<int32_t> seq = tokens(T, cfg.vocab_size, 1);
  autograd::NoGradGuard no_grad;
  const Tensor full = gpt.forward(Tensor::from_vector(seq, {1, T}, device), Tensor()).logits;  // (T, Vp)
  ASSERT_EQ(full.size(1), V);
  models::KVCache cache(gpt, T);
  auto piece = [&](int64_t from, int64_t n) {
    return Tensor::from_vector(std::vector<int32_t>(seq.begin() + from, seq.begin() + from + n), {1, n},
                               device);
  };
  double worst = 0;
  worst = std::max(worst, max_abs_diff(cache.logits(piece(0, 5)), full.narrow(0, 0, 5)));
  worst = std::max(worst, max_abs_diff(cache.logits(piece(5, 3)), full.narrow(0, 5, 3)));
  for (int64_t t = 8; t < T; ++t) {
    const Tensor step = cache.logits(piece(t, 1));
    worst = std::max(worst, max_abs_diff(step, full.narrow(0, t, 1)));
  }
  EXPECT_EQ(cache.length(), T);
  EXPECT_LT(worst, tol) << cfg.str() << " " << dtype_name(dtype);
  // next_token_logits: only the last row, the same values
  cache.clear();
  const Tensor last = cache.next_token_logits(piece(0, 10));
  EXPECT_LT(max_abs_diff(last, full.narrow(0, 9, 1)), tol);
}

}  // namespace

TEST(KVCache, Gpt2LogitsEqualTheFullForwardAtEveryPosition) {
  expect_cache_equals_full(gpt2_config(), DType::f64, Device::cpu(), 1e-12);
  expect_cache_equals_full(gpt2_config(), DType::f32, Device::cpu(), 2e-5);
}

TEST(KVCache, LlamaLogitsEqualTheFullForwardAtEveryPosition) {
  expect_cache_equals_full(llama_config(), DType::f64, Device::cpu(), 1e-12);
  expect_cache_equals_full(llama_config(), DType::f32, Device::cpu(), 2e-5);
  models::GPTConfig mqa = llama_config();
  mqa.n_kv_head = 1, mqa.attention_bias = false, mqa.tie_embeddings = true;
  expect_cache_equals_full(mqa, DType::f64, Device::cpu(), 1e-12);
}

TEST(KVCache, LogitsEqualTheFullForwardOnCuda) {
  if (!cuda::available()) GTEST_SKIP() << "no CUDA device";
  expect_cache_equals_full(gpt2_config(), DType::f32, Device::cuda(0), 2e-5);
  expect_cache_equals_full(llama_config(), DType::f32, Device::cuda(0), 2e-5);
  expect_cache_equals_full(llama_config(), DType::bf16, Device::cuda(0), 0.1);
}

// The cache gives the blocks their hooks back, refuses what does not fit, and a batch of
// several rows keeps each row's own keys.
TEST(KVCache, RestoresTheHooksAndRefusesWhatDoesNotFit) {
  models::GPT gpt(llama_config());
  nn::FlatParams params = nn::materialize(gpt.units(), Device::cpu(), DType::f64, 3);
  {
    models::KVCache cache(gpt, 6);
    EXPECT_TRUE(static_cast<bool>(gpt.h[0]->attend()));
    cache.next_token_logits(Tensor::from_vector(tokens(4, 29, 2), {1, 4}));
    try {
      cache.next_token_logits(Tensor::from_vector(tokens(3, 29, 2), {1, 3}));
      ADD_FAILURE() << "4 + 3 positions fit a capacity of 6";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("capacity 6"), std::string::npos) << e.what();
    }
    EXPECT_THROW(cache.next_token_logits(Tensor::from_vector(tokens(2, 29, 2), {2, 1})),
                 Error);                            // 2 rows, not 1
    EXPECT_THROW(models::KVCache(gpt, 25), Error);  // past block_size
  }
  for (const auto& b : gpt.h) EXPECT_FALSE(static_cast<bool>(b->attend())) << "the hook was not given back";

  // two rows at once equal each row alone
  autograd::NoGradGuard no_grad;
  std::vector<int32_t> both = tokens(5, 29, 4), other = tokens(5, 29, 9);
  both.insert(both.end(), other.begin(), other.end());
  models::KVCache cache(gpt, 8);
  const Tensor two = cache.next_token_logits(Tensor::from_vector(both, {2, 5}));
  const Tensor two_next = cache.next_token_logits(Tensor::from_vector(std::vector<int32_t>{1, 2}, {2, 1}));
  for (int r = 0; r < 2; ++r) {
    std::vector<int32_t> row(both.begin() + 5 * r, both.begin() + 5 * r + 5);
    row.push_back(r + 1);
    const Tensor full = gpt.forward(Tensor::from_vector(row, {1, 6}), Tensor()).logits;
    EXPECT_LT(max_abs_diff(two.narrow(0, r, 1), full.narrow(0, 4, 1)), 1e-12);
    EXPECT_LT(max_abs_diff(two_next.narrow(0, r, 1), full.narrow(0, 5, 1)), 1e-12);
  }
}

// generate() with the cache draws the tokens the uncached model draws: the whole sequence
// through the model for every token, sample_token on its last row with the same options.
TEST(Generate, CachedEqualsUncached) {
  for (const models::GPTConfig& cfg : {gpt2_config(), llama_config()}) {
    models::GPT gpt(cfg);
    nn::FlatParams params = nn::materialize(gpt.units(), Device::cpu(), DType::f64, 7);
    for (const models::SampleOptions& o :
         {models::SampleOptions{
              .max_new_tokens = 18, .temperature = 0.9, .top_k = 8, .top_p = 0.9, .seed = 3},
          models::SampleOptions{.max_new_tokens = 18, .temperature = 0, .seed = 1},
          models::SampleOptions{.max_new_tokens = 18, .temperature = 1.5, .seed = 5}}) {
      const std::vector<int32_t> prompt = {3, 1, 4, 1, 5};
      const std::vector<int32_t> cached = models::generate(gpt, prompt, o, Device::cpu());
      std::vector<int32_t> plain = prompt;
      autograd::NoGradGuard no_grad;
      for (int64_t n = 0; n < o.max_new_tokens; ++n) {
        const int64_t T = static_cast<int64_t>(plain.size());
        Tensor logits = gpt.forward(Tensor::from_vector(plain, {1, T}), Tensor()).logits;
        std::vector<float> row = logits.narrow(0, T - 1, 1).to_vector<float>();
        row.resize(cfg.vocab_size);
        plain.push_back(models::sample_token(row, o, plain.size()));
      }
      EXPECT_EQ(cached, plain) << cfg.str() << " temperature " << o.temperature;
    }
  }
}

// The token an `agree` hook returns is the one taken: it continues the sequence, and a stop id
// from it ends the sample (dist::ParallelModel::generate so takes rank 0's tokens on every rank).
TEST(Generate, AgreedTokensAreTheOnesTaken) {
  models::GPT gpt(llama_config());
  nn::FlatParams params = nn::materialize(gpt.units(), Device::cpu(), DType::f64, 7);
  models::SampleOptions o{.max_new_tokens = 10, .temperature = 1.0, .seed = 9};
  o.stop_ids = {7};
  std::vector<int32_t> drawn;
  o.agree = [&](int32_t t) {
    drawn.push_back(t);
    return drawn.size() == 4 ? 7 : (t + 1) % 11;  // not what was drawn; the fourth a stop id
  };
  const std::vector<int32_t> prompt = {3, 1, 4};
  const std::vector<int32_t> ids = models::generate(gpt, prompt, o, Device::cpu());
  ASSERT_EQ(drawn.size(), 4u);
  ASSERT_EQ(ids.size(), prompt.size() + 4);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(ids[prompt.size() + i], (drawn[i] + 1) % 11) << i;
  EXPECT_EQ(ids.back(), 7);
  // and each agreed token is what the model read next: the second draw follows the first agreed token
  o.agree = {};
  o.max_new_tokens = 1;
  std::vector<int32_t> after_first = prompt;
  after_first.push_back((drawn[0] + 1) % 11);
  o.seed = 9;
  const std::vector<int32_t> next = models::generate(gpt, after_first, o, Device::cpu());
  EXPECT_EQ(next.back(), drawn[1]);
}

// Past block_size the context slides; the stop ids and on_token end a sample early.
TEST(Generate, SlidesPastTheBlockAndStops) {
  models::GPT gpt(llama_config());
  nn::FlatParams params = nn::materialize(gpt.units(), Device::cpu(), DType::f64, 7);
  const models::SampleOptions o{.max_new_tokens = 60, .temperature = 1.0, .seed = 9};
  const std::vector<int32_t> prompt = tokens(30, 29, 3);  // longer than block_size 24
  const std::vector<int32_t> ids = models::generate(gpt, prompt, o, Device::cpu());
  ASSERT_EQ(ids.size(), prompt.size() + 60);
  EXPECT_EQ(models::generate(gpt, prompt, o, Device::cpu()), ids) << "the same seed draws the same tokens";
  // stop at the first new token that is a stop id
  const int32_t stop = ids[prompt.size() + 7];
  models::SampleOptions s = o;
  s.stop_ids = {stop};
  const std::vector<int32_t> stopped = models::generate(gpt, prompt, s, Device::cpu());
  const auto first = std::find(ids.begin() + prompt.size(), ids.end(), stop);
  EXPECT_EQ(stopped, std::vector<int32_t>(ids.begin(), first + 1));
  int seen = 0;
  const std::vector<int32_t> three =
      models::generate(gpt, prompt, o, Device::cpu(), [&](int32_t) { return ++seen < 3; });
  EXPECT_EQ(three.size(), prompt.size() + 3);
  EXPECT_EQ(seen, 3);
  models::SampleOptions bad = o;
  bad.top_p = 0;
  EXPECT_THROW(models::generate(gpt, prompt, bad, Device::cpu()), Error);
}

// A tokenizer with fewer ids than the model's vocabulary (Hub configs pad it past the
// tokenizer's): the ids past the tokenizer's are never drawn, greedy or sampled, and the
// tokens drawn are those of the model's logits cut to the first vocab_limit.
TEST(Generate, NeverDrawsAnIdPastTheVocabLimit) {
  models::GPT gpt(gpt2_config());  // 29 ids
  nn::FlatParams params = nn::materialize(gpt.units(), Device::cpu(), DType::f64, 7);
  const std::vector<int32_t> prompt = {3, 1, 4};
  models::SampleOptions o{.max_new_tokens = 40, .temperature = 2.0, .seed = 11};
  const std::vector<int32_t> all = models::generate(gpt, prompt, o, Device::cpu());
  ASSERT_TRUE(std::any_of(all.begin() + 3, all.end(), [](int32_t id) { return id >= 6; }))
      << "the uncut model draws ids past 6, so the cut below is tested";
  for (const double temperature : {2.0, 0.0}) {
    o.temperature = temperature, o.vocab_limit = 6;
    const std::vector<int32_t> cut = models::generate(gpt, prompt, o, Device::cpu());
    ASSERT_EQ(cut.size(), prompt.size() + 40);
    for (size_t i = prompt.size(); i < cut.size(); ++i) EXPECT_LT(cut[i], 6) << "token " << i;
    // the same draw as sample_token on the logits cut to the first 6 ids
    std::vector<int32_t> plain = prompt;
    autograd::NoGradGuard no_grad;
    for (int n = 0; n < 5; ++n) {
      const int64_t T = static_cast<int64_t>(plain.size());
      std::vector<float> row = gpt.forward(Tensor::from_vector(plain, {1, T}), Tensor())
                                   .logits.narrow(0, T - 1, 1)
                                   .to_vector<float>();
      row.resize(6);
      plain.push_back(models::sample_token(row, o, plain.size()));
    }
    EXPECT_EQ(std::vector<int32_t>(cut.begin(), cut.begin() + 8), plain) << "temperature " << temperature;
  }
  o.vocab_limit = -1;
  EXPECT_THROW(models::generate(gpt, prompt, o, Device::cpu()), Error);
}

// sample_token's distribution: over many positions, each token's frequency matches
// softmax(logits / temperature) cut to the top k and then to the nucleus, renormalised.
TEST(Generate, SampleTokenDrawsFromTheCutDistribution) {
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f, 0.5f, 2.5f, -1.0f};
  auto freq = [&](const models::SampleOptions& o) {
    std::map<int32_t, double> f;
    const int n = 40000;
    for (int i = 0; i < n; ++i) f[models::sample_token(logits, o, static_cast<uint64_t>(i))] += 1.0 / n;
    return f;
  };
  auto expected = [&](double temp, std::vector<int32_t> keep) {
    std::map<int32_t, double> p;
    double sum = 0;
    for (int32_t i : keep) sum += p[i] = std::exp(logits[i] / temp);
    for (auto& [i, v] : p) v /= sum;
    return p;
  };
  auto close = [](const std::map<int32_t, double>& got, const std::map<int32_t, double>& want) {
    for (const auto& [i, v] : got) EXPECT_TRUE(want.count(i)) << "token " << i << " is outside the cut";
    for (const auto& [i, v] : want) EXPECT_NEAR(got.count(i) ? got.at(i) : 0.0, v, 0.01) << "token " << i;
  };
  close(freq({.temperature = 1.0}), expected(1.0, {0, 1, 2, 3, 4, 5}));
  close(freq({.temperature = 0.5, .top_k = 3}), expected(0.5, {1, 4, 2}));
  // probabilities at temperature 1 of tokens 1, 4, 2: 0.40, 0.24, 0.15 of the whole; top_p 0.6
  // keeps 1 and 4 (0.64 >= 0.6), top_p 0.3 keeps 1 alone
  close(freq({.temperature = 1.0, .top_p = 0.6}), expected(1.0, {1, 4}));
  close(freq({.temperature = 1.0, .top_p = 0.3}), expected(1.0, {1}));
  EXPECT_EQ(models::sample_token(logits, {.temperature = 0}, 0), 1);  // greedy
  EXPECT_EQ(models::sample_token({2.0f, 5.0f, 5.0f}, {.temperature = 0}, 0),
            1);  // the lowest id among equals
}
