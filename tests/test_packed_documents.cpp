// Packed rows: several documents in one row of T tokens, docs (B, T) naming the document of
// every token. Each document must attend only to itself and see its positions restart at 0,
// so the whole model on a packed row gives, document by document, what it gives on each
// document alone in its own row: logits, loss and every gradient, in float64 to 1e-10, for
// GPT-2 (learned positions) and Llama (rotary positions, grouped-query attention, on the
// CPU's fused kernel and on the composed path).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <string>

#include "autograd/engine.h"
#include "models/gpt.h"
#include "models/kv_cache.h"
#include "tensor/kernels.h"

using namespace ndt;

namespace {

constexpr int64_t kV = 11;

models::GPTConfig small_gpt2() {
  return {.n_layer = 2, .n_head = 3, .n_embd = 12, .vocab_size = kV, .block_size = 16, .vocab_multiple = 4};
}

// 4 query heads over 2 kv heads, Qwen2's qkv biases, Llama 3's rotary scaling (its original
// context short enough that the scaling moves some frequencies), an untied head
models::GPTConfig small_llama() {
  models::GPTConfig c{.arch = "llama",
                      .n_layer = 2,
                      .n_head = 4,
                      .n_embd = 16,
                      .vocab_size = kV,
                      .block_size = 16,
                      .vocab_multiple = 4};
  c.n_kv_head = 2;
  c.intermediate_size = 20;
  c.attention_bias = true;
  c.rope = {.theta = 100, .llama3 = models::Llama3Scaling{4, 1, 2, 4}};
  return c;
}

// Two rows of 11 tokens: lengths 4, 1, 6 and 2, 3, 1, 5 (documents of unequal lengths, some
// of one token); the ids of documents need only grow along a row.
const std::vector<std::vector<int64_t>> kLengths = {{4, 1, 6}, {2, 3, 1, 5}};
constexpr int64_t kB = 2, kT = 11;

Tensor docs_of(const std::vector<std::vector<int64_t>>& lengths, int64_t T) {
  std::vector<int32_t> d;
  for (const auto& row : lengths) {
    int32_t id = 3;
    for (int64_t n : row) {
      for (int64_t i = 0; i < n; ++i) d.push_back(id);
      id += 2;
    }
  }
  return Tensor::from_vector(d, {static_cast<int64_t>(lengths.size()), T});
}

std::vector<int32_t> random_ids(int64_t n, uint64_t stream) {
  Tensor u = Tensor::empty({n}, DType::f32);
  kernels::fill_uniform(u, 5, stream, 0, 0.0f, static_cast<float>(kV));
  std::vector<int32_t> v;
  for (float x : u.to_vector<float>()) v.push_back(static_cast<int32_t>(x));
  return v;
}

// Next-token targets within each document; a document's last token predicts nothing (-1).
std::vector<int32_t> targets_of(const std::vector<int32_t>& tok, int64_t start, int64_t n) {
  std::vector<int32_t> t;
  for (int64_t i = 0; i < n; ++i) t.push_back(i + 1 < n ? tok[start + i + 1] : -1);
  return t;
}

struct Model {
  models::GPT gpt;
  nn::FlatParams params;
  explicit Model(const models::GPTConfig& c)
      : gpt(c), params(nn::materialize(gpt.units(), Device::cpu(), DType::f64, 42)) {
    // move every parameter off the init's exact 0s and 1s so every gradient is generic
    for (size_t i = 0; i < params.units.size(); ++i) {
      Tensor noise = Tensor::empty(params.units[i].data.shape(), DType::f64);
      kernels::fill_normal(noise, 3, i, 0, 0.0f, 0.1f);
      kernels::add_(params.units[i].data, noise);
    }
  }
  std::vector<double> grads() const {
    std::vector<double> g;
    for (const nn::FlatUnit& u : params.units)
      for (double x : u.grad.to_vector<double>()) g.push_back(x);
    return g;
  }
};

double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

void expect_packed_equals_alone(const models::GPTConfig& cfg) {
  Model m(cfg);
  const std::vector<int32_t> tok = random_ids(kB * kT, 1);
  const Tensor idx = Tensor::from_vector(tok, {kB, kT}), docs = docs_of(kLengths, kT);
  std::vector<int32_t> tgt;
  for (int64_t b = 0, s = 0; b < kB; ++b)
    for (int64_t n : kLengths[b]) {
      for (int32_t t : targets_of(tok, s, n)) tgt.push_back(t);
      s += n;
    }
  const Tensor targets = Tensor::from_vector(tgt, {kB, kT});
  const int64_t Vp = cfg.padded_vocab();

  // logits: each document's rows of the packed row against the document alone
  const std::vector<double> packed = m.gpt.forward(idx, Tensor(), 0, docs).logits.to_vector<double>();
  double worst = 0;
  int64_t counted = 0;  // the targets that count, over all documents
  for (int64_t b = 0, s = 0; b < kB; ++b)
    for (int64_t n : kLengths[b]) {
      const std::vector<int32_t> one(tok.begin() + s, tok.begin() + s + n);
      const std::vector<double> alone =
          m.gpt.forward(Tensor::from_vector(one, {1, n}), Tensor()).logits.to_vector<double>();
      const std::vector<double> part(packed.begin() + s * Vp, packed.begin() + (s + n) * Vp);
      worst = std::max(worst, max_abs_diff(part, alone));
      counted += n - 1;
      s += n;
    }
  EXPECT_LT(worst, 1e-10) << "logits of a packed row differ from its documents run alone";

  // loss and every gradient: the packed row's mean over its counted targets against the
  // documents' losses run alone, each weighted by its share of the targets
  m.params.zero_grad();
  const Tensor loss = m.gpt.forward(idx, targets, 0, docs).loss;
  backward(loss);
  const double packed_loss = loss.item();
  const std::vector<double> packed_grads = m.grads();
  m.params.zero_grad();
  double alone_loss = 0;
  for (int64_t b = 0, s = 0; b < kB; ++b)
    for (int64_t n : kLengths[b]) {
      if (n > 1) {
        const std::vector<int32_t> one(tok.begin() + s, tok.begin() + s + n);
        const Tensor l =
            m.gpt
                .forward(Tensor::from_vector(one, {1, n}), Tensor::from_vector(targets_of(tok, s, n), {1, n}))
                .loss;
        const double w = static_cast<double>(n - 1) / static_cast<double>(counted);
        alone_loss += w * l.item();
        backward(scale(l, w));  // gradients add up over the documents
      }
      s += n;
    }
  EXPECT_NEAR(packed_loss, alone_loss, 1e-12);
  const std::vector<double> alone_grads = m.grads();
  double gmax = 0;
  for (double g : alone_grads) gmax = std::max(gmax, std::abs(g));
  EXPECT_GT(gmax, 1e-3);
  EXPECT_LT(max_abs_diff(packed_grads, alone_grads), 1e-10 * std::max(1.0, gmax));
}

// Positions restart with every document (Hugging Face's position_ids of packed rows), from
// pos_offset. (Rotary embeddings depend on position differences only, so the Llama test
// below shows the masking; GPT-2's learned positions show the restart.)
TEST(PackedDocuments, PositionsRestartAtEveryDocument) {
  const Tensor docs = Tensor::from_vector<int32_t>({3, 3, 5, 5, 5, 8, 0, 0, 0, 0, 1, 1}, {2, 6});
  EXPECT_EQ(document_positions(docs).to_vector<int32_t>(),
            (std::vector<int32_t>{0, 1, 0, 1, 2, 0, 0, 1, 2, 3, 0, 1}));
  EXPECT_EQ(document_positions(docs, 2).to_vector<int32_t>(),
            (std::vector<int32_t>{2, 3, 2, 3, 4, 2, 2, 3, 4, 5, 2, 3}));
}

// The test's subject must not be a no-op: without docs the same packed row mixes its
// documents (each attends to the ones before, at later positions), and the logits differ.
TEST(PackedDocuments, WithoutDocsTheRowMixesItsDocuments) {
  Model m(small_llama());
  const Tensor idx = Tensor::from_vector(random_ids(kB * kT, 1), {kB, kT});
  const std::vector<double> a =
      m.gpt.forward(idx, Tensor(), 0, docs_of(kLengths, kT)).logits.to_vector<double>();
  const std::vector<double> b = m.gpt.forward(idx, Tensor()).logits.to_vector<double>();
  EXPECT_GT(max_abs_diff(a, b), 1e-3);
}

TEST(PackedDocuments, Gpt2EachDocumentAsIfAlone) { expect_packed_equals_alone(small_gpt2()); }
TEST(PackedDocuments, LlamaEachDocumentAsIfAlone) { expect_packed_equals_alone(small_llama()); }

// The same through the composed attention (the path CUDA takes).
TEST(PackedDocuments, LlamaEachDocumentAsIfAloneComposed) {
  setenv("NDT_SDPA", "0", 1);
  expect_packed_equals_alone(small_llama());
  expect_packed_equals_alone(small_gpt2());
  unsetenv("NDT_SDPA");
}

// One document per row given as docs is the unpacked model, to the bit.
TEST(PackedDocuments, OneDocumentPerRowIsTheUnpackedModel) {
  for (const models::GPTConfig& cfg : {small_gpt2(), small_llama()}) {
    Model m(cfg);
    const Tensor idx = Tensor::from_vector(random_ids(kB * kT, 1), {kB, kT});
    const Tensor y = Tensor::from_vector(random_ids(kB * kT, 2), {kB, kT});
    const Tensor one = Tensor::zeros({kB, kT}, DType::i32);
    EXPECT_EQ(m.gpt.forward(idx, Tensor(), 0, one).logits.to_vector<double>(),
              m.gpt.forward(idx, Tensor()).logits.to_vector<double>());
    m.params.zero_grad();
    backward(m.gpt.forward(idx, y, 0, one).loss);
    const std::vector<double> with_docs = m.grads();
    m.params.zero_grad();
    backward(m.gpt.forward(idx, y).loss);
    EXPECT_EQ(with_docs, m.grads());
  }
}

// A pipeline's chunk takes docs too: the whole model as one chunk gives forward's loss.
TEST(PackedDocuments, ForwardChunkTakesDocs) {
  Model m(small_llama());
  const Tensor idx = Tensor::from_vector(random_ids(kB * kT, 1), {kB, kT});
  const Tensor y = Tensor::from_vector(random_ids(kB * kT, 2), {kB, kT}), docs = docs_of(kLengths, kT);
  const double whole = m.gpt.forward(idx, y, 0, docs).loss.item();
  EXPECT_EQ(m.gpt.forward_chunk(0, idx, Tensor(), y, 0, docs).item(), whole);
  EXPECT_NE(m.gpt.forward_chunk(0, idx, Tensor(), y).item(), whole);
}

void expect_error(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one naming '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(PackedDocuments, RefusesBadDocs) {
  Model m(small_gpt2());
  const Tensor idx = Tensor::from_vector(random_ids(kB * kT, 1), {kB, kT});
  std::vector<int32_t> d(kB * kT, 0);
  d[5] = 2;  // row 0 goes 0 .. 2, 0: a document in two runs
  expect_error(
      [&] {
        m.gpt.forward(idx, Tensor(), 0, Tensor::from_vector(d, {kB, kT}));
      },
      "must not decrease");
  expect_error([&] { m.gpt.forward(idx, Tensor(), 0, Tensor::zeros({kB, kT - 1}, DType::i32)); }, "docs");
  expect_error([&] { m.gpt.forward(idx, Tensor(), 0, Tensor::zeros({kB, kT}, DType::f32)); }, "docs");
  expect_error([&] { m.gpt.forward(idx, Tensor(), 0, Tensor::zeros({kB + 1, kT}, DType::i32)); }, "docs");
}

// The hooks context parallelism installs receive the docs: an attend hook gets them with q, k
// and v (here it attends as the model would, so the logits are the model's on packed rows), and
// a positions hook gets the whole rows' docs, which may be longer than idx (a rank's pieces).
TEST(PackedDocuments, HooksReceiveTheDocs) {
  const Tensor idx = Tensor::from_vector(random_ids(kB * kT, 1), {kB, kT});
  const Tensor docs = docs_of(kLengths, kT);
  Model k(small_llama());
  const Tensor want = k.gpt.forward(idx, Tensor(), 0, docs).logits;
  int calls = 0;
  k.gpt.h[1]->attend() = [&calls, docs](const Tensor& q, const Tensor& kk, const Tensor& v, int64_t,
                                        const Tensor& d) {
    EXPECT_TRUE(d.defined());
    if (d.defined()) EXPECT_EQ(d.to_vector<int32_t>(), docs.to_vector<int32_t>());
    ++calls;
    return attention(q, kk, v, 0, 0, 0.0, d).out;
  };
  EXPECT_EQ(max_abs_diff(k.gpt.forward(idx, Tensor(), 0, docs).logits.to_vector<double>(),
                         want.to_vector<double>()),
            0.0);
  EXPECT_EQ(calls, 1);
  // positions from docs of whole rows of 2 T tokens, for T tokens of them
  Model m(small_gpt2());
  Tensor seen;
  m.gpt.positions = [&seen](const Tensor& x, int64_t, const Tensor& d) {
    seen = d;
    return Tensor::zeros(x.shape(), DType::i32);
  };
  const Tensor whole = Tensor::zeros({kB, 2 * kT}, DType::i32);
  m.gpt.forward(idx, Tensor(), 0, whole);
  ASSERT_TRUE(seen.defined());
  EXPECT_EQ(seen.shape(), whole.shape());
}

// A KV cache samples one sequence per row: packed rows are refused while it holds the hooks.
TEST(PackedDocuments, KvCacheRefusesDocs) {
  Model m(small_llama());
  models::KVCache cache(m.gpt, kT);
  const Tensor idx = Tensor::from_vector(random_ids(kB * kT, 1), {kB, kT});
  expect_error([&] { m.gpt.forward(idx, Tensor(), 0, docs_of(kLengths, kT)); }, "KVCache");
}

}  // namespace
