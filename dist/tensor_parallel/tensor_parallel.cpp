#include "dist/tensor_parallel/tensor_parallel.h"

#include <algorithm>

#include "dist/tensor_parallel/comm.h"

namespace ndt::dist {

void check_tensor_parallel(const models::GPTConfig& c, int64_t tp) {
  NDT_CHECK(c.n_head % tp == 0, "tensor parallelism: model.n_head = ", c.n_head,
            " is not divisible by tp_size = ", tp, "; each rank computes n_head / tp_size heads");
  NDT_CHECK(4 * c.n_embd % tp == 0, "tensor parallelism: the MLP's 4 x n_embd = ", 4 * c.n_embd,
            " hidden units are not divisible by tp_size = ", tp);
  NDT_CHECK(c.padded_vocab() % tp == 0, "tensor parallelism: the vocabulary of ", c.padded_vocab(),
            " rows (model.vocab_size ", c.vocab_size, " padded to a multiple of model.vocab_multiple ",
            c.vocab_multiple, ") is not divisible by tp_size = ", tp,
            "; set model.vocab_multiple to a multiple of ", tp);
}

namespace {

// A column-parallel linear: this rank's slice of the output columns (in `groups` blocks).
void column_parallel(nn::Linear& l, Communicator& tp, int64_t groups) {
  l.split_param("weight", 1, tp.size(), tp.rank(), groups);
  l.split_param("bias", 0, tp.size(), tp.rank(), groups);           // GPT-2 linears all have one
  l.before = [&tp](const Tensor& x) { return copy_to_tp(x, tp); };  // f
}

// A row-parallel linear: this rank's slice of the input rows; the partial outputs are
// summed (g) before the bias, which every rank holds whole.
void row_parallel(nn::Linear& l, Communicator& tp) {
  l.split_param("weight", 0, tp.size(), tp.rank());
  l.reduce_before_bias = [&tp](const Tensor& y) { return reduce_from_tp(y, tp); };  // g
}

}  // namespace

void apply_tensor_parallel(nn::Block& block, Communicator& tp) {
  if (tp.size() == 1) return;
  NDT_CHECK(block.attn.n_head % tp.size() == 0, "tensor parallelism: ", block.attn.n_head,
            " heads do not divide among ", tp.size(), " ranks");
  column_parallel(block.attn.c_attn, tp, /*groups=*/3);  // q, k and v: each rank its heads' columns
  block.attn.n_head /= tp.size();
  row_parallel(block.attn.c_proj, tp);
  column_parallel(block.mlp.c_fc, tp, 1);
  row_parallel(block.mlp.c_proj, tp);
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
