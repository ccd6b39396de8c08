#include "dist/tensor_parallel/tensor_parallel.h"

#include <algorithm>

#include "dist/tensor_parallel/comm.h"

namespace ndt::dist {

void check_tensor_parallel(const models::GPTConfig& c, int64_t tp) {
  NDT_CHECK(tp >= 1, "tensor parallelism: tp_size must be >= 1, got ", tp);  // before dividing by it
  NDT_CHECK(c.n_head % tp == 0, "tensor parallelism: model.n_head = ", c.n_head,
            " is not divisible by tp_size = ", tp, "; each rank computes n_head / tp_size heads");
  NDT_CHECK(4 * c.n_embd % tp == 0, "tensor parallelism: the MLP's 4 x n_embd = ", 4 * c.n_embd,
            " hidden units are not divisible by tp_size = ", tp);
  NDT_CHECK(c.padded_vocab() % tp == 0, "tensor parallelism: the vocabulary of ", c.padded_vocab(),
            " rows (model.vocab_size ", c.vocab_size, " padded to a multiple of model.vocab_multiple ",
            c.vocab_multiple, ") is not divisible by tp_size = ", tp,
            "; set model.vocab_multiple to a multiple of ", tp,
            " (a checkpoint written with another vocab_multiple resumes: its padded rows are unused zeros)");
}

namespace {

// The parameter splits of one block for rank `rank` of `parts`: column-parallel c_attn (its
// heads' columns of q, k and v: three blocks) and c_fc, row-parallel c_proj's.
void split_block(nn::Block& b, int64_t parts, int64_t rank) {
  for (nn::Linear* l : {&b.attn.c_attn, &b.mlp.c_fc}) {
    const int64_t groups = l == &b.attn.c_attn ? 3 : 1;
    l->split_param("weight", 1, parts, rank, groups);
    l->split_param("bias", 0, parts, rank, groups);  // GPT-2 linears all have one
  }
  for (nn::Linear* l : {&b.attn.c_proj, &b.mlp.c_proj}) l->split_param("weight", 0, parts, rank);
  b.attn.n_head /= parts;
}

}  // namespace

void apply_tensor_parallel(nn::Block& block, Communicator& tp) {
  if (tp.size() == 1) return;
  NDT_CHECK(block.attn.n_head % tp.size() == 0, "tensor parallelism: ", block.attn.n_head,
            " heads do not divide among ", tp.size(), " ranks");
  split_block(block, tp.size(), tp.rank());
  // column-parallel layers take their input through f; row-parallel ones sum their partial
  // outputs (g) before the bias, which every rank holds whole
  for (nn::Linear* l : {&block.attn.c_attn, &block.mlp.c_fc})
    l->before = [&tp](const Tensor& x) { return copy_to_tp(x, tp); };
  for (nn::Linear* l : {&block.attn.c_proj, &block.mlp.c_proj})
    l->reduce_before_bias = [&tp](const Tensor& y) { return reduce_from_tp(y, tp); };
}

void split_tensor_parallel(models::GPT& gpt, int64_t parts, int64_t rank) {
  NDT_CHECK(parts >= 1 && rank >= 0 && rank < parts, "tensor parallelism: rank ", rank, " of tp_size ", parts,
            "; tp_size must be >= 1 and the rank in [0, tp_size)");
  if (parts == 1) return;
  check_tensor_parallel(gpt.cfg, parts);
  for (auto& block : gpt.h) split_block(*block, parts, rank);
  gpt.wte.split_param("weight", 0, parts, rank);
}

void apply_tensor_parallel(models::GPT& gpt, Communicator& tp) {
  const int64_t n = tp.size();
  if (n == 1) return;
  check_tensor_parallel(gpt.cfg, n);
  for (auto& block : gpt.h) apply_tensor_parallel(*block, tp);
  // the vocabulary: wte rows [v_start, v_start + Vl) on this rank
  const int64_t Vl = gpt.cfg.padded_vocab() / n, v_start = tp.rank() * Vl;
  const int64_t v_live = std::clamp<int64_t>(gpt.cfg.vocab_size - v_start, 0, Vl);  // the rest is padding
  gpt.wte.split_param("weight", 0, n, tp.rank());
  gpt.wte.lookup = [&tp, v_start](const Tensor& ids, const Tensor& table) {
    return vocab_parallel_embedding(ids, table, v_start, tp);
  };
  gpt.before_lm_head = [&tp](const Tensor& x) { return copy_to_tp(x, tp); };  // f: lm_head is column-parallel
  gpt.loss_fn = [&tp, v_start, v_live](const Tensor& logits, const Tensor& targets) {
    return vocab_parallel_cross_entropy(logits, targets, v_start, v_live, /*ignore_index=*/-1, tp);
  };
  gpt.gather_logits = [&tp](const Tensor& logits) { return gather_vocab(logits, tp); };
}

}  // namespace ndt::dist
