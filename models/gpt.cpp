#include "models/gpt.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <type_traits>

#include "autograd/node.h"
#include "autograd/ops.h"
#include "models/family.h"
#include "nn/moe.h"

namespace ndt::models {

void GPTConfig::validate() const {
  const Family& f = family();  // throws naming the known ones
  NDT_CHECK(n_layer >= 1, "model.n_layer must be >= 1, got ", n_layer);
  NDT_CHECK(n_head >= 1, "model.n_head must be >= 1, got ", n_head);
  NDT_CHECK(n_embd >= 1, "model.n_embd must be >= 1, got ", n_embd);
  NDT_CHECK(head_size > 0 || n_embd % n_head == 0, "model.n_embd (", n_embd,
            ") must be a multiple of model.n_head (", n_head, "), or model.head_dim given (llama)");
  NDT_CHECK(vocab_size >= 1 && vocab_size <= (int64_t(1) << 24),
            "model.vocab_size must be in [1, 16777216], got ", vocab_size);
  NDT_CHECK(block_size >= 1, "model.block_size must be >= 1, got ", block_size);
  NDT_CHECK(vocab_multiple >= 1, "model.vocab_multiple must be >= 1, got ", vocab_multiple);
  NDT_CHECK(norm_eps > 0 && norm_eps < 1, "model.norm_eps must be in (0, 1), got ", norm_eps);
  // another family's fields keep their defaults
  const GPTConfig defaults;
  visit_fields(
      [&](const Field& field, const auto& v, const auto& dv) {
        if (field.of(*this) || v == dv) return;
        std::ostringstream os;
        os << std::boolalpha << "model." << field.name << " = " << v
           << " is for model.arch = " << field.family << "; leave it out for model.arch = " << arch;
        throw Error(os.str());
      },
      *this, defaults);
  f.validate(*this);
}

void check_field_ranges(const GPTConfig& c) {
  visit_fields(
      [](const Field& f, const auto& v) {
        if constexpr (std::is_same_v<std::decay_t<decltype(v)>, int64_t>)
          if (v < static_cast<int64_t>(f.lo) || v > static_cast<int64_t>(f.hi))
            throw Error("model." + std::string(f.name) + " = " + std::to_string(v) + " is outside [" +
                        std::to_string(static_cast<int64_t>(f.lo)) + ", " +
                        std::to_string(static_cast<int64_t>(f.hi)) + "]");
      },
      c);
}

std::string GPTConfig::str() const {
  const Family& f = family();
  std::ostringstream os;
  os << f.title << "(n_layer=" << n_layer << ", n_head=" << n_head;
  f.describe(*this, Family::after_heads, os);
  os << ", n_embd=" << n_embd;
  f.describe(*this, Family::after_width, os);
  os << ", vocab_size=" << vocab_size;
  if (padded_vocab() != vocab_size) os << " (padded to " << padded_vocab() << ")";
  os << ", block_size=" << block_size;
  f.describe(*this, Family::at_end, os);
  os << ")";
  return os.str();
}

namespace {
// GPT-2 init: N(0, 0.02); residual projections N(0, 0.02/sqrt(2*n_layer)). The llama blocks
// start the same way (Hugging Face initialises them N(0, 0.02) throughout).
constexpr float kStd = 0.02f;
float proj_std(const GPTConfig& c) { return kStd / std::sqrt(2.0f * static_cast<float>(c.n_layer)); }

}  // namespace

GPT::GPT(const GPTConfig& c, PipelinePart part)
    : cfg((c.validate(), c)), wte(c.padded_vocab(), c.n_embd, kStd, c.vocab_size), part_(std::move(part)) {
  if (part_.chunks.empty()) part_.chunks = {{0, c.n_layer}};
  // what this rank holds of the embeddings and the head (units() says why): only those are
  // its parameters; the others stay unregistered descriptions that nothing runs
  const bool ends = part_.first || part_.last;
  const bool input = c.tied() ? ends : part_.first, output = c.tied() ? ends : part_.last;
  if (input) child("wte", &wte);
  const Family& family = c.family();
  if (family.learned_positions) {
    wpe = std::make_unique<nn::Embedding>(c.block_size, c.n_embd, kStd);
    if (input) child("wpe", wpe.get());
  }
  for (const auto& [begin, end] : part_.chunks) {
    NDT_CHECK(0 <= begin && begin < end && end <= c.n_layer, "GPT: a pipeline chunk of blocks [", begin, ", ",
              end, ") outside the model's ", c.n_layer, " blocks");
    chunk_begin_.push_back(h.size());
    for (int64_t i = begin; i < end; ++i) {
      h.push_back(family.make_block(c, i, kStd, proj_std(c)));
      block_index_.push_back(i);
      child("h." + std::to_string(i), h.back().get());
    }
  }
  chunk_begin_.push_back(h.size());
  ln_f = family.make_norm(c);
  if (output) child("ln_f", ln_f.get());
  if (!c.tied()) {
    lm_head = std::make_unique<nn::Embedding>(c.padded_vocab(), c.n_embd, kStd, c.vocab_size);
    if (output) child("lm_head", lm_head.get());
  }
}

std::vector<nn::UnitSpec> GPT::units(bool experts_apart) const {
  std::vector<nn::UnitSpec> u;
  nn::UnitSpec emb{"embeddings", {}};
  // tied: the first and the last stage hold the same unit (wte is used at both ends);
  // untied: each end holds its own parameters
  const bool ends = part_.first || part_.last;
  const bool input = cfg.tied() ? ends : part_.first, output = cfg.tied() ? ends : part_.last;
  if (input)
    for (auto& p : wte.parameters("wte")) emb.params.push_back(p);
  if (wpe && input)
    for (auto& p : wpe->parameters("wpe")) emb.params.push_back(p);
  if (output)
    for (auto& p : ln_f->parameters("ln_f")) emb.params.push_back(p);
  if (lm_head && output)
    for (auto& p : lm_head->parameters("lm_head")) emb.params.push_back(p);
  u.push_back(emb);
  std::vector<nn::UnitSpec> apart;  // experts_apart: each MoE block's experts, after the blocks
  for (size_t i = 0; i < h.size(); ++i) {
    const std::string name = "h." + std::to_string(block_index_[i]);
    nn::UnitSpec block{name, h[i]->parameters(name)};
    const auto* moe = dynamic_cast<const nn::MoeBlock*>(h[i].get());
    if (experts_apart && moe) {
      nn::UnitSpec experts{name + ".experts", moe->mlp.experts.parameters(name + ".mlp.experts"), true};
      std::erase_if(block.params, [&](const nn::ParamSpec& p) {
        return std::any_of(experts.params.begin(), experts.params.end(),
                           [&](const nn::ParamSpec& e) { return e.name == p.name; });
      });
      apart.push_back(std::move(experts));
    }
    u.push_back(std::move(block));
  }
  u.insert(u.end(), apart.begin(), apart.end());
  return u;
}

void GPT::add_lora(const nn::LoraConfig& c) {
  NDT_CHECK(lora.empty(), "GPT: LoRA adapters were added already");
  lora_dropout = std::make_shared<nn::LoraDropout>();
  lora_dropout->p = c.dropout;
  for (size_t i = 0; i < h.size(); ++i)
    lora.push_back(std::make_unique<nn::LoraBlock>(*h[i], c, lora_dropout, block_index_[i]));
  lora_config = c;
}

std::vector<nn::UnitSpec> GPT::adapter_units() const {
  std::vector<nn::UnitSpec> u{{"embeddings", {}}};  // as units(): block i's unit is i + 1
  for (size_t i = 0; i < lora.size(); ++i) {
    const std::string name = "h." + std::to_string(block_index_[i]);
    u.push_back({name, lora[i]->parameters(name)});
  }
  return u;
}

double GPT::flops_per_token(int64_t T) const {
  // 6 flops per parameter per token (2 forward, 4 backward), embeddings excluded except
  // the lm_head matmul; attention: 12 * n_layer * T * NH HS (QK^T and PV, forward + backward;
  // NH HS = C unless model.head_dim says otherwise)
  const double C = static_cast<double>(cfg.n_embd), L = static_cast<double>(cfg.n_layer);
  const double n = L * cfg.family().block_params(cfg) + static_cast<double>(cfg.padded_vocab()) * C;
  const double attn = static_cast<double>(cfg.n_head * cfg.head_dim());
  return 6.0 * n + 12.0 * L * static_cast<double>(T) * attn;
}

Tensor GPT::final_norm(const Tensor& x) const { return ln_f->forward(x); }

// What the blocks see of the positions (B, T): the offset, the documents of packed rows and,
// for llama, the rotary tables of every token, made once per forward (or kept from the last
// one for the same positions).
nn::Positions GPT::block_positions(const Tensor& pos, int64_t pos_offset, bool cached, DType dtype,
                                   const Tensor& docs) const {
  nn::Positions p{pos_offset, {}, {}, docs, nullptr};
  if (cfg.family().learned_positions) return p;
  PositionsCache& c = pos_cache_;
  if (cached && c.rope.cos.defined() && c.rope.cos.dtype() == dtype) return c.rope;
  RopeTables t = rope_tables(pos, cfg.head_dim(), cfg.rope, dtype);
  p.cos = t.cos, p.sin = t.sin;
  if (cached) c.rope = p;
  return p;
}

// The positions of idx's tokens (B, T) i32: pos_offset .. pos_offset+T-1 for every row (CP:
// this rank's two pieces; packed rows: restarting at pos_offset with every document of docs,
// under CP from the whole rows' docs);
// cached: kept from the last call for the same (B, T, offset).
Tensor GPT::positions_of(const Tensor& idx, int64_t pos_offset, const Tensor& docs, bool& cached) const {
  NDT_CHECK(idx.dtype() == DType::i32 && idx.dim() == 2, "GPT: idx must be int32 (B, T), got ", idx.desc());
  const int64_t B = idx.size(0), T = idx.size(1);
  NDT_CHECK(pos_offset >= 0 && pos_offset + T <= cfg.block_size, "GPT: positions ", pos_offset, "..",
            pos_offset + T - 1, " exceed model.block_size ", cfg.block_size,
            "; lower train.seq_len or raise model.block_size");
  cached = false;
  if (docs.defined()) {
    // context parallelism: the whole rows' docs, which its hook checks against the sequence
    NDT_CHECK(docs.device() == idx.device() && docs.dim() == 2 && docs.size(0) == B &&
                  (positions || docs.size(1) == T),
              "GPT: docs ", docs.desc(), " must be shaped as idx ", idx.desc(), " on its device");
    return positions ? positions(idx, pos_offset, docs) : document_positions(docs, pos_offset);
  }
  if (positions) return positions(idx, pos_offset, Tensor());
  {
    PositionsCache& c = pos_cache_;
    if (!(c.pos.defined() && c.B == B && c.T == T && c.offset == pos_offset && c.device == idx.device())) {
      std::vector<int32_t> pos_host(B * T);
      for (int64_t i = 0; i < B * T; ++i) pos_host[i] = static_cast<int32_t>(pos_offset + i % T);
      c = {B, T, pos_offset, idx.device(), Tensor::from_vector(pos_host, {B, T}, idx.device()), {}};
    }
    cached = true;
    return c.pos;
  }
}

// idx (B, T), pos (B, T) -> (B, T, C) (sequence parallel: (B, T/tp, C))
Tensor GPT::embed(const Tensor& idx, const Tensor& pos) const {
  Tensor x = wte.forward(idx);
  if (wpe) x = add(x, wpe->forward(sequence_part ? sequence_part(pos) : pos));  // gpt2's positions
  return x;
}

// x (B, T, C) through h[begin, end), each block through the wrappers
Tensor GPT::run_blocks(size_t begin, size_t end, Tensor x, const nn::Positions& block_pos) const {
  for (size_t i = begin; i < end; ++i) {
    const nn::DecoderBlock* b = h[i].get();
    x = nn::wrap_block(wrappers_, static_cast<int64_t>(i),
                       [b, block_pos](const Tensor& in) { return b->forward(in, block_pos); })(x);
  }
  return x;
}

// (B, T, C) -> the final norm's output, as the lm_head reads it (TP: copied to the group;
// sequence parallel: the whole sequence again)
Tensor GPT::before_head(const Tensor& x) const {
  Tensor y = final_norm(x);
  return before_lm_head ? before_lm_head(y) : y;
}

Tensor GPT::trunk(const Tensor& idx, int64_t pos_offset, const Tensor& docs,
                  const std::shared_ptr<nn::RouterLoss>& router) const {
  NDT_CHECK(part_.whole(), "GPT: this rank holds one part of a pipeline; run it with forward_chunk");
  bool cached = false;
  const Tensor pos = positions_of(idx, pos_offset, docs, cached);
  Tensor x = embed(idx, pos);
  // the rotary tables are for all T positions: attention's q and k are whole sequences
  nn::Positions block_pos = block_positions(pos, pos_offset, cached, x.dtype(), docs);
  block_pos.router = router;
  return before_head(run_blocks(0, h.size(), x, block_pos));
}

namespace {
// the mean of values, which it empties (-1: none)
double take_mean(std::vector<double>& values) {
  if (values.empty()) return -1;
  double sum = 0;
  for (double v : values) sum += v;
  const double mean = sum / static_cast<double>(values.size());
  values.clear();
  return mean;
}
}  // namespace

double GPT::take_aux_loss() const { return take_mean(aux_values_); }
double GPT::take_z_loss() const { return take_mean(z_values_); }

std::shared_ptr<nn::RouterLoss> GPT::router_loss() const {
  // training only: evaluation's loss is the cross-entropy alone
  if (!cfg.moe() || (cfg.router_aux_loss_coef == 0 && cfg.router_z_loss_coef == 0) || !training)
    return nullptr;
  auto stats = std::make_shared<nn::RouterLoss>(cfg.n_experts);
  stats->balance = cfg.router_aux_loss_coef > 0;
  stats->z = cfg.router_z_loss_coef > 0;
  stats->reduce = reduce_router_stats;
  stats->grad_scale = router_grad_scale;
  return stats;
}

// x (B, T, C) at the head: logits (B*T, Vp) through the head's matrix, and the loss
GPTOutput GPT::head_forward(const Tensor& x_btc, const Tensor& idx, const Tensor& targets,
                            const std::shared_ptr<nn::RouterLoss>& router) const {
  GPTOutput out = head_logits(x_btc, idx, targets);
  if (!router || !out.loss.defined()) return out;
  if (router->balance) {  // + coef * the load-balancing loss of every MoE layer (nn/moe.h)
    out.aux_loss = nn::aux_loss(x_btc, router);
    aux_values_.push_back(router->value());
    out.loss = add(out.loss, scale(out.aux_loss, cfg.router_aux_loss_coef));
  }
  if (router->z) {  // + coef * the router z-loss, averaged over the MoE layers
    out.z_loss = nn::z_loss(x_btc, router);
    z_values_.push_back(router->z_value());
    out.loss = add(out.loss, scale(out.z_loss, cfg.router_z_loss_coef));
  }
  return out;
}

GPTOutput GPT::head_logits(const Tensor& x_btc, const Tensor& idx, const Tensor& targets) const {
  const int64_t B = idx.size(0), T = idx.size(1), C = cfg.n_embd;
  Tensor x = view(x_btc, {B * T, C});
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

GPTOutput GPT::forward(const Tensor& idx, const Tensor& targets, int64_t pos_offset,
                       const Tensor& docs) const {
  const std::shared_ptr<nn::RouterLoss> router = targets.defined() ? router_loss() : nullptr;
  return head_forward(trunk(idx, pos_offset, docs, router), idx, targets, router);
}

// (B, T, C) -> the logits of each row's last position (B, Vp)
Tensor GPT::next_token_logits(const Tensor& idx, int64_t pos_offset) const {
  const int64_t B = idx.size(0), T = idx.size(1), C = cfg.n_embd;
  Tensor x = trunk(idx, pos_offset, Tensor());            // (B, T, C)
  x = view(x.narrow(1, T - 1, 1).contiguous(), {B, C});   // each row's last position
  Tensor logits = matmul(x, head().weight, false, true);  // (B, C) @ head^T -> (B, Vp) (Vp/tp)
  return gather_logits ? gather_logits(logits) : logits;
}

// ---- pipeline parallelism: one chunk at a time ----------------------------------------

Tensor GPT::chunk_trunk(size_t chunk, const Tensor& idx, const Tensor& x, int64_t pos_offset,
                        const Tensor& docs, const std::shared_ptr<nn::RouterLoss>& router) const {
  NDT_CHECK(chunk + 1 < chunk_begin_.size(), "GPT: chunk ", chunk, " of a part with ",
            chunk_begin_.size() - 1, " chunks");
  const bool embeds = chunk == 0 && part_.first;
  NDT_CHECK(
      embeds != x.defined(), "GPT: chunk ", chunk,
      embeds ? " starts the pipeline: it embeds idx and takes no x" : " needs the previous stage's output x");
  bool cached = false;
  const Tensor pos = positions_of(idx, pos_offset, docs, cached);
  const Tensor in = embeds ? embed(idx, pos) : x;
  nn::Positions block_pos = block_positions(pos, pos_offset, cached, in.dtype(), docs);
  block_pos.router = router;
  Tensor y = run_blocks(chunk_begin_[chunk], chunk_begin_[chunk + 1], in, block_pos);
  return chunk + 2 == chunk_begin_.size() && part_.last ? before_head(y) : y;
}

Tensor GPT::forward_chunk(size_t chunk, const Tensor& idx, const Tensor& x, const Tensor& targets,
                          int64_t pos_offset, const Tensor& docs,
                          const std::shared_ptr<nn::RouterLoss>& router) const {
  Tensor y = chunk_trunk(chunk, idx, x, pos_offset, docs, router);
  if (!(chunk + 2 == chunk_begin_.size() && part_.last)) return y;
  NDT_CHECK(targets.defined(), "GPT: the pipeline's last chunk needs the targets");
  return head_forward(y, idx, targets, router).loss;
}

Tensor GPT::next_token_logits_chunk(size_t chunk, const Tensor& idx, const Tensor& x,
                                    int64_t pos_offset) const {
  NDT_CHECK(chunk + 2 == chunk_begin_.size() && part_.last, "GPT: only the pipeline's last chunk has logits");
  const int64_t B = idx.size(0), T = idx.size(1), C = cfg.n_embd;
  Tensor y = chunk_trunk(chunk, idx, x, pos_offset, Tensor());  // (B, T, C)
  y = view(y.narrow(1, T - 1, 1).contiguous(), {B, C});
  Tensor logits = matmul(y, head().weight, false, true);  // (B, C) @ head^T -> (B, Vp)
  return gather_logits ? gather_logits(logits) : logits;
}

}  // namespace ndt::models
