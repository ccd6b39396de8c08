#include "models/gpt.h"

#include <cmath>
#include <sstream>

#include "autograd/node.h"
#include "autograd/ops.h"

namespace ndt::models {

void GPTConfig::validate() const {
  NDT_CHECK(arch == "gpt2" || arch == "llama", "model.arch must be gpt2 or llama (Qwen2 and Mistral are llama), got '",
            arch, "'");
  NDT_CHECK(n_layer >= 1, "model.n_layer must be >= 1, got ", n_layer);
  NDT_CHECK(n_head >= 1, "model.n_head must be >= 1, got ", n_head);
  NDT_CHECK(n_embd >= 1 && n_embd % n_head == 0, "model.n_embd (", n_embd,
            ") must be a positive multiple of model.n_head (", n_head, ")");
  NDT_CHECK(vocab_size >= 1 && vocab_size <= (int64_t(1) << 24), "model.vocab_size must be in [1, 16777216], got ",
            vocab_size);
  NDT_CHECK(block_size >= 1, "model.block_size must be >= 1, got ", block_size);
  NDT_CHECK(vocab_multiple >= 1, "model.vocab_multiple must be >= 1, got ", vocab_multiple);
  NDT_CHECK(norm_eps > 0 && norm_eps < 1, "model.norm_eps must be in (0, 1), got ", norm_eps);
  if (!llama()) {
    NDT_CHECK(n_kv_head == 0 || n_kv_head == n_head, "model.n_kv_head (", n_kv_head,
              ") is for model.arch = llama; GPT-2's attention has n_head key/value heads");
    NDT_CHECK(intermediate_size == 0, "model.intermediate_size is for model.arch = llama; GPT-2's MLP has 4 x n_embd");
    NDT_CHECK(!attention_bias, "model.attention_bias is for model.arch = llama; GPT-2 has biases everywhere");
    NDT_CHECK(!tie_embeddings, "model.tie_embeddings is for model.arch = llama; GPT-2's head is always wte");
    NDT_CHECK(rope.theta == RopeConfig{}.theta && !rope.llama3,
              "model.rope_theta and model.rope_scaling are for model.arch = llama; GPT-2 learns its "
              "positions (wpe)");
    return;
  }
  NDT_CHECK(n_kv_head >= 0 && n_head % kv_heads() == 0, "model.n_kv_head (", n_kv_head,
            ") must divide model.n_head (", n_head, "): each key/value head serves n_head / n_kv_head query heads");
  NDT_CHECK(intermediate_size >= 1, "model.intermediate_size (the SwiGLU MLP's hidden units) must be >= 1 for "
            "model.arch = llama, got ", intermediate_size);
  NDT_CHECK(head_dim() % 2 == 0, "rotary embeddings turn pairs of channels: the head size n_embd / n_head = ",
            head_dim(), " must be even");
  rope_inv_freq(head_dim(), rope);  // throws naming a bad theta or scaling
}

std::string GPTConfig::str() const {
  std::ostringstream os;
  os << (llama() ? "Llama" : "GPT") << "(n_layer=" << n_layer << ", n_head=" << n_head;
  if (llama()) os << ", n_kv_head=" << kv_heads();
  os << ", n_embd=" << n_embd;
  if (llama()) os << ", intermediate_size=" << intermediate_size;
  os << ", vocab_size=" << vocab_size;
  if (padded_vocab() != vocab_size) os << " (padded to " << padded_vocab() << ")";
  os << ", block_size=" << block_size;
  if (llama()) {
    os << ", rope_theta=" << rope.theta;
    if (rope.llama3) os << " (llama3 scaling x" << rope.llama3->factor << ")";
    if (attention_bias) os << ", qkv bias";
    os << (tie_embeddings ? ", tied" : ", untied") << " head";
  }
  os << ")";
  return os.str();
}

namespace {
// GPT-2 init: N(0, 0.02); residual projections N(0, 0.02/sqrt(2*n_layer)). The llama blocks
// start the same way (Hugging Face initialises them N(0, 0.02) throughout).
constexpr float kStd = 0.02f;
float proj_std(const GPTConfig& c) { return kStd / std::sqrt(2.0f * static_cast<float>(c.n_layer)); }

std::unique_ptr<nn::DecoderBlock> make_block(const GPTConfig& c) {
  if (!c.llama()) return std::make_unique<nn::Block>(c.n_embd, c.n_head, kStd, proj_std(c), c.norm_eps);
  return std::make_unique<nn::LlamaBlock>(
      nn::LlamaBlock::Dims{c.n_embd, c.n_head, c.kv_heads(), c.intermediate_size, c.attention_bias, c.norm_eps},
      kStd, proj_std(c));
}
}  // namespace

GPT::GPT(const GPTConfig& c) : cfg((c.validate(), c)), wte(c.padded_vocab(), c.n_embd, kStd, c.vocab_size) {
  child("wte", &wte);
  if (!c.llama()) {
    wpe = std::make_unique<nn::Embedding>(c.block_size, c.n_embd, kStd);
    child("wpe", wpe.get());
  }
  for (int64_t i = 0; i < c.n_layer; ++i) {
    h.push_back(make_block(c));
    child("h." + std::to_string(i), h.back().get());
  }
  if (c.llama())
    ln_f = std::make_unique<nn::RMSNorm>(c.n_embd, c.norm_eps);
  else
    ln_f = std::make_unique<nn::LayerNorm>(c.n_embd, c.norm_eps);
  child("ln_f", ln_f.get());
  if (!c.tied()) {
    lm_head = std::make_unique<nn::Embedding>(c.padded_vocab(), c.n_embd, kStd, c.vocab_size);
    child("lm_head", lm_head.get());
  }
}

std::vector<nn::UnitSpec> GPT::units() const {
  std::vector<nn::UnitSpec> u;
  nn::UnitSpec emb{"embeddings", {}};
  for (auto& p : wte.parameters("wte")) emb.params.push_back(p);
  if (wpe)
    for (auto& p : wpe->parameters("wpe")) emb.params.push_back(p);
  for (auto& p : ln_f->parameters("ln_f")) emb.params.push_back(p);
  if (lm_head)
    for (auto& p : lm_head->parameters("lm_head")) emb.params.push_back(p);
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
  const double kv = static_cast<double>(cfg.kv_heads() * cfg.head_dim()), I = static_cast<double>(cfg.mlp_hidden());
  // gpt2: c_attn C x 3C, c_proj C x C, c_fc C x 4C, c_proj 4C x C (+ biases and LayerNorms);
  // llama: c_attn C x (C + 2 kv), c_proj C x C, gate, up and down C x I (+ RMSNorms)
  const double block_params = cfg.llama() ? C * (C + 2 * kv) + C * C + 3 * C * I + 2 * C
                                          : 12.0 * C * C + 13.0 * C;
  const double n = L * block_params + static_cast<double>(cfg.padded_vocab()) * C;
  return 6.0 * n + 12.0 * L * static_cast<double>(T) * C;
}

Tensor GPT::final_norm(const Tensor& x) const {
  if (cfg.llama()) return static_cast<const nn::RMSNorm&>(*ln_f).forward(x);
  return static_cast<const nn::LayerNorm&>(*ln_f).forward(x);
}

// What the blocks see of the positions (B, T): the offset and, for llama, the rotary tables
// of every token, made once per forward (or kept from the last one for the same positions).
nn::Positions GPT::block_positions(const Tensor& pos, int64_t pos_offset, bool cached, DType dtype) const {
  nn::Positions p{pos_offset, {}, {}};
  if (!cfg.llama()) return p;
  PositionsCache& c = pos_cache_;
  if (cached && c.rope.cos.defined() && c.rope.cos.dtype() == dtype) return c.rope;
  RopeTables t = rope_tables(pos, cfg.head_dim(), cfg.rope, dtype);
  p.cos = t.cos, p.sin = t.sin;
  if (cached) c.rope = p;
  return p;
}

// idx (B, T) -> the final norm's output (B, T, C), as the lm_head reads it (TP: copied to
// the group; sequence parallel: the whole sequence again)
Tensor GPT::trunk(const Tensor& idx, int64_t pos_offset) const {
  NDT_CHECK(idx.dtype() == DType::i32 && idx.dim() == 2, "GPT: idx must be int32 (B, T), got ", idx.desc());
  const int64_t B = idx.size(0), T = idx.size(1);
  NDT_CHECK(pos_offset >= 0 && pos_offset + T <= cfg.block_size, "GPT: positions ", pos_offset, "..",
            pos_offset + T - 1, " exceed model.block_size ", cfg.block_size,
            "; lower train.seq_len or raise model.block_size");
  Tensor pos;  // (B, T) i32: positions pos_offset .. pos_offset+T-1 for every row
  bool cached = false;
  if (positions) {
    pos = positions(idx, pos_offset);
  } else {
    PositionsCache& c = pos_cache_;
    if (!(c.pos.defined() && c.B == B && c.T == T && c.offset == pos_offset && c.device == idx.device())) {
      std::vector<int32_t> pos_host(B * T);
      for (int64_t i = 0; i < B * T; ++i) pos_host[i] = static_cast<int32_t>(pos_offset + i % T);
      c = {B, T, pos_offset, idx.device(), Tensor::from_vector(pos_host, {B, T}, idx.device()), {}};
    }
    pos = c.pos;
    cached = true;
  }

  Tensor x = wte.forward(idx);  // (B, T, C) (sequence parallel: (B, T/tp, C))
  // the rotary tables are for all T positions: attention's q and k are whole sequences
  const nn::Positions block_pos = block_positions(pos, pos_offset, cached, x.dtype());
  if (wpe) x = add(x, wpe->forward(sequence_part ? sequence_part(pos) : pos));  // gpt2's positions
  for (size_t i = 0; i < h.size(); ++i) {
    const nn::DecoderBlock* b = h[i].get();
    x = nn::wrap_block(wrappers_, static_cast<int64_t>(i),
                       [b, block_pos](const Tensor& in) { return b->forward(in, block_pos); })(x);
  }
  x = final_norm(x);
  if (before_lm_head) x = before_lm_head(x);
  return x;
}

GPTOutput GPT::forward(const Tensor& idx, const Tensor& targets, int64_t pos_offset) const {
  const int64_t B = idx.size(0), T = idx.size(1), C = cfg.n_embd;
  Tensor x = view(trunk(idx, pos_offset), {B * T, C});
  GPTOutput out;
  out.logits = matmul(x, head().weight, false, true);  // (B*T, C) @ head^T -> (B*T, Vp) (Vp/tp with TP)
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

Tensor GPT::next_token_logits(const Tensor& idx, int64_t pos_offset) const {
  const int64_t B = idx.size(0), T = idx.size(1), C = cfg.n_embd;
  Tensor x = trunk(idx, pos_offset);                           // (B, T, C)
  x = view(x.narrow(1, T - 1, 1).contiguous(), {B, C});        // each row's last position
  Tensor logits = matmul(x, head().weight, false, true);       // (B, C) @ head^T -> (B, Vp) (Vp/tp)
  return gather_logits ? gather_logits(logits) : logits;
}

}  // namespace ndt::models
