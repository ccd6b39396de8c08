#include "models/gpt.h"

#include <cmath>
#include <sstream>

#include "autograd/node.h"
#include "autograd/ops.h"

namespace ndt::models {

void GPTConfig::validate() const {
  NDT_CHECK(n_layer >= 1, "model.n_layer must be >= 1, got ", n_layer);
  NDT_CHECK(n_head >= 1, "model.n_head must be >= 1, got ", n_head);
  NDT_CHECK(n_embd >= 1 && n_embd % n_head == 0, "model.n_embd (", n_embd,
            ") must be a positive multiple of model.n_head (", n_head, ")");
  NDT_CHECK(vocab_size >= 1 && vocab_size <= 65536,
            "model.vocab_size must be in [1, 65536] (tokens are uint16), got ", vocab_size);
  NDT_CHECK(block_size >= 1, "model.block_size must be >= 1, got ", block_size);
  NDT_CHECK(vocab_multiple >= 1, "model.vocab_multiple must be >= 1, got ", vocab_multiple);
}

std::string GPTConfig::str() const {
  std::ostringstream os;
  os << "GPT(n_layer=" << n_layer << ", n_head=" << n_head << ", n_embd=" << n_embd
     << ", vocab_size=" << vocab_size;
  if (padded_vocab() != vocab_size) os << " (padded to " << padded_vocab() << ")";
  os << ", block_size=" << block_size << ")";
  return os.str();
}

namespace {
// GPT-2 init: N(0, 0.02); residual projections N(0, 0.02/sqrt(2*n_layer)).
constexpr float kStd = 0.02f;
float proj_std(const GPTConfig& c) { return kStd / std::sqrt(2.0f * static_cast<float>(c.n_layer)); }
}  // namespace

GPT::GPT(const GPTConfig& c)
    : cfg((c.validate(), c)),
      wte(c.padded_vocab(), c.n_embd, kStd, c.vocab_size),
      wpe(c.block_size, c.n_embd, kStd),
      ln_f(c.n_embd) {
  child("wte", &wte);
  child("wpe", &wpe);
  for (int64_t i = 0; i < c.n_layer; ++i) {
    h.push_back(std::make_unique<nn::Block>(c.n_embd, c.n_head, kStd, proj_std(c)));
    child("h." + std::to_string(i), h.back().get());
  }
  child("ln_f", &ln_f);
}

std::vector<nn::UnitSpec> GPT::units() const {
  std::vector<nn::UnitSpec> u;
  nn::UnitSpec emb{"embeddings", {}};
  for (auto& p : wte.parameters("wte")) emb.params.push_back(p);
  for (auto& p : wpe.parameters("wpe")) emb.params.push_back(p);
  for (auto& p : ln_f.parameters("ln_f")) emb.params.push_back(p);
  u.push_back(emb);
  for (size_t i = 0; i < h.size(); ++i) {
    const std::string name = "h." + std::to_string(i);
    u.push_back({name, h[i]->parameters(name)});
  }
  return u;
}

double GPT::flops_per_token(int64_t T) const {
  // 6 flops per parameter per token (2 forward, 4 backward), embeddings excluded except
  // the lm_head matmul; attention: 12 * n_layer * T * C (QK^T and PV, forward + backward)
  const double C = static_cast<double>(cfg.n_embd), L = static_cast<double>(cfg.n_layer);
  const double block_params = 12.0 * C * C + 13.0 * C;
  const double n = L * block_params + static_cast<double>(cfg.padded_vocab()) * C;
  return 6.0 * n + 12.0 * L * static_cast<double>(T) * C;
}

GPTOutput GPT::forward(const Tensor& idx, const Tensor& targets, int64_t pos_offset) const {
  NDT_CHECK(idx.dtype() == DType::i32 && idx.dim() == 2, "GPT: idx must be int32 (B, T), got ", idx.desc());
  const int64_t B = idx.size(0), T = idx.size(1), C = cfg.n_embd;
  NDT_CHECK(pos_offset >= 0 && pos_offset + T <= cfg.block_size, "GPT: positions ", pos_offset, "..",
            pos_offset + T - 1, " exceed model.block_size ", cfg.block_size,
            "; lower train.seq_len or raise model.block_size");
  Tensor pos;  // (B, T) i32: positions pos_offset .. pos_offset+T-1 for every row
  if (positions) {
    pos = positions(idx, pos_offset);
  } else {
    PositionsCache& c = pos_cache_;
    if (!(c.pos.defined() && c.B == B && c.T == T && c.offset == pos_offset && c.device == idx.device())) {
      std::vector<int32_t> pos_host(B * T);
      for (int64_t i = 0; i < B * T; ++i) pos_host[i] = static_cast<int32_t>(pos_offset + i % T);
      c = {B, T, pos_offset, idx.device(), Tensor::from_vector(pos_host, {B, T}, idx.device())};
    }
    pos = c.pos;
  }

  if (sequence_part) pos = sequence_part(pos);          // sequence parallel: (B, T/tp)
  Tensor x = add(wte.forward(idx), wpe.forward(pos));  // (B, T, C) (sequence parallel: (B, T/tp, C))
  for (size_t i = 0; i < h.size(); ++i) {
    const nn::Block* b = h[i].get();
    x = nn::wrap_block(wrappers_, static_cast<int64_t>(i),
                      [b, pos_offset](const Tensor& in) { return b->forward(in, pos_offset); })(x);
  }
  x = ln_f.forward(x);
  GPTOutput out;
  if (before_lm_head) x = before_lm_head(x);
  x = view(x, {B * T, C});
  out.logits = matmul(x, wte.weight, false, true);  // (B*T, C) @ wte^T -> (B*T, Vp) (Vp/tp with TP)
  if (targets.defined()) {
    NDT_CHECK(targets.shape() == idx.shape(), "GPT: targets ", targets.shape_str(), " must match idx ",
              idx.shape_str());
    if (loss_fn) {
      out.loss = loss_fn(out.logits, targets.view({B * T}));
    } else if (autograd::needs_grad({out.logits})) {
      // training: the fused classifier writes the loss's gradient over the logits
      out.loss = cross_entropy_fused(out.logits, targets.view({B * T}), -1, cfg.vocab_size);
      out.logits = Tensor();
    } else {
      out.loss = cross_entropy(out.logits, targets.view({B * T}), -1, cfg.vocab_size);
    }
  } else if (gather_logits) {
    out.logits = gather_logits(out.logits);
  }
  return out;
}

}  // namespace ndt::models
