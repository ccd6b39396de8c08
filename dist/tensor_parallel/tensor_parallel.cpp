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

void column_parallel(nn::Linear& l, int64_t parts, int64_t rank, int64_t groups, Communicator* tp) {
  // W (C_in, C_out): this rank's columns of each of the `groups` blocks, and their bias
  l.split_param("weight", 1, parts, rank, groups);
  l.split_param("bias", 0, parts, rank, groups);  // GPT-2 linears all have one
  // f: the input is whole on every rank; backward sums its gradient over the ranks
  if (tp) l.before = [tp](const Tensor& x) { return copy_to_tp(x, *tp); };
}

void row_parallel(nn::Linear& l, int64_t parts, int64_t rank, Communicator* tp) {
  // W (C_in, C_out): this rank's rows; its input is the split output of a column-parallel layer
  l.split_param("weight", 0, parts, rank);
  // g: the partial products summed over the ranks, then the bias (whole on every rank) once
  if (tp) l.reduce_before_bias = [tp](const Tensor& y) { return reduce_from_tp(y, *tp); };
}

namespace {

// One block as rank `rank` of `parts` holds it; with a communicator, with its f and g.
void parallelize_block(nn::Block& b, int64_t parts, int64_t rank, Communicator* tp) {
  NDT_CHECK(b.attn.n_head % parts == 0, "tensor parallelism: ", b.attn.n_head, " heads do not divide among ",
            parts, " ranks");
  column_parallel(b.attn.c_attn, parts, rank, /*groups=*/3, tp);  // this rank's heads of q, of k, of v
  row_parallel(b.attn.c_proj, parts, rank, tp);                   // those heads' rows
  b.attn.n_head /= parts;
  column_parallel(b.mlp.c_fc, parts, rank, /*groups=*/1, tp);  // this rank's hidden units
  row_parallel(b.mlp.c_proj, parts, rank, tp);
}

}  // namespace

void apply_tensor_parallel(nn::Block& block, Communicator& tp) {
  if (tp.size() > 1) parallelize_block(block, tp.size(), tp.rank(), &tp);
}

void split_tensor_parallel(models::GPT& gpt, int64_t parts, int64_t rank) {
  NDT_CHECK(parts >= 1 && rank >= 0 && rank < parts, "tensor parallelism: rank ", rank, " of tp_size ", parts,
            "; tp_size must be >= 1 and the rank in [0, tp_size)");
  if (parts == 1) return;
  check_tensor_parallel(gpt.cfg, parts);
  for (auto& block : gpt.h) parallelize_block(*block, parts, rank, /*tp=*/nullptr);
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
